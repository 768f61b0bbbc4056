#!/usr/bin/env python3
"""A pipeline-parallel MLP, one stage per rank, activations and gradients sent between the stages: an unmodified
torch.distributed script.

    torchrun --nproc-per-node 2 examples/pipeline_p2p.py                                    # gloo
    innet launch --backend local --topo star --workers 2 -- python examples/pipeline_p2p.py  # through innet

Rank 0 holds the first layers and the data, the last rank the last layer and the targets. Each step a batch is cut
into micro-batches; each goes forward stage by stage (dist.send of its activations to the next rank, dist.recv from
the previous), the last stage computes the loss and sends the gradient of its input back (dist.isend/irecv down the
chain), and each stage steps its own optimizer once the batch's micro-batches are through. The last rank prints the
loss of every step, every rank its parameters' checksum: the same digits on gloo and through innet.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist


def main() -> None:
    p = argparse.ArgumentParser(prog="pipeline_p2p", description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--micro", type=int, default=4, help="micro-batches a batch is cut into")
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group()  # the default backend: gloo, or innet under innet launch
    rank, world = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == world - 1
    torch.manual_seed(args.seed + rank)
    stage = torch.nn.Sequential(torch.nn.Linear(args.dim, 1 if last else args.dim), torch.nn.Identity() if last else torch.nn.Tanh())
    opt = torch.optim.SGD(stage.parameters(), lr=args.lr)
    data = torch.Generator().manual_seed(args.seed)
    truth = torch.randn(args.dim, 1, generator=data)
    losses = []
    for _ in range(args.steps):
        x = torch.randn(args.batch, args.dim, generator=data)  # every rank draws it (only the ends use it)
        y = torch.sin(x @ truth)
        opt.zero_grad()
        total = 0.0
        for xs, ys in zip(x.chunk(args.micro), y.chunk(args.micro), strict=True):
            if first:
                inputs = xs
            else:
                inputs = torch.empty_like(xs)
                dist.recv(inputs, rank - 1)
                inputs.requires_grad_()
            out = stage(inputs)
            if last:
                loss = torch.nn.functional.mse_loss(out, ys) / args.micro
                loss.backward()
                total += float(loss)
            else:
                dist.send(out.detach(), rank + 1)
                grad = torch.empty_like(out)
                dist.irecv(grad, rank + 1).wait()
                out.backward(grad)
            if not first:
                dist.isend(inputs.grad, rank - 1).wait()
        opt.step()
        losses.append(total)
    if last:
        print(f"pipeline_p2p: backend {dist.get_backend_config()}, {world} stages, losses "
              f"{' '.join(repr(v) for v in losses)}", flush=True)
    checksum = sum(float((w.detach().double() * torch.arange(1, w.numel() + 1).reshape(w.shape)).sum()) for w in stage.parameters())
    print(f"pipeline_p2p: stage {rank} parameters' checksum {checksum!r}", flush=True)
    dist.barrier()  # no rank tears the group down while another still uses it
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # without the interpreter's finalization, which races gloo's threads (examples/digits.py, leave)


if __name__ == "__main__":
    main()
