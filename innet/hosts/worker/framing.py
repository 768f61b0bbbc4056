"""The frames one in-network or PBox call sends, and the tensor-sized buffers they and its results live in.

The exponent chunk's frame carries no values. Once the scale is agreed every data chunk's frame is known:
full chunks are built into one uint8 array a window at a time as sending reaches them (a worker's start-up
is then one window's quantizing, not its whole tensor's), so sending chunks ``a..b`` is a slice of it; a
short last chunk is a frame of its own; a sparse job builds every chunk's frame at once, each in its
shorter form. A retransmission is the same frame, flagged RETX (innet.hosts.worker.window).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from innet.hosts.endpoint import Frames
from innet.hosts.job import JobSpec
from innet.switch.routed import mark, replica_mark
from innet.wire.collectives import COLLECTIVES
from innet.wire.packet import (
    HEADER_DTYPE,
    HEADER_OFFSET,
    PAYLOAD_OFFSET,
    ROUTE,
    SPARSE,
    VALUE_DTYPE,
    VER,
    build_frames,
    frame_heads,
    frame_prefix,
)
from innet.wire.sparse import encode


def buffers(spec: JobSpec, length: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The shapes of a call's tensor-sized arrays for a tensor of ``length`` values: its int32 results
    (whole chunks), and its full chunks' frames (uint8 rows)."""
    return ((spec.chunks(length) - 1) * spec.elements,), (length // spec.elements, PAYLOAD_OFFSET + 4 * spec.elements)


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


class ChunkFrames:
    """Every frame of one call's chunks ``first..end-1`` (see module doc), for a tensor this worker holds.

    A routed collective marks each data chunk with the one rank its result is for (``dest``); a replicating
    one sends a chunk whose values another rank gives as a header alone (``header_only``)."""

    def __init__(self, spec: JobSpec, tensor: np.ndarray, first: int, local_exp: int, resident: Resident) -> None:
        self.spec = spec
        self.tensor = tensor
        self.first = first
        self.end = first + spec.chunks(len(tensor))
        self.local_exp = local_exp  # the exponent chunk's
        self.resident = resident
        self.shape = buffers(spec, len(tensor))[1]
        self.scale: int | None = None
        self.q = 0  # the agreed exponent
        self.rows = np.zeros((0, 0), np.uint8)  # row i: data chunk first + 1 + i (full chunks only)
        self.built = 0  # how many of ``rows`` are built so far (``ensure``)
        self.tail = np.zeros((0, 0), np.uint8)  # the last data chunk's frame when it is shorter than the others
        self.sparse: list[bytes] = []  # with spec.sparse: every data chunk's frame, each in its shorter form
        chunks = self.end - first - 1  # a collective's rank for each data chunk (innet.switch.routed)
        collective = COLLECTIVES[spec.collective]
        self.dest = collective.dest(chunks, spec.nworkers, spec.root)  # the one rank its values go to
        source = collective.source(chunks, spec.nworkers, spec.root)  # the one rank that sends its values
        self.header_only = None if source is None else source != spec.rank

    def header(self, chunks: np.ndarray, counts: np.ndarray | int, exp: int) -> np.ndarray:
        spec = self.spec
        hdr = np.zeros(len(chunks), HEADER_DTYPE)
        hdr["job"], hdr["rank"], hdr["nworkers"], hdr["exp"], hdr["count"] = spec.job, spec.rank, spec.nworkers, exp, counts
        data = chunks > self.first
        if self.dest is not None:  # each data chunk marked with the one rank its result is for
            hdr["nworkers"][data] = mark(spec.nworkers, self.dest[chunks[data] - self.first - 1])
        if self.header_only is not None:  # or as one whose values one rank gives (``headers``)
            hdr["nworkers"][data] = replica_mark(spec.nworkers)
        hdr["slot"], hdr["chunk"] = chunks % spec.slots, chunks
        hdr["flags"] = np.where((chunks // spec.slots) & 1, VER, 0) | (ROUTE if spec.pbox is not None else 0)
        return hdr

    def prepare(self) -> None:
        """What the full chunks' frames hold whatever the agreed exponent: their buffer, and every header but the
        exponent's field, written while the exponent's round trip is in flight; at the answer ``ensure`` quantizes
        straight into the frames (the calibration's 32 frames of 2048 values: 40 us at the answer where building
        them took 74, medians in-process)."""
        spec = self.spec
        if spec.sparse or len(self.rows) or not self.shape[0]:
            return
        self.rows = self.resident.take(self.shape, np.uint8)
        chunks = np.arange(self.first + 1, self.first + 1 + self.shape[0])
        frame_heads(spec.node, spec.peer_of(chunks), self.header(chunks, spec.elements, 0), spec.elements, spec.band,
                    self.rows)

    def build(self, exp: int) -> None:
        """Take the agreed exponent: the scale, and the data chunks' frames (full chunks a window at a time,
        as sending reaches them: ``ensure``)."""
        spec, n = self.spec, len(self.tensor)
        self.q = exp
        self.scale = spec.operator.scale(exp, spec.nworkers)
        if spec.sparse:
            self._build_sparse(spec.operator.quantize(self.tensor, self.scale), exp)
            return
        full = n // spec.elements
        self.prepare()
        if full:
            self.rows[:, HEADER_OFFSET:PAYLOAD_OFFSET].view(HEADER_DTYPE)["exp"] = exp
        if n % spec.elements:
            last = np.array([self.end - 1])
            hdr = self.header(last, n % spec.elements, exp)
            tail = spec.operator.quantize(self.tensor[full * spec.elements :], self.scale)
            self.tail = build_frames(spec.node, spec.peer_of(last), hdr, tail[None], spec.band)

    def ensure(self, upto: int) -> None:
        """Build full chunks' frames up to row ``upto`` (exclusive), a window or more at a time: a worker's
        start-up is then one window's quantizing, not its whole tensor's, and the rest is spread over the call."""
        spec = self.spec
        a, b = self.built, min(len(self.rows), max(upto, self.built + spec.slots))
        if upto <= a or b <= a or self.scale is None or spec.sparse:
            return
        spec.operator.quantize(self.tensor[a * spec.elements : b * spec.elements].reshape(b - a, spec.elements),
                               self.scale, self.rows[a:b, PAYLOAD_OFFSET:].view(VALUE_DTYPE))
        self.built = b

    def _build_sparse(self, quantized: np.ndarray, exp: int) -> None:
        """Every data chunk's frame, SPARSE where its (index, value) pairs are shorter than its values."""
        elements = self.spec.elements
        chunks = np.arange(self.first + 1, self.end)
        hdr = self.header(chunks, 0, exp)
        for k in range(len(chunks)):
            values = quantized[k * elements : (k + 1) * elements]
            payload = encode(values)
            if payload is None:
                payload = values
            else:
                hdr["flags"][k] |= SPARSE
            hdr["count"][k] = len(payload)
            body = hdr[k].tobytes() + payload.astype("<i4").tobytes()
            self.sparse.append(frame_prefix(self.spec.node, self.spec.peer, len(body), self.spec.band) + body)

    def headers(self, chunks: np.ndarray, exp: int) -> np.ndarray:
        """Frames of ``chunks`` without values: the exponent chunk's, and a replicating collective's chunks
        another rank gives the values of."""
        hdr = self.header(chunks, 0, exp)
        return build_frames(self.spec.node, self.spec.peer_of(chunks), hdr, np.zeros((len(chunks), 0), np.int32),
                            self.spec.band)

    def frame(self, chunk: int) -> np.ndarray:
        """Chunk ``chunk``'s frame."""
        if chunk == self.first:
            return self.headers(np.array([chunk]), self.local_exp)[0]
        i = chunk - self.first - 1
        if self.header_only is not None and self.header_only[i]:
            return self.headers(np.array([chunk]), self.q)[0]
        if self.sparse:
            return np.frombuffer(self.sparse[i], np.uint8)
        self.ensure(i + 1)
        return self.rows[i] if i < len(self.rows) else self.tail[0]

    def one(self, chunk: int) -> bytes:
        """``frame`` of one data chunk, as bytes (a hot path)."""
        i = chunk - self.first - 1
        if self.header_only is not None and self.header_only[i]:
            return self.frame(chunk).tobytes()
        if self.sparse:
            return self.sparse[i]
        self.ensure(i + 1)
        return (self.rows[i] if i < len(self.rows) else self.tail[0]).tobytes()

    def of(self, chunks: np.ndarray) -> Frames:
        """The frames of ``chunks`` (sorted, at least one), as blocks where they are of one length."""
        if chunks[0] == self.first:
            return [self.frame(self.first).tobytes()]
        index = chunks - self.first - 1
        if self.header_only is not None and self.header_only[index].any():  # in chunk order, a run at a time
            others = self.header_only[index]
            out: Frames = []
            for run in np.split(np.arange(len(chunks)), np.flatnonzero(np.diff(others)) + 1):
                out += [self.headers(chunks[run], self.q)] if others[run[0]] else self._data(chunks[run], index[run])
            return out
        return self._data(chunks, index)

    def _data(self, chunks: np.ndarray, index: np.ndarray) -> Frames:
        """``of``'s frames of data chunks ``chunks`` (rows ``index`` of ``rows``)."""
        if self.sparse:
            return [self.sparse[i] for i in index.tolist()]
        full = index < len(self.rows)
        self.ensure(int(index[full].max()) + 1 if full.any() else 0)
        out: Frames = [self.rows[index[full]]] if full.any() else []
        if not full.all():
            out.append(self.tail)
        return out

    def release(self) -> None:
        """Free every chunk's frame once nothing more will be sent (the network has stopped): only the
        result is read afterwards (a thousand workers' frames are a quarter of a large local run's memory)."""
        self.rows = self.tail = np.zeros((0, 0), np.uint8)
        self.built = 0
        self.sparse = []
