"""Loss recovery, shared by the in-network, PBox and ring senders: loss detection by order (RACK, RFC 8985)
and the retransmission timer (RFC 6298).

Every path innet's senders use is FIFO: a worker's chunks reach its switch (or the PBox) in the order
they were sent, and a slot's result leaves once the last contribution is in, so results come back in
send order too. A result for a later transmission is then evidence that an earlier one (or its
result) was lost: RACK marks the earlier one *suspect* when that evidence first comes and declares it
lost a reordering window later, when nothing came for it meanwhile. Order, not send time, decides
(a window sent in one burst has one send time, and RACK's time test would never fire on it).

The reordering window's floor is the RTO floor, or where the run's links lose, a quarter of the minimum round
trip (RFC 8985's) if less (a FIFO path does not reorder; a ring rank keeps the RTO floor: ``Rack.floor``),
doubled (twice at most) whenever a retransmission order asked for turns out spurious, and never above the
smoothed RTT. Where the run reorders, the window also covers what its links can hold back on the way
(``innet.planning.configs.held_links``) and what was measured late; where its links also lose, one held-back
frame's wait and no more (``Rack.reordering``: a longer wait stalls every loss). A retransmission is spurious when its
answer comes back sooner than the minimum round trip after it (where the run reorders: sooner than the queue
ahead of it could drain): that answer was the original's. (An answer that waited for another worker's lost
contribution looks spurious too, which is why the window widens only so far.)
Timeouts (``RetransmitTimer``) remain for what order cannot show: a lost last chunk, or silence.
"""

from __future__ import annotations

import numpy as np

from innet.hosts.job import JobSpec

REORDER_CAP = 4  # the reordering window's bound, in RTO floors: a loss is still noticed within a few
UNSENT = np.iinfo(np.int64).max  # a free slot's transmission number: never older than a sent one


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


class Rack:
    """The reordering window and the minimum round trip of one sender."""

    def __init__(self, min_rto: float, reorder: float = 0.0, design: float = 0.0, quarter: bool = False,
                 held: float = 0.0) -> None:
        self.min_rto = min_rto
        self.quarter = quarter  # the floor may shrink to a quarter of the minimum round trip (``floor``)
        self.design = design  # how far results come back out of order by design (switches that hold partials)
        self.reorder = reorder  # how long the links are known to hold a frame back (the run's --reorder)
        self.held = held  # where the links also lose: the reordering the window covers, one held frame (``reordering``)
        self.min_rtt = float("inf")
        self.mult = 1
        self.late = 0.0  # the longest an answer came after order made it suspect, though it was never resent

    @property
    def floor(self) -> float:
        """The window's floor: a quarter of the minimum round trip (RFC 8985's), at most the RTO floor (before
        a round trip is measured, the RTO floor), plus what the switches hold back by design. A FIFO path does not
        reorder, so a loss then costs about a round trip, not the RTO floor (1 ms, in virtual time on both
        backends: leaf-spine, 100001 values, 1% loss, in-network 1.37x -> 1.13x, local, median of 9 seeds).
        Only with ``quarter``: where the run's links lose (nothing lost, a wider window costs nothing and covers
        what may reorder, e.g. a sharded PBox's cores), and not for a ring rank (its ACKs come every few pieces,
        not a round trip after each: its tail probes fired early, Mininet 1%: 212 retransmissions, 1.84x)."""
        return (min(self.min_rto, self.min_rtt / 4) if self.quarter else self.min_rto) + self.design

    def sample(self, rtt: float) -> None:
        """A round trip of a chunk sent once (Karn)."""
        if rtt < self.min_rtt:
            self.min_rtt = rtt

    def answered(self, since_resent: float, by_order: bool = True) -> bool:
        """A retransmitted chunk's answer came ``since_resent`` after the retransmission: was that spurious?
        A spurious one that order declared lost (``by_order``; not a timer's or a probe's) widens the window."""
        if since_resent < self.min_rtt < float("inf"):
            self.spurious(by_order, float("inf"))
            return True
        return False

    def spurious(self, by_order: bool, late: float) -> None:
        """A retransmission proved spurious by its answer's timing, the original's answer ``late`` after order
        first made it suspect: a spurious one order asked for doubles the window's floor part (at most four
        times); where the run reorders, the lateness is reordering the window must cover (``reordered``)."""
        if by_order:
            self.mult = min(self.mult * 2, 4)
        if self.reorder and late < float("inf"):
            self.reordered(late)

    def reordered(self, late: float) -> None:
        """An answer came ``late`` after order had made its transmission suspect, and it was never resent: the
        path reorders by that much (RACK's reordering adaptivity, measured rather than inferred)."""
        if late > self.late:
            self.late = late

    def window(self, srtt: float | None) -> float:
        """How long a suspect may still be only reordered: the RTO floor (a FIFO path reorders nothing; the
        floor is the machine's jitter), doubled per proven spurious retransmission, at most the smoothed RTT;
        or a quarter more than the longest reordering measured, at most REORDER_CAP floors."""
        return max(self.floor, min(self.floor * self.mult, srtt or 0.0), self.reordering(srtt), self.paths(srtt))

    def paths(self, srtt: float | None) -> float:
        """Where results come back out of order by design (``design``: a dynamic tree's chunks take different ways
        up, one maybe behind background traffic) and the links are not known to lose: the smoothed RTT. Order
        there says nothing about loss: leaf-spine 2:1 at 10 Mbit/s beside 50% permutation, chunks by the loaded
        spine came back ~70 ms after their neighbours and were resent, 3-16 times a run, seeds 1-3; now none.
        With ``--loss`` (``quarter``) order still finds losses (it costs a loss the wait: 1% loss, 1.1-1.3x)."""
        return (srtt or 0.0) if self.design and not self.quarter else 0.0

    def reordering(self, srtt: float | None) -> float:
        """The reordering known (the run's) or measured: a quarter more than the latest answer seen, at most
        REORDER_CAP floors, or the smoothed RTT where the run reorders (RFC 8985's bound); 0 if none.

        Where the links lose as well as reorder, one held-back frame's wait (``held``: 1.5 ``reorder_delay``), neither
        the sum over every link of the round trip nor what is measured. A slot's result comes with its last
        contribution, so an answer late past one link's hold is, but for two frames held on one path (1.5% of them
        at 5% on four links), another worker's loss being repaired after its own window: measured, it widened every
        worker's window, and the wider windows made the repairs later still, up to the smoothed RTT (star of 4,
        5% loss and 5% reordering: 6 -> 9 ms in-network, 12 -> 40 ms to the PBox, where the whole call takes 8.5 and
        34 ms lossless). A window there costs every loss its length, a spurious retransmission a frame."""
        if self.held:
            return self.held
        cap = max(REORDER_CAP * self.floor, srtt or 0.0) if self.reorder else REORDER_CAP * self.floor
        return max(self.reorder, min(1.25 * self.late, cap))


class HostQueue:
    """This host's link as one sender sees it: when each frame it hands over will have left, at the link's rate
    (``JobSpec.nic_bps``), as Linux's TCP knows which of its packets are still in the host's queues
    (``skb_still_in_host_queue``). Other senders' frames on the link are not counted: a frame may be thought
    gone before it is. With the rate not known (0), a frame leaves when it is handed over."""

    def __init__(self, bps: float) -> None:
        self.bps = bps
        self.free = -np.inf  # when every frame handed over so far will have left

    def leave(self, sizes: np.ndarray, now: float) -> np.ndarray:
        """When frames of ``sizes`` bytes, handed over at ``now`` in this order, will each have left."""
        if not self.bps or not len(sizes):
            return np.full(len(sizes), now)
        ends = max(now, self.free) + np.cumsum(sizes) * 8 / self.bps
        self.free = float(ends[-1])
        return ends

    def leave_one(self, size: int, now: float) -> float:
        """``leave`` for one frame (a hot path: no array)."""
        if not self.bps:
            return now
        self.free = max(now, self.free) + size * 8 / self.bps
        return self.free


class Undo:
    """Proof that a retransmission was spurious, as TCP's DSACK gives it (RFC 2883, 3708): a second answer
    for a chunk already answered, when that chunk was resent. The switch (or the PBox) answers a RETX of a
    completed slot from its shadow copy, so a retransmission whose original got through is answered twice.
    The first answer was then the original's, late by how long it had been suspect: the reordering the
    window must cover (``Rack.reordered``). Kept per slot, for the chunk it last carried."""

    def __init__(self, slots: int) -> None:
        self.chunk = np.full(slots, -1, np.int64)  # the chunk each slot last carried, once answered
        self.late = np.full(slots, np.nan)  # how long it was suspect before its answer, if it had been resent

    def answered(self, slots: np.ndarray, chunks: np.ndarray, resent: np.ndarray, late: np.ndarray) -> None:
        self.chunk[slots] = chunks
        self.late[slots] = np.where(resent & np.isfinite(late), late, np.nan)

    def duplicates(self, slots: np.ndarray, chunks: np.ndarray) -> np.ndarray:
        """The lateness each spurious retransmission proven by these stale answers shows (each proven once)."""
        hit = slots[(self.chunk[slots] == chunks) & ~np.isnan(self.late[slots])]
        late = self.late[hit]
        self.late[hit] = np.nan
        return late
