#!/usr/bin/env python3
"""How far one machine goes: fat-trees on the local backend (time, peak memory) and on Mininet.

Local: each ``run_topology.py --backend local --topo fat-tree --k K --elements E`` (and
``--plan-only`` at ``--plan-only-k``) runs in a fresh process; its wall time and peak
RSS (wait4's ru_maxrss) are the medians of --runs, next to the memory the run estimated
before it started (innet.planning.memory). With ``--baseline DIR`` the same commands also run
from another checkout (e.g. main before a change), alternating, and the ratios are printed.

Mininet (needs root; skipped with --skip-mininet): each ``run_topology.py --topo fat-tree --k K
--mode M [--node-group G]`` in a fresh process (every mode of --mininet-modes, every value of
--node-group): its bring-up (until its all-reduce starts), whole run, all-reduce time, its memory
(the peak drop in MemAvailable while it runs, sampled every 20 ms) and what it left behind (its
recorded processes still alive, its interfaces, state file and run directory: 0 when clean);
with --bare also the bare network's bring-up, teardown and memory (``network``, nothing started).
"""

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from innet.backends.mininet.cleanup import STATE_DIR, start_time  # noqa: E402
from innet.planning.memory import estimate_bytes  # noqa: E402
from innet.planning.spec import RunSpec  # noqa: E402
from scripts.report import report  # noqa: E402
from topologies import build  # noqa: E402


def available_kib():
    with open("/proc/meminfo", encoding="utf-8") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("MemAvailable"))


def command(k, elements, mode="innet", plan_only=False):
    args = ["--backend", "local", "--topo", "fat-tree", "--k", str(k), "--mode", mode]
    return args + (["--plan-only"] if plan_only else ["--elements", str(elements), "--no-plots"])


def timed(checkout, args):
    """(wall seconds, peak RSS in MiB) of run_topology.py from ``checkout`` in a fresh process; it must succeed."""
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        outs = [] if "--plan-only" in args else ["--out", out]  # a plan writes nothing
        proc = subprocess.Popen([sys.executable, "run_topology.py", *args, *outs], cwd=checkout,
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


def _sampled(run):
    """(what ``run()`` returned, the peak drop in MemAvailable in MiB while it ran: sampled every 20 ms)."""
    before = available_kib()
    lowest, running = [before], [True]

    def sample():
        while running[0]:
            lowest[0] = min(lowest[0], available_kib())
            time.sleep(0.02)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        result = run()
    finally:
        running[0] = False
        sampler.join()
    return result, (before - lowest[0]) / 1024


def _state_of(pid):
    """The state file (innet.backends.mininet.cleanup) of the run whose runner is ``pid``, or None."""
    for path in glob.glob(os.path.join(STATE_DIR, "*.json")):
        try:
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, ValueError):
            continue
        if data["runner"][0] == pid:
            return data
    return None


def left_behind(state, intfs):
    """What a finished run left: its recorded processes still alive, its interfaces, its state file and run dir."""
    alive = sum(start_time(pid) == started for pid, started in state["pids"].values()) if state else 0
    links = sum(os.path.exists(f"/sys/class/net/{name}") for name in intfs)
    files = int(bool(state) and (os.path.exists(state["dir"]) or _state_of(state["runner"][0]) is not None))
    return alive + links + files


def rss_mib(pids):
    """Resident MiB of the live processes ``pids`` (VmRSS: shared pages counted in each)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status", encoding="ascii") as fh:
                total += next((int(line.split()[1]) for line in fh if line.startswith("VmRSS:")), 0)
        except OSError:
            pass
    return total / 1024


# a run in a fresh process, its events (innet.events) one JSON line each on stdout: what the bench reads, never stderr
RUNNER = """
import json, sys
import innet

options = json.loads(sys.argv[1])
say = lambda e: print(json.dumps({"kind": e.kind, "message": e.message}), flush=True)
innet.run(on_event=say, **options)
"""


def cli_run(k, mode, node_group, elements):
    """One ``innet.run(topo="fat-tree", k=K, mode=MODE)`` in a fresh process: (bring-up s: until its all-reduce
    starts, whole run s, all-reduce s, what it left behind, its state file's processes, their and the runner's
    resident MiB then). The run's phases come as events (``on_event``), one JSON line each."""
    options = {"topo": "fat-tree", "k": k, "mode": mode, "plots": False, "backend": "mininet"}
    options.update({"node_group": node_group} if node_group else {})
    options.update({"elements": elements} if elements else {})
    with tempfile.TemporaryDirectory() as out:
        options["out"] = os.path.join(out, "run")
        start = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-c", RUNNER, json.dumps(options)], cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=ROOT))
        up, state, rss = None, None, 0.0
        building = False  # a calibration run (innet.backends.mininet.calibration) may come first: its phases are not this run's
        for line in proc.stdout:
            event = json.loads(line)
            if event["kind"] != "phase":
                continue
            building = building or event["message"].startswith(f"building fat-tree-k{k}:")
            if building and event["message"].startswith("all-reduce:") and up is None:
                up, state = time.perf_counter() - start, _state_of(proc.pid)
                rss = rss_mib([proc.pid, *(pid for pid, _ in (state or {"pids": {}})["pids"].values())])
        err = proc.stderr.read()
        proc.wait()
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            raise SystemExit(f"fat-tree k={k} --mode {mode} failed: {err.strip().splitlines()[-1:] if err else proc.returncode}")
        with open(os.path.join(options["out"], "results.json"), encoding="utf-8") as fh:
            runs = json.load(fh)["runs"]
    assert all(r["correct"] for r in runs), [r["errors"] for r in runs]
    graph = build("fat-tree", k=k)
    intfs = [f"{n}-eth{p}" for n in graph for p in range(graph.degree(n))]
    return up, wall, runs[0]["completion_s"], left_behind(state, intfs), len(state["pids"]) if state else 0, rss


def mininet(args):
    from innet.backends.mininet.emulation import network

    graph = build("fat-tree", k=args.k)
    hosts = sum(1 for n in graph if graph.nodes[n].get("role") == "host")
    up, down, bare = [], [], []
    for _ in range(args.runs if args.bare else 0):
        def bring_up():
            start = time.perf_counter()
            with network(graph):
                up.append(time.perf_counter() - start)
                start = time.perf_counter()
            down.append(time.perf_counter() - start)
        bare.append(_sampled(bring_up)[1])
    if bare:
        report("bare network", ["topology", "nodes", "hosts", "bring-up s", "teardown s", "peak MiB"],
               [[graph.name, graph.number_of_nodes(), hosts, statistics.median(up), statistics.median(down),
                 statistics.median(bare)]], {"runs": args.runs, "load": os.getloadavg()[0]})
    rows = []
    for mode in args.mininet_modes.split(","):
        for group in args.node_group.split(","):
            got = [_sampled(lambda m=mode, g=group: cli_run(args.k, m, g, args.elements)) for _ in range(args.runs)]
            med = [statistics.median(g[0][i] for g in got) for i in range(3)]
            rows.append([graph.name, mode, group or "auto", *med, statistics.median(m for _, m in got),
                         max(g[0][3] for g in got), statistics.median(g[0][4] for g in got),
                         statistics.median(g[0][5] for g in got)])
            print(f"python3 run_topology.py --topo fat-tree --k {args.k} --mode {mode}"
                  + (f" --node-group {group}" if group else "") + (f" --elements {args.elements}" if args.elements else ""),
                  flush=True)
    report("emulation scale", ["topology", "mode", "node group", "bring-up s", "full run s", "all-reduce s",
                               "peak MiB", "left behind", "processes", "their RSS MiB"], rows,
           {"runs": args.runs, "load": os.getloadavg()[0]})


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--k", type=int, default=4, help="Mininet fat-tree k (default 4)")
    p.add_argument("--local", default="16:65536,32:16384", help="local runs, K:ELEMENTS,... (default 16:65536,32:16384)")
    p.add_argument("--modes", default="innet", help="modes of each local run, comma-separated (default innet)")
    p.add_argument("--plan-only-k", type=int, default=32, help="time --plan-only at this k (0: skip; default 32)")
    p.add_argument("--baseline", help="another checkout to run the same local commands from, for ratios")
    p.add_argument("--skip-mininet", action="store_true")
    p.add_argument("--skip-local", action="store_true")
    p.add_argument("--mininet-modes", default="innet", help="modes of the Mininet runs, comma-separated (default innet)")
    p.add_argument("--node-group", default="", help="--node-group values to run Mininet with, comma-separated "
                   "(default: none given, i.e. auto)")
    p.add_argument("--elements", type=int, default=0, help="--elements of the Mininet runs (default: run_topology's)")
    p.add_argument("--bare", action="store_true", help="also time the bare Mininet network's bring-up and teardown")
    args = p.parse_args()
    if not args.skip_local:
        local(args)
    if not args.skip_mininet:
        mininet(args)


if __name__ == "__main__":
    main()
