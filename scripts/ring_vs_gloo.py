#!/usr/bin/env python3
"""innet's ring all-reduce against torch.distributed's gloo on the same Mininet links (#21's real-library baseline).

    sudo python scripts/ring_vs_gloo.py --bw 50 200 --repeats 3

For each link rate: ``run_topology.py --backend mininet --topo star --workers 4 --elements N --mode M --bw B`` for
M in ring (and innet), and the same with ``--backend gloo`` in place of the mode, alternating, ``--repeats`` times;
prints each mode's median completion time, the ring's theoretical time (2(N-1)/N of the tensor over one host link),
and the medians' ratio ring / gloo (the target is at most 1.1). Run it alone: it measures wall-clock time on a shared CPU.

``--loss L`` loses L of the frames on every link direction, in every mode: innet's ports inject it, gloo's TCP meets
it in the kernel (a random drop on the same TCLinks). Given several rates, each mode's median at every other rate is also
given over its median at the first:

    sudo python scripts/ring_vs_gloo.py --bw 200 --elements 262144 --modes gloo --loss 0 0.001 0.01 0.05 0.2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def measure(mode: str, bw: float, elements: int, workers: int, packet_elements: int = 0, dilation: str = "auto",
            loss: float = 0.0) -> float:
    """One run's completion time (seconds, on the requested timeline), from its results JSON. ``mode`` gloo: the
    gloo backend (undilated, its own packets: TCP's)."""
    with tempfile.TemporaryDirectory() as out:
        innets = ["--backend", "mininet", "--mode", mode, "--dilation", dilation,
                  *(["--packet-elements", str(packet_elements)] if packet_elements else [])]
        argv = [sys.executable, os.path.join(ROOT, "run_topology.py"), *(["--backend", "gloo"] if mode == "gloo" else innets),
                "--topo", "star", "--workers", str(workers), "--elements", str(elements), "--bw", f"{bw:g}",
                "--out", out, "--no-plots", *(["--loss", f"{loss:g}"] if loss else [])]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise SystemExit(f"error: {' '.join(argv[1:])} failed: {done.stderr.strip().splitlines()[-1:]}")
        with open(os.path.join(out, "results.json"), encoding="utf-8") as fh:
            (run,) = json.load(fh)["runs"]
    assert run["correct"], run["errors"]
    return float(run["completion_s"])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bw", type=float, nargs="+", default=[50.0, 200.0], help="link rates, Mbit/s (default 50 200)")
    p.add_argument("--elements", type=int, default=1 << 20, help="float32 elements (default 1048576)")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--modes", nargs="+", default=["ring", "gloo", "innet"])
    p.add_argument("--packet-elements", type=int, default=0, help="innet's packet size (gloo's TCP ignores it; default: innet's)")
    p.add_argument("--dilation", default="auto", help="innet's modes' --dilation (auto, off or a factor; gloo's TCP "
                   "always runs on undilated links, where the kernel keeps up)")
    p.add_argument("--loss", type=float, nargs="+", default=[0.0], help="loss on every link direction (default 0); "
                   "with several, the first sets the table and each other's median is given over the first's")
    args = p.parse_args()
    size = f", {args.packet_elements}-element packets" if args.packet_elements else ""
    print(f"star of {args.workers}, {args.elements} float32, medians of {args.repeats}{size}, innet's --dilation {args.dilation}"
          + (f", {args.loss[0]:g} loss on every link direction" if args.loss[0] else ""))
    print("bw_mbps  " + "  ".join(f"{m + '_s':>8}" for m in args.modes) + "  ring_theory_s  ring/gloo  runs")
    for bw in args.bw:
        times: dict[str, list[float]] = {m: [] for m in args.modes}
        lossy: dict[tuple[str, float], list[float]] = {(m, p): [] for m in args.modes for p in args.loss[1:]}
        for _ in range(args.repeats):
            for mode in args.modes:
                times[mode].append(measure(mode, bw, args.elements, args.workers, args.packet_elements, args.dilation,
                                           args.loss[0]))
                for p in args.loss[1:]:
                    try:
                        lossy[mode, p].append(measure(mode, bw, args.elements, args.workers, args.packet_elements,
                                                      args.dilation, p))
                    except SystemExit as exc:  # a lossy run that failed (gloo's time-out) is counted, not fatal
                        print(f"{mode} at loss {p:g}: {exc}", file=sys.stderr)
                        lossy[mode, p].append(float("inf"))
        med = {m: statistics.median(t) for m, t in times.items()}
        for p in args.loss[1:]:  # each mode's time under loss over its time at the first rate given
            print(f"{bw:7g}  loss {p:g} / loss {args.loss[0]:g}: " + "  ".join(
                f"{m} {statistics.median(lossy[m, p]) / med[m]:.2f}x ({','.join(f'{x:.3f}' for x in lossy[m, p])})"
                for m in args.modes))
        theory = 2 * (args.workers - 1) / args.workers * 4 * args.elements * 8 / (bw * 1e6)
        ratio = med["ring"] / med["gloo"] if "ring" in med and "gloo" in med else float("nan")  # nan: not both measured
        runs = "; ".join(f"{m} " + ",".join(f"{x:.3f}" for x in t) for m, t in times.items())
        print(f"{bw:7g}  " + "  ".join(f"{med[m]:8.3f}" for m in args.modes) + f"  {theory:13.3f}  {ratio:9.2f}  {runs}")
    return 0


if __name__ == "__main__":
    from innet.cli import Render
    from innet.events import listening

    with listening(Render()):  # the runs' phases and warnings on stderr, as the command line draws them
        sys.exit(main())
