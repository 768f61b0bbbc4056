"""Coherent early drop: under overload a switch turns whole chunks away, never single contributions.

A switch that cannot keep up loses frames at each port's socket, and each port loses its own: a chunk
keeps three workers' contributions and loses the fourth's, its slot never completes, the next round
overtakes it, and aggregation goodput collapses while the switch stays busy (sum x4 completed 0.38 of
its lossless rate under ~2x open-loop overload). So each port of an overloaded switch carries a classic
BPF filter, run by the kernel before a frame is queued (in the sender's context: the switch spends
nothing on what it turns away), that admits a contribution by its chunk number alone: every port admits
the same chunks, so a chunk is either whole or not there at all, and its workers recover it as any loss
(a retransmission, flagged RETX, is always admitted). Results, routed frames (ring, PBox) and every
frame that is not innet's pass untouched.

The unit of admission is a ``UNIT_PASSES`` run of passes over the slot pool (chunk // (2 x slots)), and
a unit is admitted when its number modulo ``SPAN`` is below the limit: admitted units keep the two
versions of every slot in turn, so a slot's next admitted round still comes a whole pool after its last.

The limit follows the switch's backlog every ``PERIOD``: frames waiting in a port's socket (read from
PACKET_STATISTICS against what the switch has read) above ``HIGH_MARK`` of what the socket holds, or
any socket overflow, cut it to one unit in ``SPAN``; below half a pass over the pool (the ports' queues
then line up again, whatever a change split) it admits everything again; in between it stays. A change applies at
once to every port, a few microseconds apart: it can split only the unit the sender is putting on the
ports at that moment, leaving some ports at most one sender burst ahead of others in their queues, and
the queues, drained while the limit is low, line up again.
The switch stays busy on whole chunks while its queue drains and refills between the two marks. A
closed-loop job keeps at most its window in flight, so in an ordinary run the backlog stays far below
its marks and nothing is filtered. The high mark sits close to the socket's end: the socket's room
past the mark is what lets a switch that falls behind for a moment catch up without loss (at half a
socket the lossless rate of sum x4 fell by a sixth), and the filter, run within ``PERIOD``, still cuts in
before any overflow (at 2x its lossless rate, 2 ms bring a port ~250 frames of 256 values, the room past
the mark ~1280).
"""

from __future__ import annotations

import ctypes
import socket
import struct
from dataclasses import dataclass

from innet.io.rawport import BUFFER_BYTES, SO_ATTACH_FILTER, RawPort
from innet.wire.packet import AGG_PORT, ETH_LEN, ETHERTYPE_IPV4, FLAGS_OFFSET, HEADER_DTYPE, HEADER_OFFSET, RESULT, RETX, ROUTE

SO_DETACH_FILTER = 27
SPAN = 16
UNIT_PASSES = 2
PERIOD = 0.002
HIGH_MARK = 0.9  # the high mark: this share of what a port's socket can hold
CHUNK_OFFSET = HEADER_OFFSET + HEADER_DTYPE.fields["chunk"][1]  # type: ignore[index]
UDP_DPORT_OFFSET = HEADER_OFFSET - 6


def socket_frames(length: int) -> int:
    """Frames of ``length`` bytes a port's socket holds: the kernel doubles the buffer asked for and charges
    each frame its allocation (a power of two, with the shared info) plus the sk_buff (~576 bytes)."""
    return 2 * BUFFER_BYTES // ((1 << (length + 320 - 1).bit_length()) + 576)


def admit_program(limit: int, slots: int = 1) -> list[tuple[int, int, int, int]]:
    """The filter: pass everything but innet contributions (no RESULT, ROUTE or RETX flag) whose unit
    (chunk // (UNIT_PASSES x ``slots``)) modulo SPAN is ``limit`` or more. Classic BPF instructions
    (code, jt, jf, k)."""
    accept, drop = 12, 13
    program: list[tuple[int, int, int, int]] = []

    def to(target: int) -> int:  # a jump's offset, counted from the next instruction
        return target - len(program) - 1

    program.append((0x28, 0, 0, 12))                                # ldh [ethertype]
    program.append((0x15, 0, to(accept), ETHERTYPE_IPV4))           # not IPv4: accept
    program.append((0x30, 0, 0, ETH_LEN + 9))                       # ldb [IP protocol]
    program.append((0x15, 0, to(accept), socket.IPPROTO_UDP))       # not UDP: accept
    program.append((0x28, 0, 0, UDP_DPORT_OFFSET))                  # ldh [UDP destination port]
    program.append((0x15, 0, to(accept), AGG_PORT))                 # not innet's: accept
    program.append((0x30, 0, 0, FLAGS_OFFSET))                      # ldb [flags]
    program.append((0x45, to(accept), 0, RESULT | ROUTE | RETX))    # a result, routed, resent: accept
    program.append((0x20, 0, 0, CHUNK_OFFSET))                      # ld [chunk]
    program.append((0x34, 0, 0, UNIT_PASSES * max(1, slots)))       # A /= the unit's chunks
    program.append((0x54, 0, 0, SPAN - 1))                          # A %= SPAN
    program.append((0x35, to(drop), 0, limit))                      # A >= limit: drop
    program.append((0x06, 0, 0, 0x40000))                           # accept: the whole frame
    program.append((0x06, 0, 0, 0))                                 # drop
    assert program[accept][0] == program[drop][0] == 0x06
    return program


def attach(port: RawPort, program: list[tuple[int, int, int, int]]) -> None:
    code = b"".join(struct.pack("HBBI", *insn) for insn in program)
    buf = ctypes.create_string_buffer(code)
    port.sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, struct.pack("HL", len(program), ctypes.addressof(buf)))


@dataclass(frozen=True)
class AdmissionReport:
    lowest_limit: int  # the lowest limit the switch came to
    limited_periods: int  # periods spent below full admission
    changes: int
    span: int


class Admission:
    """One switch's admission limit over its ports (see the module's docstring)."""

    def __init__(self, ports: list[RawPort]) -> None:
        self.ports = ports
        self.slots = 0  # the largest pool a job aggregates here (set when a config is installed; 0: none)
        self.limit = SPAN
        self.reads = 0
        self.due: float | None = None
        self.drops = sum(p.drops() for p in ports)
        self.limited_periods = 0  # periods spent below full admission
        self.lowest = SPAN  # the lowest limit it came to
        self.changes = 0
        self.frame_bytes = 0  # the longest frame read: what the marks are counted in

    def report(self) -> AdmissionReport:
        return AdmissionReport(self.lowest, self.limited_periods, self.changes, SPAN)

    def note(self, now: float, length: int) -> None:
        """A port was read at ``now``, its last frame ``length`` bytes long."""
        if not self.slots:  # nothing aggregates here: nothing to protect
            return
        self.reads += 1
        if length > self.frame_bytes:
            self.frame_bytes = length
        if self.due is None:
            self.due = now + PERIOD
        elif now >= self.due:
            self.tick(now)

    def next_wake(self) -> float | None:
        return self.due

    def tick(self, now: float) -> None:
        if self.due is None or now < self.due:
            return
        for port in self.ports:
            port.statistics()
        drops = sum(p.socket_drops for p in self.ports)
        backlog, room = max(p.backlog() for p in self.ports), socket_frames(self.frame_bytes)
        idle = self.reads == 0 and backlog == 0
        if idle:
            limit = SPAN
        elif drops > self.drops or backlog > HIGH_MARK * room:
            limit = 1
        elif backlog < self.slots // 2:
            limit = SPAN
        else:
            limit = self.limit
        self.drops, self.reads = drops, 0
        self.due = None if idle and limit == SPAN else now + PERIOD
        if limit < SPAN:
            self.limited_periods += 1
        if limit != self.limit:
            self._set(limit)

    def _set(self, limit: int) -> None:
        for port in self.ports:
            if limit < SPAN:
                attach(port, admit_program(limit, self.slots))
            else:
                port.sock.setsockopt(socket.SOL_SOCKET, SO_DETACH_FILTER, 0)
        self.limit = limit
        self.lowest = min(self.lowest, limit)
        self.changes += 1
