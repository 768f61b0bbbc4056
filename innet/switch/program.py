"""The switch-program API: what a user writes in ``switch_programs/``.

A program is a ``SwitchProgram`` subclass. Class attributes configure it;
``registers`` declares its switch memory up front; handlers are methods tagged
with ``on_packet``, ``on_timer`` or ``on_start``. A handler gets a ``Context``
(the switch's name, tier, ports, the jobs it serves and its registers) and
returns actions; the runtime does all I/O.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cached_property
from types import SimpleNamespace
from typing import Any, ClassVar

import numpy as np

from innet.errors import UserError
from innet.wire.packet import GROUP_BASE, PAYLOAD_OFFSET, Packet

PACKET_KINDS = ("contribution", "result", "routed", "abort")


# ---- actions ---------------------------------------------------------------


@dataclass(frozen=True)
class Emit:
    """Send ``packet`` out of ``port``; ``priority`` picks the port's queue (its band, 0 = most urgent:
    strict priority, up to ``innet.packet.BANDS``), and travels on as the frame's DSCP."""

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


@dataclass(frozen=True)
class EmitMany:
    """Send ``len(hdr)`` packets out of ``port`` at once (a batch handler's output).

    ``hdr`` is a contiguous ``HEADER_DTYPE`` array, ``values`` an (n, count) int32
    array; the runtime writes the frames with a few numpy copies, hop by hop.
    """

    port: int
    hdr: np.ndarray
    values: np.ndarray
    priority: int = 0
    src: np.ndarray | None = None  # with ``dst``: routed packets, addressed from src[k] to dst[k]
    dst: np.ndarray | None = None
    frames: np.ndarray | None = None  # the packets' frames as they arrived, sent as they are (routing)


@dataclass
class Batch:
    """Packets of one kind that arrived together on one port, all with the same ``count``
    (except SPARSE packets, which batch whatever their counts: ``values`` is then as wide
    as the longest, and row k's first ``hdr["count"][k]`` values are its payload).

    Numpy views into the receive buffer, valid only during the handler call:
    ``hdr`` (``HEADER_DTYPE`` records), ``values`` (n, count) int32, ``src``
    and ``dst`` (node indices), ``band`` (priority bands). A batch handler returns ``(actions, rest)``: ``rest``
    are the indices (in arrival order) of packets it leaves to the per-packet handler.
    """

    port: int
    hdr: np.ndarray
    values: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    band: np.ndarray
    rows: np.ndarray = None  # type: ignore[assignment]  # each row's index in the block it came from (default: 0..n-1)
    frames: np.ndarray | None = None  # the rows' frames as received (none for a batch made from others)

    def __post_init__(self) -> None:
        if self.rows is None:
            self.rows = np.arange(len(self.hdr))

    def __len__(self) -> int:
        return len(self.hdr)

    def packet(self, k: int) -> Packet:
        return Packet(self.hdr[k], self.values[k, : int(self.hdr["count"][k])], self.port, int(self.src[k]),
                      int(self.dst[k]), int(self.band[k]))


def group_by(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Group equal ``keys`` (e.g. a batch's slots): ``(order, starts, sizes)``, where ``order`` sorts
    ``keys`` stably (each group's members stay in arrival order) and group g is
    ``order[starts[g]:starts[g] + sizes[g]]`` — the shape ``np.ufunc.reduceat`` wants."""
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    starts = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1])))
    return order, starts, np.append(starts[1:], len(order)) - starts


Action = Emit | Multicast | Drop | ToPBox | EmitMany
HandlerResult = Action | Iterable[Action] | None


# ---- registers and jobs ----------------------------------------------------


@dataclass(frozen=True)
class Register:
    """A register array: ``shape`` entries are ints, names of class attributes, or functions of the
    program class (e.g. ``lambda p: 2 * p.slots``)."""

    name: str
    shape: tuple[int | str | Callable[[Any], int], ...]
    dtype: Any = np.int32
    fill: int = 0

    def resolve(self, program: type[SwitchProgram] | None) -> tuple[int, ...]:
        """The shape; ``program`` may be None where every entry is an int (the PBox's pool)."""
        return tuple(int(getattr(program, d)) if isinstance(d, str) else int(d(program)) if callable(d) else int(d)
                     for d in self.shape)

    def nbytes(self, program: type[SwitchProgram]) -> int:
        return int(np.prod(self.resolve(program))) * np.dtype(self.dtype).itemsize

    def array(self, program: type[SwitchProgram] | None) -> np.ndarray:
        """The register's storage. Zero-filled ones come from the kernel's zero pages, which take memory
        only once written: a pool sized for 128 slots of 2048 values costs what a job's chunks touch
        (a local fat-tree k=16's 320 switches, 65536 values per worker: 1.87 GiB with every page filled)."""
        shape = self.resolve(program)
        return np.zeros(shape, self.dtype) if self.fill == 0 else np.full(shape, self.fill, self.dtype)


@dataclass(frozen=True)
class JobPort:
    """What one switch knows about one job: its place in the job's aggregation tree.

    ``children`` are ports towards the job's workers, ``parent`` the port towards
    the tree's root (None at the root). An aggregating switch expects one
    contribution per entry of ``contributors`` (rank -> ingress port); a relay
    (``aggregate=False``) only passes packets along. ``rank`` is the rank this
    switch's partial sums carry upward (the smallest rank below it);
    ``rank_ports`` maps every rank below to the child port leading to it.
    Slots ``slot_base .. slot_base+slots-1`` of the pool belong to the job;
    ``priority`` is the queue band its packets leave in.
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
    priority: int = 0  # the band of the job's packets in every port's priority queues (0: most urgent)
    uplinks: tuple[int, ...] = ()  # --placement dynamic: the ports up a partial may take (innet.planning.dynamic)
    stride: int = 1  # --placement dynamic: chunks per turn of the uplink rotation at this tier
    window: float = 0.0  # --placement dynamic: seconds a partial waits for more contributions at most, on the run's
    # timeline (0: the program's own; innet.planning.dynamic.partial_window)

    @property
    def is_root(self) -> bool:
        return self.parent is None


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
    groups: dict[int, tuple[int, ...]] = field(default_factory=dict)  # multicast group address -> ports
    counters: dict[str, int] = field(default_factory=dict)
    now: float = 0.0
    clock: float = 1.0  # seconds of ``now`` per second of the run's timeline (dilation): a program's own times times it

    def count(self, name: str, n: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + n

    def route(self, pkt: Packet) -> Action:
        """Forward ``pkt`` towards its destination address (shortest-path routes), in its own band."""
        if pkt.dst == self.node:
            return Drop("addressed_to_switch")
        if pkt.dst >= GROUP_BASE:
            ports = self._to_group(pkt.dst, pkt.port)
            return ports if isinstance(ports, Drop) else Multicast(ports, pkt, pkt.band)
        port = self.routes.get(pkt.dst)
        return Drop("no_route") if port is None else Emit(port, pkt, pkt.band)

    @cached_property
    def route_table(self) -> np.ndarray:
        """``routes`` as an array: node index -> port (-1: none; the switch itself: -2)."""
        table = np.full(max([*self.routes, self.node], default=-1) + 2, -1, np.int64)
        for node, port in self.routes.items():
            table[node] = port
        if self.node >= 0:
            table[self.node] = -2
        return table

    def _to_group(self, group: int, ingress: int) -> tuple[int, ...] | Drop:
        """The ports a group's frame leaves by (never back where it came from), or a Drop when none."""
        ports = tuple(p for p in self.groups.get(group, ()) if p != ingress)
        return ports if ports else Drop("no_group")

    def route_many(self, batch: Batch) -> list[Action]:
        """``route`` for a whole batch: one EmitMany per egress port, band (and length, in a SPARSE batch),
        a group's rows once per port of the group; drops counted."""
        table = self.route_table
        unicast = batch.dst < GROUP_BASE
        port = table[np.clip(batch.dst, 0, len(table) - 1)]
        port[(batch.dst < 0) | ((batch.dst >= len(table) - 1) & unicast)] = -1
        rows = np.arange(len(batch))
        every = bool(unicast.all())  # rows are the batch's, in order (no group's copies)
        if not every:
            copies_rows, copies_ports = [rows[unicast]], [port[unicast]]
            for group in np.unique(batch.dst[~unicast]).tolist():
                members = np.flatnonzero(batch.dst == group)
                ports = self._to_group(group, batch.port)
                for out in () if isinstance(ports, Drop) else ports:
                    copies_rows.append(members)
                    copies_ports.append(np.full(len(members), out, np.int64))
                if isinstance(ports, Drop):
                    self.count("drop:" + ports.reason, len(members))
            rows, port = np.concatenate(copies_rows), np.concatenate(copies_ports)
        for code, reason in ((-2, "addressed_to_switch"), (-1, "no_route")):
            dropped = int(np.count_nonzero(port == code))
            if dropped:
                self.count("drop:" + reason, dropped)
        actions: list[Action] = []
        counts = batch.hdr["count"][rows].astype(np.int64)
        bands = batch.band[rows]
        key = (port << 32 | counts << 8 | bands)[port >= 0]  # one integer per (port, count, band)
        keys = np.unique(key).tolist()
        for k in keys:
            out, count, band = k >> 32, k >> 8 & 0xFFFFFF, k & 0xFF
            if every and len(keys) == 1 and len(key) == len(batch):  # every row, in order, to one port
                pick: np.ndarray | slice = slice(None)
            else:
                pick = rows[(port == out) & (counts == count) & (bands == band)]
            frames = None if batch.frames is None else batch.frames[pick, :PAYLOAD_OFFSET + 4 * count]
            actions.append(EmitMany(out, batch.hdr[pick], batch.values[pick, :count], band, src=batch.src[pick],
                                    dst=batch.dst[pick], frames=frames))
        return actions


# ---- handler decorators ----------------------------------------------------


def on_packet(kind: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Tag a method as the handler for packets of ``kind`` (see PACKET_KINDS)."""
    if kind not in PACKET_KINDS:
        raise ValueError(f"unknown packet kind {kind!r}; expected one of {PACKET_KINDS}")

    def tag(fn: Callable[..., Any]) -> Callable[..., Any]:
        fn._innet_packet = (*getattr(fn, "_innet_packet", ()), kind)  # type: ignore[attr-defined]
        return fn

    return tag


def on_batch(kind: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Tag a method as the batch handler for ``kind``: it gets a ``Batch`` of such packets at once.

    A program with a batch handler must also have the per-packet one: the
    runtime uses it for packets the batch handler leaves, and on backends that
    deliver one frame at a time. Both must give the same result.
    """
    if kind not in PACKET_KINDS:
        raise ValueError(f"unknown packet kind {kind!r}; expected one of {PACKET_KINDS}")

    def tag(fn: Callable[..., Any]) -> Callable[..., Any]:
        fn._innet_batch = kind  # type: ignore[attr-defined]
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
    source: ClassVar[str] = ""  # the file it was loaded from (set by the loader)
    # the collectives (innet.wire.collectives) its handlers serve: a routed or replicating slot needs handlers
    # that read the contributions' mark (innet.switch.routed), as ``Reduction``'s do
    collectives: ClassVar[tuple[str, ...]] = ("allreduce",)
    # seconds a switch may hold a chunk's contribution past a later chunk's before it sends it on (a timeout-based
    # program's window): results then come back out of order by design, and the workers' loss detection by order
    # allows that much per switch on their way (innet.planning.configs.reorder_allowance)
    hold: ClassVar[float] = 0.0
    extra_values: ClassVar[int] = 0  # values its own frames carry after a chunk's (a partial's bitmap)

    @classmethod
    def frame_bytes(cls, elements: int | None = None) -> int:
        """Bytes of one of its frames carrying ``elements`` values (its own ``elements`` by default), and its
        ``extra_values``: what a link carries for a chunk it aggregates."""
        return PAYLOAD_OFFSET + 4 * ((cls.elements if elements is None else elements) + cls.extra_values)

    @classmethod
    def memory_bytes(cls) -> int:
        """Register memory the program needs on every switch."""
        return sum(r.nbytes(cls) for r in cls.registers)

    @classmethod
    def allocate(cls) -> SimpleNamespace:
        regs = SimpleNamespace()
        for reg in cls.registers:
            setattr(regs, reg.name, reg.array(cls))
        return regs

    @classmethod
    def batch_handlers(cls) -> dict[str, str]:
        """Packet kind -> name of its batch handler."""
        found = {getattr(cls, a)._innet_batch: a for a in dir(cls) if hasattr(getattr(cls, a, None), "_innet_batch")}
        for kind in sorted(set(found) - set(cls.handlers()[0])):
            method = getattr(cls, found[kind])
            raise UserError(f"program file {cls.source or inspect.getfile(cls)} line {method.__code__.co_firstlineno}: "
                            f"{cls.__name__}.{found[kind]} handles a batch of {kind!r} packets, but no method handles "
                            f"one; add an @on_packet({kind!r}) method beside it (it gets the packets the batch handler "
                            "leaves, and every packet where frames come one at a time)")
        return found

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
