"""The blocking worker client: ``AllreduceClient(...).allreduce(array) -> array`` on a real interface.

It drives the same sans-I/O state machines the fabric drives (innet.hosts.worker,
innet.hosts.ring), over an AF_PACKET port with the wall clock. Used by the worker
processes inside Mininet hosts; usable from any program running in a host.
"""

from __future__ import annotations

import select
import time
from typing import Any

import numpy as np

from innet.hosts.training import Training
from innet.hosts.worker import JobSpec
from innet.io.rawport import RawPort
from innet.node.egress import Egress, serve_once
from innet.schemes.modes import worker_process
from innet.wire.faults import FaultSpec


class AllreduceClient:
    """All-reduce numpy float32 arrays of any length with the job's other workers.

    ``mode`` is "innet" or "pbox" (the spec says where to send) or "ring"
    (``ring`` lists the node index of every rank).
    """

    def __init__(self, spec: JobSpec, iface: str, mode: str = "innet", ring: list[int] | None = None,
                 faults: dict[str, dict[str, Any]] | None = None, training: Training | None = None,
                 endpoint: Any = None) -> None:
        self.port = RawPort(iface)
        self.egress = Egress({0: self.port}, faults or {"0": {"spec": vars(FaultSpec()), "seed": 0}})
        self.proc = worker_process(mode, spec, ring or [], [], training) if endpoint is None else endpoint
        self.poller = select.poll()
        self.poller.register(self.port.fileno(), select.POLLIN)

    def run(self, tensors: list[np.ndarray]) -> None:
        """All-reduce ``tensors`` in order (following the training schedule, if any) until done or failed."""
        assert isinstance(self.proc.tensors, list)  # this client's own calls, not a learner's
        self.proc.tensors.extend(self.proc.spec.as_input(t) for t in tensors)
        now = time.monotonic()
        self.egress.send_all(0, self.proc.start(now) if not self.proc.calls else self.proc.advance(now), now)
        while not self.proc.done:
            self.serve_once()

    def run_endpoint(self) -> None:
        """Start the endpoint given to the constructor and serve it until it is done or failed."""
        now = time.monotonic()
        self.egress.send_all(0, self.proc.start(now), now)
        while not self.proc.done:
            self.serve_once()

    def allreduce(self, tensor: np.ndarray) -> np.ndarray:
        """The element-wise sum over all workers (exact in fixed point); raises if the job fails."""
        self.run([tensor])
        call = self.proc.calls[-1]
        if call.error is not None:
            raise call.error
        return np.asarray(call.result).reshape(np.shape(tensor))

    def serve_once(self, wake: float | None = None) -> bool:
        """One wake-up: wait for frames or a deadline, feed them, send what comes out; whether frames came."""
        return serve_once(self.poller, self.port, self.proc, self.egress, wake)

    def linger(self, quiet: float, limit: float) -> None:
        """Keep answering peers (a ring neighbour may have missed our last ACK) until the predecessor said it
        is done (innet.hosts.ring's DONE), or none has sent anything for ``quiet`` seconds, at most ``limit``
        seconds: under heavy loss a neighbour may retransmit for long, and its DONE may be lost."""
        now = time.monotonic()
        until, end = now + quiet, now + limit
        while now < min(until, end) and not getattr(self.proc.current, "predecessor_done", False):
            if self.serve_once(min(until, end)):
                until = time.monotonic() + quiet
            now = time.monotonic()

    def close(self) -> Any:
        self.port.close()
