"""One torch.distributed rank inside a Mininet host: ``python -m innet.integrations.ranks.rank CONFIG``.

Started by innet.integrations.ranks.mininet, one per worker host. The rank joins a gloo process group over the host's
emulated interface (the IP network of innet.backends.mininet.iplane), says "ready", waits for "go", then does its task:

- ``allreduce``: gloo's all-reduce of the run's tensors, one call each (a barrier before each, so the calls start
  together), every call's start and end on the monotonic clock (the hosts share it);
- ``ddp``: trains the torch example (innet.integrations.torch.ddp.train_ddp), every gradient bucket all-reduced through
  innet (``hook`` "innet": the worker client on the host's interface, through the switches) or by DDP itself
  (``hook`` "plain": gloo).

It writes what it got to the result file (.npz for ``allreduce``, JSON for ``ddp``) and exits.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta

import numpy as np

from innet.hosts.job import JobSpec
from innet.hosts.learning.model import Task
from innet.hosts.worker.process import WorkerProcess
from innet.node.codec import read, say_ready, write
from innet.node.config import NO_FAULTS, Faults


@dataclass(frozen=True)
class DdpHook:
    """A ``ddp`` rank's: what it trains, and ``hook`` "innet" (its all-reduces through the switches, as ``spec``'s
    worker in ``mode``) or "plain" (DDP's own gloo)."""

    task: Task  # the digits' MLP is torch's own here (innet.integrations.torch.ddp.train_ddp)
    hook: str
    spec: JobSpec
    mode: str
    ring: tuple[int, ...]
    faults: Faults = field(default_factory=lambda: dict(NO_FAULTS))


@dataclass(frozen=True)
class GlooCalls:
    """An ``allreduce`` rank's: the run's seeded tensors (innet.hosts.job.worker_tensors) of ``job``."""

    seed: int
    job: int
    sizes: tuple[int, ...]
    layers: int


@dataclass(frozen=True)
class DdpResult:
    """What a ``ddp`` rank got: its test accuracy, its seconds of training, and its all-reduces through innet."""

    rank: int
    accuracy: float
    seconds: float
    calls: int
    retransmissions: int


@dataclass(frozen=True)
class RankConfig:
    """One rank's: who it is, where the ranks meet, where it writes what it got, and its task (one of two)."""

    rank: int
    world: int
    port: str
    timeout: float
    rendezvous: str
    result: str
    allreduce: GlooCalls | None = None
    ddp: DdpHook | None = None


def serve_rank(conf: RankConfig) -> int:
    os.environ["GLOO_SOCKET_IFNAME"] = conf.port
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank, world = conf.rank, conf.world
    try:
        dist.init_process_group("gloo", init_method=conf.rendezvous, rank=rank, world_size=world,
                                timeout=timedelta(seconds=conf.timeout))
        dist.barrier()
    except dist.DistError as e:  # the ranks did not meet in time (TCP's connects under heavy loss): not a failure
        sys.stdout.write(f"unfinished: {str(e).splitlines()[0] if str(e) else type(e).__name__}\n")  # to the launcher
        sys.stdout.flush()
        return 5
    say_ready()
    if sys.stdin.readline().strip() != "go":  # the controller went away before the start
        return 4
    cpu_at_go = time.process_time()
    if conf.allreduce is not None:
        _allreduce(conf.allreduce, conf.result, rank, cpu_at_go)
    elif conf.ddp is not None:
        _ddp(conf.ddp, conf.result, rank, world)
    dist.barrier()  # no rank tears gloo down while another still talks to it
    dist.destroy_process_group()
    return 0


def _allreduce(conf: GlooCalls, result: str, rank: int, cpu_at_go: float) -> None:
    import torch
    import torch.distributed as dist

    from innet.hosts.job import worker_tensors

    tensors = worker_tensors(conf.seed, conf.job, rank, conf.sizes, 0.0, conf.layers, False)
    results, started, finished = [], [], []
    for tensor in tensors:
        buffer = torch.from_numpy(np.array(tensor, np.float32))
        dist.barrier()
        started.append(time.monotonic())
        dist.all_reduce(buffer)
        finished.append(time.monotonic())
        results.append(buffer.numpy())
    np.savez(result, floats=np.concatenate(results) if results else np.zeros(0, np.float32),
             sizes=np.array([len(r) for r in results], np.int64), started=np.array(started), finished=np.array(finished),
             cpu_s=time.process_time() - cpu_at_go)


def _ddp(conf: DdpHook, result: str, rank: int, world: int) -> None:
    from innet.integrations.torch.ddp import ClientState, train_ddp
    from innet.node.client import AllreduceClient

    state = None
    proc = WorkerProcess(conf.spec, [])
    if conf.hook == "innet":
        client = AllreduceClient(conf.spec, os.environ["GLOO_SOCKET_IFNAME"], conf.mode, list(conf.ring), conf.faults)
        state = ClientState(client, world)
        assert isinstance(client.proc, WorkerProcess)
        proc = client.proc
    started = time.monotonic()
    accuracy = train_ddp(rank, world, conf.task, state)
    write(result, DdpResult(rank, accuracy, time.monotonic() - started, len(proc.calls),
                            sum(c.retransmissions for c in proc.calls)))


def leave(code: int) -> None:
    """Exit with ``code`` without the interpreter's finalization, which races gloo's C++ worker threads (they may
    still hold work objects) and aborts the rank now and then after all its work is written: "terminate called
    without an active exception", SIGABRT (pytorch/pytorch PR 179291, abandoned). Everything was waited for, the
    group destroyed and the result file closed before this."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    leave(serve_rank(read(RankConfig, sys.argv[1])))
