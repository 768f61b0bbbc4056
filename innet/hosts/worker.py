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
3. a lost chunk is retransmitted: once it is a retransmission timeout old and
   the result of a chunk sent a reordering window after it came back (RACK),
   else when no result at all came for a retransmission timeout (RFC 6298:
   SRTT + 4 RTTVAR, Karn's rule, initial 1 s, the timer restarted by every
   result, so a queue that grows behind a slow link is not taken for a loss).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from innet.errors import AllreduceAborted, AllreduceTimeout
from innet.hosts.recovery import UNSENT, HostQueue, Rack, Undo
from innet.hosts.training import ShardedClock, Training, TrainingClock, clock_of
from innet.switch.routed import mark, replica_mark
from innet.wire.collectives import COLLECTIVES
from innet.wire.operators import SUM, Operator
from innet.wire.packet import (
    ABORT,
    FLAGS_OFFSET,
    HEADER_DTYPE,
    OVERFLOW,
    PAYLOAD_OFFSET,
    RESULT,
    RETX,
    ROUTE,
    SPARSE,
    VALUE_DTYPE,
    VER,
    FrameBlock,
    build_frames,
    frame_fields,
    frame_prefix,
    pack_frames,
    parse_block,
)
from innet.wire.sparse import decode, encode

Frames = list[bytes | np.ndarray]  # what a host endpoint sends: frames, and blocks of equal-length frames (rows)


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
    initial_rto: float = 1.0  # RFC 6298's: the first window may queue behind a slow link
    timeout: float = 10.0
    reorder_window: float = 0.0  # how long reordering may hold a frame back (innet.planning.configs.reorder_window)
    pbox: int | None = None  # set: send every chunk to this PBox node instead of into the network
    sparse: bool = False  # send a chunk as (index, value) pairs when that is shorter (innet.wire.sparse)
    band: int = 0  # the priority band (DSCP) of every frame the worker sends (0: most urgent)
    operator: Operator = SUM  # what the job reduces with: its fixed-point rule decides what workers agree on
    collective: str = "allreduce"  # innet.wire.collectives: what goes in, and which ranks each result goes to
    root: int = 0  # broadcast's and reduce's root rank
    reorder: float = 0.0  # seconds results may come back out of order by design (switches that hold partials)
    lossy: bool = False  # the run's links lose frames: a tail probe may come before this call has lost anything
    nic_bps: float = 0.0  # this host's link rate: a frame still queued here is not sent again (0: not known)

    def __post_init__(self) -> None:
        if isinstance(self.operator, dict):  # from JSON
            object.__setattr__(self, "operator", Operator(**self.operator))

    def as_input(self, tensor: Any) -> np.ndarray:
        """A caller's tensor as the worker holds it: float32, or int32 bit patterns for a bit operator."""
        return np.ascontiguousarray(tensor, np.int32 if self.operator.rule == "bits" else np.float32).ravel()

    def chunks(self, length: int) -> int:
        """Chunks one call uses for a tensor of ``length`` (one more for the exponent)."""
        return 1 + -(-length // self.elements)


def first_window_rto(spec: JobSpec) -> float:
    """The RTO of a call's first window of data, before its first answer: a window may queue behind a slow
    link or a hundred other workers' windows, so the initial RTO only if larger than the RTO's cap (a 32nd
    of the no-progress timeout, what RFC 6298's 1 s came to here). The lone exponent packet before it takes
    ``spec.initial_rto``, the plan's few round trips."""
    return max(spec.initial_rto, spec.timeout / 32)


class RetransmitTimer:
    """Adaptive retransmission timeout: SRTT + 4 RTTVAR (RFC 6298), Karn's rule, back-off.

    The back-off is capped so that ~32 tries fit in the no-progress timeout.
    """

    def __init__(self, spec: JobSpec, initial: float | None = None) -> None:
        self.spec = spec
        self.initial = spec.initial_rto if initial is None else initial  # the RTO before a sample
        self.srtt: float | None = None
        self.rttvar = 0.0
        self.backoff = 1
        self._update()

    def _update(self) -> None:
        """Recompute ``rto`` (read a few times per result; it changes only with a sample or an expiry)."""
        base = self.initial if self.srtt is None else 2 * self.srtt + 4 * self.rttvar
        self.rto = min(max(self.spec.min_rto, base) * self.backoff, max(self.spec.min_rto, self.spec.timeout / 32))

    def sample(self, rtt: float) -> None:
        self.backoff = 1
        if self.srtt is None:
            self.srtt, self.rttvar = rtt, rtt / 2
        else:
            self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - rtt)
            self.srtt = 0.875 * self.srtt + 0.125 * rtt
        self._update()

    def expired(self) -> None:
        self.backoff = min(self.backoff * 2, 64)
        self._update()

    def progress(self) -> None:
        """An answer to a retransmission: the path carries again, so the back-off ends (as Linux's does on
        an ACK of new data) though Karn's rule keeps the answer out of SRTT."""
        if self.backoff != 1:
            self.backoff = 1
            self._update()


class Resident:
    """Tensor-sized arrays written page by page before the all-reduce starts, for the calls to take.

    A fresh process's first write to a tensor-sized array faults in every page of it: 0.13 s for the
    120 MB of a 30M-value result here (a tenth of that all-reduce at 1000 Mbit/s), and the run timed it
    as the network's. A training loop has its buffers in memory from its second iteration on, so a worker
    that knows its tensors makes its calls' buffers resident before "go" (``WorkerProcess.prepare``); a
    call takes one of the shape it needs, or allocates its own."""

    def __init__(self) -> None:
        self.free: dict[tuple[tuple[int, ...], str], list[np.ndarray]] = {}

    def add(self, shape: tuple[int, ...], dtype: Any) -> None:
        array = np.empty(shape, dtype)
        array.fill(0)
        self.free.setdefault((shape, np.dtype(dtype).str), []).append(array)

    def take(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """Zeros of ``shape``: a resident array, if one was made, else a new one."""
        arrays = self.free.get((shape, np.dtype(dtype).str))
        return arrays.pop() if arrays else np.zeros(shape, dtype)


class AllreduceCall:
    """One worker's part of one in-network all-reduce (see module doc).

    The window is kept per slot (a slot holds at most one chunk in flight, its
    result frees it), as numpy arrays, so a block of results is taken with a
    few array operations. Every data chunk's frame is built in one go once the
    scale is agreed; sending chunks ``a..b`` is then a slice of that array.
    """

    def __init__(self, spec: JobSpec, tensor: np.ndarray, first_chunk: int, resident: Resident | None = None) -> None:
        self.spec = spec
        self.tensor = spec.as_input(tensor)
        self.resident = resident or Resident()
        padded, self._frames_shape = self.buffers(spec, len(self.tensor))
        self.first = first_chunk
        self.end = first_chunk + spec.chunks(len(self.tensor))
        self.local_exp = spec.operator.exponent(self.tensor)
        self.scale: int | None = None
        self._q = 0
        self._padded = self.resident.take(padded, np.int32)  # the wire's int32 sums
        self.result_int = self._padded[: len(self.tensor)]
        self.in_flight = np.full(spec.slots, -1, np.int64)  # the chunk each slot carries, -1: free
        self.sent_at = np.full(spec.slots, np.inf)
        self._oldest: float | None = None  # sent_at.min(), when the one-frame path just found it (else None)
        self.resent = np.zeros(spec.slots, np.bool_)
        self.sent_seq = np.full(spec.slots, UNSENT, np.int64)  # each slot's transmission number (RACK's order)
        self.seq = 0  # transmissions so far: a later number was sent later
        self.owed_at = np.full(spec.slots, -np.inf)  # the soonest the last retransmission's own answer can come
        self.suspect_at = np.full(spec.slots, np.inf)  # when a result for a later transmission first came back
        self.by_order = np.zeros(spec.slots, np.bool_)  # the last retransmission was RACK's (not a timer's)
        self.first_suspect = np.full(spec.slots, np.inf)  # suspect_at before any retransmission of the chunk
        self.left_at = np.full(spec.slots, -np.inf)  # when each slot's last frame leaves this host (``_queue``)
        self.host = HostQueue(spec.nic_bps)  # this host's link: when each frame of this call handed to it leaves
        self.host_queued = 0  # retransmissions not made: the last copy was still in this host's queue
        self.undo = Undo(spec.slots)
        self.rack = Rack(spec.min_rto, spec.reorder_window, spec.reorder, quarter=spec.lossy)  # by design: no evidence of loss
        self.newest_seq = -1  # the newest transmission whose result came back
        self.pace = 0.0  # smoothed time between results: how fast the window drains
        self.probes = 0  # tail probes since the last result
        self.probed_at = -np.inf  # the last tail probe
        self.frames = np.zeros((0, 0), np.uint8)  # row i: data chunk first + 1 + i (full chunks only)
        self.built = 0  # rows of ``frames`` built so far (innet.hosts.worker.AllreduceCall._ensure)
        self.tail = np.zeros((0, 0), np.uint8)  # the last data chunk's frame when it is shorter than the others
        self.sparse: list[bytes] = []  # with spec.sparse: every data chunk's frame, each in its shorter form
        self.timer = RetransmitTimer(spec)
        self.sent_all = False  # the last chunk has been sent (so every chunk has: each follows its slot's last)
        self.retransmissions = 0
        self.spurious = 0  # retransmissions whose result came back sooner than a round trip could (the original's)
        self.started_at: float | None = None
        self.finished_at: float | None = None
        self.last_progress = 0.0
        self.error: Exception | None = None
        chunks = self.end - self.first - 1  # a collective's rank for each data chunk (innet.switch.routed)
        collective = COLLECTIVES[spec.collective]
        self._dest = collective.dest(chunks, spec.nworkers, spec.root)  # the one rank its values go to
        source = collective.source(chunks, spec.nworkers, spec.root)  # the one rank that sends its values
        self._header_only = None if source is None else source != spec.rank

    @staticmethod
    def buffers(spec: JobSpec, length: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The shapes of a call's tensor-sized arrays for a tensor of ``length`` values: its int32 results
        (whole chunks), and its full chunks' frames (uint8 rows)."""
        return ((spec.chunks(length) - 1) * spec.elements,), (length // spec.elements, PAYLOAD_OFFSET + 4 * spec.elements)

    @property
    def done(self) -> bool:
        return self.finished_at is not None or self.error is not None

    @property
    def result(self) -> np.ndarray:
        assert self.scale is not None
        return self.spec.operator.dequantize(self.result_int, self.scale)

    def waiting(self) -> str:
        """What this call waits for, for a progress line: its oldest chunk still unanswered."""
        out = self.in_flight[self.in_flight >= 0]
        if self.done or not len(out):
            return ""
        scheme, peer = ("PBox", "the PBox") if self.spec.pbox is not None else ("in-network", "its switch")
        return (f"{scheme}: rank {self.spec.rank} waiting for chunk {int(out.min()) - self.first} from {peer}, "
                f"{self.retransmissions} retransmissions")

    @property
    def rto(self) -> float:
        return self.timer.rto

    @property
    def _peer(self) -> int:
        """The node this worker sends to and hears results from: its switch, or the PBox."""
        return self.spec.first_hop if self.spec.pbox is None else self.spec.pbox

    def _header(self, chunks: np.ndarray, counts: np.ndarray | int, exp: int) -> np.ndarray:
        spec = self.spec
        hdr = np.zeros(len(chunks), HEADER_DTYPE)
        hdr["job"], hdr["rank"], hdr["nworkers"], hdr["exp"], hdr["count"] = spec.job, spec.rank, spec.nworkers, exp, counts
        data = chunks > self.first
        if self._dest is not None:  # each data chunk marked with the one rank its result is for
            hdr["nworkers"][data] = mark(spec.nworkers, self._dest[chunks[data] - self.first - 1])
        if self._header_only is not None:  # or as one whose values one rank gives (``_headers``)
            hdr["nworkers"][data] = replica_mark(spec.nworkers)
        hdr["slot"], hdr["chunk"] = chunks % spec.slots, chunks
        hdr["flags"] = np.where((chunks // spec.slots) & 1, VER, 0) | (ROUTE if spec.pbox is not None else 0)
        return hdr

    def _build(self, exp: int) -> None:
        """Take the agreed exponent: the scale, and the data chunks' frames (full chunks a window at a time,
        as sending reaches them: ``_ensure``)."""
        spec, n = self.spec, len(self.tensor)
        if self.timer.srtt is None:  # the lone exponent packet is answered: now a whole window may queue
            self.timer = RetransmitTimer(spec, first_window_rto(spec))
        self._q = exp
        self.scale = spec.operator.scale(exp, spec.nworkers)
        if spec.sparse:
            self._build_sparse(spec.operator.quantize(self.tensor, self.scale), exp)
            return
        full = n // spec.elements
        self.frames = self.resident.take(self._frames_shape, np.uint8)
        if n % spec.elements:
            last = np.array([self.end - 1])
            hdr = self._header(last, n % spec.elements, exp)
            tail = spec.operator.quantize(self.tensor[full * spec.elements :], self.scale)
            self.tail = build_frames(spec.node, self._peer, hdr, tail[None], spec.band)

    def _ensure(self, upto: int) -> None:
        """Build full chunks' frames up to row ``upto`` (exclusive), a window or more at a time: a worker's
        start-up is then one window's quantizing, not its whole tensor's, and the rest is spread over the call."""
        spec = self.spec
        a, b = self.built, min(len(self.frames), max(upto, self.built + spec.slots))
        if upto <= a or b <= a or self.scale is None or spec.sparse:
            return
        values = spec.operator.quantize(self.tensor[a * spec.elements : b * spec.elements], self.scale)
        hdr = self._header(np.arange(self.first + 1 + a, self.first + 1 + b), spec.elements, self._q)
        build_frames(spec.node, self._peer, hdr, values.reshape(b - a, spec.elements), spec.band, out=self.frames[a:b])
        self.built = b

    def _build_sparse(self, quantized: np.ndarray, exp: int) -> None:
        """Every data chunk's frame, SPARSE where its (index, value) pairs are shorter than its values."""
        elements = self.spec.elements
        chunks = np.arange(self.first + 1, self.end)
        hdr = self._header(chunks, 0, exp)
        for k in range(len(chunks)):
            values = quantized[k * elements : (k + 1) * elements]
            payload = encode(values)
            if payload is None:
                payload = values
            else:
                hdr["flags"][k] |= SPARSE
            hdr["count"][k] = len(payload)
            body = hdr[k].tobytes() + payload.astype("<i4").tobytes()
            self.sparse.append(frame_prefix(self.spec.node, self._peer, len(body), self.spec.band) + body)

    def _headers(self, chunks: np.ndarray, exp: int) -> np.ndarray:
        """Frames of ``chunks`` without values: the exponent chunk's, and a replicating collective's chunks
        another rank gives the values of."""
        hdr = self._header(chunks, 0, exp)
        return build_frames(self.spec.node, self._peer, hdr, np.zeros((len(chunks), 0), np.int32), self.spec.band)

    def _frame(self, chunk: int) -> np.ndarray:
        if chunk == self.first:
            return self._headers(np.array([chunk]), self.local_exp)[0]
        i = chunk - self.first - 1
        if self._header_only is not None and self._header_only[i]:
            return self._headers(np.array([chunk]), self._q)[0]
        if self.sparse:
            return np.frombuffer(self.sparse[i], np.uint8)
        self._ensure(i + 1)
        return self.frames[i] if i < len(self.frames) else self.tail[0]

    def _send(self, chunks: np.ndarray, now: float) -> Frames:
        """Put ``chunks`` (those before the end) in flight, each in its free slot; their frames, as a block."""
        out = self._send_frames(chunks, now)
        self._queue(chunks[chunks < self.end] % self.spec.slots, out, now)
        return out

    def _send_frames(self, chunks: np.ndarray, now: float) -> Frames:
        chunks = chunks[chunks < self.end]
        if not len(chunks):
            return []
        slots = chunks % self.spec.slots
        self.in_flight[slots], self.sent_at[slots], self.resent[slots] = chunks, now, False
        self.sent_seq[slots] = np.arange(self.seq, self.seq + len(chunks))
        self.seq += len(chunks)
        self._oldest = None
        self.sent_all = self.sent_all or int(chunks[-1]) == self.end - 1  # chunks come sorted
        if chunks[0] == self.first:
            return [self._frame(self.first).tobytes()]
        index = chunks - self.first - 1
        if self._header_only is not None and self._header_only[index].any():  # in chunk order, a run at a time
            others = self._header_only[index]
            out: Frames = []
            for run in np.split(np.arange(len(chunks)), np.flatnonzero(np.diff(others)) + 1):
                out += [self._headers(chunks[run], self._q)] if others[run[0]] else self._send_data(chunks[run], index[run])
            return out
        return self._send_data(chunks, index)

    def _send_data(self, chunks: np.ndarray, index: np.ndarray) -> Frames:
        """``_send``'s frames of data chunks ``chunks`` (rows ``index`` of the frames)."""
        if self.sparse:
            return [self.sparse[i] for i in index.tolist()]
        full = index < len(self.frames)
        self._ensure(int(index[full].max()) + 1 if full.any() else 0)
        out: Frames = [self.frames[index[full]]] if full.any() else []
        if not full.all():
            out.append(self.tail)
        return out

    def start(self, now: float) -> Frames:
        self.started_at = self.last_progress = now
        return self._send(np.array([self.first]), now)

    def release(self) -> None:
        """Free every chunk's frame once nothing more will be sent (the network has stopped): only the
        result is read afterwards (a thousand workers' frames are a quarter of a large local run's memory)."""
        self.frames = self.tail = np.zeros((0, 0), np.uint8)
        self.built = 0
        self.sparse = []

    def receive(self, frame: bytes, now: float) -> Frames:
        """``receive_block`` for one frame. The common case, a fresh dense result of a data chunk, is taken
        with plain ints (a large local run hands each worker one result per event); anything else, and any
        frame the fast path cannot rule out, goes through the block path, which ends in the same state."""
        fields = None if self.done else frame_fields(frame)
        if fields is None:
            return []  # what the block path does with it: nothing
        src, _, _, job, _, _, _, chunk, count, flags, _ = fields
        spec = self.spec
        if job != spec.job or src != self._peer or not flags & (RESULT | ABORT):
            return []
        if flags & (ABORT | SPARSE | OVERFLOW) or chunk == self.first:
            return self.receive_block(parse_block(*pack_frames([frame])), now)
        slot = chunk % spec.slots
        offset = (chunk - self.first - 1) * spec.elements
        if self.in_flight[slot] != chunk or count != self._count_of(chunk, offset):
            self._undo(np.array([slot]), np.array([chunk]))
            return []  # stale, a duplicate, or a bad length
        self.in_flight[slot] = -1
        sent = float(self.sent_at[slot])
        self.undo.answered(np.array([slot]), np.array([chunk]), self.resent[slot:slot + 1], now - self.first_suspect[slot:slot + 1])
        if not self.resent[slot]:
            self.timer.sample(now - sent)
            self.rack.sample(now - sent)
            self.rack.reordered(now - float(self.suspect_at[slot]))
        else:
            self._resent_answered(np.array([slot]), now)
        seq = int(self.sent_seq[slot])
        self.first_suspect[slot] = np.inf
        if seq > self.newest_seq:
            self.newest_seq = seq
        self.sent_seq[slot], self.suspect_at[slot], self.sent_at[slot] = UNSENT, np.inf, np.inf
        self._progress(now, 1)
        self._padded[offset : offset + count] = np.frombuffer(frame, VALUE_DTYPE, count, PAYLOAD_OFFSET)
        out = self._send_one(chunk + spec.slots, now)
        out += self._resend(self._lost(now), now, by_order=True)
        if self.sent_all and (self.in_flight < 0).all():
            self.finished_at = now
        return out

    def _send_one(self, chunk: int, now: float) -> Frames:
        """``_send`` for one data chunk, its frame as bytes."""
        if chunk >= self.end:
            return []
        slot = chunk % self.spec.slots
        self.in_flight[slot], self.sent_at[slot], self.resent[slot] = chunk, now, False
        self.sent_seq[slot] = self.seq
        self.seq += 1
        self._oldest = None
        self.sent_all = self.sent_all or chunk == self.end - 1
        i = chunk - self.first - 1
        if self._header_only is not None and self._header_only[i]:
            frame = self._frame(chunk).tobytes()
        elif self.sparse:
            frame = self.sparse[i]
        else:
            self._ensure(i + 1)
            frame = (self.frames[i] if i < len(self.frames) else self.tail[0]).tobytes()
        if self.spec.nic_bps:
            self.left_at[slot] = self.host.leave_one(len(frame), now)
        return [frame]

    def receive_block(self, block: FrameBlock, now: float) -> Frames:
        """Take every result for this call in ``block``; the frames to send in return."""
        if self.done:
            return []
        hdr = block.hdr
        mine = block.ok & (hdr["job"] == self.spec.job) & (block.src == self._peer)
        aborts = np.flatnonzero(mine & (hdr["flags"] & ABORT != 0))
        if len(aborts):
            origin, *missing = block.values(aborts[:1], int(hdr["count"][aborts[0]]))[0].tolist() or [-1]
            self.error = AllreduceAborted(
                f"job {self.spec.job}: rank(s) {', '.join(map(str, missing)) or '?'} sent nothing for "
                f"{self.spec.timeout / 2:g}s; node {origin} aborted the job and freed its slots")
            return []
        rows = np.flatnonzero(mine & (hdr["flags"] & RESULT != 0))
        chunks = hdr["chunk"][rows].astype(np.int64)
        slots = chunks % self.spec.slots
        fresh = (self.in_flight[slots] == chunks) & (self._dense_counts(block, rows) == self._count(chunks))
        self._undo(slots[~fresh], chunks[~fresh])
        chunks, first = np.unique(chunks[fresh], return_index=True)  # a duplicate result counts once
        if not len(chunks):
            return []
        rows, slots = rows[fresh][first], slots[fresh][first]
        self.in_flight[slots] = -1
        resent = self.resent[slots]
        self.undo.answered(slots, chunks, resent, now - self.first_suspect[slots])
        clean = ~resent & (chunks != self.first)  # Karn; the lone exponent packet never queues
        if clean.any():
            rtts = now - self.sent_at[slots][clean]
            self.timer.sample(float(np.max(rtts)))
            self.rack.sample(float(np.min(rtts)))
            self.rack.reordered(float(np.max(now - self.suspect_at[slots][clean])))
        if resent.any():
            self._resent_answered(slots[resent], now)
        self.first_suspect[slots] = np.inf
        self.newest_seq = max(self.newest_seq, int(self.sent_seq[slots].max()))
        self.sent_seq[slots], self.suspect_at[slots], self.sent_at[slots] = UNSENT, np.inf, np.inf
        self._oldest = None
        self._progress(now, len(slots))
        flags = hdr["flags"][rows]
        if (flags & OVERFLOW).any():
            self.error = OverflowError(f"job {self.spec.job}: int32 overflow in chunk {chunks[(flags & OVERFLOW) != 0][0]}")
            return []
        out: Frames = []
        if chunks[0] == self.first:
            self._build(int(hdr["exp"][rows[0]]))
            chunks, rows = chunks[1:], rows[1:]
            out += self._send(np.arange(self.first + 1, self.first + 1 + self.spec.slots), now)
        self._store(block, rows, chunks)
        if self.error is not None:
            return []
        out += self._send(chunks + self.spec.slots, now)  # a result frees its slot for the chunk ``slots`` later
        out += self._resend(self._lost(now), now, by_order=True)
        if self.sent_all and (self.in_flight < 0).all():
            self.finished_at = now
        return out

    @staticmethod
    def _dense_counts(block: FrameBlock, rows: np.ndarray) -> np.ndarray:
        """How many values each row carries once densified (a SPARSE payload starts with it; -1: none)."""
        counts = block.hdr["count"][rows].astype(np.int64)
        sparse = block.hdr["flags"][rows] & SPARSE != 0
        if sparse.any():
            readable = sparse & (counts > 0)
            counts[sparse] = -1
            counts[readable] = block.values(rows[readable], 1)[:, 0]
        return counts

    def _count(self, chunks: np.ndarray) -> np.ndarray:
        """How many values the result of each chunk carries (none for the exponent chunk, nor for a routed
        collective's chunk whose values go to another rank)."""
        elements = self.spec.elements
        counts = np.where(chunks == self.first, 0, np.minimum(elements, len(self.tensor) - (chunks - self.first - 1) * elements))
        if self._dest is not None:
            counts[(chunks > self.first) & (self._dest[np.maximum(chunks - self.first - 1, 0)] != self.spec.rank)] = 0
        return counts

    def _count_of(self, chunk: int, offset: int) -> int:
        """``_count`` of one data chunk at ``offset``."""
        if self._dest is not None and self._dest[chunk - self.first - 1] != self.spec.rank:
            return 0
        return min(self.spec.elements, len(self.tensor) - offset)

    def _store(self, block: FrameBlock, rows: np.ndarray, chunks: np.ndarray) -> None:
        """Write the results' values into place: full chunks at once, the short last one alone."""
        elements = self.spec.elements
        counts = block.hdr["count"][rows]
        sparse = block.hdr["flags"][rows] & SPARSE != 0
        full = (counts == elements) & ~sparse
        if full.any():
            self._padded.reshape(-1, elements)[chunks[full] - self.first - 1] = block.values(rows[full], elements)
        for k in np.flatnonzero(~full):
            off, count = (int(chunks[k]) - self.first - 1) * elements, int(counts[k])
            values = block.values(rows[k : k + 1], count)[0]
            if sparse[k]:
                dense = decode(values, elements)
                if dense is None:
                    self.error = ValueError(f"job {self.spec.job}: malformed sparse result for chunk {int(chunks[k])}")
                    return
                values = dense
            self._padded[off : off + len(values)] = values

    def holdoff(self) -> float:
        """How long a woken worker may let results gather before reading them (interrupt coalescing).

        With at least half the window in flight and chunks still to send, a quarter of the smoothed
        RTT: about a quarter window of results then comes in one block (far fewer wake-ups), and the
        half still in flight keeps the links busy meanwhile. Otherwise nothing: a thin window needs
        every result now, and once every chunk is out, results only end the call, which should be seen at once.
        """
        if (self.timer.srtt is None or self.sent_all
                or np.count_nonzero(self.in_flight >= 0) * 2 < self.spec.slots):
            return 0.0
        return min(self.timer.srtt / 4, self.rto / 8)

    def _progress(self, now: float, results: int) -> None:
        """``results`` fresh results came: the pace at which the window drains, and the timers restart. The pace
        is the time per result while a queue drains, so it is measured only while half the window or more is out:
        from a thin window, results come as its losses are repaired (leaf-spine PBox, 20% loss: a 5 ms pace spaced
        the tail's probes 20 ms apart on a path of 0.5 ms; 283 -> 259 ms, median of seeds 1-11)."""
        gap = (now - self.last_progress) / results
        full = np.count_nonzero(self.in_flight >= 0) * 2 >= min(self.spec.slots, self.end - self.first)
        if gap < self.rto and full:  # nor is a pause (the call's start, a straggler)
            self.pace = gap if not self.pace else 0.875 * self.pace + 0.125 * gap
        self.last_progress = now
        self.probes = 0

    def _probe_due(self) -> float:
        """When to probe the tail (RFC 8985's TLP), once this call has lost something: no result for a reordering
        window plus the time the chunks still out take to drain at the measured pace, doubled once a probe
        goes unanswered (doubled twice, a lossy tail waited 20 ms per probe where a round trip takes 0.5 ms:
        leaf-spine PBox, 20% loss, 259 -> 240 ms, median of seeds 1-11). The first two resend every chunk out;
        mid-stream the RTO follows, but once every chunk is sent the probes go on, each with only the newest chunk
        out (RFC 8985's TLP: its answer marks the older ones lost), so a lost tail costs round trips, not backed-off
        RTOs.
        Before any loss, only where the run's links lose and a round trip is measured: a fault-free run is never
        probed. Nor is a first window before its first answer (its RTO covers it: its queue is unknown)."""
        probing = self.retransmissions or (self.spec.lossy and self.timer.srtt is not None)
        if not probing or self.sent_at.min() == np.inf or (self.scale is not None and self.timer.srtt is None):
            return np.inf
        out = np.count_nonzero(self.in_flight >= 0)
        backoff = 1 if self.scale is None else 2 ** min(self.probes, 1)  # the lone exponent packet: no queue to spare
        spell = (self.rack.window(self.timer.srtt) + out * self.pace) * backoff
        return max(self.last_progress, self.probed_at) + spell

    def _lost(self, now: float) -> np.ndarray:
        """Slots whose chunk was sent before one whose result came back, and that stayed unanswered for a
        reordering window since that evidence came (RACK by order: innet.hosts.recovery)."""
        if self.sent_seq.min() >= self.newest_seq:  # nothing outstanding older than the newest answered
            return np.zeros(0, np.int64)
        fresh = (self.sent_seq < self.newest_seq) & (self.suspect_at == np.inf)
        self.suspect_at[fresh] = now
        self.first_suspect[fresh] = np.minimum(self.first_suspect[fresh], now)
        return np.flatnonzero(self.suspect_at + self.rack.window(self.timer.srtt) <= now)

    def _resent_answered(self, slots: np.ndarray, now: float) -> None:
        """Answers for the retransmitted chunks in ``slots``. A retransmission queues behind every chunk out before
        it, so where the run reorders, an answer sooner than those could drain (at half the measured pace, after a
        minimum round trip: ``owed_at``; elsewhere within a minimum round trip, as RFC 8985 has it) was the
        original's, late: the retransmission was spurious. It is counted and widens the reordering window (as
        DSACK does in RFC 8985: an incast queue makes one late contribution tens of ms late)."""
        early = now < self.owed_at[slots]
        for slot in slots[early].tolist():
            self.spurious += 1
            self.rack.spurious(bool(self.by_order[slot]), now - float(self.first_suspect[slot]))
        self.undo.late[slots[early]] = np.nan  # counted: a second answer will not prove it again

    def _undo(self, slots: np.ndarray, chunks: np.ndarray) -> None:
        """Stale answers: each that proves a retransmission spurious (``Undo``) counts, and widens the window."""
        for late in self.undo.duplicates(slots, chunks).tolist():
            self.spurious += 1
            if self.rack.reorder:
                self.rack.reordered(late)

    def next_deadline(self) -> float | None:
        if self.finished_at is not None or self.error is not None:  # done (asked after every result)
            return None
        # the backstop timer restarts whenever a result makes progress (RFC 6298 5.3): a queue that
        # grows behind a slow link is not a loss
        oldest = max(float(self.sent_at.min()) if self._oldest is None else self._oldest, self.last_progress)
        give_up = self.last_progress + self.spec.timeout
        return min(oldest + self.rto, give_up, float(self.suspect_at.min()) + self.rack.window(self.timer.srtt),
                   self._probe_due())

    def on_timeout(self, now: float) -> Frames:
        if self.done:
            return []
        if now >= self.last_progress + self.spec.timeout:  # the very sum next_deadline gave, so no float gap
            outstanding = np.sort(self.in_flight[self.in_flight >= 0])
            self.error = AllreduceTimeout(
                f"job {self.spec.job} rank {self.spec.rank}: no result for {self.spec.timeout:g}s "
                f"(chunks {outstanding[:4].tolist()}... outstanding)"
            )
            return []
        out = self._resend(self._lost(now), now, by_order=True)
        if now >= self._probe_due():  # every chunk still out: each may have lost its contribution or its result
            self.probes += 1
            self.probed_at = now
            if self.probes > 2:  # the tail, probed again: only the newest chunk out, whose answer marks the rest (RACK)
                return out + self._resend(np.array([int(np.argmax(np.where(self.in_flight >= 0, self.sent_seq, -1)))]), now)
            return out + self._resend(np.flatnonzero(self.in_flight >= 0), now)
        if now < self.last_progress + self.rto:
            return out
        expired = np.flatnonzero(self.sent_at + self.rto <= now)
        if len(expired):
            self.timer.expired()
        return out + self._resend(expired, now)

    def _resend(self, slots: np.ndarray, now: float, by_order: bool = False) -> Frames:
        """Retransmit the chunks in ``slots`` (oldest first), flagged RETX."""
        out: Frames = []
        if not len(slots):
            return out
        slots = slots[np.argsort(self.in_flight[slots])]
        if self.spec.nic_bps and (self.left_at[slots] > now).any():
            queued = self.left_at[slots] > now  # the last copy is still in this host's queue: nothing to resend yet
            self.suspect_at[slots[queued]] = np.inf  # (order may ask again once it has left)
            self.host_queued += int(np.count_nonzero(queued))
            slots = slots[~queued]
            if not len(slots):
                return out
        ahead = np.count_nonzero((self.in_flight >= 0) & (self.suspect_at == np.inf)) - np.count_nonzero(self.suspect_at[slots] == np.inf)
        rtt = self.rack.min_rtt if self.rack.min_rtt < np.inf else 0.0
        self.owed_at[slots] = now + rtt + (0.5 * ahead * self.pace if self.rack.reorder else 0.0)
        for slot in slots:
            frame = np.array(self._frame(int(self.in_flight[slot])))
            frame[FLAGS_OFFSET] |= RETX
            out.append(frame.tobytes())
        self.sent_at[slots], self.resent[slots], self.suspect_at[slots] = now, True, np.inf
        self.by_order[slots] = by_order
        self.sent_seq[slots] = np.arange(self.seq, self.seq + len(slots))
        self.seq += len(slots)
        self._oldest = None
        self.retransmissions += len(slots)
        self._queue(slots, out, now)
        return out

    def _queue(self, slots: np.ndarray, frames: Frames, now: float) -> None:
        """``frames`` (one per slot of ``slots``, in order) were handed to this host's link: when each will have
        left (``HostQueue``). A chunk whose last copy has not is not retransmitted (``_resend``)."""
        if not self.spec.nic_bps or not len(slots):
            return
        sizes = np.concatenate([np.full(len(f), f.shape[1]) if isinstance(f, np.ndarray) and f.ndim == 2 else [len(f)]
                                for f in frames])[:len(slots)]
        ends = self.host.leave(sizes, now)
        self.left_at[slots[:len(ends)]] = ends


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
            padded, frames = AllreduceCall.buffers(self.spec, int(np.size(tensor)))
            self.resident.add(padded, np.int32)
            if not self.spec.sparse:
                self.resident.add(frames, np.uint8)

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
