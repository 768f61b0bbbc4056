#!/usr/bin/env python3
"""Fault recovery: each mode's completion time under loss, reordering and duplication, alone and combined, divided
by its own lossless time (medians over seeds of each seed's ratio).

Every run is checked exact and bit-identical to its seed's lossless run; the table also gives the retransmissions
and how many of them were spurious (medians). ``--mininet`` runs the same grid on Mininet (root; minutes), else the
local fabric (virtual time: the default grid takes a minute or two).
"""

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import innet  # noqa: E402
from scripts.report import report  # noqa: E402

# (column label, the faults on every link direction)
POINTS: tuple[tuple[str, dict[str, float]], ...] = (
    ("0.001", {"loss": 0.001}), ("0.01", {"loss": 0.01}), ("0.05", {"loss": 0.05}), ("0.2", {"loss": 0.2}),
    ("reorder", {"reorder": 0.05}), ("dup", {"dup": 0.02}),
    ("0.05+reorder", {"loss": 0.05, "reorder": 0.05}), ("0.05+reorder+dup", {"loss": 0.05, "reorder": 0.05, "dup": 0.02}),
)
QUICK = ("0.01", "0.2", "0.05+reorder")
TOPOLOGIES = {"star": {"topology": "star", "workers": 4}, "leaf-spine": {"topology": "leaf-spine"}}


def ratios(topology: dict, elements: int, backend: str, modes: list[str], points: list[tuple[str, dict[str, float]]],
           seeds: list[int]) -> list[list]:
    """One row per mode: its lossless time, then the median ratio (and retransmissions/spurious) per point."""
    options = dict(topology)
    topo = options.pop("topology")
    rows = []
    for mode in modes:
        row: list = [topo, mode]
        clean = {s: innet.run(topo, mode=mode, elements=elements, backend=backend, seed=s, **options).runs[0]
                 for s in seeds}
        assert all(r.correct for r in clean.values()), mode
        row.append(statistics.median(r.completion_s for r in clean.values()))
        for label, faults in points:
            runs = {s: innet.run(topo, mode=mode, elements=elements, backend=backend, seed=s, **faults,
                                 **options).runs[0] for s in seeds}
            for s, r in runs.items():
                assert r.correct and r.result_digest == clean[s].result_digest, (mode, label, s, r.errors)
            row.append(statistics.median(runs[s].completion_s / clean[s].completion_s for s in seeds))
            row.append(f"{statistics.median(r.retransmissions for r in runs.values()):g}"
                       f"/{statistics.median(r.spurious_retransmissions for r in runs.values()):g}")
        rows.append(row)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--mininet", action="store_true", help="run on Mininet (root) instead of the local fabric")
    p.add_argument("--elements", type=int, default=262144)
    p.add_argument("--seeds", type=int, default=3, help="seeds per point (1..N); the table gives medians (default 3)")
    p.add_argument("--topo", choices=sorted(TOPOLOGIES), action="append", help="default: both")
    p.add_argument("--modes", default="innet,pbox,ring")
    p.add_argument("--points", help="comma-separated column labels to run (default: all of "
                                    + ", ".join(label for label, _ in POINTS) + ")")
    p.add_argument("--quick", action="store_true",
                   help="one seed, 16384 elements, 1%%, 20%% and 5%% loss with 5%% reordering only (for tests)")
    args = p.parse_args()
    wanted = QUICK if args.quick else (args.points.split(",") if args.points else [label for label, _ in POINTS])
    unknown = sorted(set(wanted) - {label for label, _ in POINTS})
    if unknown:
        p.error(f"unknown point(s) {', '.join(unknown)}; use {', '.join(label for label, _ in POINTS)}")
    points = [(label, faults) for label, faults in POINTS if label in wanted]
    elements, seeds = (16384, [1]) if args.quick else (args.elements, list(range(1, args.seeds + 1)))
    backend = "mininet" if args.mininet else "local"
    rows = []
    for name in args.topo or list(TOPOLOGIES):
        rows += ratios(TOPOLOGIES[name], elements, backend, args.modes.split(","), points, seeds)
    header = ["topology", "mode", "lossless_s"]
    for label, _ in points:
        header += [f"x@{label}", f"retx/spur@{label}"]
    faults = {label: faults for label, faults in points}
    report(f"fault recovery ({backend}, {elements} elements, medians of {len(seeds)} seeds)", header, rows,
           {"faults": faults})


if __name__ == "__main__":
    main()
