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

from innet.packet import ABORT, INPUT_JOB, OVERFLOW, RESULT, ROUTE, SPARSE, VER, Packet, make_packet, parse_frame
from innet.sparse import densify, encode
from innet.ssp import Consistency, ParameterKeys

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
