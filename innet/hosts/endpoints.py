"""Which endpoint a worker host runs (innet.hosts.endpoint): its all-reduce calls in a mode (a window of
chunks, or a ring rank), or its training loop against the PBox. The same on the fabric and inside a Mininet
host's own process, which imports this and nothing of the planner's."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import numpy as np

from innet.hosts.job import JobSpec
from innet.hosts.learning.learner import Learner, bind_learner
from innet.hosts.ring.call import RingCall
from innet.hosts.ssp import Consistency, SSPWorker
from innet.hosts.training import Training
from innet.hosts.worker.call import AllreduceCall
from innet.hosts.worker.process import WorkerProcess
from innet.wire.collectives import COLLECTIVES


def worker_process(mode: str, spec: JobSpec, ring: list[int], tensors: Sequence[Any],
                   training: Training | None = None) -> WorkerProcess:
    """The endpoint a worker host runs for ``mode`` (``training``: the compute schedule its calls follow)."""
    make_call = partial(_ring_call, ring) if mode == "ring" else AllreduceCall
    proc = WorkerProcess(spec, tensors, make_call, training=training)
    if spec.collective != "allreduce" or (training is not None and training.phases):  # what the rank streams for its inputs
        proc.tensors = [COLLECTIVES[s.collective].streams([t], s.rank, s.nworkers, s.root, s.elements, s.operator)[0]
                        for t, s in ((t, proc.call_spec(k)) for k, t in enumerate(tensors))]
    return proc


def endpoint_of(spec: JobSpec, tensors: Sequence[np.ndarray], mode: str, ring: list[int], training: Training | None,
                ssp: tuple[Consistency, list[float]] | None = None) -> WorkerProcess | SSPWorker:
    """A worker's endpoint, the same on the fabric (``host_endpoint``) and in a Mininet worker process
    (innet.node.worker): its all-reduce calls of ``tensors`` in ``mode``, or with ``ssp`` (the parameter server's
    consistency, and the worker's compute times) its training loop against the PBox; ``tensors`` a Learner: its
    gradients step by step, each reduction fed back to it."""
    endpoint: WorkerProcess | SSPWorker
    if ssp is not None:
        endpoint = SSPWorker(spec, tensors, ssp[1], ssp[0])
    else:
        endpoint = worker_process(mode, spec, ring, tensors, training)
    if isinstance(tensors, Learner):
        bind_learner(endpoint, tensors)
    return endpoint


def _ring_call(ring: list[int], spec: JobSpec, tensor: Any, first: int) -> RingCall:
    return RingCall(spec, ring, tensor, first)
