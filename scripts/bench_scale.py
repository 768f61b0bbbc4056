#!/usr/bin/env python3
"""How far one machine goes: fat-trees on the local backend (time, peak memory) and on Mininet.

Local: each ``run_topology.py --backend local --topo fat-tree --k K --elements E`` (and
``--plan-only`` at ``--plan-only-k``) runs in a fresh process; its wall time and peak
RSS (wait4's ru_maxrss) are the medians of --runs, next to the memory the run estimated
before it started (innet.plan.memory). With ``--baseline DIR`` the same commands also run
from another checkout (e.g. main before a change), alternating, and the ratios are printed.

Mininet (needs root; skipped with --skip-mininet): bring-up and teardown timed on the bare
network (``network``); the run is a full ``run_mininet`` (build, a process per switch and
worker, the all-reduce, checks, teardown), its memory the peak drop in MemAvailable while it
runs (sampled every 20 ms).
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from innet.plan.memory import estimate_bytes  # noqa: E402
from innet.plan.spec import RunSpec  # noqa: E402
from scripts.report import report  # noqa: E402
from topologies import build  # noqa: E402


def available_kib():
    with open("/proc/meminfo", encoding="utf-8") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("MemAvailable"))


def command(k, elements, mode="innet", plan_only=False):
    args = ["--backend", "local", "--topo", "fat-tree", "--k", str(k), "--mode", mode, "--no-plots"]
    return args + (["--plan-only"] if plan_only else ["--elements", str(elements)])


def timed(checkout, args):
    """(wall seconds, peak RSS in MiB) of run_topology.py from ``checkout`` in a fresh process; it must succeed."""
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "run_topology.py", *args, "--out", out], cwd=checkout,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": checkout})
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode() if proc.stderr else ""
    if proc.returncode != 0:
        raise SystemExit(f"run_topology.py {' '.join(args)} (in {checkout}) failed: {err.strip()[-300:]}")
    return wall, usage.ru_maxrss / 1024


def local(args):
    cases = [(int(k), int(e), m, False) for k, e in (c.split(":") for c in args.local.split(",") if c)
             for m in args.modes.split(",")]
    if args.plan_only_k:
        cases.append((args.plan_only_k, 65536, "innet", True))
    rows = []
    for k, elements, mode, plan_only in cases:
        argv = command(k, elements, mode, plan_only)
        mine, base = [], []
        for _ in range(args.runs):
            mine.append(timed(ROOT, argv))
            if args.baseline:
                base.append(timed(args.baseline, argv))
        wall, rss = statistics.median(w for w, _ in mine), statistics.median(r for _, r in mine)
        graph = build("fat-tree", k=k)
        estimate = 0.0 if plan_only else estimate_bytes(graph, RunSpec(elements=elements, mode=mode), "local") / 2**20
        row = [f"k={k}", sum(1 for n in graph if graph.nodes[n]["role"] == "host"), "plan-only" if plan_only else mode,
               "-" if plan_only else elements, wall, rss, estimate]
        if args.baseline:
            row += [statistics.median(w for w, _ in base) / wall, statistics.median(r for _, r in base) / rss]
        rows.append(row)
        print("python3 run_topology.py " + " ".join(argv), flush=True)
    header = ["fat-tree", "hosts", "mode", "elements", "wall s", "peak MiB", "estimate MiB"]
    report("local scale", header + (["baseline/this time", "baseline/this memory"] if args.baseline else []), rows,
           {"runs": args.runs, "baseline": args.baseline})


def mininet(args):
    from innet.backends.mininet import network, run_mininet

    graph = build("fat-tree", k=args.k)
    up, down, mem, total, completion = [], [], [], [], []
    for seed in range(args.runs):
        before = available_kib()
        start = time.perf_counter()
        with network(graph):
            up.append(time.perf_counter() - start)
            start = time.perf_counter()
        down.append(time.perf_counter() - start)
        lowest, running = [available_kib()], [True]

        def sample(lowest=lowest, running=running):
            while running[0]:
                lowest[0] = min(lowest[0], available_kib())
                time.sleep(0.02)

        sampler = threading.Thread(target=sample)
        sampler.start()
        start = time.perf_counter()
        result = run_mininet(graph, RunSpec(elements=100_000, seed=seed))
        total.append(time.perf_counter() - start)
        running[0] = False
        sampler.join()
        mem.append((before - lowest[0]) / 1024)
        assert result["correct"], result["errors"]
        completion.append(result["completion_s"])
    hosts = sum(1 for n in graph if graph.nodes[n].get("role") == "host")
    rows = [[graph.name, graph.number_of_nodes(), hosts, statistics.median(up), statistics.median(down),
             statistics.median(mem), statistics.median(total), statistics.median(completion)]]
    report("emulation scale", ["topology", "nodes", "hosts", "bring-up s", "teardown s", "peak MiB",
                               "full run s", "all-reduce s"], rows)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--k", type=int, default=4, help="Mininet fat-tree k (default 4)")
    p.add_argument("--local", default="16:65536,32:16384", help="local runs, K:ELEMENTS,... (default 16:65536,32:16384)")
    p.add_argument("--modes", default="innet", help="modes of each local run, comma-separated (default innet)")
    p.add_argument("--plan-only-k", type=int, default=32, help="time --plan-only at this k (0: skip; default 32)")
    p.add_argument("--baseline", help="another checkout to run the same local commands from, for ratios")
    p.add_argument("--skip-mininet", action="store_true")
    args = p.parse_args()
    local(args)
    if not args.skip_mininet:
        mininet(args)


if __name__ == "__main__":
    main()
