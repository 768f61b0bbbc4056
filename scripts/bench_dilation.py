#!/usr/bin/env python3
"""Time dilation against virtual time: Mininet's completion time over the local backend's, per mode.

For each case (a topology at a host-link rate) and mode, the same run (seeds 0..runs-1) on the local
backend (virtual time) and on Mininet dilated as ``--dilation auto`` would (factor = host-link rate over
the calibrated faithful rate, innet.backends.mininet.calibration); the table gives the factor, both medians,
their ratio (1.0 = Mininet reproduces virtual time) and how many Mininet runs were judged faithful.
The cases: a star of 4 at the seeds' 100 Gbit/s, and the default run (leaf-spine, 1000 Mbit/s).

    sudo python scripts/bench_dilation.py                 # both cases, every mode, medians of 3
    sudo python scripts/bench_dilation.py --cases star:100000 --modes innet --runs 1
"""

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from innet.backends.local.run import run_local  # noqa: E402
from innet.backends.mininet.calibration import calibration  # noqa: E402
from innet.backends.mininet.emulation import run_mininet  # noqa: E402
from innet.planning.spec import RunSpec, program_of  # noqa: E402
from innet.planning.timing.dilation import LOCAL_MIN_RTO, MININET_MIN_RTO  # noqa: E402
from innet.schemes.modes import auto_dilation, plan_run  # noqa: E402
from scripts.report import report  # noqa: E402
from topologies import build  # noqa: E402

STUCK_S = 60.0  # real seconds without progress before a run gives up (--timeout is virtual: this over the factor)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default="star:100000,leaf-spine:1000", help="TOPOLOGY:MBITS,... (default: %(default)s)")
    p.add_argument("--modes", default="innet,pbox,ring")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--dilation", type=float, default=0.0, help="this factor instead of auto's")
    args = p.parse_args()
    cal = calibration()
    faithful = cal.faithful_mbps
    rows = []
    for case in args.cases.split(","):
        topo, _, bw = case.partition(":")
        graph = build(topo, workers=4, bw=float(bw))
        for mode in args.modes.split(","):
            spec = RunSpec(mode=mode)
            factor = args.dilation or auto_dilation(graph, spec, plan_run(graph, spec, program_of(spec)), faithful,
                                                    cal.hop_s)
            local = [run_local(graph, RunSpec(mode=mode, seed=k, min_rto=LOCAL_MIN_RTO)) for k in range(args.runs)]
            real = [run_mininet(graph, RunSpec(mode=mode, seed=k, min_rto=MININET_MIN_RTO, timeout=STUCK_S / factor),
                                dilation=factor) for k in range(args.runs)]
            assert all(r.correct for r in local + real), [r.errors for r in local + real]
            t_local = statistics.median(r.completion_s for r in local)
            t_real = statistics.median(r.completion_s for r in real)
            faithful_runs = sum(r["fidelity"]["verdict"] == "faithful" for r in real)
            rows.append([topo, float(bw), mode, round(factor, 1), t_local, t_real, round(t_real / t_local, 3),
                         f"{faithful_runs}/{len(real)}"])
    report("time dilation: Mininet against virtual time", ["topology", "host Mbit/s", "mode", "dilation", "local s",
                                                           "mininet s", "mininet/local", "faithful"], rows,
           extra={"faithful_mbps": faithful, "runs": args.runs})
    print(f"faithful rate (calibration): {faithful:g} Mbit/s")


if __name__ == "__main__":
    main()
