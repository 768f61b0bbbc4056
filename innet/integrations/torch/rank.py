"""One torch.distributed rank inside a Mininet host: ``python -m innet.integrations.torch.rank CONFIG``.

Started by innet.integrations.torch.ranks, one per worker host. The rank joins a gloo process group over the host's
emulated interface (the IP network of innet.backends.mininet.iplane), says "ready", waits for "go", then does its task:

- ``allreduce``: gloo's all-reduce of the run's tensors, one call each (a barrier before each, so the calls start
  together), every call's start and end on the monotonic clock (the hosts share it);
- ``ddp``: trains the torch example (innet.integrations.torch.ddp.train_ddp), every gradient bucket all-reduced through
  innet (``hook`` "innet": the worker client on the host's interface, through the switches) or by DDP itself
  (``hook`` "plain": gloo).

It writes what it got to the result file (.npz for ``allreduce``, JSON for ``ddp``) and exits.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta
from typing import Any

import numpy as np


def serve_rank(conf: dict[str, Any]) -> int:
    os.environ["GLOO_SOCKET_IFNAME"] = conf["port"]
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank, world = conf["rank"], conf["world"]
    dist.init_process_group("gloo", init_method=conf["rendezvous"], rank=rank, world_size=world,
                            timeout=timedelta(seconds=conf["timeout"]))
    dist.barrier()
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":  # the controller went away before the start
        return 4
    cpu_at_go = time.process_time()
    if conf["task"] == "allreduce":
        _allreduce(conf, rank, cpu_at_go)
    else:
        _ddp(conf, rank, world)
    dist.barrier()  # no rank tears gloo down while another still talks to it
    dist.destroy_process_group()
    return 0


def _allreduce(conf: dict[str, Any], rank: int, cpu_at_go: float) -> None:
    import torch
    import torch.distributed as dist

    from innet.planning.spec import worker_tensors

    tensors = worker_tensors(conf["seed"], conf["job"], rank, conf["sizes"], 0.0, conf["layers"], False)
    results, started, finished = [], [], []
    for tensor in tensors:
        buffer = torch.from_numpy(np.array(tensor, np.float32))
        dist.barrier()
        started.append(time.monotonic())
        dist.all_reduce(buffer)
        finished.append(time.monotonic())
        results.append(buffer.numpy())
    np.savez(conf["result"], floats=np.concatenate(results) if results else np.zeros(0, np.float32),
             sizes=np.array([len(r) for r in results], np.int64), started=np.array(started), finished=np.array(finished),
             cpu_s=time.process_time() - cpu_at_go)


def _ddp(conf: dict[str, Any], rank: int, world: int) -> None:
    from innet.integrations.torch.ddp import ClientState, train_ddp
    from innet.node.client import AllreduceClient
    from innet.node.codec import spec_from_json

    state = None
    if conf["hook"] == "innet":
        client = AllreduceClient(spec_from_json(conf["spec"]), conf["port"], conf["mode"], conf["ring"], conf["faults"])
        state = ClientState(client, world)
    started = time.monotonic()
    accuracy = train_ddp(rank, world, conf["train"], state)
    with open(conf["result"], "w", encoding="utf-8") as fh:
        json.dump({"rank": rank, "accuracy": accuracy, "seconds": time.monotonic() - started,
                   "calls": len(state.client.proc.calls) if state else 0,
                   "retransmissions": sum(c.retransmissions for c in state.client.proc.calls) if state else 0}, fh)


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as fh:
        sys.exit(serve_rank(json.load(fh)))
