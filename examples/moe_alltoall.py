#!/usr/bin/env python3
"""A mixture-of-experts layer's all-to-all, one expert per rank: an unmodified torch.distributed script.

    torchrun --nproc-per-node 4 examples/moe_alltoall.py                                    # gloo
    innet launch --backend local --topo star --workers 4 -- python examples/moe_alltoall.py  # through innet

Each step every rank draws its tokens, a fixed gate sends each token to one expert (top-1 routing), the ranks tell
each other how many tokens each sends each (an all_to_all_single of one count per rank), send them (dispatch: an
all_to_all_single of uneven splits), each expert applies its weights and learns from its own tokens, and the
outputs go back to the ranks they came from (combine: the reverse all_to_all_single). Rank 0 gathers every rank's
checksum of its outputs (dist.gather) and prints them: the same digits on gloo and through innet, whose messages
carry a tensor's bytes as they are.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist


def main() -> None:
    p = argparse.ArgumentParser(prog="moe_alltoall", description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--tokens", type=int, default=1024, help="tokens a rank routes each step")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group()  # the default backend: gloo, or innet under innet launch
    rank, world = dist.get_rank(), dist.get_world_size()
    gate = torch.randn(args.dim, world, generator=torch.Generator().manual_seed(args.seed))  # every rank's the same
    expert = torch.randn(args.dim, args.dim, generator=torch.Generator().manual_seed(args.seed + 1 + rank)) / args.dim**0.5
    checksum = torch.zeros(1, dtype=torch.float64)
    for step in range(args.steps):
        tokens = torch.randn(args.tokens, args.dim, generator=torch.Generator().manual_seed(args.seed * 1000 + step * world + rank))
        choice = (tokens @ gate).argmax(dim=1)
        order = torch.argsort(choice, stable=True)  # tokens grouped by expert, in rank order
        sent = torch.bincount(choice, minlength=world)
        got = torch.empty_like(sent)
        dist.all_to_all_single(got, sent)  # how many tokens each rank sends this expert
        arrived = torch.empty(int(got.sum()), args.dim)
        dist.all_to_all_single(arrived, tokens[order], got.tolist(), sent.tolist())  # dispatch
        out = torch.tanh(arrived @ expert)
        expert -= args.lr * arrived.T @ (out - arrived) / max(1, len(arrived))  # the expert learns to echo its tokens
        back = torch.empty(args.tokens, args.dim)
        dist.all_to_all_single(back, out, sent.tolist(), got.tolist())  # combine
        mine = torch.empty_like(back)
        mine[order] = back
        checksum += (mine.double() * torch.arange(1, args.dim + 1, dtype=torch.float64)).sum()
    sums = [torch.zeros(1, dtype=torch.float64) for _ in range(world)] if rank == 0 else None
    dist.gather(checksum, sums, dst=0)
    if rank == 0:
        print(f"moe_alltoall: backend {dist.get_backend_config()}, {world} ranks, {args.steps} steps of "
              f"{args.tokens} tokens: checksums {' '.join(repr(float(s)) for s in sums or [])}", flush=True)
    dist.barrier()  # no rank tears the group down while another still uses it
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # without the interpreter's finalization, which races gloo's threads (examples/digits.py, leave)


if __name__ == "__main__":
    main()
