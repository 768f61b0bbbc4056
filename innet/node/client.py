"""The blocking worker client: ``AllreduceClient(...).allreduce(array) -> array`` on a real interface.

It drives the same sans-I/O state machines the fabric drives (innet.hosts.worker,
innet.hosts.ring), over an AF_PACKET port with the wall clock. Used by the worker
processes inside Mininet hosts; usable from any program running in a host.
"""

from __future__ import annotations

import os
import time

import numpy as np

from innet.hosts.endpoints import worker_process
from innet.hosts.job import JobSpec
from innet.hosts.ring.linger import Linger
from innet.hosts.ssp import SSPWorker
from innet.hosts.training import Training
from innet.hosts.worker.process import WorkerProcess
from innet.io.rawport import RawPort
from innet.node.config import NO_FAULTS, Faults
from innet.node.egress import Egress, serve_once

STATUS_EVERY = 2.0  # seconds between a worker's status writes


class AllreduceClient:
    """All-reduce numpy float32 arrays of any length with the job's other workers.

    ``mode`` is "innet" or "pbox" (the spec says where to send) or "ring"
    (``ring`` lists the node index of every rank).
    """

    def __init__(self, spec: JobSpec, iface: str, mode: str = "innet", ring: list[int] | None = None,
                 faults: Faults | None = None, training: Training | None = None,
                 endpoint: WorkerProcess | SSPWorker | None = None) -> None:
        self.port = RawPort(iface)
        self.egress = Egress({0: self.port}, faults or NO_FAULTS)
        self.proc: WorkerProcess | SSPWorker = worker_process(mode, spec, ring or [], [], training) if endpoint is None else endpoint
        self.status = ""  # a file to keep saying what the worker waits for in (the controller's progress line)
        self.status_at = 0.0

    def run(self, tensors: list[np.ndarray]) -> None:
        """All-reduce ``tensors`` in order (following the training schedule, if any) until done or failed."""
        assert isinstance(self.proc, WorkerProcess) and isinstance(self.proc.tensors, list)  # its own calls, not a learner's
        self.proc.tensors.extend(self.proc.spec.as_input(t) for t in tensors)
        now = time.monotonic()
        self.egress.send_all(0, self.proc.start(now) if not self.proc.calls else self.proc.advance(now), now)
        while not self.proc.done:
            self.serve_once()

    def run_endpoint(self, start: float | None = None) -> None:
        """Start the endpoint given to the constructor and serve it until it is done or failed. ``start``: the
        instant it starts at (the controller's go instant; default now): a process woken late sends what it starts
        with held from then, as a held frame's answer (innet.node.egress.expire), so its hold absorbs the lateness
        where it can (the calibration's workers: 0.1-0.8 ms apart at load 10, on 2 cores)."""
        now = time.monotonic() if start is None else start
        self.egress.send_all(0, self.proc.start(now), now)
        while not self.proc.done:
            self.serve_once()

    def allreduce(self, tensor: np.ndarray) -> np.ndarray:
        """The element-wise sum over all workers (exact in fixed point); raises if the job fails."""
        self.run([tensor])
        assert isinstance(self.proc, WorkerProcess)
        call = self.proc.calls[-1]
        if call.error is not None:
            raise call.error
        return np.asarray(call.result).reshape(np.shape(tensor))

    def serve_once(self, wake: float | None = None) -> bool:
        """One wake-up: wait for frames or a deadline, feed them, send what comes out; whether frames came."""
        woken = serve_once(self.port, self.proc, self.egress, wake)
        self.report(time.monotonic())
        return woken

    def report(self, now: float) -> None:
        """Every STATUS_EVERY seconds, write what the worker waits for (``waiting()``) to ``status``, whole; the first
        STATUS_EVERY after the first wake-up, not at it: written there (0.3-0.44 ms under load), it came right after
        each worker sent its exponent frame, the instant the others' were due too, and held the cores from them (the
        calibration's star at 80 Mbit/s: two of four exponent frames 0.5-0.7 ms late, the whole run behind them)."""
        if not self.status or not hasattr(self.proc, "waiting"):
            return
        if not self.status_at:
            self.status_at = now + STATUS_EVERY
        if now < self.status_at:
            return
        self.status_at = now + STATUS_EVERY
        with open(self.status + ".part", "w") as fh:
            fh.write(self.proc.waiting())
        os.replace(self.status + ".part", self.status)

    def linger(self, limit: float) -> None:
        """A ring rank's linger (innet.hosts.ring.linger.Linger): keep answering the predecessor, which may have missed
        this rank's last ACKs, until its DONE came, ``limit`` seconds at most."""
        linger = Linger(self.proc.current if isinstance(self.proc, WorkerProcess) else None, time.monotonic(), limit)
        while not linger.over(time.monotonic()):
            self.serve_once(min(linger.end, linger.due()))
            now = time.monotonic()
            self.egress.send_all(0, linger.repeat(now), now)

    def close(self) -> None:
        self.port.close()
