"""One rank's part of one ring all-reduce (``RingCall``), sans-I/O: the protocol, flow control, ACKs and loss
recovery are the package's (innet.hosts.ring); what it ACKs and what ACKs tell it are innet.hosts.ring.acks.
"""

from __future__ import annotations

import itertools
from collections import deque

import numpy as np

from innet.hosts.endpoint import Frames
from innet.hosts.job import JobSpec
from innet.hosts.recovery import HostQueue, Rack, RetransmitTimer, first_window_rto
from innet.hosts.ring.acks import ACK_EVERY, WINDOW, Receipts, Scoreboard, decode
from innet.hosts.ring.geometry import ring_geometry, ring_phases
from innet.wire.packet import (
    HEADER_DTYPE,
    PAYLOAD_OFFSET,
    RESULT,
    RETX,
    ROUTE,
    FrameBlock,
    build_frames,
    make_packet,
    parse_frame,
)

ACK_BAND = 0  # ACKs jump the queue of data on the way back (see the package notes)


class RingCall:
    """One worker's part of one ring all-reduce; same endpoint interface as the others."""

    def __init__(self, spec: JobSpec, ring: list[int], tensor: np.ndarray, first_chunk: int) -> None:
        self.spec = spec
        self.data_band = max(spec.band, ACK_BAND + 1)
        n = spec.nworkers
        self.ring = ring  # rank -> node index
        self.rank = spec.rank
        self.next_node, self.prev_node = ring[(spec.rank + 1) % n], ring[(spec.rank - 1) % n]
        self.tensor = spec.as_input(tensor)
        self.reduces, self.gathers = ring_phases(spec.collective)
        self.segments, self.pieces = ring_geometry(len(self.tensor), n, spec.elements, spec.collective, spec.root)
        self.first = first_chunk
        self.end = first_chunk + self.pieces
        self.steps = 3 * (n - 1)  # and the DONE's step number; a collective of one half skips the other's steps
        self.missing = (n - 1) + (self.reduces + self.gathers) * (n - 1) * self.pieces  # packets still to receive
        self.exp = spec.operator.exponent(self.tensor)
        self.scale: int | None = None
        self.quantized = np.zeros(0, np.int32)
        self.result_int = np.zeros(len(self.tensor), np.int64)
        self.receipts = Receipts(self._expected)  # what came from the predecessor, and the ACKs it is owed
        self.scoreboard = Scoreboard(self._expected)  # what went to the successor, and what its ACKs show lost
        self.pending: list[tuple[int, int]] = []
        self.backlog: deque[tuple[int, int, np.ndarray | None, int | None]] = deque()  # waiting for the window
        self.early: list[bytes] = []
        self.retransmissions = 0
        self.started_at: float | None = None
        self.finished_at: float | None = None
        self.last_progress = 0.0
        self.last_ack = 0.0  # the successor's last useful ACK
        self.last_sent = 0.0  # the newest new packet: an ACK waits for up to ACK_EVERY packets after the one it covers
        self.error: Exception | None = None
        self.timer = RetransmitTimer(spec)
        self.rack = Rack(spec.min_rto, spec.reorder_window, held=spec.reorder_link if spec.lossy else 0.0)
        self.probes = 0  # tail probes since the last useful ACK
        self.probed_at = 0.0  # the last tail probe
        self.spurious = 0
        self.sent_done = False
        self.predecessor_done = False  # the predecessor's DONE came: it will not probe this call again
        self.host = HostQueue(spec.nic_bps)  # this host's link: when each frame this call handed it leaves
        self.left: dict[tuple[int, int], float] = {}  # when each unacknowledged packet's last copy leaves this host
        self.path_rtt: float | None = None  # smoothed round trip from leaving this host (no host queue in it)
        self.retry: dict[tuple[int, int], float] = {}  # each unanswered retransmission's own deadline (``_retry_due``)

    # -- geometry ---------------------------------------------------------
    def _segment_sent(self, step: int) -> int:
        n, k = self.spec.nworkers, step - (self.spec.nworkers - 1)
        if k < n - 1:
            return (self.rank - k) % n
        return (self.rank + 1 - (k - (n - 1))) % n

    def _piece(self, segment: int, j: int) -> tuple[int, int]:
        a, b = self.segments[segment]
        lo = a + j * self.spec.elements
        return min(lo, b), min(lo + self.spec.elements, b)

    # -- endpoint interface -------------------------------------------------
    @property
    def result(self) -> np.ndarray:
        assert self.scale is not None
        return self.spec.operator.dequantize(self.result_int, self.scale)

    @property
    def done(self) -> bool:
        return (self.finished_at is not None and not self.scoreboard.unacked and not self.backlog) or self.error is not None

    def waiting(self) -> str:
        """What this rank waits for, for a progress line: the first piece missing from its predecessor, else the
        oldest ACK its successor owes."""
        if self.done:
            return ""
        n, tail = self.spec.nworkers, f", {self.retransmissions} retransmissions"
        for step in range(self.steps):
            if self.missing and len(self.receipts.got.get(step, ())) < self._expected(step):
                return (f"ring: rank {self.rank} waiting for piece {self.receipts.next_in.get(step, 0)} of step {step} "
                        f"from rank {(self.rank - 1) % n}{tail}")
        if self.scoreboard.unacked:
            step, j = min(self.scoreboard.unacked)
            return f"ring: rank {self.rank} waiting for rank {(self.rank + 1) % n} to acknowledge piece {j} of step {step}{tail}"
        return ""

    def start(self, now: float) -> Frames:
        self.started_at = self.last_progress = self.last_ack = now
        if self.spec.nworkers == 1:
            self._agree(self.exp)
            self.result_int[:] = self.quantized
            self.finished_at = now
            return []
        self._send(0, 0, None)
        return self._drain(now)

    def _agree(self, q: int) -> None:
        if self.timer.srtt is None:  # the exponent steps' lone packets are done: a window of data may queue
            self.timer = RetransmitTimer(self.spec, first_window_rto(self.spec))
        self.q = q
        self.scale = self.spec.operator.scale(q, self.spec.nworkers)
        self.quantized = self.spec.operator.quantize(self.tensor, self.scale)

    def _send(self, step: int, j: int, values: np.ndarray | None, exp: int | None = None) -> None:
        """Queue packet j of ``step``; ``_drain`` sends it once the window has room."""
        self.backlog.append((step, j, values, exp))

    def _drain(self, now: float) -> Frames:
        """Send what the window has room for, oldest first: blocks of equal-length frames, each a run of them in
        the backlog's order. Grouped by length across the whole window instead, a step's short last piece went out
        with another step's short piece queued ahead of them, before its own step's earlier pieces: the successor
        took it for a hole (a duplicate ACK, and 16 DONE repeats), 6 in 20 jumbo runs on Mininet."""
        room = max(WINDOW, ACK_EVERY * self.steps) - len(self.scoreboard.unacked)
        items = [self.backlog.popleft() for _ in range(min(room, len(self.backlog)))]
        return [self._transmit(count, list(run), now)
                for count, run in itertools.groupby(items, lambda item: 0 if item[2] is None else len(item[2]))]

    def _transmit(self, count: int, items: list[tuple[int, int, np.ndarray | None, int | None]], now: float) -> np.ndarray:
        """The frames of ``items`` (each with ``count`` values) as one block; each one put in flight."""
        spec = self.spec
        hdr = np.zeros(len(items), HEADER_DTYPE)
        hdr["job"], hdr["rank"], hdr["nworkers"], hdr["flags"], hdr["count"] = spec.job, spec.rank, spec.nworkers, ROUTE, count
        hdr["slot"] = [step for step, _, _, _ in items]
        hdr["chunk"] = [self.first + j for _, j, _, _ in items]
        hdr["exp"] = [self.exp if exp is None else exp for _, _, _, exp in items]
        values = np.stack([v for _, _, v, _ in items if v is not None]) if count else np.zeros((len(items), 0), np.int32)
        block = build_frames(spec.node, self.next_node, hdr, values, self.data_band)
        for (step, j, _, _), row in zip(items, block, strict=True):
            self.scoreboard.sent((step, j), row.tobytes(), now)
            self.left[(step, j)] = self.host.leave_one(len(row), now)
        self.last_sent = now
        return block

    def _retry_due(self, key: tuple[int, int]) -> float | None:
        """When a retransmission, unanswered, is sent again: it is acknowledged on arrival (its RETX flag), so its
        ACK is due a round trip after it leaves this host (``path_rtt``: the host's own queue is not in it); two,
        at least the reordering window, as SwitchML's per-slot timer. Before, a lost retransmission waited for an
        ACK of something sent later, or a tail probe (which takes only each step's oldest piece), or the RTO: on
        the leaf-spine at 20% loss a cross-rack round trip survives 17% of the time, and a piece lost six times
        took 714 frame times to cross one hop, its tries 33-247 apart (262144 values, medians of 21 seeds: 65.6 ->
        53.5 ms)."""
        if self.path_rtt is None:
            return None
        return self.left[key] + max(self.rack.window(self.path_rtt), 2 * self.path_rtt)

    def receive(self, frame: bytes, now: float) -> Frames:
        pkt = parse_frame(frame)
        if pkt is None or pkt.job != self.spec.job or not pkt.has(ROUTE) or pkt.dst != self.spec.node:
            return []
        if pkt.chunk >= self.end:
            self.early.append(frame)  # the next call's: the peer moved on first
            return []
        resent: Frames = []
        acks: Frames = []
        self._take(pkt.src, int(pkt.hdr["flags"]), pkt.slot, pkt.chunk, pkt.exp, pkt.values, now, resent, acks)
        return resent + self._drain(now) + acks + self._fin()

    def receive_block(self, block: FrameBlock, now: float) -> Frames:
        """``receive`` for a block of frames: one vectorised filter, then each packet in arrival order."""
        hdr = block.hdr
        flags, chunk = hdr["flags"].astype(np.int64), hdr["chunk"].astype(np.int64)
        mine = block.ok & (hdr["job"] == self.spec.job) & (flags & ROUTE != 0) & (block.dst == self.spec.node)
        for k in np.flatnonzero(mine & (chunk >= self.end)):
            self.early.append(block.frame(int(k)))  # the next call's: the peer moved on first
        rows = np.flatnonzero(mine & (chunk >= self.first) & (chunk < self.end))
        resent: Frames = []
        acks: Frames = []
        fields = zip(block.src[rows].tolist(), flags[rows].tolist(), hdr["slot"][rows].tolist(), chunk[rows].tolist(),
                     hdr["exp"][rows].tolist(), hdr["count"][rows].tolist(), rows.tolist(), strict=True)
        for src, flag, step, c, exp, count, k in fields:
            self._take(src, flag, step, c, exp, block.values(k, count), now, resent, acks)
        return resent + self._drain(now) + acks + self._fin()

    def _take(self, src: int, flags: int, step: int, chunk: int, exp: int, values: np.ndarray, now: float,
              resent: Frames, acks: Frames) -> None:
        """One packet of this call, from ``src``: an ACK (what it shows lost goes to ``resent``), or a
        piece of ``step`` (what it lets this rank send is queued; its ACK, when one is due, goes to ``acks``)."""
        if chunk < self.first:
            return
        if flags & RESULT and step == self.steps:  # a DONE (with 2 ranks the predecessor is the successor too)
            self.predecessor_done |= src == self.prev_node
            return
        if flags & RESULT:
            if src == self.next_node:
                resent.extend(self._on_ack(step, values, now, chunk - self.first, bool(flags & RETX)))
            return
        if src != self.prev_node or step >= self.steps:
            return
        j = chunk - self.first
        fresh, hole = self.receipts.take(step, j, values)
        if fresh:
            self.missing -= 1
            self.last_progress = now
            if step >= self.spec.nworkers - 1 and self.scale is None:
                self.pending.append((step, j))  # the predecessor agreed on the scale before this rank did
            else:
                self._advance(step, j, exp)
        if self.receipts.due(step, fresh, hole, bool(flags & RETX)):
            acks.append(self._ack(step, j, flags & RETX))
        self._check_finished(now)

    def _ack(self, step: int, j: int, retx: int) -> bytes:
        """A cumulative ACK of ``step`` with a selective bitmap (innet.hosts.acks.encode). Its chunk is piece ``j``'s,
        whose arrival sent it, and its RETX flag says that arrival was a retransmission (an echo, as TCP's
        timestamps give one: ``Scoreboard.arrived`` tells an original's late answer from its retransmission's)."""
        pkt = make_packet(self.receipts.ack(step), job=self.spec.job, rank=self.rank, nworkers=self.spec.nworkers,
                          slot=step, chunk=self.first + j, flags=ROUTE | RESULT | retx)
        return pkt.to_frame(self.spec.node, self.prev_node, ACK_BAND)

    def _on_ack(self, step: int, values: np.ndarray, now: float, arrived: int = 0, retx: bool = False) -> Frames:
        """An ACK for ``step`` from the successor (innet.hosts.acks.decode); ``arrived``, the piece whose arrival sent
        it, a retransmission if ``retx``: what it acknowledges is off the scoreboard, its round trip sampled, and
        what it shows lost (``Scoreboard.arrived``) resent."""
        if len(values) < 1:
            return []
        base, bits = decode(values)
        acked = self.scoreboard.acknowledged(step, base, bits)
        if acked:
            self.probes = 0
            self.timer.progress()
        # the round trip is sampled from the packet whose arrival sent this ACK: an older one's includes the wait
        # for the ACK (every ACK_EVERY packets, or a lost ACK's successor)
        trigger = (step, arrived)
        for key, sent, frame, suspect, resent in acked:
            left = self.left.pop(key)
            self.retry.pop(key, None)
            self.last_progress = self.last_ack = now
            if resent:
                self.spurious += self.rack.answered(now - sent)
            elif suspect is not None:  # late, not lost: the path reorders by that much
                self.rack.reordered(now - suspect)
            # Karn; and the lone exponent packets never queue, so they would underestimate, as would the
            # empty pieces of a collective's empty or short shards (innet.wire.collectives)
            elif key == trigger and step >= self.spec.nworkers - 1 and len(frame) > PAYLOAD_OFFSET:
                self.timer.sample(now - sent)
                self.rack.sample(now - sent)
                self.path_rtt = now - left if self.path_rtt is None else 0.875 * self.path_rtt + 0.125 * (now - left)
        if not self.scoreboard.arrived(step, arrived, retx, base, bits, now):
            return []
        return list(self._resend_lost(now))

    def _resend_lost(self, now: float) -> list[bytes]:
        """Retransmit the suspects a reordering window old."""
        if not self.scoreboard.suspect:
            return []
        window = self.rack.reordering(self.timer.srtt)  # the receiver ACKs a hole at once: no jitter to wait out
        return [self._retransmit(key, now) for key in self.scoreboard.lost(now, window)]

    def _fin(self) -> Frames:
        """The DONE frame for the successor, the first time this call is done without an error."""
        if self.sent_done or not self.done or self.error is not None or self.spec.nworkers == 1:
            return []
        self.sent_done = True
        return [self.done_frame()]

    def done_frame(self) -> bytes:
        pkt = make_packet(None, job=self.spec.job, rank=self.rank, nworkers=self.spec.nworkers,
                          slot=self.steps, chunk=self.first, flags=ROUTE | RESULT)
        return pkt.to_frame(self.spec.node, self.next_node, ACK_BAND)

    def quiet(self) -> float:
        """Two minimum round trips, at least the reordering window and the smoothed RTT: a tail probe's spacing."""
        return max(self.rack.window(self.timer.srtt), 2 * self.rack.min_rtt if self.rack.min_rtt < float("inf") else 0.0)

    def _retransmit(self, key: tuple[int, int], now: float) -> bytes:
        frame = self.scoreboard.resend(key, now)
        self.retransmissions += 1
        self.left[key] = self.host.leave_one(len(frame), now)
        due = self._retry_due(key)
        if due is not None:
            self.retry[key] = due
        return frame

    def _advance(self, step: int, j: int, exp: int) -> None:
        """Queue what receiving packet j of ``step`` from the predecessor lets this rank send."""
        n = self.spec.nworkers
        if step < n - 1:  # exponent chain
            running = max(exp, self.exp)
            if step < n - 2:
                self._send(step + 1, 0, None, exp=running)
                return
            self._agree(running)
            first = n - 1 if self.reduces else 2 * (n - 1)  # all-gather alone: this rank's own segment goes round
            if not self.reduces:
                lo, hi = self.segments[(self.rank + 1) % n]
                self.result_int[lo:hi] = self.quantized[lo:hi]
            for p in range(self.pieces):
                self._send(first, p, self._own(self._segment_sent(first), p))
            for pending in self.pending:
                self._advance(*pending, 0)
            return
        k = step - (n - 1)
        received = self.receipts.got[step][j]
        if k < n - 1:  # reduce-scatter: add own part
            seg = (self.rank - k - 1) % n
            lo, hi = self._piece(seg, j)
            total = self.spec.operator.combine(received.astype(np.int32), self.quantized[lo:hi])  # on the wire's int32
            if k == n - 2:  # fully reduced: this rank's result for ``seg``; it starts the all-gather
                self.result_int[lo:hi] = total
                if not self.gathers:
                    return
            self._send(step + 1, j, total.astype(np.int32))
            return
        seg = (self.rank - (k - (n - 1))) % n
        lo, hi = self._piece(seg, j)
        self.result_int[lo:hi] = received
        if step + 1 < self.steps:
            self._send(step + 1, j, received.astype(np.int32))

    def _own(self, segment: int, j: int) -> np.ndarray:
        lo, hi = self._piece(segment, j)
        return self.quantized[lo:hi]

    def _expected(self, step: int) -> int:
        return 1 if step < self.spec.nworkers - 1 else self.pieces

    def _check_finished(self, now: float) -> None:
        """Finished once every step's packets arrived: then every packet this rank owes was sent too."""
        if self.finished_at is None and not self.missing:
            self.finished_at = now

    def next_deadline(self) -> float | None:
        if self.done:
            return None
        oldest = self.scoreboard.oldest_timer()
        give_up = self.last_progress + self.spec.timeout
        if oldest is None:
            return give_up
        # the timer restarts whenever an ACK makes progress (RFC 6298 5.3): a queue that grows is not a loss; and
        # while new packets go out (a chain's one step sends its pieces at its predecessor's pace, each ACK after
        # ACK_EVERY of them, which can outlast the RTO), their ACKs are still to come
        lost = min(self.scoreboard.suspect.values(), default=float("inf")) + self.rack.reordering(self.timer.srtt)
        lost = min(lost, min(self.retry.values(), default=float("inf")))
        return min(max(oldest, self.last_ack, self._sending()) + self.timer.rto, give_up, self._probe_due(), lost)

    def _sending(self) -> float:
        """``last_sent``, while this call has lost nothing or its links reorder: once a FIFO path has lost
        something, its ACKs are no longer just late (a lossy ring's RTO restarted by every packet sent waited too
        long: 20% loss on the leaf-spine 6.5x -> 10.1x), but where frames are held back they may well be."""
        return self.last_sent if not self.retransmissions or self.rack.reorder else 0.0

    def _probe_due(self) -> float:
        """When to probe (RFC 8985's TLP), once this call has lost something: no ACK or probe for two round trips
        (``quiet``: at least a reordering window), the same spacing for every probe (not doubled). Before any loss,
        only where the run's links lose (``JobSpec.lossy``) and a round trip is measured, or a lone packet is still
        unacknowledged: once a rank has the exponent, its RTO is the data window's (``first_window_rto``, 312 ms), and
        its own exponent packets may not have reached its successor (leaf-spine, 20% loss, seed 9: a rank whose ACKs
        were all lost waited 312 ms).

        Nor before the newest frame this call handed its host has left it and had two round trips from there to be
        answered (``path_rtt``, as ``_retry_due``; the spacing itself before one is measured): a probe handed over
        sooner only queues behind it (RFC 8985 restarts the probe timer with each transmission; Linux does not
        resend from the host's queue). Before, where a frame's time is long next to the RTO floor, a rank probed
        every floor (1 ms, no round trip measured yet) with pieces still queued here, each probe another frame in
        the queue, and with every piece resent Karn's rule let no round trip be measured: star of 4 at 10 Mbit/s
        (8 KiB frames, 6.6 ms each), 120000 values, 1% loss, seeds 1-3: 2.12-2.22 s with 818-962 retransmissions
        for 40-55 frames dropped (lossless 0.59 s), now 0.62-0.81 s with 6-14 (the model: 0.66 s)."""
        measured = self.timer.srtt is not None or self.scoreboard.lone_out()
        if not (self.retransmissions or (self.spec.lossy and measured)) or not self.scoreboard.unacked:
            return float("inf")
        quiet = self.quiet()
        drained = self.host.free + (quiet if self.path_rtt is None else 2 * self.path_rtt)
        return max(max(self.last_ack, self.probed_at) + quiet, drained)

    def on_timeout(self, now: float) -> list[bytes]:
        if self.done:
            return []
        if now >= self.last_progress + self.spec.timeout:  # the very sum next_deadline gave, so no float gap
            from innet.errors import AllreduceTimeout

            n, timeout = self.spec.nworkers, self.spec.timeout
            if self.scoreboard.unacked and now >= self.last_ack + timeout:
                blame = f"rank {(self.rank + 1) % n} (its successor in the ring) acknowledged nothing"
            else:
                blame = f"nothing new from rank {(self.rank - 1) % n} (its predecessor in the ring)"
            self.error = AllreduceTimeout(f"job {self.spec.job} rank {self.rank}: {blame} for {timeout:g}s")
            return []
        rto = self.timer.rto
        lost = self._resend_lost(now) + [self._retransmit(key, now) for key, due in sorted(self.retry.items()) if due <= now]
        if now < max(self.last_ack, self._sending()) + rto or now >= self._probe_due():
            if now < self._probe_due():
                return lost
            self.probes += 1  # a tail probe: each step's oldest packet asks for an ACK naming every hole
            self.probed_at = now
            unacked = self.scoreboard.unacked
            return lost + [self._retransmit(key, now) for key in self.scoreboard.oldest() if unacked[key][0] < now]  # not just resent
        out = [self._retransmit(key, now) for key in self.scoreboard.expired(now, rto)]
        if out:
            self.timer.expired()
        return lost + out
