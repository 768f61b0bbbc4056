"""Ensembles sharing one input stream (the Horovod ensemble paper): N jobs read the same data.

In every iteration worker rank r of every job reads the same input shard
(``elements`` int32 values, seeded). The input server (the PBox host, the
data's box) streams each shard either as one unicast copy per job, or, shared,
once to the group address ``GROUP_BASE + r``: every switch on the way copies it
out of the ports its group table names, the reverse-path tree of the unicast
routes from those workers to the server, so a link carries a shard once however
many jobs read it. Input frames are routed innet frames of job ``INPUT_JOB`` in
the bulk band, so they never hold up a gradient. A receiver that heard nothing
new for ``idle`` seconds NACKs what it misses (backing off), and the server
resends those chunks to it alone.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from innet.errors import UserError
from innet.graph import link_name, next_hop, node_indices, pboxes, port_to
from innet.hosts.job import JobSpec
from innet.wire.packet import (
    BANDS,
    GROUP_BASE,
    HEADER_DTYPE,
    INPUT_JOB,
    PAYLOAD_OFFSET,
    RETX,
    ROUTE,
    FrameBlock,
    build_frames,
    make_packet,
    pack_frames,
    parse_block,
)

if TYPE_CHECKING:
    import networkx as nx

INPUT_BAND = BANDS - 1


@dataclass(frozen=True)
class Receiver:
    host: str
    node: int
    job: int
    rank: int


@dataclass(frozen=True)
class InputPlan:
    """Who streams which shards to whom: the server, the receivers, and the stream's geometry."""

    server: str
    node: int
    shared: bool
    elements: int  # values in one shard (one worker's input of one iteration)
    per_packet: int
    iterations: int
    seed: int
    receivers: tuple[Receiver, ...]
    idle: float = 0.05
    timeout: float = 10.0

    @property
    def chunks(self) -> int:
        """Frames per shard."""
        return -(-self.elements // self.per_packet)

    @property
    def total(self) -> int:
        """Frames of one rank's stream: every iteration's shard."""
        return self.iterations * self.chunks

    def ranks(self) -> list[int]:
        return sorted({r.rank for r in self.receivers})

    def destinations(self, rank: int) -> list[int]:
        """Where rank ``rank``'s stream is addressed: its group, or each reader."""
        return [GROUP_BASE + rank] if self.shared else [r.node for r in self.receivers if r.rank == rank]


def plan_input(graph: nx.Graph, specs: dict[int, dict[str, JobSpec]], elements: int, shared: bool, per_packet: int,
               iterations: int, seed: int, idle: float, timeout: float) -> InputPlan:
    """The input stream of a run whose workers are ``specs`` (job -> host -> JobSpec), served by the PBox host;
    a reader NACKs after ``idle`` seconds without a new chunk."""
    boxes = pboxes(graph)
    if not boxes:
        raise UserError("{input_elements} streams the input from the PBox host, and this topology has none")
    index = node_indices(graph)
    receivers = tuple(Receiver(host, index[host], job, spec.rank)
                      for job in sorted(specs) for host, spec in sorted(specs[job].items()))
    return InputPlan(boxes[0], index[boxes[0]], shared, elements, per_packet, iterations, seed, receivers, idle, timeout)


def _route(graph: nx.Graph, a: str, b: str) -> list[str]:
    """The nodes the unicast route from ``a`` to ``b`` visits, ``a`` and ``b`` included."""
    nodes = [a]
    while nodes[-1] != b:
        nodes.append(next_hop(graph, nodes[-1], b))
    return nodes


def group_tables(graph: nx.Graph, plan: InputPlan) -> dict[str, dict[int, tuple[int, ...]]]:
    """Switch -> group address -> the ports a group's frames leave by: for each reader, the unicast route
    from it to the server, reversed (so a frame always arrives where the route to its source leads)."""
    tables: dict[str, dict[int, set[int]]] = {}
    for reader in plan.receivers:
        path = _route(graph, reader.host, plan.server)
        for node, up in zip(path[:-2], path[1:-1], strict=True):  # every hop but the server's own
            tables.setdefault(up, {}).setdefault(GROUP_BASE + reader.rank, set()).add(port_to(graph, up, node))
    return {sw: {g: tuple(sorted(p)) for g, p in groups.items()} for sw, groups in tables.items()}


def predicted_input_bytes(graph: nx.Graph, plan: InputPlan, shared: bool | None = None) -> dict[str, int]:
    """Bytes the stream puts on each link without loss: each shard once per link of its group's tree
    (shared: the readers' routes to the server, as ``group_tables`` builds it), or once per reader along the
    server's route to it (unicast). ``shared`` overrides the plan's choice, to price the other."""
    shared = plan.shared if shared is None else shared
    full, last = divmod(plan.elements, plan.per_packet)
    shard = full * (PAYLOAD_OFFSET + 4 * plan.per_packet) + (PAYLOAD_OFFSET + 4 * last if last else 0)
    stream = plan.iterations * shard
    out: dict[str, int] = {}
    for rank in plan.ranks():
        paths = [_route(graph, r.host, plan.server) if shared else _route(graph, plan.server, r.host)
                 for r in plan.receivers if r.rank == rank]
        links = [link_name(u, v) for path in paths for u, v in zip(path, path[1:], strict=False)]
        for name in (set(links) if shared else links):
            out[name] = out.get(name, 0) + stream
    return out


def input_shard(seed: int, iteration: int, rank: int, elements: int) -> np.ndarray:
    """The input worker rank ``rank`` of every job reads in ``iteration`` (seeded int32 values)."""
    return np.random.default_rng([seed, iteration, rank, 0x1D]).integers(-2**31, 2**31, elements, dtype=np.int64).astype(np.int32)


def _chunk_values(plan: InputPlan, rank: int, seqs: np.ndarray) -> Iterable[tuple[np.ndarray, np.ndarray]]:
    """(sequence numbers, their values as rows) for the chunks ``seqs`` of rank ``rank``'s stream,
    grouped by length (a shard's last chunk may be shorter)."""
    shards = {t: input_shard(plan.seed, t, rank, plan.elements) for t in np.unique(seqs // plan.chunks).tolist()}
    padded = {t: np.concatenate([s, np.zeros(plan.chunks * plan.per_packet - len(s), np.int32)])
              for t, s in shards.items()}
    counts = np.minimum(plan.per_packet, plan.elements - (seqs % plan.chunks) * plan.per_packet)
    for count in np.unique(counts).tolist():
        picked = seqs[counts == count]
        rows = np.array([padded[int(s) // plan.chunks][(int(s) % plan.chunks) * plan.per_packet:][:count]
                         for s in picked.tolist()], np.int32).reshape(len(picked), count)
        yield picked, rows


def _frames(plan: InputPlan, rank: int, seqs: np.ndarray, dst: int, flags: int) -> list[np.ndarray]:
    """Blocks of frames (one row each) carrying chunks ``seqs`` of rank ``rank``'s stream to ``dst``."""
    out: list[np.ndarray] = []
    for picked, rows in _chunk_values(plan, rank, seqs):
        hdr = np.zeros(len(picked), HEADER_DTYPE)
        hdr["job"], hdr["rank"], hdr["chunk"], hdr["count"], hdr["flags"] = INPUT_JOB, rank, picked, rows.shape[1], flags
        hdr["nworkers"] = len({r.job for r in plan.receivers})
        out.append(build_frames(plan.node, dst, hdr, rows, INPUT_BAND))
    return out


@dataclass
class InputServer:
    """The input server's endpoint: streams every rank's shards at the start, answers NACKs (a daemon)."""

    plan: InputPlan
    daemon: bool = True
    sent_bytes: int = 0
    resent: int = 0
    nacks: int = 0
    readers: dict[int, int] = field(default_factory=dict)  # reader node -> its rank

    @property
    def done(self) -> bool:
        return False

    def start(self, now: float) -> list[bytes | np.ndarray]:
        self.readers = {r.node: r.rank for r in self.plan.receivers}
        seqs = np.arange(self.plan.total)
        out = [f for rank in self.plan.ranks() for dst in self.plan.destinations(rank)
               for f in _frames(self.plan, rank, seqs, dst, ROUTE)]
        self.sent_bytes += sum(f.size for f in out)
        return list(out)

    def receive(self, frame: bytes, now: float) -> list[bytes | np.ndarray]:
        return self.receive_block(parse_block(*pack_frames([frame])), now)

    def receive_block(self, block: FrameBlock, now: float) -> list[bytes | np.ndarray]:
        hdr = block.hdr
        nacks = np.flatnonzero(block.ok & (hdr["job"] == INPUT_JOB) & (hdr["flags"] & RETX != 0)
                               & (block.dst == self.plan.node))
        out: list[bytes | np.ndarray] = []
        for k in nacks.tolist():
            src, rank = int(block.src[k]), int(hdr["rank"][k])
            if self.readers.get(src) != rank:
                continue
            seqs = block.values(slice(k, k + 1), int(hdr["count"][k]))[0].astype(np.int64)
            seqs = np.unique(seqs[(seqs >= 0) & (seqs < self.plan.total)])
            self.nacks += 1
            self.resent += len(seqs)
            frames = _frames(self.plan, rank, seqs, src, ROUTE | RETX) if len(seqs) else []
            self.sent_bytes += sum(f.size for f in frames)
            out += frames
        return out

    def next_deadline(self) -> float | None:
        return None

    def on_timeout(self, now: float) -> list[bytes | np.ndarray]:
        return []


class InputReceiver:
    """A worker host's input: every chunk of its rank's stream, whichever copy brings it; NACKs the rest."""

    daemon = False

    def __init__(self, plan: InputPlan, reader: Receiver) -> None:
        self.plan, self.reader = plan, reader
        self.data = np.zeros((plan.total, plan.per_packet), np.int32)
        self.got = np.zeros(plan.total, bool)
        self.accept = {reader.node, GROUP_BASE + reader.rank}
        self.started_at = self.last_new = self.finished_at = float("nan")
        self.backoff = 1
        self.nacks = self.nack_bytes = self.duplicates = 0
        self.error = ""

    @property
    def done(self) -> bool:
        return bool(self.got.all()) or bool(self.error)

    def start(self, now: float) -> list[bytes | np.ndarray]:
        self.started_at = self.last_new = now
        return []

    def receive(self, frame: bytes, now: float) -> list[bytes | np.ndarray]:
        return self.receive_block(parse_block(*pack_frames([frame])), now)

    def receive_block(self, block: FrameBlock, now: float) -> list[bytes | np.ndarray]:
        hdr, plan = block.hdr, self.plan
        rows = np.flatnonzero(block.ok & (hdr["job"] == INPUT_JOB) & (hdr["rank"] == self.reader.rank)
                              & (block.src == plan.node) & np.isin(block.dst, list(self.accept)))
        seqs = hdr["chunk"][rows].astype(np.int64)
        counts = hdr["count"][rows].astype(np.int64)
        expect = np.minimum(plan.per_packet, plan.elements - (seqs % max(plan.chunks, 1)) * plan.per_packet)
        fine = (seqs < plan.total) & (counts == expect)
        rows, seqs, counts = rows[fine], seqs[fine], counts[fine]
        fresh = ~self.got[seqs]
        self.duplicates += int(np.count_nonzero(~fresh))
        for count in np.unique(counts[fresh]).tolist():
            pick = fresh & (counts == count)
            self.data[seqs[pick], :count] = block.values(rows[pick], count)
        if fresh.any():
            self.got[seqs[fresh]] = True
            self.last_new, self.backoff = now, 1
            if self.got.all():
                self.finished_at = now
        return []

    def next_deadline(self) -> float | None:
        """When to NACK: ``idle`` (backing off) after the last new chunk; before the first, a quarter of the
        timeout (the stream may queue behind other readers' copies or more urgent bands for long)."""
        if self.done:
            return None
        return self.last_new + (self.plan.idle * self.backoff if self.got.any() else self.plan.timeout / 4)

    def on_timeout(self, now: float) -> list[bytes | np.ndarray]:
        due = self.next_deadline()
        if due is None or now < due:
            return []
        if now - self.started_at > self.plan.timeout and now - self.last_new > self.plan.timeout / 2:
            self.error = f"input: rank {self.reader.rank} on {self.reader.host} got nothing new for {now - self.last_new:.1f}s"
            return []
        missing = np.flatnonzero(~self.got)
        out: list[bytes | np.ndarray] = []
        for at in range(0, len(missing), self.plan.per_packet):
            nack = make_packet(missing[at:at + self.plan.per_packet].astype(np.int32), job=INPUT_JOB,
                               rank=self.reader.rank, flags=ROUTE | RETX)
            out.append(nack.to_frame(self.reader.node, self.plan.node, INPUT_BAND))
        self.nacks += len(out)
        self.nack_bytes += sum(len(f) for f in out)
        self.backoff = min(self.backoff * 2, 16)
        self.last_new = now
        return out

    def exact(self) -> bool:
        """Every shard of every iteration as the server holds it, bit for bit."""
        if not self.got.all():
            return False
        plan = self.plan
        for t in range(plan.iterations):
            rows = self.data[t * plan.chunks:(t + 1) * plan.chunks].ravel()
            if not np.array_equal(rows[:plan.elements], input_shard(plan.seed, t, self.reader.rank, plan.elements)):
                return False
        return True

    def outcome(self) -> InputOutcome:
        return InputOutcome(self.reader.host, self.reader.job, self.reader.rank, self.exact(),
                            self.finished_at - self.started_at, self.nacks, self.nack_bytes, self.duplicates, self.error)


@dataclass(frozen=True)
class InputOutcome:
    """What one reader got of the stream."""

    host: str
    job: int
    rank: int
    exact: bool
    completion_s: float
    nacks: int
    nack_bytes: int
    duplicates: int
    error: str


@dataclass(frozen=True)
class InputSummary:
    """The run's input stream (results.json's ``input``)."""

    shared: bool
    elements: int
    iterations: int
    readers: int
    exact: bool
    completion_s: float
    bytes: int
    predicted_bytes: int
    unicast_bytes: int
    saved_bytes: int
    saved_fraction: float
    nacks: int
    duplicates: int
    errors: list[str]
    readers_detail: list[InputOutcome]


def input_summary(graph: nx.Graph, plan: InputPlan, readers: list[InputOutcome], measured: int) -> InputSummary:
    """The run's input stream: delivered exactly or not, how long it took, and the bytes it cost on the links
    (``measured``: the server's sends, the switches' copies and the NACKs) against N unicast copies."""
    unicast = sum(predicted_input_bytes(graph, plan, shared=False).values())
    nack_bytes = sum(int(r.nack_bytes) for r in readers)
    measured += nack_bytes
    return InputSummary(
        shared=plan.shared, elements=plan.elements, iterations=plan.iterations, readers=len(readers),
        exact=all(r.exact for r in readers) and len(readers) == len(plan.receivers),
        completion_s=max((float(r.completion_s) for r in readers), default=0.0),
        bytes=measured, predicted_bytes=sum(predicted_input_bytes(graph, plan).values()),
        unicast_bytes=unicast, saved_bytes=unicast - measured,
        saved_fraction=round(1 - measured / unicast, 4) if unicast else 0.0,
        nacks=sum(int(r.nacks) for r in readers),
        duplicates=sum(int(r.duplicates) for r in readers),
        errors=sorted({str(r.error) for r in readers if r.error}),
        readers_detail=readers,
    )
