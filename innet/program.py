"""The switch-program API: what a user writes in ``switch_programs/``.

A program is a ``SwitchProgram`` subclass. Class attributes configure it;
``registers`` declares its switch memory up front; handlers are methods tagged
with ``on_packet``, ``on_timer`` or ``on_start``. A handler gets a ``Context``
(the switch's name, tier, ports, the jobs it serves and its registers) and
returns actions; the runtime does all I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cached_property
from types import SimpleNamespace
from typing import Any, ClassVar

import numpy as np

from innet.packet import Packet

PACKET_KINDS = ("contribution", "result", "routed", "abort")


# ---- actions ---------------------------------------------------------------


@dataclass(frozen=True)
class Emit:
    """Send ``packet`` out of ``port``; ``priority`` picks the port's queue (0 = most urgent)."""

    port: int
    packet: Packet
    priority: int = 0


@dataclass(frozen=True)
class Multicast:
    """Send a copy of ``packet`` out of every port in ``ports``."""

    ports: tuple[int, ...]
    packet: Packet
    priority: int = 0


@dataclass(frozen=True)
class Drop:
    """Discard the packet, counted under ``reason``."""

    reason: str


@dataclass(frozen=True)
class ToPBox:
    """Send ``packet`` to the job's PBox (ATP-style fallback), routed by address."""

    packet: Packet


Action = Emit | Multicast | Drop | ToPBox
HandlerResult = Action | Iterable[Action] | None


# ---- registers and jobs ----------------------------------------------------


@dataclass(frozen=True)
class Register:
    """A register array: ``shape`` entries are ints or names of class attributes."""

    name: str
    shape: tuple[int | str, ...]
    dtype: Any = np.int32
    fill: int = 0

    def resolve(self, program: type[SwitchProgram]) -> tuple[int, ...]:
        return tuple(int(getattr(program, d)) if isinstance(d, str) else int(d) for d in self.shape)

    def nbytes(self, program: type[SwitchProgram]) -> int:
        return int(np.prod(self.resolve(program))) * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class JobPort:
    """What one switch knows about one job: its place in the job's aggregation tree.

    ``children`` are ports towards the job's workers, ``parent`` the port towards
    the tree's root (None at the root). An aggregating switch expects one
    contribution per entry of ``contributors`` (rank -> ingress port); a relay
    (``aggregate=False``) only passes packets along. ``rank`` is the rank this
    switch's partial sums carry upward (the smallest rank below it);
    ``rank_ports`` maps every rank below to the child port leading to it.
    Slots ``slot_base .. slot_base+slots-1`` of the pool belong to the job.
    """

    job: int
    nworkers: int
    children: tuple[int, ...]
    parent: int | None
    aggregate: bool
    contributors: dict[int, int]
    rank: int
    rank_ports: dict[int, int]
    slot_base: int = 0
    slots: int = 0
    pbox: int | None = None
    stall_timeout: float = 0.0  # a slot incomplete this long aborts the job (0: never)

    @property
    def is_root(self) -> bool:
        return self.parent is None

    @cached_property
    def bits(self) -> dict[int, int]:
        """Contributor rank -> its bit in a slot's contributor bitmap."""
        return {rank: 1 << i for i, rank in enumerate(sorted(self.contributors))}

    @cached_property
    def full(self) -> int:
        """The bitmap of a slot every contributor has reached."""
        return (1 << len(self.contributors)) - 1


@dataclass
class Context:
    """Everything a handler may read or change: one per switch."""

    name: str
    tier: str
    ports: dict[int, str]
    jobs: dict[int, JobPort]
    regs: SimpleNamespace
    node: int = -1
    routes: dict[int, int] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)
    now: float = 0.0

    def count(self, name: str, n: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + n

    def route(self, pkt: Packet) -> Action:
        """Forward ``pkt`` towards its destination address (shortest-path routes)."""
        if pkt.dst == self.node:
            return Drop("addressed_to_switch")
        port = self.routes.get(pkt.dst)
        return Drop("no_route") if port is None else Emit(port, pkt)


# ---- handler decorators ----------------------------------------------------


def on_packet(kind: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Tag a method as the handler for packets of ``kind`` (see PACKET_KINDS)."""
    if kind not in PACKET_KINDS:
        raise ValueError(f"unknown packet kind {kind!r}; expected one of {PACKET_KINDS}")

    def tag(fn: Callable[..., Any]) -> Callable[..., Any]:
        fn._innet_packet = (*getattr(fn, "_innet_packet", ()), kind)  # type: ignore[attr-defined]
        return fn

    return tag


def on_timer(interval: float) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Tag a method to run every ``interval`` seconds (of the backend's clock)."""

    def tag(fn: Callable[..., Any]) -> Callable[..., Any]:
        fn._innet_timer = float(interval)  # type: ignore[attr-defined]
        return fn

    return tag


def on_start(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Tag a method to run once when the switch starts (after jobs are installed)."""
    fn._innet_start = True  # type: ignore[attr-defined]
    return fn


class SwitchProgram:
    """Base class of switch programs.

    Subclasses set ``name``, ``slots`` and ``elements`` (and anything their
    ``registers`` shapes name), and define tagged handlers. The runtime makes
    one instance per switch.
    """

    name: ClassVar[str] = "program"
    slots: ClassVar[int] = 0
    elements: ClassVar[int] = 256
    registers: ClassVar[tuple[Register, ...]] = ()

    @classmethod
    def memory_bytes(cls) -> int:
        """Register memory the program needs on every switch."""
        return sum(r.nbytes(cls) for r in cls.registers)

    @classmethod
    def allocate(cls) -> SimpleNamespace:
        regs = SimpleNamespace()
        for reg in cls.registers:
            setattr(regs, reg.name, np.full(reg.resolve(cls), reg.fill, dtype=reg.dtype))
        return regs

    @classmethod
    def handlers(cls) -> tuple[dict[str, str], dict[str, float], list[str]]:
        """(packet kind -> method name, timer method -> interval, start methods)."""
        packet: dict[str, str] = {}
        timers: dict[str, float] = {}
        starts: list[str] = []
        for attr in dir(cls):
            fn: Any = getattr(cls, attr, None)
            for kind in getattr(fn, "_innet_packet", ()):
                packet[kind] = attr
            if hasattr(fn, "_innet_timer"):
                timers[attr] = fn._innet_timer
            if hasattr(fn, "_innet_start"):
                starts.append(attr)
        return packet, timers, starts
