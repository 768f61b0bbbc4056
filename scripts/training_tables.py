#!/usr/bin/env python3
"""The training tables of docs/training.md from a ``--train ... --mode all`` run's results.json.

    python run_topology.py --backend local --topo star --workers 4 --train digits --mode all --packet-elements 1024 --out DIR
    python scripts/training_tables.py DIR/results.json

Prints two Markdown tables: test accuracy after every epoch per scheme (the exact float baseline first), and per
scheme its final accuracy against the baseline, time per epoch, time to 95% and its scheme's own figures.
"""

from __future__ import annotations

import json
import sys
from typing import Any

NAMES = {"innet": "innet", "pbox": "PBox", "ring": "ring", "topk": "top-k", "ssp": "SSP", "asp": "ASP"}


def accuracy_table(result: dict[str, Any]) -> list[str]:
    runs = result["runs"]
    epochs = len(result["exact_epochs"])
    lines = ["| epoch | exact | " + " | ".join(NAMES.get(r["scheme"], r["scheme"]) for r in runs) + " |",
             "|---" * (len(runs) + 2) + "|"]
    for e in range(epochs):
        cells = [f"{100 * result['exact_epochs'][e]['accuracy']:.2f}"]
        cells += [f"{100 * r['epochs'][e]['accuracy']:.2f}" if e < len(r["epochs"]) else "-" for r in runs]
        lines.append(f"| {e + 1} | " + " | ".join(cells) + " |")
    return lines


def time_table(result: dict[str, Any]) -> list[str]:
    exact = result["accuracy_exact"]
    lines = ["| scheme | final accuracy | vs exact | test loss | time per epoch | time to 95% | notes |",
             "|---|---|---|---|---|---|---|"]
    for r in result["runs"]:
        notes = []
        if r.get("bytes_vs_dense") is not None:
            notes.append(f"{100 * r['bytes_vs_dense']:.1f}% of the dense bytes")
        if r.get("consistency"):
            notes.append(f"staleness read: max {r['max_staleness']}, mean {r['mean_staleness']:.2f}")
        reach = "never" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.3f} s"
        lines.append(f"| {NAMES.get(r['scheme'], r['scheme'])} | {100 * r['accuracy']:.2f}% | "
                     f"{100 * (r['accuracy'] - exact):+.2f} | {r['loss']:.3f} | {r['time_per_epoch_s']:.3f} s | {reach} | "
                     f"{'; '.join(notes)} |")
    return lines


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: training_tables.py RESULTS.json", file=sys.stderr)
        return 2
    with open(sys.argv[1], encoding="utf-8") as fh:
        result = json.load(fh)
    if "accuracy_exact" not in result:
        print(f"error: {sys.argv[1]} is not a --train run's results", file=sys.stderr)
        return 2
    print(f"exact float baseline: {100 * result['accuracy_exact']:.2f}%\n")
    print("\n".join(accuracy_table(result)))
    print()
    print("\n".join(time_table(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
