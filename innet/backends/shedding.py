"""Drop early under overload: shed whole chunks in the kernel, the same chunks on every port.

A switch that cannot keep up loses frames at its sockets, each port its own,
so nearly every slot misses someone's contribution, rounds are overtaken, and
aggregation collapses (an aggregating switch offered twice its lossless rate
completed about a third of that rate). Instead, when a port's queue grows past
``HIGH`` bytes or the kernel dropped frames there, the switch admits only a
fraction of the chunks: a classic BPF filter on every port passes a plain
contribution only when a hash of its chunk number falls under the fraction.
The same chunks pass on every port, so what is admitted completes, and what is
shed costs the switch nothing (the filter runs in the sender's softirq).
Results, retransmissions, routed, fallback and abort frames always pass, so a
closed-loop worker's retransmission is never shed. Every ``INTERVAL`` the
fraction is cut when a queue grows past ``HIGH`` or frames were dropped, and
raised a step when every queue is below ``LOW``; an idle switch admits all.
"""

from __future__ import annotations

from collections.abc import Iterable

from innet.backends.rawport import RawPort
from innet.wire.packet import (
    ABORT,
    AGG_PORT,
    ETHERTYPE_IPV4,
    FALLBACK,
    FLAGS_OFFSET,
    HEADER_DTYPE,
    HEADER_OFFSET,
    RESULT,
    RETX,
    ROUTE,
)

INTERVAL = 0.01  # seconds between looks at the queues
HIGH, LOW = 1 << 20, 1 << 18  # bytes queued at a port: shed more above HIGH, admit more below LOW
CUT, DROP_CUT, STEP, FLOOR = 0.93, 0.8, 1 / 64, 1 / 64
LEVELS = 256  # the filter's resolution: admit = threshold / LEVELS
ALWAYS = RESULT | RETX | ROUTE | FALLBACK | ABORT  # frames never shed
ACCEPT = 0x40000  # a BPF return value: deliver the frame whole
IP_PROTO_OFFSET, UDP_DPORT_OFFSET, UDP = 23, 36, 17
CHUNK_OFFSET = HEADER_OFFSET + HEADER_DTYPE.fields["chunk"][1]  # type: ignore[index]


def chunk_filter(threshold: int) -> list[tuple[int, int, int, int]]:
    """A classic BPF program passing every frame except plain contributions whose chunk hashes to
    ``threshold`` / LEVELS or above (Fibonacci hashing: the top 8 bits of chunk x 2654435761)."""
    return [
        (0x28, 0, 0, 12),                   # 0  ldh [ethertype]
        (0x15, 0, 10, ETHERTYPE_IPV4),      # 1  not IPv4: accept
        (0x30, 0, 0, IP_PROTO_OFFSET),      # 2  ldb [ip proto]
        (0x15, 0, 8, UDP),                  # 3  not UDP: accept
        (0x28, 0, 0, UDP_DPORT_OFFSET),     # 4  ldh [udp dport]
        (0x15, 0, 6, AGG_PORT),             # 5  not innet: accept
        (0x30, 0, 0, FLAGS_OFFSET),         # 6  ldb [flags]
        (0x45, 4, 0, ALWAYS),               # 7  a result, retransmission, routed...: accept
        (0x20, 0, 0, CHUNK_OFFSET),         # 8  ld [chunk]
        (0x24, 0, 0, 2654435761),           # 9  A *= golden ratio x 2^32
        (0x74, 0, 0, 24),                   # 10 A >>= 24
        (0x35, 1, 0, threshold),            # 11 A >= threshold: shed
        (0x06, 0, 0, ACCEPT),               # 12 accept
        (0x06, 0, 0, 0),                    # 13 drop
    ]


def admitted(chunks: Iterable[int], threshold: int) -> list[int]:
    """The chunks ``chunk_filter(threshold)`` passes (what the kernel computes, for tests)."""
    return [c for c in chunks if ((c * 2654435761) & 0xFFFFFFFF) >> 24 < threshold]


class Shedder:
    """Watches a switch's ports and sheds chunks while they are overloaded (see the module's text)."""

    def __init__(self, ports: Iterable[RawPort]) -> None:
        self.ports = list(ports)
        self.admit = 1.0
        self.threshold = LEVELS
        self.due = 0.0
        self.last_backlog = 0
        self.drops = sum(p.drops() for p in self.ports)
        self.shedding_s = 0.0  # time spent admitting less than every chunk
        self.lowest = 1.0

    def tick(self, now: float) -> None:
        if now < self.due:
            return
        idle = now - self.due > 10 * INTERVAL
        self.due = now + INTERVAL
        drops = sum(p.drops() for p in self.ports)
        dropped, self.drops = drops > self.drops, drops
        backlog = max(p.backlog() for p in self.ports)
        if self.threshold < LEVELS:
            self.shedding_s += INTERVAL
        if dropped:
            self.admit = max(FLOOR, self.admit * DROP_CUT)
        elif idle:
            self.admit = 1.0
        elif backlog > HIGH and backlog >= self.last_backlog:
            self.admit = max(FLOOR, self.admit * CUT)
        elif backlog < LOW:
            self.admit = min(1.0, self.admit + STEP)
        self.last_backlog = backlog
        self.lowest = min(self.lowest, self.admit)
        self._install(min(LEVELS, round(self.admit * LEVELS)))

    def _install(self, threshold: int) -> None:
        if threshold == self.threshold:
            return
        for port in self.ports:
            if threshold >= LEVELS:
                port.detach_filter()
            else:
                port.attach_filter(chunk_filter(threshold))
        self.threshold = threshold

    def report(self) -> dict[str, float]:
        return {"shedding_s": round(self.shedding_s, 3), "lowest_admit": round(self.lowest, 4), "admit": round(self.admit, 4)}
