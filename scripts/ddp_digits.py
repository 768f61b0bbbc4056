#!/usr/bin/env python3
"""Example: PyTorch DDP on the digits, every gradient bucket all-reduced through innet (the fabric), beside
plain DDP from the same seed. Prints each one's test accuracy.

    python scripts/ddp_digits.py --procs 4 --epochs 10
"""

from __future__ import annotations

import argparse
import os
import socket
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _train(rank: int, world: int, rendezvous: str, args: argparse.Namespace, out: object) -> None:
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from innet.backends.ddp import FabricState, innet_hook
    from innet.hosts.model import load_data
    from innet.plan.spec import RunSpec
    from topologies import build

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=rendezvous, rank=rank, world_size=world)
    data = load_data("digits", args.seed, world)
    x, y = (torch.from_numpy(a) for a in data.shard(rank))
    per_rank = args.batch // world
    steps = len(data.y_train) // args.batch
    results = {}
    for mode in ("innet", "plain"):
        torch.manual_seed(args.seed)
        net = torch.nn.Sequential(torch.nn.Linear(data.features, args.hidden), torch.nn.ReLU(),
                                  torch.nn.Linear(args.hidden, data.classes))
        model = DistributedDataParallel(net)
        state = None
        if mode == "innet":
            state = FabricState(build("star", workers=world), RunSpec(packet_elements=1024))
            model.register_comm_hook(state, innet_hook)
        opt = torch.optim.SGD(model.parameters(), lr=args.lr)
        for epoch in range(args.epochs):
            order = torch.from_numpy(np.random.default_rng([args.seed, rank, epoch]).permutation(len(y)))
            for step in range(steps):
                take = order[step * per_rank : (step + 1) * per_rank]
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(x[take]), y[take]).backward()
                opt.step()
        with torch.no_grad():
            predicted = net(torch.from_numpy(data.x_test)).argmax(dim=1).numpy()
        results[mode] = (float(np.mean(predicted == data.y_test)), state.virtual_s if state else 0.0)
        del model  # its reducer's threads end before the process group does
    if rank == 0:
        out.put(results)  # type: ignore[attr-defined]
    dist.barrier()  # no rank tears gloo down while another still talks to it (that aborted a rank, rarely)
    dist.destroy_process_group()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--procs", type=int, default=4, help="DDP processes, 2 to 4 (default 4)")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch", type=int, default=32, help="global batch (default 32)")
    p.add_argument("--lr", type=float, default=0.5)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if not 2 <= args.procs <= 4 or args.batch % args.procs:
        print(f"error: --procs must be 2 to 4 and divide --batch, got {args.procs} and {args.batch}", file=sys.stderr)
        return 2
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    with socket.socket() as probe:  # a free port on loopback for the ranks to meet at
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    mp.start_processes(_train, args=(args.procs, f"tcp://127.0.0.1:{port}", args, out), nprocs=args.procs,
                       start_method="spawn")
    results = out.get()
    (innet, virtual), (plain, _) = results["innet"], results["plain"]
    print(f"innet hook: test accuracy {innet:.4f} ({virtual:.3f} virtual seconds in all-reduces)")
    print(f"plain DDP:  test accuracy {plain:.4f}")
    print(f"difference: {100 * (innet - plain):+.2f} points")
    return 0


if __name__ == "__main__":
    sys.exit(main())
