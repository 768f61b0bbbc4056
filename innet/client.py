"""The blocking worker client: ``AllreduceClient(...).allreduce(array) -> array`` on a real interface.

It drives the same sans-I/O state machines the fabric drives (innet.worker,
innet.ring), over an AF_PACKET port with the wall clock. Used by the worker
processes inside Mininet hosts; usable from any program running in a host.
"""

from __future__ import annotations

import select
import time
from typing import Any

import numpy as np

from innet.faults import FaultSpec
from innet.modes import worker_process
from innet.rawport import RawPort
from innet.training import Training
from innet.worker import JobSpec


class AllreduceClient:
    """All-reduce numpy float32 arrays of any length with the job's other workers.

    ``mode`` is "innet" or "pbox" (the spec says where to send) or "ring"
    (``ring`` lists the node index of every rank).
    """

    def __init__(self, spec: JobSpec, iface: str, mode: str = "innet", ring: list[int] | None = None,
                 faults: dict[int, FaultSpec] | None = None, seed: int = 0, training: Training | None = None,
                 endpoint: Any = None) -> None:
        from innet.node import Egress

        self.port = RawPort(iface)
        self.egress = Egress({0: self.port}, {"0": vars(faults[0]) if faults else vars(FaultSpec())}, seed)
        self.proc = worker_process(mode, spec, ring or [], [], training) if endpoint is None else endpoint
        self.poller = select.poll()
        self.poller.register(self.port.fileno(), select.POLLIN)

    def run(self, tensors: list[np.ndarray]) -> None:
        """All-reduce ``tensors`` in order (following the training schedule, if any) until done or failed."""
        self.proc.tensors.extend(np.asarray(t, np.float32) for t in tensors)
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

    def serve_once(self, wake: float | None = None) -> None:
        """One wake-up: wait for frames or a deadline, feed them, send what comes out."""
        from innet.node import serve_once

        serve_once(self.poller, self.port, self.proc, self.egress, wake)

    def linger(self, seconds: float) -> None:
        """Keep answering peers (a ring neighbour may have missed our last ACK) for a while."""
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            self.serve_once(until)

    def close(self) -> Any:
        self.port.close()
