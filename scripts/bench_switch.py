#!/usr/bin/env python3
"""One innet switch against the Linux bridge, same sender, same frames, same run (medians of --runs).

Rows: forward program, and sum_allreduce with 2, 4 and 8 workers, at 64, 256
and 1024 elements per packet, a pool of 512 slots (switchbench.SLOTS: the open-loop
sender keeps more than a pool in every port's queue, and a pool of a read's worth let
one port's read overtake another port's contributions). The sender (one process,
all workers' interfaces in lockstep; by default the frames made in the kernel: scripts/xdpgen.bpf.c run as
BPF_PROG_TEST_RUN's live frames, stamped and redirected into the workers' veths, whose far ends get NAPI (GRO on:
for every target alike) and whose poll, skb and hand-off to CPU 1 (RPS) run on the sender's core; --sender c:
sendmmsg from a loop in C, scripts/blast.c built at run time; --sender python: that loop in Python) runs on CPU 0;
the switch gets CPU 1, all of it: the innet switch's process, and (RPS on the switch's ports) the kernel's receive
path of every frame it takes in, so the bridge's forwarding and the eBPF
program run there too, and the delivery of what the switch sends. So each
column measures one core's worth of switch against the same input, and the
sender's core does only the sending. (--unsteered: the old method, veth's
synchronous delivery left in the sender's softirq on CPU 0, where the bridge
and the eBPF program then share the sender's core and the Python switch's
receive path rides on it free.)

Columns: the sender's own rate into the innet switch; what the bridge forwarded
flat out (the same frames: for sum, the workers' contributions, flooded); innet's lossless rate
(RFC 2544 throughput with a 1% allowance: the highest paced rate at which it
completed >= 99% of what was sent: frames forwarded, or contributions folded
into finished aggregations), in packets and gradient elements per second, and
its ratio to the bridge; what innet completed when the sender ran flat out
(overload), and offered twice its lossless rate, what it completed as a share of that rate (graceful
overload keeps >= 0.9: the switch turns whole chunks away early rather than losing single contributions);
and, at the lossless rate, the packets the switch took in per second of its own
CPU time (its system calls and the kernel's veth delivery of what it sends
included): its rate were it never idle, against BMv2's documented
plain-forwarding rate (~80-100k packets/s; 90k taken, not measured here); and the share
of CPU 1 busy while the sender ran flat out at the bridge and at the Python switch
(/proc/stat, other processes' work included: a node that completed all the sender sent
with CPU 1 short of busy was bounded by the sender); and the frames the sender sent flat out per second of
its own CPU time (all targets' runs: its rate were it never descheduled, beside the switches' per cpu-s).

--receive switch (the default with the xdp sender): every frame handed to CPU 1 first (a cpumap entry whose kthread,
real-time as a NIC queue's softirq, redirects it into its port's veth), so the veths' receive (their poll, any XDP
program, the skb) runs on the switch's core too, for every column alike; --receive sender: on the sender's core
(the method before 2026-11-29's night: there the bridge and the Python switch got their veths' poll free).

--ebpf adds, for the sum rows, the same switch with --data-plane ebpf's programs on its ports (switch.c's XDP half,
which takes a contribution that only folds before the kernel makes an skb of it and sends a root's result to every
child as XDP frames, the hosts' ends' GRO on to take them, then its tc program; --tc-only: the tc program alone): its
lossless rate, what it completed flat out, what the sender pushed flat out in the same run and CPU 1's busy seconds
per second of the send ("core busy": /proc/stat, read around the run's frame counters, which count to GRACE after
the sender's exit, so over 1 where a node works on through a backlog, as the Python switch does; other processes' work
included: when the program completed all the sender sent with that core short of busy, the sender bounds it, not
the switch), the frames it takes in per second of the program's
own run time (the kernel's BPF run-time statistics, on while it runs; the receive path before it and the
delivery of what it sends not included), and its lossless rate over the Python switch's and over the bridge's
forwarding, both from the same set of runs. "per core-s" columns: the bridge's intake flat out and each switch's
completions at its lossless rate, over CPU 1's busy seconds while they were counted (``per_core``), and the eBPF
switch's ratios in that measure: one core's worth of each, even where one sending core could not fill it (quiet
machine only).
"""

import argparse
import os
import shutil
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from innet.backends.mininet.dataplane import cache_dir  # noqa: E402
from scripts.blast import native_sender, xdp_generator  # noqa: E402
from scripts.report import report  # noqa: E402
from scripts.switchbench import measure  # noqa: E402

BMV2_PPS = 90e3  # the software P4 switch's documented plain-forwarding rate (80-100k packets/s): not measured here


def per_core(runs: list[dict]) -> float:
    """The median of a node's frames per second of CPU 1 busy (``core_pps``: the bridge's intake flat out, a
    switch's completions at its lossless rate, each counted with the core's busy seconds to the same instant): what the node
    would carry with that core all its own and busy. Flat out, the Python switch's completions collapse (its ports'
    partial chunks), so its figure is taken where it completes what it is sent. On a quiet machine only: other
    processes' work on CPU 1 counts as the node's."""
    return statistics.median(r.get("core_pps", 0.0) for r in runs) if runs else 0.0


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--seconds", type=float, help="each run's sending time (default 1, --quick 0.5)")
    p.add_argument("--search", type=int, default=5, help="bisection steps for the lossless rate")
    p.add_argument("--quick", action="store_true", help="only forward and sum x4 at 256 elements, runs of 0.5 s")
    p.add_argument("--ebpf", action="store_true", help="also the eBPF switch (--data-plane ebpf) on the sum rows")
    p.add_argument("--unsteered", action="store_true",
                   help="the old method: the switch's receive path in the sender's softirq (CPU 0), not on CPU 1")
    p.add_argument("--sender", choices=("xdp", "c", "python"), default="xdp",
                   help="xdp: the frames made in the kernel (xdpgen.bpf.c, live frames); c: blast.c's sendmmsg (the "
                        "method before 2026-11-29); python: its loop in Python (before 2026-11-28's evening)")
    p.add_argument("--receive", choices=("switch", "sender"), default="switch",
                   help="the xdp sender's frames received (the veths' poll) on the switch's core or the sender's")
    p.add_argument("--tc-only", action="store_true", help="--ebpf's switch without its XDP half")
    p.add_argument("--python-sender", action="store_const", const="python", dest="sender", help="--sender python")
    args = p.parse_args()
    if args.sender == "xdp" and not shutil.which("clang"):
        print("bench_switch: no clang to build the kernel-made sender (xdpgen.bpf.c): blast.c sends (--sender c)")
        args.sender = "c"
    native = "" if args.sender == "python" else native_sender(cache_dir())
    xdp = xdp_generator(cache_dir()) if args.sender == "xdp" else ""
    cases = [("forward", 1, e) for e in (64, 256, 1024)] + [("sum", w, e) for w in (2, 4, 8) for e in (64, 256, 1024)]
    if args.quick:
        cases = [("forward", 1, 256), ("sum", 4, 256)]
    if args.seconds is None:
        args.seconds = 0.5 if args.quick else 1.0
    rows = []
    ebpf_target, hop = "ebpf" if args.tc_only else "xdp", args.sender == "xdp" and args.receive == "switch"
    for kind, workers, elements in cases:
        targets = ["bridge", "innet", *([ebpf_target] if args.ebpf and kind == "sum" else [])]
        runs: dict[str, list[dict]] = {target: [] for target in targets}
        for _ in range(args.runs):  # interleaved: a busy machine's load weighs on all three alike
            for target in targets:
                runs[target].append(measure(kind, workers, elements, target, args.seconds,
                                            args.search if target != "bridge" else 0, not args.unsteered, native, xdp,
                                            hop=hop))
        bridge, innet, ebpf = runs["bridge"], runs["innet"], runs.get(ebpf_target, [])
        bridge_pps = statistics.median(r["in_pps"] for r in bridge)
        lossless = statistics.median(r["lossless_pps"] for r in innet)
        cpu_pps = statistics.median(r.get("cpu_pps", 0.0) for r in innet)
        rows.append([kind if kind == "forward" else f"sum x{workers}", elements,
                     statistics.median(r["sender_pps"] for r in innet), bridge_pps, lossless, lossless * elements,
                     round(lossless / bridge_pps, 3), statistics.median(r["done_pps"] for r in innet),
                     round(statistics.median(r["overload2_pps"] / r["lossless_pps"] if r["lossless_pps"] else 0.0
                                             for r in innet), 3),
                     cpu_pps, round(cpu_pps / BMV2_PPS, 1),
                     *(round(statistics.median(r["core_busy"] for r in runs[t]), 3) for t in ("bridge", "innet")),
                     statistics.median(r["sender_cpu_pps"] for t in targets for r in runs[t]),
                     per_core(bridge), per_core(innet)])
        if args.ebpf:
            rows[-1] += [statistics.median(r[k] for r in ebpf) if ebpf else 0.0
                         for k in ("lossless_pps", "done_pps", "sender_pps", "core_busy", "cpu_pps")]
            ebpf_pps = rows[-1][-5]
            rows[-1] += [round(ebpf_pps / lossless, 2) if lossless and ebpf else 0.0,
                         round(ebpf_pps / bridge_pps, 2) if ebpf else 0.0]
            core = [per_core(bridge), per_core(innet), per_core(ebpf)]
            rows[-1] += [core[2], round(core[2] / core[1], 2) if core[1] else 0.0, round(core[2] / core[0], 2) if core[0] else 0.0]
    report("switch vs Linux bridge", ["program", "elements/pkt", "sender pps", "bridge pps", "innet pps",
                                      "innet elements/s", "innet/bridge", "innet pps overloaded", "at 2x / lossless",
                                      "pps per cpu-s", "per cpu-s / BMv2", "bridge core busy", "innet core busy",
                                      "sender pps per cpu-s", "bridge pps per core-s", "innet pps per core-s",
                                      *(["ebpf pps", "ebpf pps flat out", "ebpf sender pps", "ebpf core busy", "ebpf pps per cpu-s",
                                        "ebpf/innet", "ebpf/bridge", "ebpf pps per core-s", "ebpf/innet per core-s",
                                        "ebpf/bridge per core-s"] if args.ebpf else [])],
           rows, {"steered": not args.unsteered, "sender": args.sender, "receive": args.receive if args.sender == "xdp" else "sender",
                  "ebpf": ebpf_target if args.ebpf else ""})

if __name__ == "__main__":
    main()
