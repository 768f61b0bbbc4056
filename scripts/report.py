"""Benchmarks' shared parts: medians of repeated runs, a table, and results/bench.jsonl."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

from innet.results.files import write_text_atomic


def median_of(runs: int, measure: Callable[[], float]) -> tuple[float, list[float]]:
    samples = [measure() for _ in range(runs)]
    return statistics.median(samples), samples


def report(name: str, header: list[str], rows: list[list[Any]], extra: dict[str, Any] | None = None,
           path: str = os.path.join("results", "bench.jsonl")) -> None:
    """Print a table and append one JSON line with the same figures (the file rewritten atomically, never
    through a link: innet.results.files)."""
    cells = [header] + [[f"{c:.4g}" if isinstance(c, float) else str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    print(f"== {name}")
    for row in cells:
        print("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))
    old = ""
    if os.path.isfile(path) and not os.path.islink(path):
        with open(path, encoding="utf-8") as fh:
            old = fh.read()
    write_text_atomic(path, old + json.dumps({"bench": name, "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
                                              "cores": os.cpu_count(), "machine": platform.machine(),
                                              "header": header, "rows": rows, **(extra or {})}) + "\n")
