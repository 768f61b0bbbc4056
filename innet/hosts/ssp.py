"""Training against the PBox as a parameter server: BSP, SSP with a staleness bound, or ASP.

Every worker runs its own loop: compute iteration t (seeded gradients; compute is
time passing, a straggler's slowed), push the gradient's keys to the PBox, pull
the parameters back, start t+1. The PBox adds each push to its parameters at once
(int64, exact) and answers with the parameters when the consistency model allows:

- a push of iteration t is answered once every worker pushed that key up to
  iteration ``t - s`` (``clock = min over workers of iterations pushed >= t + 1 - s``);
  BSP is s = 0 (everyone's iteration t), ASP never waits;
- a worker's read of iteration t then misses at most ``staleness = t + 1 - clock``
  iterations of the slowest worker: 0 under BSP, at most s under SSP (the bound,
  tested), anything under ASP. Each answer carries its clock, so workers record
  the staleness they saw;
- after its last iteration a worker pushes an empty iteration T and is answered
  under BSP: every worker ends with the same parameters, the exact sum of all
  workers' gradients of all iterations, which is what the run checks.

Fixed point: one exponent for the whole run (max over workers of their
gradients' magnitude, agreed in a first round through the PBox), scaled so the
sum of N workers x T iterations fits int32. A push waiting for stragglers is
acknowledged (a result with no values), so it is not retransmitted; an
acknowledged key is probed again only after a quarter of the no-progress timeout.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from innet.errors import AllreduceTimeout
from innet.hosts.endpoint import Frames
from innet.hosts.job import JobSpec
from innet.hosts.recovery import RetransmitTimer
from innet.wire import fixedpoint
from innet.wire.packet import RESULT, RETX, ROUTE, make_packet, parse_frame

CONSISTENCY = ("bsp", "ssp", "asp")


@dataclass(frozen=True)
class Consistency:
    """How a PBox job's pushes are answered: ``model`` bsp|ssp|asp, ``staleness`` s for ssp."""

    model: str = "bsp"
    staleness: int = 0
    iterations: int = 1  # T: training iterations (the keys' pushes 0..T-1, then the final T)
    length: int = 0  # elements of each iteration's gradient

    @property
    def bound(self) -> float:
        return {"bsp": 0, "ssp": self.staleness, "asp": float("inf")}[self.model]

    @property
    def json_bound(self) -> int | None:
        """The bound as results.json says it (None: ASP's, none)."""
        return None if self.model == "asp" else int(self.bound)

    def keys(self, elements: int) -> int:
        return -(-self.length // elements)


class ParameterKeys:
    """A PBox's parameters of one job, its keys' clocks, and the pushes waiting to be answered."""

    def __init__(self, members: dict[int, int], elements: int, slots: int, node: int, job: int, cons: Consistency) -> None:
        self.members, self.elements, self.slots, self.node, self.job, self.cons = members, elements, slots, node, job, cons
        keys = cons.keys(elements)
        self.params = np.zeros((keys, elements), np.int64)
        self.pushed = np.zeros((max(members) + 1 if members else 0, keys), np.int64)  # rank x key: iterations in
        self.waiting: dict[int, list[tuple[int, int]]] = {}  # key -> (rank, iteration) not yet answered
        self.exps: dict[int, int] = {}
        self.agreed = False

    def clock(self, key: int) -> int:
        return int(self.pushed[sorted(self.members), key].min())

    def _ready(self, key: int, t: int) -> bool:
        need = t + 1 if t >= self.cons.iterations else t + 1 - self.cons.bound  # the final read is BSP
        return self.clock(key) >= need

    def _answer(self, rank: int, t: int, key: int) -> bytes:
        """Push (rank, t) of ``key`` answered: the key's clock, then its parameters."""
        n = min(self.elements, self.cons.length - key * self.elements)
        return self._ack(rank, t, key, np.concatenate([[self.clock(key)], self.params[key, :n]]).astype(np.int32))

    def _ack(self, rank: int, t: int, key: int, values: np.ndarray | None = None) -> bytes:
        """Push (rank, t) of ``key`` acknowledged (no values: its answer waits), or answered with ``values``."""
        chunk = 1 + t * len(self.params) + key
        return make_packet(values, job=self.job, rank=rank, chunk=chunk, slot=key % self.slots, flags=RESULT | ROUTE,
                           nworkers=len(self.members)).to_frame(self.node, self.members[rank])

    def receive(self, rank: int, chunk: int, exp: int, values: np.ndarray) -> list[bytes]:
        """A worker's exponent (chunk 0) or push; what to send back."""
        if chunk == 0:  # the exponent round: answered once every worker said its exponent
            self.exps[rank] = exp
            if len(self.exps) < len(self.members):
                return []
            targets = [rank] if self.agreed else sorted(self.members)  # later: a worker that missed the answer
            self.agreed = True
            agreed = make_packet(None, job=self.job, chunk=0, flags=RESULT | ROUTE, exp=max(self.exps.values()),
                                 nworkers=len(self.members))
            return [agreed.replace(rank=r).to_frame(self.node, self.members[r]) for r in targets]
        t, key = divmod(chunk - 1, len(self.params))
        if t > self.cons.iterations or len(values) > self.elements or t > self.pushed[rank, key]:
            return []  # malformed, or a push from the future (its worker cannot have read the one before)
        waiting = self.waiting.setdefault(key, [])
        if t < self.pushed[rank, key]:  # a retransmission: answer again, or acknowledge again
            return [self._ack(rank, t, key) if (rank, t) in waiting else self._answer(rank, t, key)]
        self.params[key, : len(values)] += values
        self.pushed[rank, key] += 1
        waiting.append((rank, t))
        out, self.waiting[key] = [], []
        for r, it in waiting:
            if self._ready(key, it):
                out.append(self._answer(r, it, key))
            else:
                self.waiting[key].append((r, it))
        if (rank, t) in self.waiting[key]:
            out.append(self._ack(rank, t, key))
        return out


class SSPWorker:
    """One worker's training loop against the PBox (see module doc). Sans-I/O, like every endpoint."""

    def __init__(self, spec: JobSpec, tensors: Sequence[np.ndarray], compute: list[float], cons: Consistency) -> None:
        """``tensors``: each iteration's gradient, read when its compute starts (a lazy sequence, such as a
        learner's, may say the run's exponent up front: ``bound_exponent()``)."""
        assert spec.pbox is not None
        self.spec, self.cons, self.compute = spec, cons, compute
        self.tensors = tensors
        self.keys = cons.keys(spec.elements)
        bound = getattr(tensors, "bound_exponent", None)
        self.local_exp = bound() if bound is not None else max(
            (fixedpoint.magnitude_exponent(np.asarray(t, np.float32)) for t in tensors), default=fixedpoint.EXP_MIN)
        self.timer = RetransmitTimer(spec)
        self.scale: int | None = None
        self.quantized: list[np.ndarray] = []
        self.t = -1  # the iteration being pushed (-1: agreeing on the exponent)
        self.ready_at: float | None = None  # when iteration t's gradient is computed (None: pushing)
        self.sent_at: dict[int, float] = {}  # key -> when its push went out (unacknowledged)
        self.acked: dict[int, float] = {}  # key -> when to probe it again (acknowledged, not answered)
        self.answered: set[int] = set()
        self.next_key = 0
        self.final = np.zeros(cons.length, np.int64)
        self.read = np.zeros(cons.length, np.int64)  # the parameters as last read, key by key
        self.staleness: list[int] = []  # per answered read of iterations 0..T-1
        self.started: list[float] = []  # per iteration: when its compute started
        self.finished: list[float] = []  # per iteration: when its last read came back
        self.retransmissions = 0
        self.last_progress = 0.0
        self.error: Exception | None = None
        self.done_at: float | None = None

    @property
    def done(self) -> bool:
        return self.done_at is not None or self.error is not None

    def _frame(self, chunk: int, values: np.ndarray | None = None, exp: int = 0, flags: int = 0) -> bytes:
        spec = self.spec
        pkt = make_packet(values, job=spec.job, rank=spec.rank, nworkers=spec.nworkers, chunk=chunk,
                          slot=(chunk - 1) % self.keys % spec.slots if chunk else 0, exp=exp, flags=ROUTE | flags)
        return pkt.to_frame(spec.node, spec.pbox or 0)

    def _push(self, key: int, flags: int = 0) -> bytes:
        t = self.t
        values = None
        if t < self.cons.iterations:
            values = self.quantized[t][key * self.spec.elements : (key + 1) * self.spec.elements]
        return self._frame(1 + t * self.keys + key, values, flags=flags)

    def start(self, now: float) -> Frames:
        self.last_progress = now
        self.sent_at[-1] = now
        return [self._frame(0, exp=self.local_exp)]

    def _compute(self, now: float) -> None:
        """Iteration t + 1's compute starts (or the final read, which computes nothing)."""
        self.t += 1
        self.sent_at, self.acked, self.answered, self.next_key = {}, {}, set(), 0
        self.started.append(now)
        if self.t < self.cons.iterations:
            assert self.scale is not None
            tensor = np.ascontiguousarray(self.tensors[self.t], np.float32).ravel()
            self.quantized.append(fixedpoint.quantize(tensor, self.scale))
        self.ready_at = now + (self.compute[self.t] if self.t < self.cons.iterations else 0.0)

    def _fill(self, now: float) -> Frames:
        out: Frames = []
        while len(self.sent_at) + len(self.acked) < self.spec.slots and self.next_key < self.keys:
            out.append(self._push(self.next_key))
            self.sent_at[self.next_key] = now
            self.next_key += 1
        return out

    def receive(self, frame: bytes, now: float) -> Frames:
        pkt = parse_frame(frame)
        if (self.done or pkt is None or not pkt.has(RESULT) or pkt.job != self.spec.job or pkt.rank != self.spec.rank
                or pkt.src != self.spec.pbox):
            return []
        if pkt.chunk == 0:
            if self.t >= 0:
                return []
            self.last_progress = now
            self.sent_at = {}
            self.scale = fixedpoint.scale_for(pkt.exp, self.spec.nworkers * self.cons.iterations)
            self._compute(now)
            return []
        t, key = divmod(pkt.chunk - 1, self.keys)
        if t != self.t or key in self.answered or self.ready_at is not None:
            return []
        self.last_progress = now
        if key in self.sent_at and key not in self.acked:
            self.timer.sample(now - self.sent_at[key])
        self.sent_at.pop(key, None)
        if pkt.count == 0:  # acknowledged: the answer waits for slower workers
            self.acked[key] = now + self.spec.timeout / 4
            return self._fill(now)
        self.acked.pop(key, None)
        self.answered.add(key)
        values = pkt.values[1:].astype(np.int64)
        self.read[key * self.spec.elements : key * self.spec.elements + len(values)] = values
        if t == self.cons.iterations:
            self.final[key * self.spec.elements : key * self.spec.elements + len(values)] = values
        else:
            self.staleness.append(t + 1 - int(pkt.values[0]))
        out = self._fill(now)
        if len(self.answered) == self.keys:
            self.finished.append(now)
            if t == self.cons.iterations:
                self.done_at = now
            else:
                self._compute(now)
        return out

    def read_values(self) -> np.ndarray:
        """The parameters (the sum of every gradient pushed) as this worker last read them, in float."""
        assert self.scale is not None
        return fixedpoint.dequantize(self.read, self.scale)

    def next_deadline(self) -> float | None:
        if self.done:
            return None
        if self.ready_at is not None:
            return self.ready_at
        due = [s + self.timer.rto for s in self.sent_at.values()] + list(self.acked.values())
        return min([*due, self.last_progress + self.spec.timeout])

    def on_timeout(self, now: float) -> Frames:
        if self.done:
            return []
        if self.ready_at is not None and now >= self.ready_at:
            self.ready_at = None
            self.last_progress = now
            return self._fill(now)
        if now >= self.last_progress + self.spec.timeout:
            self.error = AllreduceTimeout(f"job {self.spec.job} rank {self.spec.rank}: no answer from the PBox for "
                                          f"{self.spec.timeout:g}s in iteration {self.t}")
            return []
        out: Frames = []
        for key, sent in list(self.sent_at.items()):
            if sent + self.timer.rto <= now:
                out.append(self._frame(0, exp=self.local_exp) if key < 0 else self._push(key, RETX))
                self.sent_at[key] = now
        for key, probe in list(self.acked.items()):
            if probe <= now:
                out.append(self._push(key, RETX))
                self.acked[key] = now + self.spec.timeout / 4
        if out:
            self.timer.expired()
            self.retransmissions += len(out)
        return out
