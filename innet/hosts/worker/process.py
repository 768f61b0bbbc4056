"""A worker host's whole run: one all-reduce call per tensor, FIFO (``WorkerProcess``).

The calls are in-network or PBox (innet.hosts.worker.call) or a ring's (innet.hosts.ring); with a training
schedule (innet.hosts.training) each also waits for its gradient, modelled as time passing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from innet.hosts.endpoint import Frames
from innet.hosts.job import JobSpec
from innet.hosts.training import ShardedClock, Training, TrainingClock, clock_of
from innet.hosts.worker.call import AllreduceCall
from innet.hosts.worker.framing import Resident, buffers
from innet.wire.packet import RESULT, FrameBlock, build_frames


class WorkerProcess:
    """A worker host's whole run: one all-reduce call per tensor, FIFO.

    ``make_call(spec, tensor, first_chunk)`` makes each call (in-network, PBox
    or ring). The job's chunk stream continues across calls, so a packet of an
    earlier call is always recognisable as stale; the previous call still sees
    every frame, so it can answer a peer that missed its end. Same interface as
    every endpoint the backends drive: ``start``, ``receive``,
    ``next_deadline``, ``on_timeout``.

    Without ``training`` the calls run back to back. With it, the tensors are
    the layers (or slices) of successive iterations and each call also waits
    until its gradient is computed (innet.hosts.training: compute is modelled as time
    passing); the clock picks which tensor goes next (FIFO or P3 priority), so
    ``calls`` are in the order they began and ``order`` says whose tensor each is.
    """

    def __init__(self, spec: JobSpec, tensors: Sequence[np.ndarray], make_call: Callable[..., Any] = AllreduceCall,
                 first_chunk: int = 0, training: Training | None = None) -> None:
        self.spec = spec
        self.tensors = tensors
        self.make_call = make_call
        self.calls: list[Any] = []
        self.order: list[int] = []  # the tensor index of each call, in the order they began
        self.by_tensor: dict[int, Any] = {}
        self.next_first = first_chunk
        self.training = training
        self.clock: TrainingClock | ShardedClock | None = None
        self.resident = Resident()

    @property
    def current(self) -> Any:
        return self.calls[-1] if self.calls else None

    @property
    def done(self) -> bool:
        call = self.current
        return call is not None and (call.error is not None or (call.done and len(self.calls) == len(self.tensors)))

    @property
    def error(self) -> Exception | None:
        return next((c.error for c in self.calls if c.error is not None), None)

    @property
    def compute_starts(self) -> list[float]:
        """Each iteration's compute start (with ``training``), as far as the run got."""
        return list(self.clock.starts) if self.clock else []

    def _finished(self, k: int) -> float | None:
        call = self.by_tensor.get(k)
        return None if call is None else call.finished_at

    def _next(self, now: float) -> tuple[int | None, float | None]:
        """(the tensor to all-reduce now, None), or (None, when its gradient will exist; None: not before more calls end)."""
        if self.clock is None:
            return len(self.calls), None
        return self.clock.next_call(self.by_tensor, len(self.tensors), now, self._finished)

    def calls_in_order(self) -> list[Any]:
        """The calls begun so far, in the order of their tensors."""
        return [self.by_tensor[k] for k in sorted(self.by_tensor)]

    def prepare(self) -> None:
        """Make the in-network or PBox calls' tensor-sized buffers resident now, before the run starts
        (``Resident``), where the tensors are known in advance (not a learner's)."""
        if self.make_call is not AllreduceCall or not isinstance(self.tensors, (list, tuple)):
            return
        for tensor in self.tensors:
            padded, frames = buffers(self.spec, int(np.size(tensor)))
            self.resident.add(padded, np.int32)
            if not self.spec.sparse:
                self.resident.add(frames, np.uint8)

    def rehearse(self) -> AllreduceCall | None:
        """Run a throwaway call on the first tensor's first window through its start, the exponent's answer and one
        result, before "go" (it sends nothing and keeps nothing): a fresh process's first pass through this code and
        numpy's costs 2-3x a later one's, and on the eBPF switch the CPU of the four workers' starts at "go" and of
        their answers, all at one instant on two cores, is the calibration's time (its worker in-process, cold: the
        start 0.62 -> 0.18 ms, the answer 0.50 -> 0.17 ms, medians of 11 fresh processes at load 11). The throwaway
        call, or None where there is none to make."""
        if self.make_call is not AllreduceCall or not isinstance(self.tensors, (list, tuple)) or not self.tensors:
            return None
        spec = self.call_spec(0)
        tensor = spec.as_input(np.ravel(self.tensors[0])[: spec.elements * spec.slots])
        if not len(tensor):
            return None
        call = AllreduceCall(spec, tensor, 0)
        call.start(0.0)
        call.receive(_result(call, call.first, 0), 0.0)
        if not call.done and call.end > call.first + 1:
            call.receive(_result(call, call.first + 1, min(spec.elements, len(tensor))), 0.0)
        return call

    def call_spec(self, k: int) -> JobSpec:
        """Tensor k's call's spec: the job's, with a sharded schedule's collective for that call."""
        collective = self.training.collective(k) if self.training is not None else None
        return self.spec if collective is None else replace(self.spec, collective=collective)

    def _begin(self, k: int, now: float) -> Frames:
        spec = self.call_spec(k)
        call = (AllreduceCall(spec, self.tensors[k], self.next_first, self.resident) if self.make_call is AllreduceCall
                else self.make_call(spec, self.tensors[k], self.next_first))
        self.next_first = call.end
        early = self.calls[-1].early if self.calls and hasattr(self.calls[-1], "early") else []
        self.calls.append(call)
        self.order.append(k)
        self.by_tensor[k] = call
        out = list(call.start(now))
        for frame in early:  # frames of this call that arrived while the previous one was finishing
            out.extend(call.receive(frame, now))
        return out

    def start(self, now: float) -> Frames:
        if self.training is not None:
            self.clock = clock_of(self.training, now)
        return self._advance([], now)

    def advance(self, now: float) -> Frames:
        """Begin the next call if the current one is over, another tensor is waiting and its gradient is ready."""
        return self._advance([], now)

    def _advance(self, out: Frames, now: float) -> Frames:
        call = self.current
        while (call is None or (call.done and call.error is None)) and len(self.calls) < len(self.tensors):
            k, _ = self._next(now)
            if k is None:
                break
            out.extend(self._begin(k, now))
            call = self.current
        return out

    def receive(self, frame: bytes, now: float) -> Frames:
        out: Frames = []
        for call in self.calls[-2:]:
            out.extend(call.receive(frame, now))
        return self._advance(out, now)

    def receive_block(self, block: FrameBlock, now: float) -> Frames:
        """``receive`` for a block of frames; calls without a block form get them one by one."""
        out: Frames = []
        for call in self.calls[-2:]:
            if hasattr(call, "receive_block"):
                out.extend(call.receive_block(block, now))
            else:
                for k in range(len(block.lengths)):
                    out.extend(call.receive(block.frame(k), now))
        return self._advance(out, now)

    def next_deadline(self) -> float | None:
        if self.calls:  # ``done``'s test, spelt out: the fabric asks after every frame
            call = self.calls[-1]
            if call.error is not None:
                return None
            if not call.done:
                return call.next_deadline()
        if len(self.calls) == len(self.tensors):
            return None
        k, when = self._next(float("-inf"))  # when the next tensor's gradient exists, if that is known
        return when if k is None else -float("inf")

    def waiting(self) -> str:
        """What the current call waits for (``AllreduceCall.waiting``, ``RingCall.waiting``), for a progress line."""
        call = self.current
        said = call.waiting() if call is not None and hasattr(call, "waiting") else ""
        return f"call {len(self.calls)}/{len(self.tensors)}, {said}" if said and len(self.tensors) > 1 else said

    def holdoff(self) -> float:
        call = self.current
        return call.holdoff() if call is not None and hasattr(call, "holdoff") and not call.done else 0.0

    def on_timeout(self, now: float) -> Frames:
        call = self.current
        out = list(call.on_timeout(now)) if call is not None and not call.done else []
        return self._advance(out, now)


def _result(call: AllreduceCall, chunk: int, count: int) -> bytes:
    """A result of ``chunk`` carrying ``count`` zeros, as ``call``'s peer would send it (``rehearse``)."""
    spec, chunks = call.spec, np.array([chunk])
    hdr = call.frames.header(chunks, count, call.local_exp)
    hdr["flags"] |= RESULT
    return build_frames(spec.peer_of(chunks), spec.node, hdr, np.zeros((1, count), np.int32), spec.band)[0].tobytes()
