"""A switch's CPU cost per frame by the size of what one read brings: the batch path against the per-packet one.

A ToR of a 2x3 leaf-spine job (the runtime alone, no network) takes clean rounds of
contributions, each worker's window of 64 in a run, cut into reads of N frames; the batch
path (``receive_block``) and the per-packet path (``receive``) each handle the same
stream. Prints CPU µs per frame (median of repeats) and the smallest N at which the
batch path is the cheaper: where ``innet.switch.runtime.SMALL_BLOCK`` should be.

    python3 scripts/bench_blocks.py [--rounds 200] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # topologies/: the checkout's, not installed

from innet.planning.configs import switch_configs  # noqa: E402
from innet.planning.planner import plan_job  # noqa: E402
from innet.switch.loader import load_program  # noqa: E402
from innet.switch.runtime import SMALL_BLOCK, SwitchRuntime  # noqa: E402
from innet.wire.packet import VER, make_packet, pack_frames, parse_block  # noqa: E402
from topologies import build  # noqa: E402

SLOTS = 64  # each worker's window: a run of 64 frames from one port


def arrivals(rounds: int, elements: int = 256) -> tuple[SwitchRuntime, list[tuple[int, list[bytes]]]]:
    """A fresh ToR runtime and its stream: per round, each worker's window of SLOTS contributions in a run."""
    graph = build("leaf-spine", racks=2, hosts_per_rack=3)
    plan = plan_job(graph, [f"h{i}" for i in range(1, 7)], method="tor", slots=SLOTS)
    program = load_program("sum_allreduce")
    cfg = switch_configs(graph, [plan])["t1"]
    job = cfg.jobs[1]
    runs = []
    for rnd in range(rounds):
        for rank in sorted(job.contributors):
            port = job.contributors[rank]
            frames = [make_packet(np.arange(elements, dtype=np.int32), job=1, rank=rank, nworkers=6, slot=slot,
                                  chunk=slot + SLOTS * rnd, flags=VER if rnd % 2 else 0).to_frame(cfg.neighbors[port], cfg.node)
                      for slot in range(SLOTS)]
            runs.append((port, frames))
    return SwitchRuntime(cfg, program), runs


def cost(size: int, batch: bool, rounds: int) -> float:
    """CPU µs per frame with reads of ``size`` frames (a run shorter than that is one read)."""
    runtime, runs = arrivals(rounds)
    reads = [(port, frames[k : k + size]) for port, frames in runs for k in range(0, len(frames), size)]
    if batch:
        reads_parsed = [(port, pack_frames(frames)) for port, frames in reads]
        start = time.process_time()
        for port, (buf, lengths) in reads_parsed:
            runtime.receive_block(port, parse_block(buf, lengths), 0.0)
    else:
        start = time.process_time()
        for port, frames in reads:
            for frame in frames:
                runtime.receive(port, frame, 0.0)
    n = sum(len(frames) for _, frames in reads)
    return (time.process_time() - start) / n * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    print(f"{'frames/read':>11}  {'batch µs/frame':>14}  {'per-packet µs/frame':>19}  {'batch/per-packet':>16}")
    crossover = None
    for size in (1, 2, 3, 4, 5, 6, 8, 16, 64):  # a read within one worker's run
        batch = float(np.median([cost(size, True, args.rounds) for _ in range(args.repeats)]))
        single = float(np.median([cost(size, False, args.rounds) for _ in range(args.repeats)]))
        if crossover is None and batch < single:
            crossover = size
        print(f"{size:>11}  {batch:>14.1f}  {single:>19.1f}  {batch / single:>16.2f}")
    print(f"the batch path is cheaper from {crossover} frames a read; SMALL_BLOCK = {SMALL_BLOCK}")


if __name__ == "__main__":
    main()
