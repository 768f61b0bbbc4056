"""Elastic background flows (``--background PATTERN:LOAD:tcp``): tenants that back off, on the local fabric.

Each flow of the pattern is a small TCP-like sender (Reno: slow start, congestion avoidance, halving once a
window on a congestion mark) behind an application that writes at the flow's rate, and a sink that acknowledges
every segment. Its segments are background frames (``BACKGROUND_JOB``, routed by address) of the job's frame
size, so the flow is ACK-clocked through the very FIFOs the job's frames wait in: when the job's frames queue
ahead of it, its window takes longer to come back and it sends less. What it models of Linux's TCP, which the
Mininet backend runs (innet.node.elastic): an initial window of 10 segments, a window that grows only while it
limits the sender (``tcp_is_cwnd_limited``), and a writer that stops writing while ``NOTSENT`` bytes wait
unsent (``TCP_NOTSENT_LOWAT``); a segment's payload is what a kernel's 8250-byte frame carries.

Its frames travel in priority band ``BAND``, behind the job's, as the kernel's TCP does on Mininet. The fabric's
queues never drop; a link direction marks an elastic frame (ECN's CE) where a Mininet interface's queue would be
full (``QUEUE_FRAMES`` frames), and the sink echoes the mark (ECE) in its acknowledgement.
Deterministic: no randomness but each flow's first write, at a seeded phase.
"""

from __future__ import annotations

import struct

import networkx as nx
import numpy as np

from innet.graph import node_indices
from innet.hosts.background import (
    BACKGROUND_ELEMENTS,
    BACKGROUND_JOB,
    FRAME_BYTES,
    BackgroundSpec,
    host_flows,
)
from innet.wire.packet import HEADER_DTYPE, HEADER_OFFSET, ROUTE, TOS_OFFSET, frame_fields, make_packet

TCP_OVERHEAD = 14 + 20 + 20 + 12  # Ethernet, IP, TCP with timestamps: a kernel segment's bytes beyond its payload
SEGMENT = FRAME_BYTES - TCP_OVERHEAD  # payload bytes per segment: an 8250-byte frame, as the job's (TCP_MAXSEG)
INITIAL_WINDOW = 10  # segments (Linux's initial congestion window)
NOTSENT = 2 * SEGMENT  # the writer waits while this much is written but not sent (TCP_NOTSENT_LOWAT)
QUEUE_FRAMES = 1000  # a link direction marks elastic frames beyond this many frames' bytes (a veth's txqueuelen)
WARM_S = 0.002  # the flows run alone this long (on the run's timeline) before what they deliver alone is measured,
ALONE_S = 0.004  # for this long; then the job starts (on both backends)
STALL_S = 0.2  # no acknowledgement for this long with segments out: they count as lost, the window restarts
# (Linux's least retransmission timeout; on Mininet the kernel's is set to it on the run's timeline)
ECT, CE = 0b10, 0b11  # ECN bits of the IP TOS byte: ECN-capable, congestion experienced
BAND = 1  # the priority band of the flows' frames: on Mininet the kernel queues TCP (priority 0) in pfifo_fast's
# band 1, behind the job's frames, whose ports send them at priority 6, band 0 (innet.io.rawport.SOCKET_PRIORITY)
DATA, ACK, ACK_ECE = 0, 1, 2  # a background frame's ``rank``: a segment, an acknowledgement (with the echo)
_CHUNK = HEADER_OFFSET + HEADER_DTYPE.fields["chunk"][1]  # type: ignore[index]
_RANK = HEADER_OFFSET + HEADER_DTYPE.fields["rank"][1]  # type: ignore[index]


def marked(frame: bytes, backlog_bytes: float) -> bytes:
    """``frame`` as a link direction with ``backlog_bytes`` waiting passes it on: an elastic frame that finds
    the queue full is marked congestion experienced; every other frame unchanged."""
    tos = frame[TOS_OFFSET]
    if tos & 3 != ECT or backlog_bytes < QUEUE_FRAMES * FRAME_BYTES:
        return frame
    return frame[:TOS_OFFSET] + bytes([tos | CE]) + frame[TOS_OFFSET + 1:]


def _frame(src: int, dst: int, elements: int, kind: int, flow: int, number: int) -> bytearray:
    pkt = make_packet(np.zeros(elements, np.int32), job=BACKGROUND_JOB, flags=ROUTE, rank=kind, slot=flow,
                      chunk=number)
    frame = bytearray(pkt.to_frame(src, dst, BAND))
    frame[TOS_OFFSET] |= ECT
    return frame


class Flow:
    """One elastic flow's sender: the application's writes at ``rate`` (payload bits per second) and the Reno
    window over them."""

    def __init__(self, src: int, dst: int, index: int, rate: float, phase: float) -> None:
        self.template = _frame(src, dst, BACKGROUND_ELEMENTS, DATA, index, 0)
        self.rate = rate / 8  # bytes per second
        self.written_at = phase  # the application's writes are due from here on
        self.unsent = 0.0  # bytes written, not yet sent
        self.cwnd, self.ssthresh = float(INITIAL_WINDOW), float("inf")
        self.sent = self.acked = 0  # segments sent, segments acknowledged (or given up as lost)
        self.lost = 0  # segments given up as lost: the sink's count leaves them out
        self.recover = 0  # no halving again until the segments sent before the last one are acknowledged
        self.progress_at = phase  # the last acknowledgement that acknowledged something (or the start)
        self.halvings = 0

    def write(self, now: float) -> None:
        """The application writes what is due, unless ``NOTSENT`` bytes wait unsent: then it waits, and what
        it would have written meanwhile is not written (an application paced by the clock)."""
        if now > self.written_at:
            self.unsent = min(float(NOTSENT), self.unsent + (now - self.written_at) * self.rate)
            self.written_at = now

    def send(self, now: float) -> list[bytes]:
        self.write(now)
        out = []
        while self.unsent >= SEGMENT - 1e-6 and self.sent - self.acked < int(self.cwnd):  # (a float's rounding)
            struct.pack_into("!I", self.template, _CHUNK, self.sent & 0xFFFFFFFF)
            out.append(bytes(self.template))
            self.sent += 1
            self.unsent = max(0.0, self.unsent - SEGMENT)
        if out and self.sent - len(out) == self.acked:
            self.progress_at = now  # the first segment out after an idle spell: the stall clock starts now
        return out

    def on_ack(self, count: int, echo: bool, now: float) -> None:
        """The sink has ``count`` segments in all (``echo``: one came marked)."""
        count = min(count + self.lost, self.sent)
        newly = count - self.acked
        if newly <= 0:
            return
        out = self.sent - self.acked  # in flight before this acknowledgement
        self.acked, self.progress_at = count, now
        if echo and count > self.recover:
            self.ssthresh = max(self.cwnd / 2, 2.0)
            self.cwnd, self.recover = self.ssthresh, self.sent
            self.halvings += 1
        elif self.cwnd < self.ssthresh:
            if self.cwnd < 2 * out:  # slow start: the window grows while the sender uses half of it
                self.cwnd = min(self.cwnd + newly, self.ssthresh)
        elif out >= int(self.cwnd):  # congestion avoidance: a segment a window, while the window limits
            self.cwnd += newly / self.cwnd

    def next_write(self, now: float) -> float | None:
        """When the application will have a segment's worth written (None while the window is full)."""
        if self.sent - self.acked >= int(self.cwnd):
            return self.progress_at + STALL_S
        return max(now, self.written_at) + (SEGMENT - self.unsent) / self.rate

    def stalled(self, now: float) -> None:
        """No acknowledgement for ``STALL_S``: what is out is lost (a fault dropped it); one window again."""
        if self.sent > self.acked and now >= self.progress_at + STALL_S:
            self.ssthresh = max(self.cwnd / 2, 2.0)
            self.cwnd, self.lost, self.acked = 1.0, self.lost + self.sent - self.acked, self.sent
            self.progress_at = now
            self.halvings += 1


class ElasticHost:
    """The elastic background endpoint of one host: its flows' senders, and the sink of the flows to it."""

    daemon = True
    done = False

    def __init__(self, node: int, flows: list[tuple[int, float]], seed: int = 0) -> None:
        """``flows``: (destination node index, bits per second on the wire) of each flow from node ``node``."""
        self.node = node
        rng = np.random.default_rng([seed, node, 36])
        self.flows = [Flow(node, dst, k, bps * SEGMENT / FRAME_BYTES, float(rng.random() * FRAME_BYTES * 8 / bps))
                      for k, (dst, bps) in enumerate(flows)]
        self.offered_bps = sum(bps for _, bps in flows)
        self.received: dict[tuple[int, int], int] = {}  # (sender node, flow) -> segments received
        self._acks: dict[tuple[int, int], bytearray] = {}
        self.received_bytes = 0  # payload
        self.flows_open = True
        self.samples: list[tuple[float, int]] = []  # (time, payload bytes received by then), at each arrival

    def stop_sending(self) -> None:
        """Send no more segments (the run is over: the fabric delivers what is in flight)."""
        self.flows_open = False

    @property
    def sent_bytes(self) -> int:
        return sum(f.sent for f in self.flows) * SEGMENT

    def start(self, now: float) -> list[bytes]:
        return self.on_timeout(now)

    def receive(self, frame: bytes, now: float) -> list[bytes]:
        fields = frame_fields(frame)
        if fields is None or fields[3] != BACKGROUND_JOB or fields[1] != self.node:
            return []
        src, kind, flow, number = fields[0], fields[4], fields[6], fields[7]
        if kind != DATA:
            sender = self.flows[flow]
            sender.on_ack(number, kind == ACK_ECE, now)
            return sender.send(now) if self.flows_open else []
        key = (src, flow)
        count = self.received[key] = self.received.get(key, 0) + 1
        self.received_bytes += SEGMENT
        self.samples.append((now, self.received_bytes))
        ack = self._acks.get(key)
        if ack is None:
            ack = self._acks[key] = _frame(self.node, src, 0, ACK, flow, 0)
        struct.pack_into("!H", ack, _RANK, ACK_ECE if frame[TOS_OFFSET] & 3 == CE else ACK)
        struct.pack_into("!I", ack, _CHUNK, count & 0xFFFFFFFF)
        return [bytes(ack)]

    def next_deadline(self) -> float | None:
        return min((t for f in self.flows if (t := f.next_write(0.0)) is not None), default=None)

    def on_timeout(self, now: float) -> list[bytes]:
        out: list[bytes] = []
        if not self.flows_open:
            return out
        for flow in self.flows:
            flow.stalled(now)
            out += flow.send(now)
        return out


def received_between(samples: list[tuple[float, int]], start: float, end: float) -> int:
    """Payload bytes that arrived in (``start``, ``end``], from (time, bytes by then) ``samples``."""
    before = [b for t, b in samples if t <= start]
    upto = [b for t, b in samples if t <= end]
    return (upto[-1] if upto else 0) - (before[-1] if before else 0)


def elastic_hosts(graph: nx.Graph, bg: BackgroundSpec, seed: int = 0) -> dict[str, ElasticHost]:
    """One elastic endpoint per host of the topology that sends or receives a flow of ``bg``."""
    index = node_indices(graph)
    return {h: ElasticHost(index[h], flows, seed) for h, flows in host_flows(graph, bg, seed).items()}
