"""The worker side of in-network all-reduce, as a sans-I/O state machine.

``AllreduceCall`` is one worker's part of one all-reduce: it takes frames in and
gives frames out, with a clock passed in, so the in-process fabric (virtual
time) and a Mininet host (raw socket, wall clock) drive the very same code.

Protocol (SwitchML, with an in-network exponent agreement first):
1. chunk ``first`` carries no values, only this worker's magnitude exponent;
   the switches return the max, from which every worker derives the same scale;
2. the quantized tensor streams through the job's slots, ``elements`` values a
   chunk, at most ``slots`` chunks in flight; the result of chunk ``c`` frees
   its slot for chunk ``c + slots``;
3. a chunk whose result is late is retransmitted (adaptive timeout, Karn's rule).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from innet import fixedpoint
from innet.errors import AllreduceAborted, AllreduceTimeout
from innet.packet import ABORT, OVERFLOW, RESULT, RETX, ROUTE, VER, make_packet, parse_frame


@dataclass(frozen=True)
class JobSpec:
    """What a worker knows of its job: identity, pool geometry, and addressing."""

    job: int
    rank: int
    nworkers: int
    slots: int
    elements: int
    node: int
    first_hop: int
    min_rto: float = 0.001
    initial_rto: float = 0.2
    timeout: float = 10.0
    pbox: int | None = None  # set: send every chunk to this PBox node instead of into the network

    def chunks(self, length: int) -> int:
        """Chunks one call uses for a tensor of ``length`` (one more for the exponent)."""
        return 1 + -(-length // self.elements)


class RetransmitTimer:
    """Adaptive retransmission timeout: SRTT + 4 RTTVAR (RFC 6298), Karn's rule, back-off.

    The back-off is capped so that ~32 tries fit in the no-progress timeout.
    """

    def __init__(self, spec: JobSpec) -> None:
        self.spec = spec
        self.srtt: float | None = None
        self.rttvar = 0.0
        self.backoff = 1

    @property
    def rto(self) -> float:
        base = self.spec.initial_rto if self.srtt is None else 2 * self.srtt + 4 * self.rttvar
        return min(max(self.spec.min_rto, base) * self.backoff, max(self.spec.min_rto, self.spec.timeout / 32))

    def sample(self, rtt: float) -> None:
        self.backoff = 1
        if self.srtt is None:
            self.srtt, self.rttvar = rtt, rtt / 2
        else:
            self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - rtt)
            self.srtt = 0.875 * self.srtt + 0.125 * rtt

    def expired(self) -> None:
        self.backoff = min(self.backoff * 2, 64)


class AllreduceCall:
    """One worker's part of one in-network all-reduce (see module doc)."""

    def __init__(self, spec: JobSpec, tensor: np.ndarray, first_chunk: int) -> None:
        self.spec = spec
        self.tensor = np.ascontiguousarray(tensor, np.float32).ravel()
        self.first = first_chunk
        self.end = first_chunk + spec.chunks(len(self.tensor))
        self.local_exp = fixedpoint.magnitude_exponent(self.tensor)
        self.scale: int | None = None
        self._q = 0
        self.quantized = np.zeros(0, np.int32)
        self.result_int = np.zeros(len(self.tensor), np.int64)
        self.sent: dict[int, tuple[float, bool]] = {}
        self.timers: list[tuple[float, int]] = []
        self.timer = RetransmitTimer(spec)
        self.next_chunk = first_chunk
        self.retransmissions = 0
        self.started_at: float | None = None
        self.finished_at: float | None = None
        self.last_progress = 0.0
        self.error: Exception | None = None

    @property
    def done(self) -> bool:
        return self.finished_at is not None or self.error is not None

    @property
    def result(self) -> np.ndarray:
        assert self.scale is not None
        return fixedpoint.dequantize(self.result_int, self.scale)

    @property
    def rto(self) -> float:
        return self.timer.rto

    def _frame(self, chunk: int, retx: bool) -> bytes:
        spec = self.spec
        slot, version = chunk % spec.slots, (chunk // spec.slots) & 1
        flags = (VER if version else 0) | (RETX if retx else 0) | (ROUTE if spec.pbox is not None else 0)
        if chunk == self.first:
            values, exp = None, self.local_exp
        else:
            off = (chunk - self.first - 1) * spec.elements
            values, exp = self.quantized[off : off + spec.elements], self._q
        pkt = make_packet(values, job=spec.job, rank=spec.rank, nworkers=spec.nworkers,
                          slot=slot, chunk=chunk, flags=flags, exp=exp)
        return pkt.to_frame(spec.node, spec.first_hop if spec.pbox is None else spec.pbox)

    def _send(self, chunk: int, now: float, retx: bool = False) -> bytes:
        self.sent[chunk] = (now, retx or chunk in self.sent)
        heapq.heappush(self.timers, (now, chunk))
        return self._frame(chunk, retx)

    def start(self, now: float) -> list[bytes]:
        self.started_at = self.last_progress = now
        self.next_chunk = self.first + 1
        return [self._send(self.first, now)]

    def receive(self, frame: bytes, now: float) -> list[bytes]:
        pkt = parse_frame(frame)
        source = self.spec.first_hop if self.spec.pbox is None else self.spec.pbox
        if pkt is None or pkt.job != self.spec.job or self.done or pkt.src != source:
            return []
        if pkt.has(ABORT):
            origin, *missing = (int(x) for x in pkt.values) or (-1,)
            self.error = AllreduceAborted(
                f"job {self.spec.job}: rank(s) {', '.join(map(str, missing)) or '?'} sent nothing for "
                f"{self.spec.timeout / 2:g}s; node {origin} aborted the job and freed its slots")
            return []
        if not pkt.has(RESULT) or pkt.chunk not in self.sent:
            return []
        sent_at, retransmitted = self.sent.pop(pkt.chunk)
        if not retransmitted and pkt.chunk != self.first:  # Karn; the lone exponent packet never queues
            self.timer.sample(now - sent_at)
        self.last_progress = now
        if pkt.has(OVERFLOW):
            self.error = OverflowError(f"job {self.spec.job}: int32 overflow in chunk {pkt.chunk}")
            return []
        out: list[bytes] = []
        if pkt.chunk == self.first:
            self._q = pkt.exp
            self.scale = fixedpoint.scale_for(pkt.exp, self.spec.nworkers)
            self.quantized = fixedpoint.quantize(self.tensor, self.scale)
            while self.next_chunk < min(self.end, self.first + 1 + self.spec.slots):
                out.append(self._send(self.next_chunk, now))
                self.next_chunk += 1
        else:
            off = (pkt.chunk - self.first - 1) * self.spec.elements
            self.result_int[off : off + pkt.count] = pkt.values
            if self.next_chunk < self.end:
                out.append(self._send(self.next_chunk, now))
                self.next_chunk += 1
        if not self.sent and self.next_chunk >= self.end:
            self.finished_at = now
        return out

    def next_deadline(self) -> float | None:
        if self.done:
            return None
        while self.timers and self.sent.get(self.timers[0][1], (None,))[0] != self.timers[0][0]:
            heapq.heappop(self.timers)
        retx = self.timers[0][0] + self.rto if self.timers else None
        give_up = self.last_progress + self.spec.timeout
        return give_up if retx is None else min(retx, give_up)

    def on_timeout(self, now: float) -> list[bytes]:
        if self.done:
            return []
        if now >= self.last_progress + self.spec.timeout:  # the very sum next_deadline gave, so no float gap
            self.error = AllreduceTimeout(
                f"job {self.spec.job} rank {self.spec.rank}: no result for {self.spec.timeout:g}s "
                f"(chunks {sorted(self.sent)[:4]}... outstanding)"
            )
            return []
        out = []
        rto = self.rto
        while self.timers and self.timers[0][0] + rto <= now:
            sent_at, chunk = heapq.heappop(self.timers)
            if self.sent.get(chunk, (None,))[0] == sent_at:
                self.retransmissions += 1
                out.append(self._send(chunk, now, retx=True))
        if out:
            self.timer.expired()
        return out


class WorkerProcess:
    """A worker host's whole run: one all-reduce call per tensor, back to back.

    ``make_call(spec, tensor, first_chunk)`` makes each call (in-network, PBox
    or ring). The job's chunk stream continues across calls, so a packet of an
    earlier call is always recognisable as stale; the previous call still sees
    every frame, so it can answer a peer that missed its end. Same interface as
    every endpoint the backends drive: ``start``, ``receive``,
    ``next_deadline``, ``on_timeout``.
    """

    def __init__(self, spec: JobSpec, tensors: list[np.ndarray], make_call: Callable[..., Any] = AllreduceCall,
                 first_chunk: int = 0) -> None:
        self.spec = spec
        self.tensors = tensors
        self.make_call = make_call
        self.calls: list[Any] = []
        self.next_first = first_chunk

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

    def _begin(self, now: float) -> list[bytes]:
        call = self.make_call(self.spec, self.tensors[len(self.calls)], self.next_first)
        self.next_first = call.end
        early = self.calls[-1].early if self.calls and hasattr(self.calls[-1], "early") else []
        self.calls.append(call)
        out = list(call.start(now))
        for frame in early:  # frames of this call that arrived while the previous one was finishing
            out.extend(call.receive(frame, now))
        return out

    def start(self, now: float) -> list[bytes]:
        return self._advance(self._begin(now), now) if self.tensors else []

    def advance(self, now: float) -> list[bytes]:
        """Begin the next call if the current one is over and another tensor is waiting."""
        return self._advance([], now)

    def _advance(self, out: list[bytes], now: float) -> list[bytes]:
        call = self.current
        while call is not None and call.done and call.error is None and len(self.calls) < len(self.tensors):
            out.extend(self._begin(now))
            call = self.current
        return out

    def receive(self, frame: bytes, now: float) -> list[bytes]:
        out: list[bytes] = []
        if len(self.calls) > 1:
            out.extend(self.calls[-2].receive(frame, now))
        call = self.current
        if call is not None:
            out.extend(call.receive(frame, now))
        return self._advance(out, now)

    def next_deadline(self) -> float | None:
        call = self.current
        return None if call is None or self.done else call.next_deadline()

    def on_timeout(self, now: float) -> list[bytes]:
        call = self.current
        return [] if call is None else self._advance(list(call.on_timeout(now)), now)
