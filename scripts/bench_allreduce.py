#!/usr/bin/env python3
"""End-to-end all-reduce on shaped links: goodput, and the modes' time ratios against theory.

A star of N workers (and the PBox host) on links of 50, 100, 200 and 1000 Mbit/s (--rates), undilated;
each worker all-reduces a tensor sized to take ~1 s in-network at the link rate. Per mode:
completion time (median of --runs), goodput = tensor bits / time / link rate
(in-network's ceiling is the payload share of a frame: 8192/8250 = 99.3% at
the default 2048 elements per packet, 1024/1082 = 94.6% at 256: --packet-elements), and
the ratio to in-network's time next to the theory: PBox ≈ N (its one link
carries every worker's gradient), ring ≈ 2(N-1)/N.
"cores busy" is how many of the machine's cores were busy during the
all-reduce (/proc/stat, so the kernel's veth and shaper work is in it; median
of the runs), "in processes" the part the switch and host processes were
charged with; a row at or above 80% of all cores was CPU-bound, so the
emulation, not the links, set its time. (A row below that can still be held
up by the CPUs: processes that become runnable together wait for each other
on 2 cores; README's Performance section shows this for the ring.) It also
names the highest link rate at which in-network goodput was >= 90%, and the
highest at which every mode was within 10% of theory.

``--unshaped`` also runs each rate's in-network tensor over unshaped links (veth speed, no shaper):
the data plane's own ceiling on this machine, as goodput against the rate (a table of its own).

``--default-run`` measures instead what ``sudo python run_topology.py --mode all`` runs: the default
leaf-spine at the default 1000 Mbit/s, each mode at the factor ``--dilation auto`` gives it
(``innet.api.dilation_of``), and its modes' time ratios against the same theory.
"""

import argparse
import dataclasses
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from innet.backends.mininet.emulation import run_mininet, saturated  # noqa: E402
from innet.planning.timing.dilation import TCLINK_MAX_MBPS  # noqa: E402
from innet.results.check import RunSpec  # noqa: E402
from scripts.report import report  # noqa: E402
from topologies import build  # noqa: E402


def seeded_runs(graph, spec: RunSpec, runs: int, dilation: float = 1.0) -> list:
    """``spec`` run ``runs`` times on Mininet with seeds 0, 1, ...; every run's result must be exact."""
    records = [run_mininet(graph, dataclasses.replace(spec, seed=k), dilation=dilation) for k in range(runs)]
    assert all(r["correct"] for r in records), [r["errors"] for r in records]
    return records


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--rates", default="50,100,200,1000", help="link rates in Mbit/s")
    p.add_argument("--pool-slots", type=int, default=0, help="slots in the switch's pool (default: the program's, 128)")
    p.add_argument("--packet-elements", type=int, default=0,
                   help="gradient values per packet (default: the program's, 2048; over 364 the links get jumbo MTUs)")
    p.add_argument("--unshaped", action="store_true",
                   help="also each rate's in-network tensor over unshaped links: the data plane's own ceiling")
    p.add_argument("--default-run", action="store_true",
                   help="the default run's topology, rate and dilation (run_topology.py --mode all) instead of stars")
    args = p.parse_args()
    if args.default_run:
        return default_run(args.runs)
    n = args.workers
    theory = {"innet": 1.0, "pbox": float(n), "ring": 2 * (n - 1) / n}
    rows, best, all_within = [], 0, 0
    for rate in [int(r) for r in args.rates.split(",")]:
        graph = build("star", workers=n, bw=float(rate))
        elements = rate * 30_000
        times, busy = {}, {}
        for mode in ("innet", "pbox", "ring"):
            spec = RunSpec(mode=mode, elements=elements, pool_slots=args.pool_slots, packet_elements=args.packet_elements)
            runs = seeded_runs(graph, spec, args.runs)
            times[mode] = statistics.median(r["completion_s"] for r in runs)
            busy[mode] = (statistics.median(r["machine_busy_cores"] for r in runs),
                          statistics.median(r["busy_cores"] for r in runs))
        off = {mode: t / times["innet"] / theory[mode] - 1 for mode, t in times.items()}
        goodput = {mode: elements * 32 / t / (rate * 1e6) for mode, t in times.items()}
        for mode, t in times.items():
            rows.append([rate, mode, elements, t, round(goodput[mode], 3), round(t / times["innet"], 2), round(theory[mode], 2),
                         f"{100 * off[mode]:+.0f}%", *busy[mode], "yes" if saturated(busy[mode][0]) else "no"])
        if goodput["innet"] >= 0.9:
            best = max(best, rate)
        if all(abs(o) <= 0.1 for o in off.values()):
            all_within = max(all_within, rate)
    report("all-reduce goodput and mode ratios", ["Mbit/s", "mode", "elements", "time s", "goodput", "x innet",
                                                  "theory", "off by", "cores busy", "in processes", "CPU-bound"], rows,
           extra={"workers": n, "pool_slots": args.pool_slots, "packet_elements": args.packet_elements,
                  "highest_rate_with_90pct_goodput": best,
                  "highest_rate_with_every_mode_within_10pct": all_within})
    print(f"highest link rate with in-network goodput >= 90%: {best or 'none'} Mbit/s")
    print(f"highest link rate with every mode within 10% of theory: {all_within or 'none'} Mbit/s")
    if args.unshaped:
        unshaped(args)


def unshaped(args) -> None:
    """Each rate's in-network tensor on the same star with its links left unshaped (above TCLink's range):
    how fast the data plane itself carries it, as goodput against the rate."""
    rows = []
    for rate in [int(r) for r in args.rates.split(",")]:
        elements = rate * 30_000
        graph = build("star", workers=args.workers, bw=10 * TCLINK_MAX_MBPS)
        spec = RunSpec(mode="innet", elements=elements, pool_slots=args.pool_slots, packet_elements=args.packet_elements)
        runs = seeded_runs(graph, spec, args.runs)
        t = statistics.median(r["completion_s"] for r in runs)
        rows.append([rate, elements, t, round(elements * 32 / t / (rate * 1e6), 3),
                     statistics.median(r["machine_busy_cores"] for r in runs), statistics.median(r["busy_cores"] for r in runs),
                     statistics.median(r["switch_cpu_share"]["s1"] for r in runs)])
    report("all-reduce over unshaped links", ["Mbit/s", "elements", "time s", "goodput", "cores busy", "in processes",
                                              "switch core"], rows,
           extra={"workers": args.workers, "pool_slots": args.pool_slots, "packet_elements": args.packet_elements})


def default_run(runs: int) -> None:
    """``run_topology.py --mode all`` at its defaults, ``runs`` times per mode: the time ratios to in-network's."""
    from innet.api import dilation_of, mode_specs, spec_of
    from innet.planning.configs import pick_workers

    rows, times = [], {}
    for mode in ("innet", "pbox", "ring"):
        given, graph = spec_of(mode=mode)  # the command line's defaults
        spec = mode_specs(given, graph)[0]
        factor = dilation_of(graph, spec)
        records = seeded_runs(graph, spec, runs, factor)
        times[mode] = statistics.median(r["completion_s"] for r in records)
        faithful = sum(r["fidelity"]["verdict"] == "faithful" for r in records)
        rows.append([mode, round(factor), times[mode],
                     ",".join(f"{r['completion_s']:.6f}" for r in records), f"{faithful}/{runs}"])
    n = len(pick_workers(graph, spec.workers))
    theory = {"innet": 1.0, "pbox": float(n), "ring": 2 * (n - 1) / n}
    for row in rows:
        mode = row[0]
        row += [round(times[mode] / times["innet"], 3), theory[mode], f"{100 * (times[mode] / times['innet'] / theory[mode] - 1):+.1f}%"]
    report("the default run's modes against theory", ["mode", "dilation", "time s", "runs s", "faithful",
                                                        "x innet", "theory", "off by"], rows, extra={"workers": n})


if __name__ == "__main__":
    main()
