"""The ring's ACKs (innet.hosts.ring): what a rank tells its predecessor it holds, and what a rank makes of
what its successor tells it.

An ACK is cumulative with a selective bitmap, per step: its first value is the first piece of the step still
missing (all below it arrived), the others a bitmap of the ACK_SPAN pieces from there (``encode``,
``decode``). ``Receipts`` is the receiving side: the pieces each step brought, and when an ACK is due;
``Scoreboard`` the sending side: every packet still unacknowledged with its RTO timer, each transmission's
number, and which ones order shows lost (RACK, RFC 8985: the path is FIFO, so a packet sent before one that arrived and still
unacknowledged was lost), as a SACK sender's scoreboard (RFC 6675) keeps them.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable

import numpy as np

from innet.wire.packet import FLAGS_OFFSET, RETX

ACK_EVERY = 16  # a step's pieces an ACK waits for, at most (the ring's package notes)
ACK_SPAN = 1024  # pieces an ACK's bitmap covers above its cumulative point (128 bytes)
WINDOW = 256  # packets unacknowledged at most, or ACK_EVERY a step if more (the ring's package notes)

Key = tuple[int, int]  # (step, piece)


def encode(have: np.ndarray) -> np.ndarray:
    """The values of an ACK for a step of which ``have`` says which pieces arrived."""
    missing = np.flatnonzero(~have)
    base = int(missing[0]) if len(missing) else len(have)
    bits = np.zeros(ACK_SPAN, bool)
    span = have[base:base + ACK_SPAN]
    bits[:len(span)] = span
    return np.concatenate(([base], np.packbits(bits, bitorder="little").view(np.int32)))


def decode(values: np.ndarray) -> tuple[int, np.ndarray]:
    """An ACK's cumulative point and its bitmap (``encode``'s)."""
    return int(values[0]), np.unpackbits(np.ascontiguousarray(values[1:]).view(np.uint8), bitorder="little")


class Receipts:
    """What came from the predecessor, per step: each piece's values (``got``), the first piece not yet
    received (``next_in``), and the hole an out-of-order arrival last reported (``hole_acked``: a rank that
    saw one has lost something, innet.hosts.ring.linger.Linger). ``expected(step)``: the pieces a step brings."""

    def __init__(self, expected: Callable[[int], int]) -> None:
        self.expected = expected
        self.got: dict[int, dict[int, np.ndarray]] = {}  # step -> piece -> values received
        self.have: dict[int, np.ndarray] = {}  # step -> which pieces arrived (for ACKs)
        self.next_in: dict[int, int] = {}  # step -> the first piece not yet received (all below it were)
        self.hole_acked: dict[int, int] = {}  # step -> the hole an out-of-order arrival last reported
        self.since_ack: dict[int, int] = {}  # step -> pieces since its last ACK

    def take(self, step: int, j: int, values: np.ndarray) -> tuple[bool, bool]:
        """Piece ``j`` of ``step`` arrived with ``values``: whether it is fresh, and whether it shows a hole or
        fills one (either is said at once)."""
        pieces = self.got.setdefault(step, {})
        if j in pieces:
            return False, False
        pieces[j] = values.astype(np.int64)
        first = self.next_in.get(step, 0)
        if j == first:
            while first in pieces:
                first += 1
            self.next_in[step] = first
            return True, first > j + 1  # a hole filled (the piece was late, or resent): say so at once too
        # out of order on a FIFO path: say so at once, each time (TCP's duplicate ACKs, RFC 5681 4.2)
        self.hole_acked[step] = first
        return True, True

    def due(self, step: int, fresh: bool, hole: bool, retx: bool) -> bool:
        """Whether the arrival just taken for ``step`` is ACKed now: a duplicate, a hole, a retransmission (its
        echo), every ACK_EVERY pieces, and the step's last."""
        self.since_ack[step] = self.since_ack.get(step, 0) + 1
        if (not fresh or hole or retx or self.since_ack[step] >= ACK_EVERY
                or len(self.got[step]) == self.expected(step)):
            self.since_ack[step] = 0
            return True
        return False

    def ack(self, step: int) -> np.ndarray:
        """The values of an ACK for ``step`` (``encode``)."""
        have = self.have.setdefault(step, np.zeros(self.expected(step), bool))
        have[list(self.got[step])] = True
        return encode(have)


class Scoreboard:
    """What this rank sent its successor and is not yet acknowledged, per step, with each transmission's number
    (a later number was sent later) and RTO timer, and the suspects: packets sent before one known to have
    arrived. Every packet is keyed (step, piece); ``expected(step)``: the pieces a step sends."""

    def __init__(self, expected: Callable[[int], int]) -> None:
        self.expected = expected
        self.unacked: dict[Key, tuple[float, bytes]] = {}  # (sent at, frame) of each packet unacknowledged
        self.open: dict[int, set[int]] = {}  # step -> its unacknowledged packets (the keys of ``unacked``)
        self.seq = 0  # transmissions so far: a later number was sent later
        self.sent_seq: dict[Key, int] = {}  # each unacknowledged packet's transmission number
        self.first_seqs: dict[int, np.ndarray] = {}  # step -> each piece's first transmission number (-1: unsent)
        self.resent_seq: dict[Key, list[int]] = {}  # each packet resent: its retransmissions' numbers
        self.sends: dict[int, list[tuple[int, int]]] = {}  # step -> every transmission's (number, piece), in order
        self.newest_acked: dict[int, int] = {}  # step -> the newest transmission acknowledged
        self.delivered = -1  # the newest transmission taken to have arrived, of any step (the path is FIFO)
        self.suspect: dict[Key, float] = {}  # unacknowledged, though sent before one acknowledged: since when
        self.timers: list[tuple[float, int, int]] = []  # (armed at, step, j); stale once ``armed`` differs
        self.armed: dict[Key, float] = {}  # when each unacknowledged packet's RTO timer was last armed

    def sent(self, key: Key, frame: bytes, now: float) -> None:
        """Packet ``key`` went out for the first time, as ``frame``."""
        step, j = key
        self.unacked[key] = (now, frame)
        self.sent_seq[key] = self.seq
        self.first_seqs.setdefault(step, np.full(self.expected(step), -1, np.int64))[j] = self.seq
        self.sends.setdefault(step, []).append((self.seq, j))
        self.seq += 1
        self.open.setdefault(step, set()).add(j)
        self._arm(key, now)

    def resend(self, key: Key, now: float) -> bytes:
        """Packet ``key`` goes again now: its frame, flagged RETX."""
        frame = bytearray(self.unacked[key][1])
        frame[FLAGS_OFFSET] |= RETX
        self.suspect.pop(key, None)
        self.resent_seq.setdefault(key, []).append(self.seq)
        self.sends[key[0]].append((self.seq, key[1]))
        self.unacked[key] = (now, bytes(frame))
        self.sent_seq[key] = self.seq
        self.seq += 1
        self._arm(key, now)
        return bytes(frame)

    def acknowledged(self, step: int, base: int, bits: np.ndarray) -> list[tuple[Key, float, bytes, float | None, bool]]:
        """The packets of ``step`` an ACK (``decode``'s ``base``, ``bits``) acknowledges, each taken off the board:
        its key, when it was last sent, its frame, since when it was suspect (None: never), whether it was resent."""
        pending = self.open.get(step, set())
        held = {base + int(k) for k in np.flatnonzero(bits)}  # beyond the cumulative point
        out = []
        for key in [(step, j) for j in pending if j < base or j in held]:
            sent, frame = self.unacked.pop(key)
            pending.discard(key[1])
            del self.armed[key]
            del self.sent_seq[key]
            out.append((key, sent, frame, self.suspect.pop(key, None), key in self.resent_seq))
        return out

    def arrived(self, step: int, j: int, retx: bool, base: int, bits: np.ndarray, now: float) -> bool:
        """An ACK of ``step`` was sent on the arrival of piece ``j`` (a retransmission if ``retx``): every packet sent
        before that transmission arrived or was lost (the path is FIFO). RACK's newest delivered transmission (RFC
        8985) is that one, known from the echo (for a retransmission, which one: ``_retransmission``), not taken from
        the pieces acknowledged: an original's answer that came late (a queue deeper than the minimum round trip,
        where RFC 8985's own test, 6.2 step 2, cannot tell) would then pass for its retransmission's, and declare
        lost every piece still queued behind it. The unacknowledged packets sent before it become suspects; False
        when nothing of ``step`` is known to have arrived."""
        delivered = self._retransmission(step, j, base, bits) if retx else self.first(step, j)
        if delivered > self.delivered:
            self.delivered = delivered
            self._lost_before(step, now)
        if delivered > self.newest_acked.get(step, -1):
            self.newest_acked[step] = delivered
        newest = self.newest_acked.get(step)
        if newest is None:
            return False
        # the path is FIFO: a packet sent before one acknowledged, and still not acknowledged, was lost, unless the
        # path reorders: it is resent once it stayed so for a reordering window (innet.hosts.recovery)
        for k in self.open.get(step, set()):
            if self.sent_seq[(step, k)] < newest:
                self.suspect.setdefault((step, k), now)
        return True

    def _lost_before(self, step: int, now: float) -> None:
        """Packets of steps other than ``step`` sent before the newest known to have arrived (``delivered``): a lone
        packet (an exponent step's) and a retransmission are acknowledged on arrival, and ACKs come back in order
        too, so one still unacknowledged was lost, or its ACK was (a data piece's ACK may wait for ACK_EVERY more).
        Per step only, a lost exponent packet waited for its RTO, which the data a rank goes on sending meanwhile
        kept restarting (star of 4, 20% loss, seed 1: 8.5 ms, a sixth of the call)."""
        for other, js in self.open.items():
            if other == step:
                continue
            lone = self.expected(other) == 1
            for j in js:
                key = (other, j)
                if (lone or key in self.resent_seq) and self.sent_seq[key] < self.delivered:
                    self.suspect.setdefault(key, now)

    def first(self, step: int, j: int) -> int:
        """Piece ``j`` of ``step``'s first transmission number (-1: never sent)."""
        firsts = self.first_seqs.get(step)
        return int(firsts[j]) if firsts is not None and j < len(firsts) else -1

    def _retransmission(self, step: int, j: int, base: int, bits: np.ndarray) -> int:
        """Which transmission of piece ``j`` of ``step`` arrived, when its retransmission's echo sent an ACK (cumulative
        point ``base``, bitmap ``bits``): the echo cannot say which one. The ACK was sent on that arrival, so every
        other piece it shows held arrived before it, as did what earlier ACKs echoed (``delivered``), and (the path
        is FIFO) all were sent before it: a retransmission sent after the newest of those. Of these, the newest
        that does not make most of the step's packets sent between that bound and it lost: a probe queued behind
        its own original (star of 4, 1% loss: 2.5 ms, longer than the smoothed RTT) would, taken for a later
        probe, declare lost the 20 pieces between them; a lossy tail's probes, sent with little between them, are
        taken as they come (leaf-spine, 20% loss: a round trip survives 17% of the time)."""
        firsts = self.first_seqs.get(step, np.zeros(0, np.int64))
        held = np.zeros(len(firsts), bool)
        held[:base] = True
        beyond = base + np.flatnonzero(bits)
        held[beyond[beyond < len(held)]] = True
        held[j:j + 1] = False
        bound = max(int(firsts[held].max(initial=-1)), self.delivered)  # a piece resent: its first transmission's
        resent = [seq for seq in self.resent_seq.get((step, j), []) if seq > bound]
        if not resent:
            return max(self.resent_seq.get((step, j), []), default=self.first(step, j))
        sends = self.sends.get(step, [])
        for seq in reversed(resent):
            between = [k for _, k in sends[bisect.bisect_right(sends, (bound, len(held))):bisect.bisect_left(sends, (seq, -1))]
                       if k != j]
            if sum(not held[k] for k in between) <= sum(held[k] for k in between):
                return seq
        return resent[0]

    def _arm(self, key: Key, now: float) -> None:
        self.armed[key] = now
        heapq.heappush(self.timers, (now, *key))

    def oldest_timer(self) -> float | None:
        """When the oldest RTO timer still running was armed (None: none is)."""
        while self.timers and self.armed.get(self.timers[0][1:]) != self.timers[0][0]:
            heapq.heappop(self.timers)
        return self.timers[0][0] if self.timers else None

    def expired(self, now: float, rto: float) -> list[Key]:
        """Each step's oldest packet whose RTO timer ran out by ``now``, to be probed; the step's others are armed
        again, not resent: the probe's ACK names them lost, or the next timeout probes them."""
        probes: dict[int, Key] = {}  # step -> its oldest expired packet
        while self.timers and self.timers[0][0] + rto <= now:
            armed_at, step, j = heapq.heappop(self.timers)
            if self.armed.get((step, j)) != armed_at:
                continue
            if step in probes:
                self._arm((step, j), now)
            else:
                probes[step] = (step, j)
        return list(probes.values())

    def lost(self, now: float, window: float) -> list[Key]:
        """The suspects a reordering ``window`` old, in order, taken off the suspects."""
        if not self.suspect:
            return []
        lost = sorted(key for key, since in self.suspect.items() if since + window <= now)
        for key in lost:
            del self.suspect[key]
        return lost

    def oldest(self) -> list[Key]:
        """Each step's oldest unacknowledged packet, in step order (a tail probe's)."""
        return [(step, min(js)) for step, js in sorted(self.open.items()) if js]

    def lone_out(self) -> bool:
        """Whether a lone packet (an exponent step's) is still unacknowledged."""
        return any(js and self.expected(s) == 1 for s, js in self.open.items())
