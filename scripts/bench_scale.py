#!/usr/bin/env python3
"""What a fat-tree k=4 (16 hosts, 20 switches) costs on this machine: bring-up, run, teardown, memory.

Bring-up and teardown are timed on the bare network (``innet.emulation.network``);
the run is a full ``run_mininet`` (build, 20 switch processes, 16 workers, the
all-reduce, checks, teardown), and its memory is the peak drop in MemAvailable
while it runs (sampled every 20 ms). Medians of --runs.
"""

import argparse
import os
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from innet.backends.mininet import network, run_mininet  # noqa: E402
from innet.results.check import RunSpec  # noqa: E402
from scripts.report import report  # noqa: E402
from topologies import build  # noqa: E402


def available_kib():
    with open("/proc/meminfo", encoding="utf-8") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("MemAvailable"))


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--k", type=int, default=4)
    args = p.parse_args()
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


if __name__ == "__main__":
    main()
