"""Ring all-reduce between the worker hosts (the Horovod / Pipe-SGD baseline), sans-I/O.

Rank r sends only to rank r+1 (addressed packets, routed by the switches).
Steps, each one packet chain per ``elements``-sized piece:
1. N-1 exponent steps pass the running max exponent along, so all agree on a scale;
2. N-1 reduce-scatter steps: at step k rank r sends segment (r-k) mod N, its own
   values plus what it got for that segment at step k-1;
3. N-1 all-gather steps pass the reduced segments along.
Packet j of a step is sent as soon as packet j of the previous step arrived
(the ring is pipelined), as long as fewer than WINDOW packets are unacknowledged
(the flow control a ring gets from TCP in Gloo or NCCL; in-network all-reduce
gets the same from its slot pool); the rest wait in order. Receivers acknowledge with a bitmap of the packets of
a step they hold (every ACK_EVERY packets of a step, at the end of a step, on
every retransmission and on every packet that comes out of order, as TCP's
duplicate ACKs: a lost ACK for a hole then costs the next packet, not ACK_EVERY
more; star of 4, 262144 values, 1/5/20% loss: -9/-12/-19%). The window is at least ACK_EVERY x steps, so when it
is full some step has ACK_EVERY packets unacknowledged: either one of them is
still on its way, or its ACK is, or one was lost (and the timeout's probe
finds it); the two ends never just wait for each other.

Loss recovery (RACK-like): the path to the successor is FIFO, so an unacknowledged
packet of a step sent before one the successor has acknowledged for that step was
lost, and is retransmitted at once. On a timeout a sender retransmits only the
oldest unacknowledged packet of each step, as a probe: its RETX flag asks for an
immediate ACK, which then names any other holes. A late ACK so costs at most one
spurious packet per step, not a window's worth.

A rank's ACKs share its uplink with its own data, so behind a queue of data
they would make the round trip as long as the queue, and the window (however
large) would hold the ring below link rate: ACKs travel in priority band 0 and
data in the job's band, but never 0 (``data_band``), so they jump that queue
(Mininet, star of 4 at 25 Mbit/s: 1.90 -> 1.64 s, theory 1.56 s).

A rank whose call is done (every packet it owed sent and acknowledged) tells its successor so with
a DONE frame (an ACK-shaped frame for step ``3(N-1)``, no values). After its last call a rank
lingers (``Linger``): its predecessor may have missed its last ACKs and probe for them, so it keeps
answering until the predecessor's DONE (``predecessor_done``) says no probe will come. That DONE is
the one thing that ends a linger; a bound (the run's timeout) is the last resort for a predecessor
that died, or whose DONE was lost.

Frames are taken a block at a time (``receive_block``: one vectorised filter,
then each packet's step logic) and what a block lets a rank send is built as
one array of frames (``build_frames``) and sent with one sendmmsg.
"""

from __future__ import annotations

import bisect
import heapq
from collections import deque

import numpy as np

from innet.hosts.recovery import HostQueue, Rack
from innet.hosts.worker import Frames, JobSpec, RetransmitTimer, first_window_rto
from innet.wire.collectives import Collective
from innet.wire.packet import (
    FLAGS_OFFSET,
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

ACK_EVERY = 16
ACK_BAND = 0  # ACKs jump the queue of data on the way back (see the module notes)
ACK_SPAN = 1024  # pieces an ACK's bitmap covers above its cumulative point (128 bytes)
WINDOW = 256


def ring_geometry(length: int, n: int, per_packet: int, collective: str = "allreduce",
                  root: int = 0) -> tuple[list[tuple[int, int]], int]:
    """The ring's ``n`` segments of a tensor of ``length`` values (sizes differ by at most one), and the
    pieces every step sends: as many as the longest segment needs, so a shorter segment's last may be empty.
    For another collective: its shards (whole packets, innet.wire.collectives), segment s being shard
    s-1, so that rank r ends the reduce-scatter holding shard r; for broadcast and reduce the root's
    segment (root+1) is the whole tensor and the others are empty, so the one half they run is a
    pipelined chain: from the root round to its predecessor, or from its successor round to the root."""
    if collective in ("broadcast", "reduce"):
        segments = [(0, length) if s == (root + 1) % n else (0, 0) for s in range(n)]
    elif collective != "allreduce":
        b = Collective.shards(length, n, per_packet).tolist()
        segments = [(b[(s - 1) % n], b[(s - 1) % n + 1]) for s in range(n)]
    else:
        segments = [(length * i // n, length * (i + 1) // n) for i in range(n)]
    return segments, max(1, -(-max(b - a for a, b in segments) // per_packet))


def ring_phases(collective: str) -> tuple[bool, bool]:
    """Which halves of the ring all-reduce a collective runs: (reduce-scatter, all-gather). Ring reduce-scatter
    and reduce are the first (the chain to the root), all-gather and broadcast the second (the chain from it);
    all-reduce and barrier run both."""
    return {"reduce_scatter": (True, False), "reduce": (True, False), "all_gather": (False, True),
            "broadcast": (False, True)}.get(collective, (True, True))


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
        self.got: dict[int, dict[int, np.ndarray]] = {}      # step -> piece -> values received
        self.have: dict[int, np.ndarray] = {}                # step -> which pieces arrived (for ACKs)
        self.unacked: dict[tuple[int, int], tuple[float, bytes]] = {}
        self.open: dict[int, set[int]] = {}  # step -> its unacknowledged packets (the keys of ``unacked``)
        self.timers: list[tuple[float, int, int]] = []  # (armed at, step, j); stale once ``armed`` differs
        self.armed: dict[tuple[int, int], float] = {}
        self.since_ack: dict[int, int] = {}
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
        self.seq = 0  # transmissions so far: a later number was sent later
        self.sent_seq: dict[tuple[int, int], int] = {}  # each unacknowledged packet's transmission number
        self.first_seqs: dict[int, np.ndarray] = {}  # step -> each piece's first transmission number (-1: unsent)
        self.resent_seq: dict[tuple[int, int], list[int]] = {}  # each packet resent: its retransmissions' numbers
        self.sends: dict[int, list[tuple[int, int]]] = {}  # step -> every transmission's (number, piece), in order
        self.newest_acked: dict[int, int] = {}  # step -> the newest transmission acknowledged
        self.delivered = -1  # the newest transmission taken to have arrived, of any step (the path is FIFO)
        self.next_in: dict[int, int] = {}  # step -> the first piece not yet received (all below it were)
        self.hole_acked: dict[int, int] = {}  # step -> the hole an out-of-order arrival last reported (``Linger``)
        self.rack = Rack(spec.min_rto, spec.reorder_window)
        self.probes = 0  # tail probes since the last useful ACK
        self.probed_at = 0.0  # the last tail probe
        self.suspect: dict[tuple[int, int], float] = {}  # unacknowledged, though sent before one acknowledged: since when
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
        return (self.finished_at is not None and not self.unacked and not self.backlog) or self.error is not None

    def waiting(self) -> str:
        """What this rank waits for, for a progress line: the first piece missing from its predecessor, else the
        oldest ACK its successor owes."""
        if self.done:
            return ""
        n, tail = self.spec.nworkers, f", {self.retransmissions} retransmissions"
        for step in range(self.steps):
            if self.missing and len(self.got.get(step, ())) < self._expected(step):
                return (f"ring: rank {self.rank} waiting for piece {self.next_in.get(step, 0)} of step {step} "
                        f"from rank {(self.rank - 1) % n}{tail}")
        if self.unacked:
            step, j = min(self.unacked)
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
        """Send what the window has room for, oldest first: blocks of equal-length frames."""
        room = max(WINDOW, ACK_EVERY * self.steps) - len(self.unacked)
        items = [self.backlog.popleft() for _ in range(min(room, len(self.backlog)))]
        by_count: dict[int, list[tuple[int, int, np.ndarray | None, int | None]]] = {}
        for item in items:
            by_count.setdefault(0 if item[2] is None else len(item[2]), []).append(item)
        return [self._transmit(count, group, now) for count, group in by_count.items()]

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
            self.unacked[(step, j)] = (now, row.tobytes())
            self.left[(step, j)] = self.host.leave_one(len(row), now)
            self.sent_seq[(step, j)] = self.seq
            self.first_seqs.setdefault(step, np.full(self._expected(step), -1, np.int64))[j] = self.seq
            self.sends.setdefault(step, []).append((self.seq, j))
            self.seq += 1
            self.open.setdefault(step, set()).add(j)
            self._arm((step, j), now)
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

    def _arm(self, key: tuple[int, int], now: float) -> None:
        self.armed[key] = now
        heapq.heappush(self.timers, (now, *key))

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
        pieces = self.got.setdefault(step, {})
        fresh = j not in pieces
        hole = False
        if fresh:
            pieces[j] = values.astype(np.int64)
            first = self.next_in.get(step, 0)
            if j == first:
                while first in pieces:
                    first += 1
                self.next_in[step] = first
                hole = first > j + 1  # a hole filled (the piece was late, or resent): say so at once too
            else:  # out of order on a FIFO path: say so at once, each time (TCP's duplicate ACKs, RFC 5681 4.2)
                self.hole_acked[step] = first
                hole = True
            self.missing -= 1
            self.last_progress = now
            if step >= self.spec.nworkers - 1 and self.scale is None:
                self.pending.append((step, j))  # the predecessor agreed on the scale before this rank did
            else:
                self._advance(step, j, exp)
        self.since_ack[step] = self.since_ack.get(step, 0) + 1
        if (not fresh or hole or flags & RETX or self.since_ack[step] >= ACK_EVERY
                or len(pieces) == self._expected(step)):
            self.since_ack[step] = 0
            acks.append(self._ack(step, pieces, j, flags & RETX))
        self._check_finished(now)

    def _ack(self, step: int, pieces: dict[int, np.ndarray], j: int, retx: int) -> bytes:
        """A cumulative ACK with a selective bitmap: values[0] is the first piece of the step still
        missing (all below it arrived), the other values a bitmap of the ACK_SPAN pieces from there. Its chunk is
        piece ``j``'s, whose arrival sent it, and its RETX flag says that arrival was a retransmission (an echo,
        as TCP's timestamps give one: ``_on_ack`` tells an original's late answer from its retransmission's)."""
        have = self.have.setdefault(step, np.zeros(self._expected(step), bool))
        have[list(pieces)] = True
        missing = np.flatnonzero(~have)
        base = int(missing[0]) if len(missing) else len(have)
        bits = np.zeros(ACK_SPAN, bool)
        span = have[base:base + ACK_SPAN]
        bits[:len(span)] = span
        words = np.concatenate(([base], np.packbits(bits, bitorder="little").view(np.int32)))
        pkt = make_packet(words, job=self.spec.job, rank=self.rank, nworkers=self.spec.nworkers,
                          slot=step, chunk=self.first + j, flags=ROUTE | RESULT | retx)
        return pkt.to_frame(self.spec.node, self.prev_node, ACK_BAND)

    def _on_ack(self, step: int, values: np.ndarray, now: float, arrived: int = 0, retx: bool = False) -> Frames:
        """An ACK for ``step`` from the successor: its cumulative point, then its bitmap; ``arrived``, the piece whose
        arrival sent it, a retransmission if ``retx``. Every piece sent before that transmission arrived or was lost
        (the path is FIFO): RACK's newest delivered transmission (RFC 8985) is that one, known from the echo (for a
        retransmission, which one: ``_retransmission``), not taken from the pieces acknowledged: an original's answer
        that came late (a queue deeper than the minimum round trip, where RFC 8985's own test, 6.2 step 2, cannot
        tell) would then pass for its retransmission's, and declare lost every piece still queued behind it."""
        if len(values) < 1:
            return []
        base = int(values[0])
        bits = np.unpackbits(np.ascontiguousarray(values[1:]).view(np.uint8), bitorder="little")
        pending = self.open.get(step, set())
        held = {base + int(k) for k in np.flatnonzero(bits)}  # beyond the cumulative point
        acked = [(step, j) for j in pending if j < base or j in held]
        if acked:
            self.probes = 0
            self.timer.progress()
        # the round trip is sampled from the packet whose arrival sent this ACK: an older one's includes the wait
        # for the ACK (every ACK_EVERY packets, or a lost ACK's successor)
        trigger = (step, arrived)
        for key in acked:
            sent = self.unacked.pop(key)
            left = self.left.pop(key)
            self.retry.pop(key, None)
            pending.discard(key[1])
            del self.armed[key]
            self.last_progress = self.last_ack = now
            del self.sent_seq[key]
            suspect = self.suspect.pop(key, None)
            if key in self.resent_seq:
                self.spurious += self.rack.answered(now - sent[0])
            elif suspect is not None:  # late, not lost: the path reorders by that much
                self.rack.reordered(now - suspect)
            # Karn; and the lone exponent packets never queue, so they would underestimate, as would the
            # empty pieces of a collective's empty or short shards (innet.wire.collectives)
            elif key == trigger and step >= self.spec.nworkers - 1 and len(sent[1]) > PAYLOAD_OFFSET:
                self.timer.sample(now - sent[0])
                self.rack.sample(now - sent[0])
                self.path_rtt = now - left if self.path_rtt is None else 0.875 * self.path_rtt + 0.125 * (now - left)
        delivered = self._retransmission(step, arrived, base, bits) if retx else self._first(step, arrived)
        if delivered > self.delivered:
            self.delivered = delivered
            self._lost_before(step, now)
        if delivered > self.newest_acked.get(step, -1):
            self.newest_acked[step] = delivered
        newest = self.newest_acked.get(step)
        if newest is None:
            return []
        # the path is FIFO: a packet sent before one acknowledged, and still not acknowledged, was lost, unless the
        # path reorders: it is resent once it stayed so for a reordering window (innet.hosts.recovery)
        for j in pending:
            if self.sent_seq[(step, j)] < newest:
                self.suspect.setdefault((step, j), now)
        return list(self._resend_lost(now))

    def _lost_before(self, step: int, now: float) -> None:
        """Packets of steps other than ``step`` sent before the newest known to have arrived (``delivered``): a lone
        packet (an exponent step's) and a retransmission are acknowledged on arrival, and ACKs come back in order
        too, so one still unacknowledged was lost, or its ACK was (a data piece's ACK may wait for ACK_EVERY more).
        Per step only, a lost exponent packet waited for its RTO, which the data a rank goes on sending meanwhile
        kept restarting (star of 4, 20% loss, seed 1: 8.5 ms, a sixth of the call)."""
        for other, js in self.open.items():
            if other == step:
                continue
            lone = self._expected(other) == 1
            for j in js:
                key = (other, j)
                if (lone or key in self.resent_seq) and self.sent_seq[key] < self.delivered:
                    self.suspect.setdefault(key, now)

    def _first(self, step: int, j: int) -> int:
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
            return max(self.resent_seq.get((step, j), []), default=self._first(step, j))
        sends = self.sends.get(step, [])
        for seq in reversed(resent):
            between = [k for _, k in sends[bisect.bisect_right(sends, (bound, len(held))):bisect.bisect_left(sends, (seq, -1))]
                       if k != j]
            if sum(not held[k] for k in between) <= sum(held[k] for k in between):
                return seq
        return resent[0]

    def _resend_lost(self, now: float) -> list[bytes]:
        """Retransmit the suspects a reordering window old."""
        if not self.suspect:
            return []
        window = self.rack.reordering(self.timer.srtt)  # the receiver ACKs a hole at once: no jitter to wait out
        lost = sorted(key for key, since in self.suspect.items() if since + window <= now)
        for key in lost:
            del self.suspect[key]
        return [self._retransmit(key, now) for key in lost]

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
        frame = bytearray(self.unacked[key][1])
        frame[FLAGS_OFFSET] |= RETX
        self.suspect.pop(key, None)
        self.retransmissions += 1
        self.resent_seq.setdefault(key, []).append(self.seq)
        self.sends[key[0]].append((self.seq, key[1]))
        self.unacked[key] = (now, bytes(frame))
        self.left[key] = self.host.leave_one(len(frame), now)
        due = self._retry_due(key)
        if due is not None:
            self.retry[key] = due
        self.sent_seq[key] = self.seq
        self.seq += 1
        self._arm(key, now)
        return bytes(frame)

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
        received = self.got[step][j]
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
        while self.timers and self.armed.get(self.timers[0][1:]) != self.timers[0][0]:
            heapq.heappop(self.timers)
        give_up = self.last_progress + self.spec.timeout
        if not self.timers:
            return give_up
        # the timer restarts whenever an ACK makes progress (RFC 6298 5.3): a queue that grows is not a loss; and
        # while new packets go out (a chain's one step sends its pieces at its predecessor's pace, each ACK after
        # ACK_EVERY of them, which can outlast the RTO), their ACKs are still to come
        lost = min(self.suspect.values(), default=float("inf")) + self.rack.reordering(self.timer.srtt)
        lost = min(lost, min(self.retry.values(), default=float("inf")))
        return min(max(self.timers[0][0], self.last_ack, self._sending()) + self.timer.rto, give_up, self._probe_due(), lost)

    def _sending(self) -> float:
        """``last_sent``, while this call has lost nothing or its links reorder: once a FIFO path has lost
        something, its ACKs are no longer just late (a lossy ring's RTO restarted by every packet sent waited too
        long: 20% loss on the leaf-spine 6.5x -> 10.1x), but where frames are held back they may well be."""
        return self.last_sent if not self.retransmissions or self.rack.reorder else 0.0

    def _probe_due(self) -> float:
        """When to probe (RFC 8985's TLP), once this call has lost something: no ACK for two round trips (at least
        a reordering window), doubled per probe
        unanswered up to four times (as ``AllreduceCall._probe_due``). Before any loss, only where the run's links lose
        (``JobSpec.lossy``) and a round trip is measured, or a lone packet is still unacknowledged: once a rank has
        the exponent, its RTO is the data window's (``first_window_rto``, 312 ms), and its own exponent packets may
        not have reached its successor (leaf-spine, 20% loss, seed 9: a rank whose ACKs were all lost waited 312 ms)."""
        measured = self.timer.srtt is not None or any(js and self._expected(s) == 1 for s, js in self.open.items())
        if not (self.retransmissions or (self.spec.lossy and measured)) or not self.unacked:
            return float("inf")
        return max(self.last_ack, self.probed_at) + self.quiet()

    def on_timeout(self, now: float) -> list[bytes]:
        if self.done:
            return []
        if now >= self.last_progress + self.spec.timeout:  # the very sum next_deadline gave, so no float gap
            from innet.errors import AllreduceTimeout

            n, timeout = self.spec.nworkers, self.spec.timeout
            if self.unacked and now >= self.last_ack + timeout:
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
            oldest = [(step, min(js)) for step, js in sorted(self.open.items()) if js]
            return lost + [self._retransmit(key, now) for key in oldest if self.unacked[key][0] < now]  # not just resent
        probes: dict[int, tuple[int, int]] = {}  # step -> its oldest expired packet
        while self.timers and self.timers[0][0] + rto <= now:
            armed_at, step, j = heapq.heappop(self.timers)
            if self.armed.get((step, j)) != armed_at:
                continue
            if step in probes:  # not resent: the probe's ACK names it lost, or the next timeout probes it
                self._arm((step, j), now)
            else:
                probes[step] = (step, j)
        out = [self._retransmit(key, now) for key in probes.values()]
        if out:
            self.timer.expired()
        return lost + out


DONE_REPEATS = 16  # a lossy call's DONE, resent while lingering: all lost at 20% loss on 4 links, 1 in 10^4


class Linger:
    """A ring rank after its last call (``call``), which keeps answering its predecessor until the
    predecessor's DONE came, ``limit`` seconds at most. Any other call (not a ring's, or one of a ring of
    one) has no predecessor to wait for: it is over at once.

    A call that lost something (so its links lose) resends its own DONE ``DONE_REPEATS`` times, a tail probe's
    spacing apart, and lingers until they are out: a lost DONE no longer holds the successor for ``limit``
    (the run's timeout: 2000 s on Mininet at ×200 dilation). A clean call sends its DONE once, as before."""

    def __init__(self, call: object, now: float, limit: float) -> None:
        self.call = call if isinstance(call, RingCall) and call.spec.nworkers > 1 else None
        self.end = now + limit
        lossy = self.call is not None and self.call.sent_done and (self.call.retransmissions or self.call.hole_acked)
        self.repeats = DONE_REPEATS if lossy else 0
        self.next_repeat = now

    def over(self, now: float) -> bool:
        return self.call is None or (self.call.predecessor_done and not self.repeats) or now >= self.end

    def due(self) -> float:
        """When to resend the DONE next (inf: never again)."""
        return self.next_repeat if self.repeats else float("inf")

    def repeat(self, now: float) -> list[bytes]:
        """The DONE, if a repeat is due."""
        if self.call is None or not self.repeats or now < self.next_repeat:
            return []
        self.repeats -= 1
        self.next_repeat = now + self.call.quiet()
        return [self.call.done_frame()]
