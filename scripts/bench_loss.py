#!/usr/bin/env python3
"""Loss recovery: each mode's completion time under loss, divided by its own lossless time (medians of 3 seeds).

Every run is checked exact; the table also gives the retransmissions and how many of them were spurious.
``--mininet`` runs the same grid on Mininet (root; minutes), else the local fabric (virtual time, seconds).
"""

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import innet  # noqa: E402
from scripts.report import report  # noqa: E402

LOSSES = (0.001, 0.01, 0.05, 0.2)
TOPOLOGIES = {"star": {"topology": "star", "workers": 4}, "leaf-spine": {"topology": "leaf-spine"}}


def ratios(topology: dict, elements: int, backend: str, modes: list[str], losses: tuple[float, ...],
           seeds: list[int]) -> list[list]:
    """One row per mode: its lossless time, then the median ratio (and retransmissions, spurious) per loss."""
    options = dict(topology)
    topo = options.pop("topology")
    rows = []
    for mode in modes:
        row: list = [topo, mode]
        clean = {s: innet.run(topo, mode=mode, elements=elements, backend=backend, seed=s, **options).runs[0]
                 for s in seeds}
        assert all(r.correct for r in clean.values()), mode
        row.append(statistics.median(r.completion_s for r in clean.values()))
        for loss in losses:
            runs = {s: innet.run(topo, mode=mode, elements=elements, backend=backend, seed=s, loss=loss,
                                 **options).runs[0] for s in seeds}
            assert all(r.correct for r in runs.values()), (mode, loss, [r.errors for r in runs.values()])
            row.append(statistics.median(runs[s].completion_s / clean[s].completion_s for s in seeds))
            row.append(f"{statistics.median(r.retransmissions for r in runs.values()):g}"
                       f"/{statistics.median(r.spurious_retransmissions for r in runs.values()):g}")
        rows.append(row)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--mininet", action="store_true", help="run on Mininet (root) instead of the local fabric")
    p.add_argument("--elements", type=int, default=262144)
    p.add_argument("--seeds", type=int, default=3, help="seeds per point; the table gives medians (default 3)")
    p.add_argument("--topo", choices=sorted(TOPOLOGIES), action="append", help="default: both")
    p.add_argument("--modes", default="innet,pbox,ring")
    p.add_argument("--quick", action="store_true", help="one seed, 16384 elements, 1%% and 20%% only (for tests)")
    args = p.parse_args()
    losses, elements, seeds = LOSSES, args.elements, list(range(1, args.seeds + 1))
    if args.quick:
        losses, elements, seeds = (0.01, 0.2), 16384, [1]
    backend = "mininet" if args.mininet else "local"
    rows = []
    for name in args.topo or list(TOPOLOGIES):
        rows += ratios(TOPOLOGIES[name], elements, backend, args.modes.split(","), losses, seeds)
    header = ["topology", "mode", "lossless_s"]
    for loss in losses:
        header += [f"x@{loss:g}", f"retx/spur@{loss:g}"]
    report(f"loss recovery ({backend}, {elements} elements, medians of {len(seeds)} seeds)", header, rows)


if __name__ == "__main__":
    main()
