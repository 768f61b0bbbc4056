"""The PBox: a central parameter-server box in the style of PHub, as a sans-I/O endpoint.

Workers send their chunks (keys) to the PBox's address (ROUTE flag); the PBox
sums each key once all of the job's workers sent it and returns the sum to
every worker. Keys are spread over ``cores`` shards by slot (``slot % cores``):
on Mininet each shard is its own process, fed only its keys by a socket filter,
as PHub pins key ranges to cores. The per-key bookkeeping is the switch's
(slot x version, contributor bitmap, chunk number, shadow copy), so exactness,
exactly-once and stale detection are the same as in-network.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from innet.packet import ABORT, INPUT_JOB, OVERFLOW, RESULT, ROUTE, SPARSE, VER, FrameBlock, Packet, build_frames, make_packet, parse_frame
from innet.program import group_by
from innet.sparse import densify, encode
from innet.ssp import Consistency, ParameterKeys
from innet.worker import Frames

INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class PBoxJob:
    """A job the PBox serves: rank -> worker node index, and the job's slots."""

    job: int
    members: dict[int, int]
    slots: int
    elements: int
    stall_timeout: float = 0.0  # a key incomplete this long aborts the job (0: never)
    sparse: bool = False  # top-k job: results go back as (index, value) pairs when that is shorter
    consistency: str = ""  # a training job (innet.ssp): "bsp", "ssp" or "asp"; "": all-reduce keys
    staleness: int = 0  # ssp: the bound s
    iterations: int = 0  # training: iterations
    length: int = 0  # training: elements of each iteration's gradient

    def training(self) -> Consistency:
        return Consistency(self.consistency, self.staleness, self.iterations, self.length)


class _JobState:
    def __init__(self, job: PBoxJob) -> None:
        shape = (2, job.slots)
        self.acc = np.zeros((2, job.slots, job.elements), np.int64)
        self.seen = np.zeros(shape, np.uint64)
        self.chunk = np.full(shape, -1, np.int64)
        self.done = np.zeros(shape, np.bool_)
        self.exp = np.zeros(shape, np.int16)
        self.count = np.zeros(shape, np.int32)
        self.since = np.zeros(shape, np.float64)
        self.full = (1 << len(job.members)) - 1
        self.node_of = np.full(max(job.members, default=-1) + 1, -2, np.int64)  # rank -> its node (-2: none)
        self.node_of[list(job.members)] = list(job.members.values())
        self.ranks = np.array(sorted(job.members), np.int64)


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
            if job.consistency:
                continue
            st = self.state[job.job]
            stuck = (~st.done) & (st.chunk >= 0) & (now - st.since > job.stall_timeout) if job.stall_timeout > 0 else None
            if stuck is None or not stuck.any():
                continue
            v, i = (int(x[0]) for x in np.nonzero(stuck))
            missing = [r for r in sorted(job.members) if not int(st.seen[v, i]) >> r & 1]
            st.chunk[:], st.seen[:], st.done[:] = -1, 0, False
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
        """Fold the keys of ``rows`` (one job's packets) that only plain new contributions touch; return their rows."""
        st, hdr, src = self.state[job.job], block.hdr[rows], block.src[rows]
        rank, slot, flags = (hdr[name].astype(np.int64) for name in ("rank", "slot", "flags"))
        key = np.where(flags & VER, job.slots, 0) + slot
        known = rank < len(st.node_of)
        plain = ((flags & ~VER == ROUTE) & (hdr["count"] == job.elements) & (slot < job.slots)
                 & (slot % self.cores == self.core) & known)
        plain[known] &= st.node_of[rank[known]] == src[known]
        plain &= ~np.isin(key, key[~plain])  # a key some other packet touches goes one by one
        if not plain.any():
            return rows[:0]
        rows, hdr, key, rank = rows[plain], hdr[plain], key[plain], rank[plain]
        order, starts, sizes = group_by(key)  # a key's packets together, in arrival order
        keys = key[order][starts]
        chunk, bits = hdr["chunk"].astype(np.int64)[order], np.uint64(1) << rank[order].astype(np.uint64)
        first = np.minimum.reduceat(chunk, starts)
        group_bits = np.bitwise_or.reduceat(bits, starts)
        flat = {name: getattr(st, name).reshape(-1) for name in ("seen", "chunk", "done", "exp", "count", "since")}
        new = first > flat["chunk"][keys]
        joins = ((first == flat["chunk"][keys]) & ~flat["done"][keys] & (flat["seen"][keys] & group_bits == 0)
                 & (flat["count"][keys] == job.elements))
        ok = ((first == np.maximum.reduceat(chunk, starts)) & (group_bits == np.add.reduceat(bits, starts))
              & (new | joins))
        if not ok.any():
            return rows[:0]
        took = order[np.repeat(ok, sizes)]
        keys, new, first, group_bits, starts, sizes = keys[ok], new[ok], first[ok], group_bits[ok], starts[ok], sizes[ok]
        begins = np.concatenate(([0], np.cumsum(sizes)[:-1]))
        acc = st.acc.reshape(-1, job.elements)
        acc[keys] = np.where(new[:, None], 0, acc[keys]) + np.add.reduceat(
            block.values(rows[took], job.elements).astype(np.int64), begins)
        exps = np.maximum.reduceat(hdr["exp"][took].astype(np.int16), begins)
        flat["exp"][keys] = np.where(new, exps, np.maximum(flat["exp"][keys], exps))
        flat["seen"][keys] = np.where(new, np.uint64(0), flat["seen"][keys]) | group_bits
        flat["chunk"][keys], flat["done"][keys], flat["count"][keys] = first, False, job.elements
        flat["since"][keys] = np.where(new, now, flat["since"][keys])
        complete = flat["seen"][keys] == st.full
        if complete.any():
            flat["done"][keys[complete]] = True
            out.append(self._results(job, keys[complete], hdr[order[starts[complete] + sizes[complete] - 1]]))
        return rows[took]

    def _results(self, job: PBoxJob, keys: np.ndarray, last: np.ndarray) -> np.ndarray:
        """The result of each key in ``keys`` for every member, rank by rank, as one block of frames;
        headers from ``last``, the packet that completed each key (as ``_result`` builds one)."""
        st = self.state[job.job]
        n = len(st.ranks)
        totals = st.acc.reshape(-1, job.elements)[keys]
        hdr = np.repeat(last, n)
        hdr["rank"] = np.tile(st.ranks, len(keys))
        hdr["flags"] = np.repeat(RESULT | ROUTE | np.where(keys >= job.slots, VER, 0)
                                 | np.where(np.abs(totals).max(axis=1) > INT32_MAX, OVERFLOW, 0), n)
        hdr["exp"], hdr["count"] = np.repeat(st.exp.reshape(-1)[keys], n), job.elements
        return build_frames(self.node, st.node_of[hdr["rank"]], hdr, np.repeat(totals.astype(np.int32), n, axis=0))

    def receive(self, frame: bytes, now: float) -> list[bytes]:
        pkt = parse_frame(frame)
        if pkt is None or pkt.dst != self.node or pkt.has(RESULT) or pkt.job == INPUT_JOB:  # input NACKs: not ours
            return []
        job = self.jobs.get(pkt.job)
        if job is None:
            return self._drop("unknown_job")
        if job.members.get(pkt.rank) != pkt.src:
            return self._drop("not_member")
        if job.consistency:  # a training job: pushes and reads of parameters (innet.ssp)
            if pkt.slot % self.cores != self.core:
                return []
            return self.params[job.job].receive(pkt.rank, pkt.chunk, pkt.exp, pkt.values)
        dense = densify(pkt, job.elements)  # a top-k chunk is summed densified, as by the topk_sparse program
        if dense is None:
            return self._drop("bad_sparse")
        pkt = dense
        if pkt.slot >= job.slots or pkt.count > job.elements or pkt.slot % self.cores != self.core:
            return self._drop("bad_slot")
        st, v, i, bit = self.state[pkt.job], pkt.version, pkt.slot, 1 << pkt.rank
        if pkt.chunk < st.chunk[v, i]:
            return self._drop("stale")
        if pkt.chunk > st.chunk[v, i]:
            st.chunk[v, i], st.seen[v, i], st.done[v, i] = pkt.chunk, 0, False
            st.acc[v, i, : pkt.count] = pkt.values
            st.exp[v, i], st.count[v, i], st.since[v, i] = pkt.exp, pkt.count, now
        elif int(st.seen[v, i]) & bit:
            if st.done[v, i]:
                return [self._result(job, pkt, pkt.rank)]
            return self._drop("duplicate")
        else:
            st.acc[v, i, : pkt.count] += pkt.values
            st.exp[v, i] = max(int(st.exp[v, i]), pkt.exp)
        st.seen[v, i] = int(st.seen[v, i]) | bit
        if int(st.seen[v, i]) != st.full:
            return []
        st.done[v, i] = True
        return [self._result(job, pkt, rank) for rank in sorted(job.members)]

    def _result(self, job: PBoxJob, pkt: Packet, rank: int) -> bytes:
        st, v, i = self.state[job.job], pkt.version, pkt.slot
        total = st.acc[v, i, : st.count[v, i]]
        flags = RESULT | ROUTE | (VER if v else 0)
        if total.size and int(np.max(np.abs(total))) > INT32_MAX:
            flags |= OVERFLOW
        values = total.astype(np.int32)
        if job.sparse and (short := encode(values)) is not None:  # the union of what was sent, when shorter
            values, flags = short, flags | SPARSE
        out = pkt.replace(values, rank=rank, flags=flags, exp=int(st.exp[v, i]))
        return out.to_frame(self.node, job.members[rank])
