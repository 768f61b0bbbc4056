"""A host's point-to-point messages, in and out (``MessageHost``): the protocol of innet.hosts.p2p, sans-I/O.

Same interface as every endpoint the backends drive (``start``, ``receive``, ``next_deadline``, ``on_timeout``).
``post`` queues a message (``send_frames`` then says what may go out); ``received`` lists the messages that came,
in order per sender and channel; ``finished`` the messages sent and acknowledged whole. ``done`` once every message
posted is acknowledged and ``expected`` messages came.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from innet.hosts.endpoint import Frames
from innet.hosts.job import JobSpec
from innet.hosts.p2p.wire import P2P_JOB, decode, encode
from innet.hosts.recovery import RetransmitTimer, first_window_rto
from innet.hosts.ring.acks import ACK_EVERY, WINDOW
from innet.hosts.ring.acks import decode as decode_ack
from innet.hosts.ring.acks import encode as encode_ack
from innet.wire.packet import FLAGS_OFFSET, RESULT, RETX, ROUTE, make_packet, parse_frame

ACK_BAND = 0  # ACKs jump the queue of data on the way back, as the ring's
Key = tuple[int, int, int]  # (the peer's node, channel, sequence number mod 2**16)


@dataclass(frozen=True)
class Message:
    """A message that came whole: from ``src`` (rank), on ``channel``, its sequence number there, tag and bytes."""

    src: int
    channel: int
    seq: int
    tag: int
    data: bytes


@dataclass
class Outgoing:
    """A message on its way: its words, the next piece never sent, the pieces unacknowledged (each with its last
    transmission's number, when it went and its frame), its host's RTO timer."""

    key: Key
    ticket: int
    words: np.ndarray
    pieces: int
    timer: RetransmitTimer
    next: int = 0
    unacked: dict[int, tuple[int, float, bytes]] = field(default_factory=dict)
    acked: int = 0
    seq: int = 0  # transmissions so far (a later number went later)
    progress: float = 0.0  # the last time an ACK acknowledged something
    resent: set[int] = field(default_factory=set)  # pieces resent and not yet acknowledged (Karn)


@dataclass
class Incoming:
    """A message coming in: its pieces so far, how many it has (known with piece 0), pieces since the last ACK."""

    pieces: dict[int, np.ndarray] = field(default_factory=dict)
    total: int = -1
    next_in: int = 0  # the first piece not yet here
    since_ack: int = 0


class MessageHost:
    """Rank ``spec.rank``'s messages (``nodes``: every rank's node index), ``spec.elements`` values a piece."""

    daemon = False

    def __init__(self, spec: JobSpec, nodes: Sequence[int], expected: int = 0) -> None:
        self.spec, self.nodes = spec, list(nodes)
        self.rank_of = {node: rank for rank, node in enumerate(self.nodes)}
        self.expected = expected
        self.out: dict[Key, Outgoing] = {}
        self.turn: deque[Key] = deque()  # messages with pieces never sent, round robin
        self.next_seq: dict[tuple[int, int], int] = {}  # (receiver, channel) -> its next sequence number
        self.incoming: dict[Key, Incoming] = {}
        self.whole: dict[Key, Message] = {}  # come whole, waiting for an earlier one of its sender and channel
        self.next_in: dict[tuple[int, int], int] = {}  # (sender, channel) -> the sequence number handed on next
        self.answered: dict[Key, int] = {}  # handed on: their pieces, for a repeat's ACK
        self.received: list[Message] = []
        self.finished: list[int] = []  # the tickets of messages acknowledged whole, in that order
        self.tickets = 0
        # the round trips to every receiver, one RTO: a message whose tail (or its ACK) is lost may have no round
        # trip of its own yet (a first window's RTO is a 32nd of the run's timeout)
        self.timer = RetransmitTimer(spec, first_window_rto(spec))
        self.armed = 0.0  # when the RTO timer was last (re)started: a piece sent with none in flight, or an ACK
        self.error: Exception | None = None
        self.now = 0.0

    # -- sending ----------------------------------------------------------------------------------------------
    def post(self, dst: int, channel: int, data: bytes | np.ndarray, tag: int = 0, now: float | None = None) -> int:
        """Queue a message to rank ``dst`` (at ``now``: by default the host's last instant, a fabric's start): its
        ticket (``finished`` names it once it is acknowledged whole)."""
        if now is not None:
            self.now = now
        node = self.nodes[dst]
        seq = self.next_seq.get((node, channel), 0)
        self.next_seq[(node, channel)] = seq + 1
        words = encode(data, tag)
        key = (node, channel, seq & 0xFFFF)
        self.tickets += 1
        self.out[key] = Outgoing(key, self.tickets, words, -(-len(words) // self.spec.elements), self.timer,
                                 progress=self.now)
        self.turn.append(key)
        return self.tickets

    def _frame(self, key: Key, j: int, retx: int = 0) -> bytes:
        per = self.spec.elements
        values = self.out[key].words[j * per : (j + 1) * per]
        pkt = make_packet(values, job=P2P_JOB, rank=self.spec.rank, nworkers=key[1], slot=key[2], chunk=j,
                          flags=ROUTE | retx)
        return pkt.to_frame(self.spec.node, key[0], max(self.spec.band, ACK_BAND + 1))

    def send_frames(self, now: float) -> Frames:
        """The pieces the window has room for now, a piece of each message in turn."""
        self.now = now
        in_flight = sum(len(m.unacked) for m in self.out.values())
        room = max(WINDOW, ACK_EVERY * len(self.out)) - in_flight
        frames: Frames = []
        while room > 0 and self.turn:
            key = self.turn.popleft()
            m = self.out[key]
            if not any(o.unacked for o in self.out.values()):
                self.armed = now
            frame = self._frame(key, m.next)
            m.unacked[m.next] = (m.seq, now, frame)
            m.seq += 1
            m.next += 1
            room -= 1
            frames.append(frame)
            if m.next < m.pieces:
                self.turn.append(key)
        return frames

    def _resend(self, m: Outgoing, j: int, now: float) -> bytes:
        frame = bytearray(m.unacked[j][2])
        frame[FLAGS_OFFSET] |= RETX
        m.unacked[j] = (m.seq, now, bytes(frame))
        m.seq += 1
        m.resent.add(j)
        return bytes(frame)

    def _on_ack(self, key: Key, chunk: int, values: np.ndarray, now: float) -> Frames:
        m = self.out.get(key)
        if m is None or len(values) < 2:
            return []
        base, bits = decode_ack(values)
        held = {j for j in m.unacked if j < base or (j - base < len(bits) and bits[j - base])}
        trigger = m.unacked.get(chunk)
        if trigger is not None and chunk in held and chunk not in m.resent:
            m.timer.sample(now - trigger[1])
        for j in held:
            del m.unacked[j]
            m.resent.discard(j)
        if held:
            m.acked += len(held)
            m.progress = self.armed = now
            m.timer.progress()
        if m.acked == m.pieces:
            del self.out[key]
            self.finished.append(m.ticket)
            return self.send_frames(now)
        # the path is FIFO: what went before the piece whose arrival sent this ACK, and is unacknowledged, was lost
        if trigger is None:
            return self.send_frames(now)
        lost = sorted(j for j, (seq, _, _) in m.unacked.items() if seq < trigger[0])
        return [self._resend(m, j, now) for j in lost] + self.send_frames(now)

    # -- receiving --------------------------------------------------------------------------------------------
    def _on_piece(self, src: int, channel: int, seq: int, j: int, values: np.ndarray, retx: bool) -> Frames:
        key = (src, channel, seq)
        if key in self.answered:  # a repeat of a message handed on: its ACK was lost
            pieces = self.answered[key]
            return [self._ack(key, j, np.ones(pieces, bool), retx)]
        if src not in self.rank_of:
            return []
        got = self.incoming.setdefault(key, Incoming())
        fresh = j not in got.pieces
        if fresh:
            got.pieces[j] = values.copy()
            if j == 0:
                low, high = np.asarray(values[:2], np.int32).view(np.uint32).tolist()
                got.total = -(-(3 + -(-(low | high << 32) // 4)) // self.spec.elements)
        in_order = j == got.next_in
        while got.next_in in got.pieces:
            got.next_in += 1
        got.since_ack += 1
        complete = got.total >= 0 and len(got.pieces) >= got.total
        if not (complete or not fresh or not in_order or retx or got.since_ack >= ACK_EVERY):
            return []
        got.since_ack = 0
        have = np.zeros(max(got.total, max(got.pieces) + 1), bool)
        have[list(got.pieces)] = True
        ack = self._ack(key, j, have, retx)
        if complete:
            self._whole(key, got)
        return [ack]

    def _ack(self, key: Key, j: int, have: np.ndarray, retx: bool) -> bytes:
        pkt = make_packet(encode_ack(have), job=P2P_JOB, rank=self.spec.rank, nworkers=key[1], slot=key[2], chunk=j,
                          flags=ROUTE | RESULT | (RETX if retx else 0))
        return pkt.to_frame(self.spec.node, key[0], ACK_BAND)

    def _whole(self, key: Key, got: Incoming) -> None:
        del self.incoming[key]
        words = np.concatenate([got.pieces[j] for j in range(got.total)])
        tag, data = decode(words)
        src, channel, seq = key
        self.answered[key] = got.total
        self.whole[key] = Message(self.rank_of[src], channel, seq, tag, data)
        nxt = self.next_in.get((src, channel), 0)
        while (src, channel, nxt & 0xFFFF) in self.whole:
            self.received.append(self.whole.pop((src, channel, nxt & 0xFFFF)))
            self.answered.pop((src, channel, (nxt - 0x8000) & 0xFFFF), None)  # long past: its key is reused later
            nxt += 1
        self.next_in[(src, channel)] = nxt

    # -- the endpoint interface -------------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self.error is not None or (not self.out and len(self.received) >= self.expected)

    def start(self, now: float) -> Frames:
        return self.send_frames(now)

    def receive(self, frame: bytes, now: float) -> Frames:
        self.now = now
        pkt = parse_frame(frame)
        if pkt is None or pkt.job != P2P_JOB or not pkt.flags & ROUTE or pkt.dst != self.spec.node:
            return []
        key = (pkt.src, pkt.nworkers, pkt.slot)
        if pkt.flags & RESULT:
            return self._on_ack(key, pkt.chunk, pkt.values, now)
        return self._on_piece(pkt.src, pkt.nworkers, pkt.slot, pkt.chunk, pkt.values, bool(pkt.flags & RETX))

    def next_deadline(self) -> float | None:
        if self.error is not None or not any(m.unacked for m in self.out.values()):
            return None
        return min(self.armed + self.rto(), min(m.progress for m in self.out.values()) + self.spec.timeout)

    def rto(self) -> float:
        """The timer's RTO where the run's links lose (``JobSpec.lossy``); else at least a first window's: a
        lossless run loses only what overflows a queue (Mininet's) and mostly finds it by order, while an
        all-to-all's incast queues grow faster than the smoothed RTT (fat-tree, 15 ranks, 400 kB a pair: 26
        spurious probes at the adaptive RTO)."""
        return self.timer.rto if self.spec.lossy else max(self.timer.rto, first_window_rto(self.spec))

    def on_timeout(self, now: float) -> Frames:
        """No ACK for an RTO (the host's, as a TCP connection's: the messages share its link and queues): each
        message's oldest piece again, asking for an ACK at once (a probe); a message that heard nothing for the
        run's timeout fails the host."""
        self.now = now
        late = [m for m in self.out.values() if m.unacked and now >= m.progress + self.spec.timeout]
        if late:
            node = late[0].key[0]
            self.error = TimeoutError(f"innet: a message from rank {self.spec.rank} to rank "
                                      f"{self.rank_of.get(node, node)} was not acknowledged for {self.spec.timeout:g}s")
            return []
        if now < self.armed + self.rto():
            return []
        self.timer.expired()
        self.armed = now
        return [self._resend(m, min(m.unacked), now) for m in self.out.values() if m.unacked]
