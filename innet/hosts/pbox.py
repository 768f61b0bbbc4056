"""The PBox: a central parameter-server box in the style of PHub, as a sans-I/O endpoint.

Workers send their chunks (keys) to the PBox's address (ROUTE flag); the PBox
sums each key once all of the job's workers sent it and returns the sum to
every worker. Keys are spread over ``cores`` shards by slot (``slot % cores``):
on Mininet each shard is its own process, fed only its keys by a socket filter,
as PHub pins key ranges to cores. The per-key bookkeeping is the aggregation
engine's (innet.switch.engine), the very code the switches run: slot x version,
a contributor bitmap of any width, chunk number, shadow copy, the job's reduce
operator; so exactness, exactly-once and stale detection are the same as in-network.

``RackPBox`` is a rack's PBox in PHub's hierarchical reduction (``--pbox-layout rack``): it sums its rack's
copies of a key and exchanges the sum with the central PBox, a ``PBoxServer`` whose members are the racks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from innet.hosts.endpoint import Frames
from innet.hosts.ssp import Consistency, ParameterKeys
from innet.switch.engine import ADDED, ANSWER, COMPLETE, DUPLICATE, RESEND_UP, Engine, new_pool
from innet.switch.routed import replica_mark
from innet.wire.operators import SUM, Operator
from innet.wire.packet import (
    ABORT,
    INPUT_JOB,
    OVERFLOW,
    RESULT,
    RETX,
    ROUTE,
    SPARSE,
    VER,
    FrameBlock,
    Packet,
    build_frames,
    make_packet,
    parse_frame,
)
from innet.wire.sparse import densify, encode


@dataclass(frozen=True)
class PBoxJob:
    """A job the PBox serves: rank -> worker node index, and the job's slots."""

    job: int
    members: dict[int, int]
    slots: int
    elements: int
    stall_timeout: float = 0.0  # a key incomplete this long aborts the job (0: never)
    sparse: bool = False  # top-k job: results go back as (index, value) pairs when that is shorter
    consistency: str = ""  # a training job (innet.hosts.ssp): "bsp", "ssp" or "asp"; "": all-reduce keys
    staleness: int = 0  # ssp: the bound s
    iterations: int = 0  # training: iterations
    length: int = 0  # training: elements of each iteration's gradient
    operator: Operator = SUM

    def training(self) -> Consistency:
        return Consistency(self.consistency, self.staleness, self.iterations, self.length)


class _JobState:
    """One all-reduce job's slot pool at this shard: the engine's registers, keyed version * slots + slot."""

    def __init__(self, job: PBoxJob) -> None:
        self.engine = Engine(new_pool(2 * job.slots, job.elements, len(job.members)), job.operator)
        self.ranks = np.array(sorted(job.members), np.int64)
        self.who = np.full(max(job.members, default=-1) + 1, -1, np.int64)  # rank -> contributor index (-1: none)
        self.who[self.ranks] = np.arange(len(self.ranks))
        self.node_of = np.full(len(self.who), -2, np.int64)  # rank -> its node (-2: none)
        self.node_of[self.ranks] = [job.members[r] for r in self.ranks.tolist()]
        self.heard = np.full(len(self.ranks), -np.inf)  # when each contributor last sent anything


class PBoxServer:
    """Aggregates the keys of its jobs whose ``slot % cores == core``."""

    def __init__(self, node: int, jobs: list[PBoxJob], cores: int = 1, core: int = 0) -> None:
        self.node = node
        self.jobs = {j.job: j for j in jobs}
        self.state = {j.job: _JobState(j) for j in jobs if not j.consistency}
        self.params = {j.job: ParameterKeys(j.members, j.elements, j.slots, node, j.job, j.training())
                       for j in jobs if j.consistency}
        self.cores, self.core = cores, core
        self.counters: dict[str, int] = {}

    done = False
    daemon = True  # serves until stopped

    def _drop(self, reason: str) -> list[bytes]:
        self.counters[reason] = self.counters.get(reason, 0) + 1
        return []

    def start(self, now: float) -> list[bytes]:
        return []

    CHECK_EVERY = 0.05

    def next_deadline(self) -> float | None:
        if not any(j.stall_timeout > 0 and not j.consistency for j in self.jobs.values()):
            return None
        return self._next_check

    _next_check = 0.0

    def on_timeout(self, now: float) -> list[bytes]:
        """Abort every job with a key that waited too long for a worker; free its keys."""
        self._next_check = now + self.CHECK_EVERY
        out: list[bytes] = []
        for job in self.jobs.values():
            if job.consistency or job.stall_timeout <= 0:
                continue
            st = self.state[job.job]
            keys = np.arange(2 * job.slots)
            key = st.engine.stuck(keys, now, job.stall_timeout, st.heard)
            if key is None:
                continue
            missing = st.ranks[st.engine.missing(key, len(st.ranks))].tolist()
            st.engine.free(keys)
            self.counters["aborted_jobs"] = self.counters.get("aborted_jobs", 0) + 1
            for rank in sorted(job.members):
                note = make_packet(np.array([self.node, *missing]), job=job.job, rank=rank, flags=ABORT | ROUTE)
                out.append(note.to_frame(self.node, job.members[rank]))
        return out

    def receive_block(self, block: FrameBlock, now: float) -> Frames:
        """``receive`` for a block of frames. The keys whose packets in the block are all plain new
        contributions (one round, from distinct members, none seen before, full chunks) are summed
        at once, and their results sent as one block; every other frame goes through ``receive``,
        in arrival order (it shares no key with the summed ones, so the outcome is the same)."""
        hdr = block.hdr
        ours = block.ok & (block.dst == self.node) & (hdr["flags"] & RESULT == 0)
        out: Frames = []
        rest = np.ones(len(hdr), bool)
        for job_id in np.unique(hdr["job"][ours]).tolist():
            job = self.jobs.get(job_id)
            if job is not None and not job.consistency and not job.sparse:
                taken = self._sum_block(job, block, np.flatnonzero(ours & (hdr["job"] == job_id)), now, out)
                rest[taken] = False
        for k in np.flatnonzero(rest).tolist():
            out.extend(self.receive(block.frame(k), now))
        return out

    def _sum_block(self, job: PBoxJob, block: FrameBlock, rows: np.ndarray, now: float, out: Frames) -> np.ndarray:
        """Fold what the engine can of ``rows`` (one job's packets) at once; return the rows it took."""
        st, hdr, src = self.state[job.job], block.hdr[rows], block.src[rows]
        rank, slot, flags = (hdr[name].astype(np.int64) for name in ("rank", "slot", "flags"))
        known = rank < len(st.who)
        rank = np.where(known, rank, 0)
        mine = (known & (st.who[rank] >= 0) & (st.node_of[rank] == src) & (hdr["count"] == job.elements)
                & (slot < job.slots) & (slot % self.cores == self.core) & (flags & (SPARSE | RESULT) == 0)
                & (hdr["nworkers"] != replica_mark(len(st.ranks))))  # a replicating key: packet by packet
        keys = np.where(flags & VER, job.slots, 0) + slot
        mine &= ~np.isin(keys, keys[~mine])  # a key some other packet touches goes one by one, in order
        if not mine.any():
            return rows[:0]
        rows, hdr, rank, flags, keys = rows[mine], hdr[mine], rank[mine], flags[mine], keys[mine]
        st.heard[st.who[rank]] = now
        folded = st.engine.contribute_many(keys, st.who[rank], len(st.ranks), hdr["chunk"].astype(np.int64), hdr["exp"],
                                           block.values(rows, job.elements), flags & ~VER == ROUTE, now)
        if len(folded.completed):
            st.engine.finish(folded.completed, down=True)
            out.extend(self._results(job, folded.completed, hdr[folded.last_rows]))
        return rows[folded.taken]

    def _results(self, job: PBoxJob, keys: np.ndarray, last: np.ndarray) -> list[np.ndarray]:
        """The result of each key in ``keys`` for every member, rank by rank, as blocks of frames; headers
        from ``last``, the packet that completed each key (as ``_result`` builds one). A routed key's values
        go to its rank alone, every other member gets the header (innet.switch.routed)."""
        st = self.state[job.job]
        r, n = st.engine.r, len(st.ranks)
        hdr = np.repeat(last, n)
        hdr["rank"] = np.tile(st.ranks, len(keys))
        hdr["flags"] = np.repeat(RESULT | ROUTE | np.where(keys >= job.slots, VER, 0) | np.where(r.overflow[keys], OVERFLOW, 0), n)
        hdr["exp"], hdr["count"] = np.repeat(r.exp[keys], n), job.elements
        values = np.repeat(r.pool[keys, :job.elements], n, axis=0)
        dest = np.repeat(last["nworkers"].astype(np.int64) - n - 1, n)
        full = (dest < 0) | (dest >= n) | (dest == st.ranks[np.tile(np.arange(n), len(keys))])
        out = [build_frames(self.node, st.node_of[hdr["rank"][full]], hdr[full], values[full])] if full.any() else []
        if not full.all():
            acks = hdr[~full]
            acks["count"] = 0
            out.append(build_frames(self.node, st.node_of[acks["rank"]], acks, values[~full][:, :0]))
        return out

    def receive(self, frame: bytes, now: float) -> list[bytes]:
        pkt = parse_frame(frame)
        if pkt is None or pkt.dst != self.node or pkt.has(RESULT) or pkt.job == INPUT_JOB:  # input NACKs: not ours
            return []
        job = self.jobs.get(pkt.job)
        if job is None:
            return self._drop("unknown_job")
        if job.members.get(pkt.rank) != pkt.src:
            return self._drop("not_member")
        if job.consistency:  # a training job: pushes and reads of parameters (innet.hosts.ssp)
            if pkt.slot % self.cores != self.core:
                return []
            return self.params[job.job].receive(pkt.rank, pkt.chunk, pkt.exp, pkt.values)
        dense = densify(pkt, job.elements)  # a top-k chunk is summed densified, as by the topk_sparse program
        if dense is None:
            return self._drop("bad_sparse")
        if dense.slot >= job.slots or dense.count > job.elements or dense.slot % self.cores != self.core:
            return self._drop("bad_slot")
        st = self.state[job.job]
        st.heard[st.who[dense.rank]] = now
        key = dense.version * job.slots + dense.slot
        what = st.engine.contribute(key, int(st.who[dense.rank]), len(st.ranks), dense.chunk, dense.exp, dense.values, now,
                                    dense.nworkers == replica_mark(len(st.ranks)))
        if what == COMPLETE:
            st.engine.finish(key, down=True)
            return [self._result(job, dense, key, rank) for rank in sorted(job.members)]
        if what == ANSWER and not pkt.has(RETX):  # the network's copy of a counted one: nobody asked
            return self._drop(DUPLICATE)
        if what == ANSWER:
            return [self._result(job, dense, key, dense.rank)]
        return [] if what == ADDED else self._drop(what)

    def _result(self, job: PBoxJob, pkt: Packet, key: int, rank: int) -> bytes:
        r = self.state[job.job].engine.r
        flags = RESULT | ROUTE | (VER if key >= job.slots else 0) | (OVERFLOW if r.overflow[key] else 0)
        values = self.state[job.job].engine.values(key).copy()
        if job.sparse and (short := encode(values)) is not None:  # the union of what was sent, when shorter
            values, flags = short, flags | SPARSE
        dest = pkt.nworkers - len(job.members) - 1  # a routed key's values are for one rank alone
        if 0 <= dest < len(job.members) and dest != rank:
            values = values[:0]
        out = pkt.replace(values, rank=rank, flags=flags, exp=int(r.exp[key]))
        return out.to_frame(self.node, job.members[rank])


class RackPBox:
    """A rack's PBox: sums the keys of ``job`` (its members: this rack's ranks) and exchanges the sums with the PBox
    ``up``. When all its workers sent a key, the partial sum goes up as the rack's one contribution (under its lowest
    rank); the total that comes back goes to each worker. The engine's bookkeeping is a switch's below the root: a
    complete key waits for its parent (WAITING), a worker's repeat of it sends the partial up again (RESEND_UP: a lost
    partial or total is repaired from below), a repeat after the total is answered with the total (ANSWER)."""

    done = False
    daemon = True  # serves until stopped

    def __init__(self, node: int, job: PBoxJob, up: int, racks: int, nworkers: int) -> None:
        self.node, self.job, self.up = node, job, up
        self.racks, self.nworkers = racks, nworkers
        self.leader = min(job.members)  # the rank the rack contributes as, at the central PBox
        self.state = _JobState(job)
        self.overflowed: set[int] = set()  # keys whose rack sum overflowed int32 (the total will say so)
        self.counters: dict[str, int] = {}

    def start(self, now: float) -> list[bytes]:
        return []

    def next_deadline(self) -> float | None:
        return None

    def on_timeout(self, now: float) -> list[bytes]:
        return []

    def _drop(self, reason: str) -> list[bytes]:
        self.counters[reason] = self.counters.get(reason, 0) + 1
        return []

    def receive(self, frame: bytes, now: float) -> list[bytes]:
        pkt = parse_frame(frame)
        job = self.job
        if pkt is None or pkt.dst != self.node or pkt.job != job.job:
            return []
        if pkt.has(RESULT):
            return self._down(pkt) if pkt.src == self.up else self._drop("not_member")
        if job.members.get(pkt.rank) != pkt.src:
            return self._drop("not_member")
        if pkt.slot >= job.slots or pkt.count > job.elements:
            return self._drop("bad_slot")
        st = self.state
        key = pkt.version * job.slots + pkt.slot
        what = st.engine.contribute(key, int(st.who[pkt.rank]), len(st.ranks), pkt.chunk, pkt.exp, pkt.values, now)
        if what == COMPLETE:
            st.engine.finish(key, down=False)
            if st.engine.r.overflow[key]:
                self.overflowed.add(key)
            return [self._up(pkt, key)]
        if what in (ANSWER, RESEND_UP) and not pkt.has(RETX):  # the network's copy of a counted one: nobody asked
            return self._drop(DUPLICATE)
        if what == RESEND_UP:
            return [self._up(pkt, key, RETX)]
        if what == ANSWER:
            return [self._result(pkt, key, pkt.rank)]
        return [] if what == ADDED else self._drop(what)

    def _up(self, pkt: Packet, key: int, retx: int = 0) -> bytes:
        """The rack's partial sum of ``key`` as its contribution at the central PBox (``retx``: again, flagged RETX)."""
        engine = self.state.engine
        flags = ROUTE | retx | (VER if key >= self.job.slots else 0)
        out = pkt.replace(engine.values(key).copy(), rank=self.leader, nworkers=self.racks, flags=flags,
                          exp=int(engine.r.exp[key]))
        return out.to_frame(self.node, self.up)

    def _down(self, pkt: Packet) -> list[bytes]:
        """The central PBox's total of a key: kept (to answer repeats), and sent to every worker of the rack."""
        engine, key = self.state.engine, pkt.version * self.job.slots + pkt.slot
        overflow = pkt.has(OVERFLOW) or key in self.overflowed
        if pkt.slot >= self.job.slots or not engine.take_result(key, pkt.chunk, pkt.exp, overflow, pkt.values):
            return self._drop("stale_result")
        self.overflowed.discard(key)
        return [self._result(pkt, key, rank) for rank in sorted(self.job.members)]

    def _result(self, pkt: Packet, key: int, rank: int) -> bytes:
        r = self.state.engine.r
        flags = RESULT | ROUTE | (VER if key >= self.job.slots else 0) | (OVERFLOW if r.overflow[key] else 0)
        out = pkt.replace(self.state.engine.values(key).copy(), rank=rank, nworkers=self.nworkers, flags=flags,
                          exp=int(r.exp[key]))
        return out.to_frame(self.node, self.job.members[rank])
