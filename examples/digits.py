"""The examples' training (ddp_digits.py, fsdp_digits.py): a small MLP on scikit-learn's digits, CPU, one process
per rank, torchrun's environment, the model wrapped for data parallelism by the example.

An ordinary torch.distributed program: it names no backend, so it runs on gloo under torchrun and through the
emulated network under innet launch (which makes "innet" the default backend). Rank 0 prints the test accuracy and
the mean milliseconds per step.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.distributed as dist
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split


def digits(seed: int) -> tuple[torch.Tensor, ...]:
    """The digits scaled to [0, 1], split 80/20 with ``seed``: x_train, y_train, x_test, y_test."""
    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split((x / 16.0).astype(np.float32), y.astype(np.int64),
                                                        test_size=0.2, random_state=seed)
    return tuple(torch.from_numpy(p) for p in (x_train, y_train, x_test, y_test))


def train(name: str, wrap: Callable[[torch.nn.Module], torch.nn.Module]) -> None:
    """Example ``name``: train the MLP wrapped by ``wrap`` (DDP, FSDP) with the command line's settings."""
    p = argparse.ArgumentParser(prog=name, description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch", type=int, default=32, help="global batch, split evenly over the ranks")
    p.add_argument("--lr", type=float, default=0.5)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group()  # the default backend: gloo, or innet under innet launch
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y, x_test, y_test = digits(args.seed)
    steps = len(y) // world // (args.batch // world)  # the same on every rank
    x, y = x[rank::world], y[rank::world]
    torch.manual_seed(args.seed)
    net = torch.nn.Sequential(torch.nn.Linear(64, args.hidden), torch.nn.ReLU(), torch.nn.Linear(args.hidden, 10))
    model = wrap(net)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    per_rank = args.batch // world
    started = time.perf_counter()
    for epoch in range(args.epochs):
        order = torch.from_numpy(np.random.default_rng([args.seed, rank, epoch]).permutation(len(y)))
        for step in range(steps):
            take = order[step * per_rank : (step + 1) * per_rank]
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x[take]), y[take]).backward()
            opt.step()
    seconds = time.perf_counter() - started
    with torch.no_grad():
        accuracy = float((net(x_test).argmax(dim=1) == y_test).float().mean())
    if rank == 0:
        print(f"{name}: backend {dist.get_backend_config()}, {world} ranks: test accuracy {accuracy:.4f}, "
              f"{1000 * seconds / (args.epochs * steps):.2f} ms per step, {args.epochs * steps} steps", flush=True)
    dist.barrier()  # no rank tears the group down while another still uses it
    dist.destroy_process_group()
    leave()


def leave() -> None:
    """End the process now that all is done, without the interpreter's finalization. Under torchrun with gloo
    that finalization races gloo's C++ worker threads, which may still hold work objects: about one run in four
    (more on a loaded machine) both ranks then abort after everything was printed ("terminate called without an
    active exception", SIGABRT, torchrun's exit 1). pytorch/pytorch PR 179291 (abandoned) describes it. Every
    collective was waited for and the group destroyed above, so nothing is lost by skipping finalization."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

