#!/usr/bin/env python3
"""One innet switch against the Linux bridge, same sender, same frames, same run (medians of 3).

Rows: forward program, and sum_allreduce with 2, 4 and 8 workers, at 64, 256
and 1024 elements per packet. Columns: the sender's own rate, what the bridge
forwarded, what the innet switch took in and sent out, and innet / bridge.
"""

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from innet.bench import report  # noqa: E402
from innet.benchswitch import measure  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--quick", action="store_true", help="only forward and sum x4 at 256 elements")
    args = p.parse_args()
    cases = [("forward", 1, e) for e in (64, 256, 1024)] + [("sum", w, e) for w in (2, 4, 8) for e in (64, 256, 1024)]
    if args.quick:
        cases = [("forward", 1, 256), ("sum", 4, 256)]
    rows = []
    for kind, workers, elements in cases:
        bridge = [measure(kind, workers, elements, "bridge", args.seconds) for _ in range(args.runs)]
        innet = [measure(kind, workers, elements, "innet", args.seconds) for _ in range(args.runs)]
        bridge_pps = statistics.median(r["in_pps"] for r in bridge)
        # what the switch completed: forwarded packets, or contributions folded into finished aggregations
        done = [r["out_pps"] if kind == "forward" else r["aggregations_per_s"] * workers for r in innet]
        innet_pps = statistics.median(done)
        rows.append([kind if kind == "forward" else f"sum x{workers}", elements,
                     statistics.median(r["sender_pps"] for r in innet), bridge_pps, innet_pps,
                     innet_pps * elements, innet_pps / bridge_pps])
    report("switch vs Linux bridge", ["program", "elements/pkt", "sender pps", "bridge pps", "innet pps",
                                      "innet elements/s", "innet/bridge"], rows)


if __name__ == "__main__":
    main()
