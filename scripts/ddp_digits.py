#!/usr/bin/env python3
"""Example: PyTorch DDP on the digits, every gradient bucket all-reduced through innet, beside plain DDP (gloo's
all-reduce) from the same seed. Prints each one's test accuracy.

    python scripts/ddp_digits.py --procs 4 --epochs 10
    sudo python scripts/ddp_digits.py --backend mininet --procs 4 --epochs 10

--backend fabric (the default, no root): the ranks are local processes; each bucket is gathered to rank 0 and
all-reduced on the in-process fabric (virtual time). --backend mininet: one rank per host of a Mininet star, each
bucket all-reduced in-network by the worker client on the host's interface, through the Python switch; plain DDP
runs over the same links.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _train(rank: int, world: int, rendezvous: str, args: argparse.Namespace, out: object) -> None:
    import torch
    import torch.distributed as dist

    from innet.integrations.ranks.rank import leave
    from innet.integrations.torch.ddp import FabricState, train_ddp
    from innet.planning.spec import RunSpec
    from topologies import build

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=rendezvous, rank=rank, world_size=world)
    results = {}
    for mode in ("innet", "plain"):
        state = FabricState(build("star", workers=world), RunSpec(packet_elements=1024)) if mode == "innet" else None
        results[mode] = (train_ddp(rank, world, _task(args, world), state), state.virtual_s if state else 0.0)
    if rank == 0:
        out.put(results)  # type: ignore[attr-defined]
    dist.barrier()  # no rank tears gloo down while another still talks to it (that aborted a rank, rarely)
    dist.destroy_process_group()
    leave(0)  # the interpreter's teardown aborted a rank now and then, after everything above had finished


def _task(args: argparse.Namespace, world: int) -> Any:
    from innet.hosts.learning.model import Task

    return Task(epochs=args.epochs, batch=args.batch, lr=args.lr, hidden=args.hidden, seed=args.seed, workers=world)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--procs", type=int, default=4, help="DDP processes, 2 to 4 (default 4)")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch", type=int, default=32, help="global batch (default 32)")
    p.add_argument("--lr", type=float, default=0.5)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backend", choices=("fabric", "mininet"), default="fabric",
                   help="fabric: local processes, the in-process fabric (default); mininet: ranks in Mininet hosts (root)")
    args = p.parse_args()
    if not 2 <= args.procs <= 4 or args.batch % args.procs:
        print(f"error: --procs must be 2 to 4 and divide --batch, got {args.procs} and {args.batch}", file=sys.stderr)
        return 2
    if args.backend == "mininet":
        return _mininet(args)
    import torch.multiprocessing as mp

    from innet.integrations.launch.procs import free_port

    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    port = free_port()  # on loopback, for the ranks to meet at
    mp.start_processes(_train, args=(args.procs, f"tcp://127.0.0.1:{port}", args, out), nprocs=args.procs,
                       start_method="spawn")
    results = out.get()
    (innet, virtual), (plain, _) = results["innet"], results["plain"]
    print(f"innet hook: test accuracy {innet:.4f} ({virtual:.3f} virtual seconds in all-reduces)")
    print(f"plain DDP:  test accuracy {plain:.4f}")
    print(f"difference: {100 * (innet - plain):+.2f} points")
    return 0


def _mininet(args: argparse.Namespace) -> int:
    from innet.api import prepare
    from innet.errors import UserError
    from innet.integrations.ranks.mininet import ddp_mininet

    if os.geteuid() != 0:
        print("error: --backend mininet needs root: run with sudo, or use --backend fabric", file=sys.stderr)
        return 2
    try:
        prepared = prepare("star", workers=args.procs, backend="mininet", packet_elements=1024, calibrate=False)
        out = ddp_mininet(prepared.graph, prepared.runs[0], _task(args, args.procs))
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; everything this run created was removed", file=sys.stderr)
        return 130
    (innet, *_), (plain, *_) = out["innet"].ranks, out["plain"].ranks
    print(f"innet hook: test accuracy {innet.accuracy:.4f} ({innet.seconds:.3f} seconds training, "
          f"{innet.calls} all-reduces through the switch, {innet.retransmissions} retransmissions)")
    print(f"plain DDP:  test accuracy {plain.accuracy:.4f} ({plain.seconds:.3f} seconds training)")
    print(f"difference: {100 * (innet.accuracy - plain.accuracy):+.2f} points")
    return 0


if __name__ == "__main__":
    from innet.cli import Render
    from innet.events import listening

    with listening(Render()):  # the runs' phases and warnings on stderr, as the command line draws them
        sys.exit(main())
