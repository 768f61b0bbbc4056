"""Coherent early drop: under overload a switch turns whole chunks away, never single contributions.

A switch that cannot keep up loses frames at each port's socket, and each port loses its own: a chunk
keeps three workers' contributions and loses the fourth's, its slot never completes, the next round
overtakes it, and aggregation goodput collapses while the switch stays busy (sum x4 completed 0.38 of
its lossless rate under ~2x open-loop overload). So each port of an overloaded switch carries a classic
BPF filter, run by the kernel before a frame is queued (in the sender's context: the switch spends
nothing on what it turns away), that admits a contribution only when its chunk number modulo ``SPAN``
is below a limit: every port admits the same chunks, so a chunk is either whole or not there at all,
and its workers recover it as any loss (a retransmission, flagged RETX, is always admitted). Results,
routed frames (ring, PBox) and every frame that is not innet's pass untouched.

The limit follows the switch's backlog, AIMD, every ``PERIOD``: frames waiting in its sockets beyond
``BACKLOG`` (read from PACKET_STATISTICS against what the switch has read), or any socket overflow,
cut it by an eighth; a period with traffic and neither raises it by one; a period without traffic
restores full admission. A closed-loop job keeps at most its window in flight, so in an ordinary run
the backlog stays far below ``BACKLOG`` and nothing is filtered.
"""

from __future__ import annotations

import ctypes
import socket
import struct

from innet.backends.rawport import SO_ATTACH_FILTER, RawPort
from innet.wire.packet import AGG_PORT, ETH_LEN, ETHERTYPE_IPV4, FLAGS_OFFSET, HEADER_DTYPE, HEADER_OFFSET, RESULT, RETX, ROUTE

SO_DETACH_FILTER = 27
SPAN = 16
PERIOD = 0.01
LOW, HIGH = 4096, 8192
CHUNK_OFFSET = HEADER_OFFSET + HEADER_DTYPE.fields["chunk"][1]  # type: ignore[index]
UDP_DPORT_OFFSET = HEADER_OFFSET - 6


def admit_program(limit: int, slots: int = 1) -> list[tuple[int, int, int, int]]:
    """The filter: pass everything but innet contributions (no RESULT, ROUTE or RETX flag) of a pass over
    the slot pool (chunk // ``slots``) whose number modulo SPAN is ``limit`` or more. Whole passes, so that
    a slot's next admitted round still comes after every other slot's (the pool's reuse distance: with
    single chunks turned away, a slot would come round again a few frames later, and ports read a few
    frames apart would overtake each other's rounds). Classic BPF instructions (code, jt, jf, k)."""
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
    program.append((0x34, 0, 0, max(1, slots)))                     # A /= slots: the pass
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


class Admission:
    """One switch's admission limit over its ports (see the module's docstring)."""

    def __init__(self, ports: list[RawPort]) -> None:
        self.ports = ports
        self.slots = 1  # the largest pool a job has on the switch (set when a config is installed)
        self.limit = SPAN
        self.reads = 0
        self.due: float | None = None
        self.drops = sum(p.drops() for p in ports)
        self.limited_periods = 0  # periods spent below full admission
        self.lowest = SPAN  # the lowest limit it came to
        self.trace: list = []

    def report(self) -> dict[str, int]:
        return {"lowest_limit": self.lowest, "limited_periods": self.limited_periods, "span": SPAN, "trace": self.trace[:80]}

    def note(self, now: float) -> None:
        """A port was read at ``now``."""
        self.reads += 1
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
        backlog = sum(p.backlog() for p in self.ports)
        idle = self.reads == 0
        if drops > self.drops or backlog > HIGH:
            limit = 1
        elif backlog < LOW:
            limit = SPAN
        else:
            limit = self.limit
        self.trace.append((round(now, 4), self.reads, backlog, drops, limit))
        self.drops, self.reads = drops, 0
        self.due = None if idle and limit == SPAN else now + PERIOD
        if limit != self.limit:
            self._set(limit)
        if limit < SPAN:
            self.limited_periods += 1

    def _set(self, limit: int) -> None:
        for port in self.ports:
            if limit < SPAN:
                attach(port, admit_program(limit, self.slots))
            elif self.limit < SPAN:
                port.sock.setsockopt(socket.SOL_SOCKET, SO_DETACH_FILTER, 0)
        self.limit = limit
        self.lowest = min(self.lowest, limit)
