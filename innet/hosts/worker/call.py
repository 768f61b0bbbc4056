"""One worker's part of one in-network (or PBox) all-reduce, as a sans-I/O state machine.

``AllreduceCall`` takes frames in and gives frames out, with a clock passed in, so the in-process fabric
(virtual time) and a Mininet host (raw socket, wall clock) drive the very same code.

Protocol (SwitchML, with an in-network exponent agreement first):
1. chunk ``first`` carries no values, only this worker's magnitude exponent;
   the switches return the max, from which every worker derives the same scale;
2. the quantized tensor streams through the job's slots, ``elements`` values a
   chunk, at most ``slots`` chunks in flight; the result of chunk ``c`` frees
   its slot for chunk ``c + slots``;
3. a lost chunk is retransmitted (``Window``: by order, a timer, or a tail probe).

The call holds the data: its tensor, what its frames carry (``ChunkFrames``) and the results it takes in;
its ``Window`` holds the slots, and what to resend when.
"""

from __future__ import annotations

import numpy as np

from innet.errors import AllreduceAborted, AllreduceTimeout
from innet.hosts.endpoint import Frames
from innet.hosts.job import JobSpec
from innet.hosts.worker.framing import ChunkFrames, Resident, buffers
from innet.hosts.worker.window import Window
from innet.wire.packet import (
    ABORT,
    OVERFLOW,
    PAYLOAD_OFFSET,
    RESULT,
    SPARSE,
    VALUE_DTYPE,
    FrameBlock,
    frame_fields,
    pack_frames,
    parse_block,
)
from innet.wire.sparse import decode


class AllreduceCall:
    """One worker's part of one in-network all-reduce (see module doc)."""

    def __init__(self, spec: JobSpec, tensor: np.ndarray, first_chunk: int, resident: Resident | None = None) -> None:
        self.spec = spec
        self.tensor = spec.as_input(tensor)
        resident = resident or Resident()
        self.first = first_chunk
        self.end = first_chunk + spec.chunks(len(self.tensor))
        self.local_exp = spec.operator.exponent(self.tensor)
        self._padded = resident.take(buffers(spec, len(self.tensor))[0], np.int32)  # the wire's int32 sums
        self.result_int = self._padded[: len(self.tensor)]
        self.frames = ChunkFrames(spec, self.tensor, first_chunk, self.local_exp, resident)
        self.window = Window(spec, first_chunk, self.end, self.frames.frame)
        self.started_at: float | None = None
        self.finished_at: float | None = None
        self.error: Exception | None = None
        self.misshapen = ""  # an answer to a chunk in flight that carried the wrong number of values, if one came

    @property
    def done(self) -> bool:
        return self.finished_at is not None or self.error is not None

    @property
    def scale(self) -> int | None:
        return self.frames.scale

    @property
    def result(self) -> np.ndarray:
        assert self.scale is not None
        return self.spec.operator.dequantize(self.result_int, self.scale)

    @property
    def rto(self) -> float:
        return self.window.rto

    @property
    def retransmissions(self) -> int:
        return self.window.retransmissions

    @property
    def spurious(self) -> int:
        return self.window.spurious

    @property
    def host_queued(self) -> int:
        return self.window.host_queued

    def waiting(self) -> str:
        """What this call waits for, for a progress line: its oldest chunk still unanswered."""
        in_flight = self.window.in_flight
        out = in_flight[in_flight >= 0]
        if self.done or not len(out):
            return ""
        scheme, peer = ("PBox", "the PBox") if self.spec.pbox is not None else ("in-network", "its switch")
        return (f"{scheme}: rank {self.spec.rank} waiting for chunk {int(out.min()) - self.first} from {peer}, "
                f"{self.retransmissions} retransmissions")

    def holdoff(self) -> float:
        """``Window.holdoff``: how long a woken worker may let results gather before reading them."""
        return self.window.holdoff()

    def _agree(self, exp: int) -> None:
        """Take the agreed exponent: the scale, the data chunks' frames, and a data window's RTO."""
        self.window.agree()
        self.frames.build(exp)

    def start(self, now: float) -> Frames:
        """The exponent chunk's frame; the data frames' headers are written while its round trip is in flight."""
        self.started_at = self.window.last_progress = now
        out = self._send(np.array([self.first]), now)
        self.frames.prepare()
        return out

    def release(self) -> None:
        """``ChunkFrames.release``: only the result is read once the network has stopped."""
        self.frames.release()

    # -- sending --------------------------------------------------------------
    def _send(self, chunks: np.ndarray, now: float) -> Frames:
        """Put ``chunks`` (those before the end) in flight, each in its free slot; their frames, as a block."""
        chunks = chunks[chunks < self.end]
        if not len(chunks):
            return []
        out = self.frames.of(chunks)
        self.window.put(chunks, out, now)
        return out

    def _send_one(self, chunk: int, now: float) -> Frames:
        """``_send`` for one data chunk, its frame as bytes."""
        if chunk >= self.end:
            return []
        frame = self.frames.one(chunk)
        self.window.put_one(chunk, len(frame), now)
        return [frame]

    # -- receiving ------------------------------------------------------------
    def receive(self, frame: bytes, now: float) -> Frames:
        """``receive_block`` for one frame. The common case, a fresh dense result of a data chunk, is taken
        with plain ints (a large local run hands each worker one result per event); anything else, and any
        frame the fast path cannot rule out, goes through the block path, which ends in the same state."""
        fields = None if self.done else frame_fields(frame)
        if fields is None:
            return []  # what the block path does with it: nothing
        src, _, _, job, _, _, _, chunk, count, flags, exp = fields
        spec, window = self.spec, self.window
        if job != spec.job or (src != spec.peer and src not in spec.servers) or not flags & (RESULT | ABORT):
            return []
        if flags & (ABORT | SPARSE | OVERFLOW):
            return self.receive_block(parse_block(*pack_frames([frame])), now)
        slot = chunk % spec.slots
        if chunk == self.first:
            return self._agreed(slot, count, exp, now)
        offset = (chunk - self.first - 1) * spec.elements
        if window.in_flight[slot] != chunk or count != self._count_of(chunk, offset):
            if window.in_flight[slot] == chunk:
                self._misshapen(chunk, count, self._count_of(chunk, offset))
            window.stale(np.array([slot]), np.array([chunk]))
            return []  # stale, a duplicate, or a bad length
        window.answered_one(slot, chunk, now)
        self._padded[offset : offset + count] = np.frombuffer(frame, VALUE_DTYPE, count, PAYLOAD_OFFSET)
        out = self._send_one(chunk + spec.slots, now)
        out += window.resend_lost(now)
        if window.drained():
            self.finished_at = now
        return out

    def _agreed(self, slot: int, count: int, exp: int, now: float) -> Frames:
        """``receive`` of the exponent chunk's plain answer (no values, agreed exponent ``exp``): what the block path
        does with it, without its arrays (on the eBPF star this CPU, all four workers' at one instant, is the run's
        time)."""
        window = self.window
        if window.in_flight[slot] != self.first or count:
            if window.in_flight[slot] == self.first:
                self._misshapen(self.first, count, 0)
            window.stale(np.array([slot]), np.array([self.first]))
            return []
        window.answered_one(slot, self.first, now)
        self._agree(exp)
        out = self._send(np.arange(self.first + 1, self.first + 1 + self.spec.slots), now)
        out += window.resend_lost(now)
        if window.drained():
            self.finished_at = now
        return out

    def receive_block(self, block: FrameBlock, now: float) -> Frames:
        """Take every result for this call in ``block``; the frames to send in return."""
        if self.done:
            return []
        hdr, window = block.hdr, self.window
        mine = block.ok & (hdr["job"] == self.spec.job) & self.spec.hears(block.src)
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
        counts, due = self._dense_counts(block, rows), self._count(chunks)
        current = window.in_flight[slots] == chunks
        fresh = current & (counts == due)
        if (current & ~fresh).any():
            k = int(np.flatnonzero(current & ~fresh)[0])
            self._misshapen(int(chunks[k]), int(counts[k]), int(due[k]))
        window.stale(slots[~fresh], chunks[~fresh])
        chunks, first = np.unique(chunks[fresh], return_index=True)  # a duplicate result counts once
        if not len(chunks):
            return []
        rows, slots = rows[fresh][first], slots[fresh][first]
        window.answered(slots, chunks, now)
        flags = hdr["flags"][rows]
        if (flags & OVERFLOW).any():
            self.error = OverflowError(f"job {self.spec.job}: int32 overflow in chunk {chunks[(flags & OVERFLOW) != 0][0]}")
            return []
        out: Frames = []
        if chunks[0] == self.first:
            self._agree(int(hdr["exp"][rows[0]]))
            chunks, rows = chunks[1:], rows[1:]
            out += self._send(np.arange(self.first + 1, self.first + 1 + self.spec.slots), now)
        self._store(block, rows, chunks)
        if self.error is not None:
            return []
        out += self._send(chunks + self.spec.slots, now)  # a result frees its slot for the chunk ``slots`` later
        out += window.resend_lost(now)
        if window.drained():
            self.finished_at = now
        return out

    def _misshapen(self, chunk: int, got: int, due: int) -> None:
        """Remember the first answer of the wrong length to a chunk in flight: dropped (a spoofer's must not end
        the call), but if the call then times out, its error says why: the switch program's result."""
        if not self.misshapen:
            self.misshapen = (f"; its switch answered chunk {chunk} with {got} values where {due} were due: the "
                              "switch program's result has the wrong shape")

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
        elements, dest = self.spec.elements, self.frames.dest
        counts = np.where(chunks == self.first, 0, np.minimum(elements, len(self.tensor) - (chunks - self.first - 1) * elements))
        if dest is not None:
            counts[(chunks > self.first) & (dest[np.maximum(chunks - self.first - 1, 0)] != self.spec.rank)] = 0
        return counts

    def _count_of(self, chunk: int, offset: int) -> int:
        """``_count`` of one data chunk at ``offset``."""
        dest = self.frames.dest
        if dest is not None and dest[chunk - self.first - 1] != self.spec.rank:
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

    # -- timers ---------------------------------------------------------------
    def next_deadline(self) -> float | None:
        if self.finished_at is not None or self.error is not None:  # done (asked after every result)
            return None
        return self.window.deadline()

    def on_timeout(self, now: float) -> Frames:
        if self.done:
            return []
        if now >= self.window.last_progress + self.spec.timeout:  # the very sum next_deadline gave, so no float gap
            in_flight = self.window.in_flight
            outstanding = np.sort(in_flight[in_flight >= 0])
            self.error = AllreduceTimeout(
                f"job {self.spec.job} rank {self.spec.rank}: no result for {self.spec.timeout:g}s "
                f"(chunks {outstanding[:4].tolist()}... outstanding){self.misshapen}"
            )
            return []
        return self.window.on_timeout(now)
