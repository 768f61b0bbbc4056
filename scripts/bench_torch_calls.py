#!/usr/bin/env python3
"""Many small torch.distributed calls: the backend "innet" on the local fabric against gloo, back to back.

    python scripts/bench_torch_calls.py                     # 4,000 async all_reduces of one float, 4 ranks, 3 repeats
    python scripts/bench_torch_calls.py --wait each --calls 500   # each call waited for before the next

Each repeat runs this file as every rank twice: under torch's own launcher on gloo (``python -m
torch.distributed.run``), then under ``innet launch --backend local --topo star`` (the backend "innet"); the two
alternate, so a load on the machine falls on both. A rank makes its ``--calls`` one-float tensors (rank r's i-th
is (r + 1)(i mod 5 + 1): the values differ, their magnitudes too, and every sum is exact in float32), meets the
others at a barrier, then times issuing every call (``async_op=True``) and waiting for them all (or, with ``--wait
each``, each before the next). Rank 0 prints the seconds and a digest of every result; the digests of innet and
gloo must be the same (the script stops if they are not). It prints each run's seconds, the medians of the
repeats and their ratio innet / gloo (issue 48's target: at most 1.5). Only the calls are timed, not the ranks'
start (torch's import) nor their end. Run it alone: it measures wall-clock time on a shared CPU.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAID = re.compile(r"(\w+): (\d+) calls, (\d+) ranks: ([\d.]+) s, results ([0-9a-f]+)")


def rank_main(calls: int, each: bool) -> None:
    """One rank's part (run by the launchers: RANK is set): the timed calls, rank 0's line."""
    import torch
    import torch.distributed as dist

    dist.init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    tensors = [torch.full((1,), float((rank + 1) * (i % 5 + 1))) for i in range(calls)]
    dist.barrier()
    started = time.perf_counter()
    if each:
        for t in tensors:
            dist.all_reduce(t)
    else:
        works = [dist.all_reduce(t, async_op=True) for t in tensors]
        for work in works:
            work.wait()
    took = time.perf_counter() - started
    digest = hashlib.sha256(torch.cat(tensors).numpy().tobytes()).hexdigest()[:16]
    if rank == 0:
        backend = dist.get_backend_config().split(":")[-1]
        print(f"{backend}: {calls} calls, {world} ranks: {took:.3f} s, results {digest}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # no interpreter teardown: gloo's abort (tests/torchrun.py)


def measure(backend: str, calls: int, ranks: int, each: bool) -> tuple[float, str]:
    """One run's seconds and results digest, as its rank 0 said."""
    body = [os.path.abspath(__file__), "--calls", str(calls), *(["--wait", "each"] if each else [])]
    if backend == "gloo":
        argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks), "--standalone", *body]
    else:
        argv = [sys.executable, "-m", "innet", "launch", "--backend", "local", "--topo", "star", "--workers", str(ranks),
                "--", sys.executable, *body]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env, timeout=1800)
    found = SAID.search(done.stdout)
    if found is None:
        raise SystemExit(f"error: the {backend} run failed (exit {done.returncode}): "
                         f"{(done.stderr.strip().splitlines() or ['no message'])[-1]}")
    return float(found.group(4)), found.group(5)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=4000, help="all_reduces of one float per run (default 4000)")
    p.add_argument("--ranks", type=int, default=4, help="ranks (default 4)")
    p.add_argument("--repeats", type=int, default=3, help="runs of each backend (default 3)")
    p.add_argument("--wait", choices=("all", "each"), default="all",
                   help="all: issue every call, then wait for them (default); each: wait for each call before the next")
    args = p.parse_args()
    if os.environ.get("RANK") is not None:
        rank_main(args.calls, args.wait == "each")
        return 0
    if args.calls < 1 or args.ranks < 2 or args.repeats < 1:
        raise SystemExit("error: --calls and --repeats must be at least 1, --ranks at least 2")
    times: dict[str, list[float]] = {"gloo": [], "innet": []}
    digests: set[str] = set()
    print(f"{args.calls} all_reduces of one float ({'each waited for' if args.wait == 'each' else 'async'}), "
          f"{args.ranks} ranks")
    for repeat in range(1, args.repeats + 1):
        for backend in ("gloo", "innet"):
            seconds, digest = measure(backend, args.calls, args.ranks, args.wait == "each")
            times[backend].append(seconds)
            digests.add(digest)
            print(f"  run {repeat}: {backend:5} {seconds:8.3f} s  results {digest}", flush=True)
        if len(digests) != 1:
            raise SystemExit(f"error: innet's results differ from gloo's (digests {', '.join(sorted(digests))})")
    gloo, innet = statistics.median(times["gloo"]), statistics.median(times["innet"])
    print(f"median of {args.repeats}: gloo {gloo:.3f} s, innet {innet:.3f} s, innet / gloo {innet / gloo:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
