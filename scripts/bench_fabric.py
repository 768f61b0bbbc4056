#!/usr/bin/env python3
"""How far the in-process fabric reaches: simulated packets per wall-clock second (medians of 3)."""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from innet.backends.local.run import LocalRun  # noqa: E402
from innet.results.check import RunSpec  # noqa: E402
from scripts.report import median_of, report  # noqa: E402
from topologies import build  # noqa: E402


def measure(topo, params, elements, mode="innet", runs=3):
    def once():
        lr = LocalRun(build(topo, **params), RunSpec(mode=mode, elements=elements))
        start = time.perf_counter()
        result = lr.finish()
        assert result["correct"]
        once.packets = sum(link.packets for link in lr.fabric.links.values())
        return time.perf_counter() - start

    wall, _ = median_of(runs, once)
    return wall, once.packets


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true", help="a twentieth of the elements, one run each (for tests)")
    args = p.parse_args()
    rows = []
    cases = [("star", {"workers": 8}, 1_000_000, "innet"), ("leaf-spine", {"racks": 4, "hosts_per_rack": 4}, 500_000, "innet"),
             ("fat-tree", {"k": 4}, 200_000, "innet"), ("leaf-spine", {"racks": 4, "hosts_per_rack": 4}, 500_000, "pbox"),
             ("leaf-spine", {"racks": 4, "hosts_per_rack": 4}, 500_000, "ring")]
    for topo, params, elements, mode in cases:
        elements = elements // 20 if args.quick else elements
        wall, packets = measure(topo, params, elements, mode, runs=1 if args.quick else 3)
        rate = packets / wall
        rows.append([f"{topo} {params}", mode, elements, packets, wall, rate, int(rate * 60 / max(packets, 1) * elements)])
    report("fabric reach", ["topology", "mode", "elements/worker", "link packets", "wall_s (median of 3)",
                            "packets/s", "elements/worker in 60 s"], rows)


if __name__ == "__main__":
    main()
