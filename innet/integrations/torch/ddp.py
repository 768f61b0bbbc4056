"""PyTorch DDP through innet: a communication hook that all-reduces every gradient bucket through the network.

``model.register_comm_hook(state, innet_hook)`` replaces DDP's all-reduce; the hook hands DDP back the
bucket's mean over the ranks, as DDP's default hook does. ``state`` says how the bucket reaches innet:

- ``FabricState``, the quick start (no root): every rank's bucket is gathered to rank 0 over the process
  group, all-reduced there on the in-process fabric (the run's switches and program, fixed point, virtual
  time), and each rank's result is scattered back;
- ``ClientState``, the real thing: each rank runs inside a Mininet host and all-reduces with the worker client
  on its own interface (innet.node.client); innet.integrations.ranks.mininet starts the ranks.

``train_ddp`` is the example's training loop (a small torch MLP on the digits), the same in both.
"""

# no ``from __future__ import annotations``: DDP checks the hook's annotations as objects, not strings
from dataclasses import replace
from typing import Any

import networkx as nx
import numpy as np
import torch
import torch.distributed as dist

from innet.backends.local.run import LocalRun
from innet.hosts.learning.model import Task
from innet.hosts.worker.process import WorkerProcess
from innet.node.client import AllreduceClient
from innet.planning.spec import RunSpec


def fabric_allreduce(graph: nx.Graph, run: RunSpec, tensors: list[np.ndarray]) -> tuple[list[np.ndarray], float]:
    """Each rank's tensor (rank r: ``tensors[r]``) all-reduced by ``run`` on the fabric: every rank's result,
    and the virtual seconds it took."""
    local = LocalRun(graph, replace(run, elements=len(tensors[0]), iterations=1),
                     given={rank: [t] for rank, t in enumerate(tensors)})
    took = local.fabric.run()
    procs = sorted((p for p in local.procs if isinstance(p, WorkerProcess)), key=lambda p: p.spec.rank)
    for proc in procs:
        if proc.error is not None:
            raise proc.error
    return [np.asarray(p.calls[-1].result, np.float32) for p in procs], took


class FabricState:
    """Gather to rank 0, all-reduce on the fabric there, scatter back (see module doc)."""

    def __init__(self, graph: nx.Graph, run: RunSpec) -> None:
        self.graph, self.run = graph, run
        self.world = dist.get_world_size()
        self.virtual_s = 0.0  # rank 0: the fabric's time spent in all-reduces

    def allreduce(self, array: np.ndarray) -> np.ndarray:
        mine = torch.from_numpy(np.ascontiguousarray(array, np.float32))
        rank = dist.get_rank()
        gathered = [torch.empty_like(mine) for _ in range(self.world)] if rank == 0 else None
        dist.gather(mine, gathered, dst=0)
        results = None
        if gathered is not None:
            sums, took = fabric_allreduce(self.graph, self.run, [g.numpy() for g in gathered])
            self.virtual_s += took
            results = [torch.from_numpy(s) for s in sums]
        out = torch.empty_like(mine)
        dist.scatter(out, results, src=0)
        return out.numpy()


class ClientState:
    """A rank inside a Mininet host: its worker client all-reduces on the host's interface."""

    def __init__(self, client: AllreduceClient, world: int) -> None:
        self.client, self.world = client, world

    def allreduce(self, array: np.ndarray) -> np.ndarray:
        return self.client.allreduce(np.ascontiguousarray(array, np.float32))


def train_ddp(rank: int, world: int, task: Task, state: Any = None) -> float:
    """Train a one-hidden-layer torch MLP on the digits with DDP (the process group is up): every rank its shard,
    the global batch ``task.batch`` split evenly, seeded by ``task.seed`` (its data set and model aside); with ``state``, every bucket goes
    through ``innet_hook``, else through DDP's own (gloo) all-reduce. The test accuracy at the end."""
    from torch.nn.parallel import DistributedDataParallel

    from innet.hosts.learning.model import load_data

    seed, batch = task.seed, task.batch
    data = load_data("digits", seed, world)
    x, y = (torch.from_numpy(a) for a in data.shard(rank))
    per_rank, steps = batch // world, len(data.y_train) // batch
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(data.features, task.hidden), torch.nn.ReLU(),
                              torch.nn.Linear(task.hidden, data.classes))
    model = DistributedDataParallel(net)
    if state is not None:
        model.register_comm_hook(state, innet_hook)
    opt = torch.optim.SGD(model.parameters(), lr=task.lr)
    for epoch in range(task.epochs):
        order = torch.from_numpy(np.random.default_rng([seed, rank, epoch]).permutation(len(y)))
        for step in range(steps):
            take = order[step * per_rank : (step + 1) * per_rank]
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x[take]), y[take]).backward()
            opt.step()
    with torch.no_grad():
        predicted = net(torch.from_numpy(data.x_test)).argmax(dim=1).numpy()
    del model  # its reducer's threads end before the process group does
    return float(np.mean(predicted == data.y_test))


def innet_hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: the bucket's mean over the ranks, all-reduced through innet."""
    buffer = bucket.buffer()
    total = state.allreduce(buffer.detach().cpu().numpy())
    buffer.copy_(torch.from_numpy(np.asarray(total, np.float32) / state.world).view_as(buffer))
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(buffer)
    return future
