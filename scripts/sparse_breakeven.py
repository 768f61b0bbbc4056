#!/usr/bin/env python3
"""Top-k sparse against dense: bytes on the links and completion time per density, and where sparse
stops paying off. In-process fabric (exact bytes, virtual time), star of 4 workers by default.

    python scripts/sparse_breakeven.py [--mode innet|pbox] [--workers 4] [--elements 262144] [--bw 100]
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from innet.backends.local.run import LocalRun  # noqa: E402
from innet.experiments.report import crossing  # noqa: E402  (sparse pays off while it saves at least 1%)
from innet.results.check import RunSpec  # noqa: E402
from scripts.report import report  # noqa: E402
from topologies import build  # noqa: E402

DENSITIES = (0.001, 0.01, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6)


def measure(args, topk):
    graph = build("star", workers=args.workers, bw=args.bw)
    run = RunSpec(mode=args.mode, program="topk_sparse" if topk else "sum_allreduce", elements=args.elements,
                  iterations=2, topk=topk)
    lr = LocalRun(graph, run)
    result = lr.finish()
    assert result["correct"], result["errors"]
    up = sum(link.bytes for (a, _), link in lr.fabric.links.items() if graph.nodes[a]["role"] == "host")
    return result["completion_s"], up, sum(result["link_bytes"].values()) - up


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=("innet", "pbox"), default="innet")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--elements", type=int, default=262144)
    p.add_argument("--bw", type=float, default=100.0)
    args = p.parse_args()
    time0, up0, down0 = measure(args, 0.0)
    rows, by_bytes, by_time = [], [], []
    for d in DENSITIES:
        t, up, down = measure(args, d)
        ratio = (up + down) / (up0 + down0)
        rows.append([d, up / up0, down / down0, ratio, t / time0])
        by_bytes.append((d, ratio))
        by_time.append((d, t / time0))
    extra = {"mode": args.mode, "workers": args.workers, "elements": args.elements,
             "breakeven_bytes": crossing(by_bytes), "breakeven_time": crossing(by_time)}
    report(f"top-k sparse vs dense ({args.mode}, star of {args.workers}, fabric)",
           ["density", "uplink_B/dense", "downlink_B/dense", "all_B/dense", "time/dense"], rows, extra)
    for what in ("bytes", "time"):
        at = extra[f"breakeven_{what}"]
        print(f"sparse stops paying off ({what}: saves under 1%) at density {at:.3f}" if at is not None
              else f"sparse pays off ({what}) at every density measured")


if __name__ == "__main__":
    main()
