"""A rack's PBox in PHub's hierarchical reduction (``--pbox-layout rack``), as a sans-I/O endpoint.

Its rack's workers send it every key; when all of them have, it sends the partial sum up to the central
PBox as the rack's one contribution (under the rack's lowest rank), and when the central PBox's total comes
back, hands it to each of its workers. The bookkeeping is the aggregation engine's, as a switch's below the
root keeps it: a complete key waits for its parent (WAITING), a worker's repeat of it sends the partial up
again (RESEND_UP, so a lost partial or total is repaired from below), a repeat after the total came is
answered with the total (ANSWER). The central PBox is a plain ``PBoxServer`` whose members are the racks.
"""

from __future__ import annotations

from innet.hosts.pbox import PBoxJob, _JobState
from innet.switch.engine import ADDED, ANSWER, COMPLETE, RESEND_UP
from innet.wire.packet import OVERFLOW, RESULT, ROUTE, VER, Packet, parse_frame


class RackPBox:
    """Sums the keys of ``job`` (its members: this rack's ranks) and exchanges the sums with the PBox ``up``."""

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
        if what == RESEND_UP:
            return [self._up(pkt, key)]
        if what == ANSWER:
            return [self._result(pkt, key, pkt.rank)]
        return [] if what == ADDED else self._drop(what)

    def _up(self, pkt: Packet, key: int) -> bytes:
        """The rack's partial sum of ``key`` as its contribution at the central PBox."""
        engine = self.state.engine
        flags = ROUTE | (VER if key >= self.job.slots else 0)
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
