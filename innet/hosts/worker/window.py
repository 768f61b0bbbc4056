"""The sending half of an in-network or PBox call: its window of slots, and what it resends when.

A slot holds at most one chunk in flight and its result frees it, so the window is kept per slot, as numpy
arrays: a block of results is taken with a few array operations. A lost chunk is retransmitted once it is a
retransmission timeout old and the result of a chunk sent a reordering window after it came back (RACK),
else when no result at all came for a retransmission timeout (RFC 6298: SRTT + 4 RTTVAR, Karn's rule,
initial 1 s, the timer restarted by every result, so a queue that grows behind a slow link is not taken for
a loss); a lost tail is probed (RFC 8985's TLP). Both come from innet.hosts.recovery, as the ring's do.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from innet.hosts.endpoint import Frames
from innet.hosts.job import JobSpec
from innet.hosts.recovery import UNSENT, HostQueue, Rack, RetransmitTimer, Undo, first_window_rto
from innet.wire.packet import FLAGS_OFFSET, RETX


class Window:
    """Which chunk each of a call's slots carries (chunks ``first..end-1``), since when, what order or a timer
    says is lost, and the retransmissions: ``frame(chunk)`` gives a chunk's frame to resend."""

    def __init__(self, spec: JobSpec, first: int, end: int, frame: Callable[[int], np.ndarray]) -> None:
        self.spec = spec
        self.first, self.end = first, end
        self.frame = frame
        self.in_flight = np.full(spec.slots, -1, np.int64)  # the chunk each slot carries, -1: free
        self.sent_at = np.full(spec.slots, np.inf)
        self.resent = np.zeros(spec.slots, np.bool_)
        self.sent_seq = np.full(spec.slots, UNSENT, np.int64)  # each slot's transmission number (RACK's order)
        self.first_seq = np.full(spec.slots, UNSENT, np.int64)  # each slot's chunk's first transmission number
        self.seq = 0  # transmissions so far: a later number was sent later
        self.owed_at = np.full(spec.slots, -np.inf)  # the soonest the last retransmission's own answer can come
        self.suspect_at = np.full(spec.slots, np.inf)  # when a result for a later transmission first came back
        self.by_order = np.zeros(spec.slots, np.bool_)  # the last retransmission was RACK's (not a timer's)
        self.first_suspect = np.full(spec.slots, np.inf)  # suspect_at before any retransmission of the chunk
        self.left_at = np.full(spec.slots, -np.inf)  # when each slot's last frame leaves this host (``queue``)
        self.host = HostQueue(spec.nic_bps)  # this host's link: when each frame of this call handed to it leaves
        self.host_queued = 0  # retransmissions not made: the last copy was still in this host's queue
        self.undo = Undo(spec.slots)
        self.rack = Rack(spec.min_rto, spec.reorder_window, spec.reorder, quarter=spec.lossy,  # by design: no evidence of loss
                         held=spec.reorder_link if spec.lossy else 0.0)
        self.newest_seq = -1  # the newest transmission whose result came back
        self.timer = RetransmitTimer(spec)
        self.agreed = False  # the exponent chunk is answered: data chunks go out (``agree``)
        self.sent_all = False  # the last chunk has been sent (so every chunk has: each follows its slot's last)
        self.pace = 0.0  # smoothed time between results: how fast the window drains
        self.probes = 0  # tail probes since the last result
        self.probed_at = -np.inf  # the last tail probe
        self.retransmissions = 0
        self.spurious = 0  # retransmissions whose result came back sooner than a round trip could (the original's)
        self.last_progress = 0.0

    @property
    def rto(self) -> float:
        return self.timer.rto

    def drained(self) -> bool:
        """Every chunk sent and answered."""
        return self.sent_all and bool((self.in_flight < 0).all())

    def agree(self) -> None:
        """The lone exponent packet is answered: now a whole window may queue (``first_window_rto``)."""
        self.agreed = True
        if self.timer.srtt is None:
            self.timer = RetransmitTimer(self.spec, first_window_rto(self.spec))

    # -- sending ------------------------------------------------------------
    def put(self, chunks: np.ndarray, frames: Frames, now: float) -> None:
        """``chunks`` (sorted, before the end) go out now in ``frames``, each in its free slot."""
        slots = chunks % self.spec.slots
        self.in_flight[slots], self.sent_at[slots], self.resent[slots] = chunks, now, False
        self.sent_seq[slots] = self.first_seq[slots] = np.arange(self.seq, self.seq + len(chunks))
        self.seq += len(chunks)
        self.sent_all = self.sent_all or int(chunks[-1]) == self.end - 1
        self.queue(slots, frames, now)

    def put_one(self, chunk: int, size: int, now: float) -> None:
        """``put`` for one data chunk whose frame is ``size`` bytes (a hot path: no array)."""
        slot = chunk % self.spec.slots
        self.in_flight[slot], self.sent_at[slot], self.resent[slot] = chunk, now, False
        self.sent_seq[slot] = self.first_seq[slot] = self.seq
        self.seq += 1
        self.sent_all = self.sent_all or chunk == self.end - 1
        if self.spec.nic_bps:
            self.left_at[slot] = self.host.leave_one(size, now)

    def queue(self, slots: np.ndarray, frames: Frames, now: float) -> None:
        """``frames`` (one per slot of ``slots``, in order) were handed to this host's link: when each will have
        left (``HostQueue``). A chunk whose last copy has not is not retransmitted (``resend``)."""
        if not self.spec.nic_bps or not len(slots):
            return
        sizes = np.concatenate([np.full(len(f), f.shape[1]) if isinstance(f, np.ndarray) and f.ndim == 2 else [len(f)]
                                for f in frames])[:len(slots)]
        ends = self.host.leave(sizes, now)
        self.left_at[slots[:len(ends)]] = ends

    def resend(self, slots: np.ndarray, now: float, by_order: bool = False) -> Frames:
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
            frame = np.array(self.frame(int(self.in_flight[slot])))
            frame[FLAGS_OFFSET] |= RETX
            out.append(frame.tobytes())
        self.sent_at[slots], self.resent[slots], self.suspect_at[slots] = now, True, np.inf
        self.by_order[slots] = by_order
        self.sent_seq[slots] = np.arange(self.seq, self.seq + len(slots))
        self.seq += len(slots)
        self.retransmissions += len(slots)
        self.queue(slots, out, now)
        return out

    def resend_lost(self, now: float) -> Frames:
        """``resend`` what order shows lost (``lost``)."""
        return self.resend(self.lost(now), now, by_order=True)

    # -- results --------------------------------------------------------------
    def answered_one(self, slot: int, chunk: int, now: float) -> None:
        """``answered`` for one chunk's fresh result (a hot path: plain ints)."""
        self.in_flight[slot] = -1
        sent = float(self.sent_at[slot])
        self.undo.answered(np.array([slot]), np.array([chunk]), self.resent[slot:slot + 1], now - self.first_suspect[slot:slot + 1])
        if self.resent[slot]:
            self._resent_answered(np.array([slot]), now)
        elif chunk != self.first:  # Karn's rule; the lone exponent packet never queues (``answered``)
            self.timer.sample(now - sent)
            self.rack.sample(now - sent)
            self.rack.reordered(now - float(self.suspect_at[slot]))
        seq = int(self._delivered(np.array([slot]), now)[0])
        self.first_suspect[slot] = np.inf
        if seq > self.newest_seq:
            self.newest_seq = seq
        self.sent_seq[slot], self.suspect_at[slot], self.sent_at[slot] = UNSENT, np.inf, np.inf
        self._progress(now, 1)

    def answered(self, slots: np.ndarray, chunks: np.ndarray, now: float) -> None:
        """Fresh results for ``chunks`` (one each, in their slots ``slots``): the slots are free, the round trips
        sampled (Karn's rule), the retransmissions among them judged, the timers restarted."""
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
        self.newest_seq = max(self.newest_seq, int(self._delivered(slots, now).max()))
        self.sent_seq[slots], self.suspect_at[slots], self.sent_at[slots] = UNSENT, np.inf, np.inf
        self._progress(now, len(slots))

    def _delivered(self, slots: np.ndarray, now: float) -> np.ndarray:
        """The transmission each of these fresh answers is taken to answer (RACK's newest delivered): the last one,
        except to the PBox where the run reorders, whose answer to a retransmission coming sooner than the
        retransmission could be answered (``owed_at``) is the original's (RFC 8985 6.2 step 2: an ambiguous answer
        does not move RACK on). Taken for the retransmission's, a late original's answer made every chunk still
        out before it suspect; each worker's repeats all cross the PBox's link, the one every worker's chunks queue
        on, so these false losses crowded out the real ones' repairs (star, 5% loss and 5% reordering, one link's
        window: 3.0x -> 1.95x lossless, leaf-spine 3.4x -> 2.6x, medians of seeds 1-6). In-network a repeat goes
        no farther than the worker's switch (its contribution held there, or the result answered from the shadow
        copy), and taking the answer for the retransmission's, which detects a lost retransmission sooner, is
        the faster (1.8x and 2.2x; 2.0x and 2.5x the other way)."""
        if self.spec.pbox is None or not self.rack.reorder:
            return self.sent_seq[slots]
        return np.where(self.resent[slots] & (now < self.owed_at[slots]), self.first_seq[slots], self.sent_seq[slots])

    def stale(self, slots: np.ndarray, chunks: np.ndarray) -> None:
        """Stale answers: each that proves a retransmission spurious (``Undo``) counts, and widens the window."""
        for late in self.undo.duplicates(slots, chunks).tolist():
            self.spurious += 1
            if self.rack.reorder:
                self.rack.reordered(late)

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

    # -- timers ---------------------------------------------------------------
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

    def probe_due(self) -> float:
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
        if not probing or self.sent_at.min() == np.inf or (self.agreed and self.timer.srtt is None):
            return np.inf
        out = np.count_nonzero(self.in_flight >= 0)
        backoff = 1 if not self.agreed else 2 ** min(self.probes, 1)  # the lone exponent packet: no queue to spare
        lone = not self.agreed and self.spec.lossy  # a header: resent early it costs a frame (``Rack.held``)
        spell = ((self.rack.floor if lone else self.rack.window(self.timer.srtt)) + out * self.pace) * backoff
        return max(self.last_progress, self.probed_at) + spell

    def lost(self, now: float) -> np.ndarray:
        """Slots whose chunk was sent before one whose result came back, and that stayed unanswered for a
        reordering window since that evidence came (RACK by order: innet.hosts.recovery)."""
        if self.sent_seq.min() >= self.newest_seq:  # nothing outstanding older than the newest answered
            return np.zeros(0, np.int64)
        fresh = (self.sent_seq < self.newest_seq) & (self.suspect_at == np.inf)
        self.suspect_at[fresh] = now
        self.first_suspect[fresh] = np.minimum(self.first_suspect[fresh], now)
        return np.flatnonzero(self.suspect_at + self.rack.window(self.timer.srtt) <= now)

    def deadline(self) -> float:
        """When ``on_timeout`` is next due: the RTO, order's window, a tail probe, or giving up."""
        # the backstop timer restarts whenever a result makes progress (RFC 6298 5.3): a queue that
        # grows behind a slow link is not a loss
        oldest = max(float(self.sent_at.min()), self.last_progress)
        give_up = self.last_progress + self.spec.timeout
        return min(oldest + self.rto, give_up, float(self.suspect_at.min()) + self.rack.window(self.timer.srtt),
                   self.probe_due())

    def on_timeout(self, now: float) -> Frames:
        """What is due at ``now`` (short of giving up): what order shows lost, a tail probe, or what the RTO
        found unanswered."""
        out = self.resend_lost(now)
        if now >= self.probe_due():  # every chunk still out: each may have lost its contribution or its result
            self.probes += 1
            self.probed_at = now
            if self.probes > 2:  # the tail, probed again: only the newest chunk out, whose answer marks the rest (RACK)
                return out + self.resend(np.array([int(np.argmax(np.where(self.in_flight >= 0, self.sent_seq, -1)))]), now)
            return out + self.resend(np.flatnonzero(self.in_flight >= 0), now)
        if now < self.last_progress + self.rto:
            return out
        expired = np.flatnonzero(self.sent_at + self.rto <= now)
        if len(expired):
            self.timer.expired()
        return out + self.resend(expired, now)
