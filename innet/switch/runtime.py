"""The switch runtime: runs one SwitchProgram on one switch, without doing I/O.

The transport (the in-process fabric, or raw sockets inside Mininet) hands it
frames with ``receive``; it parses them, calls the program's handler, executes
the returned actions and hands back ``(port, frame)`` pairs to send. It also
counts packets and bytes per port (point-to-point messages' frames, job P2P_JOB, apart too) and every drop by
reason.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

import numpy as np

from innet.errors import UserError
from innet.switch.engine import slots_held
from innet.switch.loader import failure
from innet.switch.program import (
    Action,
    Batch,
    Context,
    Drop,
    Emit,
    EmitMany,
    HandlerResult,
    JobPort,
    Multicast,
    SwitchProgram,
    ToPBox,
)
from innet.wire.packet import (
    ABORT,
    AGG_PORT,
    BANDS,
    FALLBACK,
    HEADER_OFFSET,
    INPUT_JOB,
    P2P_JOB,
    RESULT,
    ROUTE,
    SPARSE,
    FrameBlock,
    Packet,
    build_frames,
    frame_prefix,
    pack_frames,
    parse_block,
    parse_frame,
)

Frames = list[tuple[int, bytes]]
Out = list[tuple[int, "bytes | np.ndarray"]]  # a frame, or a block of equal-length frames (one per row)
KIND_NAMES = ("contribution", "result", "abort", "routed")
KIND_CODES = {name: code for code, name in enumerate(KIND_NAMES)}
DEFAULT_SWITCH_MEMORY = 4 << 20
SPARSE_RUN = 1 << 16  # past any count: the batching key of SPARSE packets
# Shorter blocks are cheaper frame by frame: a block costs about five frames' per-packet handling
# (scripts/bench_blocks.py prints both paths' cost per frame by block size, and where they cross).
SMALL_BLOCK = 5


@dataclass
class PortStats:
    """A port's frames and bytes in and out; of the bytes, those of point-to-point messages (job P2P_JOB: torch's
    send/recv and all-to-all, innet.hosts.p2p), which a Mininet launch reports apart from the side plane's TCP."""

    rx_packets: int = 0
    rx_bytes: int = 0
    tx_packets: int = 0
    tx_bytes: int = 0
    message_rx_bytes: int = 0
    message_tx_bytes: int = 0


@dataclass(frozen=True)
class JobSlots:
    """Where a job's slots sit in a switch's pool."""

    aggregate: bool
    slot_base: int
    slots: int


@dataclass(frozen=True)
class SwitchReport:
    """A switch's counters (per port, per reason), its jobs' slots and its register memory."""

    name: str
    memory_bytes: int
    memory_capacity: int
    jobs: dict[int, JobSlots]
    ports: dict[str, PortStats]  # interface -> its packets and bytes
    counters: dict[str, int]
    slots_held: tuple[tuple[float, int], ...] = ()  # with ``SwitchConfig.timeline``: (instant, slots held) at each
    # change, from none held
    slots: int = 0  # the pool's slots, with ``slots_held``
    data_plane: str = "python"  # "ebpf": its ports ran the tc program (innet.ebpf), counted in ``ports`` and ``counters``


@dataclass
class SwitchConfig:
    """Everything a switch is told by the control plane before traffic starts."""

    name: str
    node: int
    tier: str
    ports: dict[int, str]
    neighbors: dict[int, int]
    routes: dict[int, int]
    jobs: dict[int, JobPort] = field(default_factory=dict)
    memory_bytes: int = DEFAULT_SWITCH_MEMORY
    groups: dict[int, tuple[int, ...]] = field(default_factory=dict)  # multicast group address -> ports
    clock: float = 1.0  # the switch's seconds per second of the run's timeline (a dilated run's factor)
    timeline: bool = False  # keep the slots held at each change (innet.results.timeline)


def kind_of(pkt: Packet) -> str:
    flags = pkt.flags
    if flags & ROUTE:
        return "routed"
    if flags & ABORT:
        return "abort"
    return "result" if flags & RESULT else "contribution"


_KIND_OF_FLAGS = np.array([3 if f & ROUTE else 2 if f & ABORT else 1 if f & RESULT else 0 for f in range(256)], np.int64)


def kind_codes(flags: np.ndarray) -> np.ndarray:
    """``kind_of`` for a whole array of (8-bit) flags: KIND_CODES values, 3 for routed."""
    return _KIND_OF_FLAGS[flags]


def flatten(out: Out) -> Frames:
    """Every frame of ``out`` as bytes, blocks split into their rows."""
    frames: Frames = []
    for port, frame in out:
        if isinstance(frame, bytes):
            frames.append((port, frame))
        else:
            frames.extend((port, row.tobytes()) for row in frame)
    return frames


def frame_problem(frame: bytes) -> str:
    """Why parse_frame refused a frame: 'foreign' (not innet) or 'malformed'."""
    if len(frame) >= HEADER_OFFSET and frame[12:14] == b"\x08\x00" and frame[23] == 17:
        if int.from_bytes(frame[36:38], "big") == AGG_PORT:
            return "malformed"
    return "foreign"


def check_fits(config: SwitchConfig, program: type[SwitchProgram]) -> None:
    """Refuse, in one line, a program whose registers or whose jobs' slots do not fit the switch."""
    need = program.memory_bytes()
    if need > config.memory_bytes:
        raise UserError(
            f"program {program.name} needs {need} bytes of register memory but switch "
            f"{config.name} has {config.memory_bytes}; lower its slots ({{pool_slots}}) or elements "
            "({packet_elements}), or raise {switch_memory}"
        )
    for job in config.jobs.values():
        if job.aggregate and job.slot_base + job.slots > program.slots:
            raise UserError(
                f"job {job.job} wants slots {job.slot_base}..{job.slot_base + job.slots - 1} "
                f"on {config.name}, which has {program.slots}"
            )


class SwitchRuntime:
    def __init__(self, config: SwitchConfig, program: type[SwitchProgram]) -> None:
        check_fits(config, program)
        self.config = config
        self.program = program()
        self.ctx = Context(
            name=config.name, tier=config.tier, ports=dict(config.ports), jobs=dict(config.jobs),
            regs=program.allocate(), node=config.node, routes=dict(config.routes), groups=dict(config.groups),
            clock=config.clock,
        )
        self.handlers, timers, self.starts = program.handlers()
        self.batch_handlers = program.batch_handlers()
        if "routed" not in self.handlers:  # the default for routed packets, ctx.route, has a batch form too
            self.batch_handlers["routed"] = ""
        self.batch_kinds = np.isin(np.arange(len(KIND_NAMES)), [KIND_CODES[k] for k in self.batch_handlers])
        self.timers = {name: [interval * config.clock] * 2 for name, interval in timers.items()}  # on the run's timeline
        self.stats = {port: PortStats() for port in config.ports}
        held = slots_held(self.ctx.regs) if config.timeline else None  # a program without a pool has no track
        self.slot_log: list[tuple[float, int]] | None = [] if held is not None else None  # none held at first
        self.slots = held[1] if held is not None else 0

    @property
    def memory_bytes(self) -> int:
        return self.program.memory_bytes()

    def start(self, now: float) -> Frames:
        self.ctx.now = now
        for timer in self.timers.values():
            timer[1] = now + timer[0]
        out: Out = []
        for name in self.starts:
            try:
                result = getattr(self.program, name)(self.ctx)
            except (Exception, SystemExit) as exc:  # noqa: BLE001 - a program's failure is one line naming it
                raise self._failed(name, exc) from None
            self._execute(result, out)
        return flatten(out)

    def next_timer(self) -> float | None:
        return min((t[1] for t in self.timers.values()), default=None)

    def run_timers(self, now: float) -> Frames:
        self.ctx.now = now
        out: Out = []
        for name, timer in self.timers.items():
            if timer[1] <= now:
                timer[1] = now + timer[0]
                try:
                    result = getattr(self.program, name)(self.ctx)
                except (Exception, SystemExit) as exc:  # noqa: BLE001 - a program's failure is one line naming it
                    raise self._failed(name, exc) from None
                self._execute(result, out)
        if self.slot_log is not None:
            self._note_slots(now)
        return flatten(out)

    def _note_slots(self, now: float) -> None:
        """The slots held now, kept where they changed (at one instant, the last count: a slot taken and freed
        by frames of one instant was held for no time)."""
        held, log = slots_held(self.ctx.regs), self.slot_log
        assert log is not None and held is not None
        if log and log[-1][0] == now:
            log.pop()
        if held[0] != (log[-1][1] if log else 0):
            log.append((now, held[0]))

    def receive(self, port: int, frame: bytes, now: float) -> Frames:
        """Handle one frame that arrived on ``port``; return the frames to send."""
        stats = self.stats[port]
        stats.rx_packets += 1
        stats.rx_bytes += len(frame)
        self.ctx.now = now
        pkt = parse_frame(frame, port)
        out: Out = []
        if pkt is None:
            self.ctx.count("bad:" + frame_problem(frame))
            return []
        if pkt.job == P2P_JOB:
            stats.message_rx_bytes += len(frame)
        self._dispatch(port, pkt, out)
        if self.slot_log is not None:
            self._note_slots(now)
        return flatten(out)

    def receive_block(self, port: int, block: FrameBlock, now: float) -> Out:
        """Handle a block of frames that arrived together on ``port``, in arrival order.

        Runs of well-formed, unspoofed packets of one kind and size go to the
        program's batch handler for that kind; every other frame, and what the
        batch handler leaves, goes through the per-packet path.
        """
        self.ctx.now = now
        n = len(block.lengths)
        out: Out = []
        codes = kind_codes(block.hdr["flags"])
        # the reverse-path check of _spoofed: a routed packet's source routes back to this port, others are the neighbour's
        unspoofed = block.src == self.config.neighbors.get(port, -3)
        routed = codes == 3
        if routed.any():
            table = self.ctx.route_table
            back = table[np.clip(block.src, 0, len(table) - 1)]
            unspoofed = np.where(routed, (block.src >= 0) & (back == port), unspoofed)
        batchable = block.ok & unspoofed & self.batch_kinds[codes]
        # runs of one kind and count; SPARSE packets of one kind batch whatever their counts (SPARSE_RUN)
        count = np.where(block.hdr["flags"] & SPARSE, SPARSE_RUN, block.hdr["count"].astype(np.int64))
        key = np.where(batchable, count * 4 + codes, -1)
        edges = [0, n] if (key == key[0]).all() else [0, *(np.flatnonzero(key[1:] != key[:-1]) + 1).tolist(), n]
        for a, b in zip(edges[:-1], edges[1:], strict=False):
            if key[a] < 0:
                for k in range(a, b):
                    out.extend(self.receive(port, block.frame(k), now))
                continue
            stats = self.stats[port]
            stats.rx_packets += b - a
            stats.rx_bytes += int(block.lengths[a:b].sum())
            rows = slice(a, b)
            messages = block.hdr["job"][rows] == P2P_JOB
            if messages.any():
                stats.message_rx_bytes += int(block.lengths[rows][messages].sum())
            width = int(block.hdr["count"][rows].max())  # a SPARSE run's rows are as wide as its longest
            batch = Batch(port, block.hdr[rows], block.values(rows, width), block.src[rows], block.dst[rows],
                          block.band[rows], frames=block.frames[rows])
            handler = self.batch_handlers[KIND_NAMES[key[a] % 4]]
            if handler:
                try:
                    returned = getattr(self.program, handler)(self.ctx, batch)
                except (Exception, SystemExit) as exc:  # noqa: BLE001 - a program's failure is one line naming it
                    raise self._failed(handler, exc) from None
                actions, rest = self._batch_result(handler, returned, len(batch))
            else:
                actions, rest = self.ctx.route_many(batch), np.zeros(0, np.int64)
            self._execute(actions, out)
            for k in rest:
                self._dispatch(port, batch.packet(int(k)), out)
        if self.slot_log is not None:
            self._note_slots(now)
        return out

    def receive_rows(self, port: int, frames: np.ndarray, lengths: np.ndarray, now: float) -> Out:
        """What one read of a port's receive ring brought (``frames[k, :lengths[k]]``): fewer than
        SMALL_BLOCK frames go frame by frame, more as a block. At low rates a read mostly brings one or
        two frames, and the block path's fixed cost (its numpy calls) would be spent on each."""
        if len(lengths) < SMALL_BLOCK:
            out: Out = []
            for k in range(len(lengths)):
                out.extend(self.receive(port, frames[k, : lengths[k]].tobytes(), now))
            return out
        return self.receive_block(port, parse_block(frames, lengths), now)

    def receive_frames(self, port: int, frames: list[bytes], now: float) -> Frames:
        """``receive_block`` for frames given as bytes (tests, and backends without a receive ring)."""
        buf, lengths = pack_frames(frames)
        return flatten(self.receive_block(port, parse_block(buf, lengths), now))

    def _dispatch(self, port: int, pkt: Packet, out: Out) -> None:
        if self._spoofed(port, pkt):
            self.ctx.count("drop:spoofed_source")
            return
        kind = kind_of(pkt)
        handler = self.handlers.get(kind)
        if handler is None:
            result: HandlerResult = self.ctx.route(pkt) if kind == "routed" else Drop("no_handler")
        else:
            try:
                result = getattr(self.program, handler)(self.ctx, pkt)
            except (Exception, SystemExit) as exc:  # noqa: BLE001 - a program's failure is one line naming it
                raise self._failed(handler, exc) from None
        self._execute(result, out)

    def _where(self) -> str:
        """The program, for a line about it: its name and file."""
        cls = type(self.program)
        return f"program {cls.name} ({self.program.source or inspect.getfile(cls)})"

    def _failed(self, handler: str, exc: BaseException) -> UserError:
        """A handler's exception as one line naming the program, the handler, its file and line."""
        cls = type(self.program)
        return UserError(f"{self._where()}: handler {cls.__name__}.{handler} raised "
                         f"{failure(exc, self.program.source or inspect.getfile(cls))}")

    def _batch_result(self, handler: str, returned: object, n: int) -> tuple[HandlerResult, np.ndarray]:
        """A batch handler's ``(actions, rest)``, or one line saying how it is not that."""
        cls = type(self.program)
        ok = isinstance(returned, tuple) and len(returned) == 2
        rest = np.asarray(returned[1]) if ok else np.zeros(0)  # type: ignore[index]
        if not ok or rest.ndim != 1 or (len(rest) and (rest.dtype.kind not in "iu" or rest.min() < 0 or rest.max() >= n)):
            raise UserError(f"{self._where()}: batch handler {cls.__name__}.{handler} returned {_short(returned)}; "
                            f"return (actions, rest): rest the indices (0..{n - 1}) of the packets it leaves to the "
                            "per-packet handler")
        return returned[0], rest  # type: ignore[index]

    def _spoofed(self, port: int, pkt: Packet) -> bool:
        """Reverse-path check: a routed packet must arrive where its source's route leads,
        a hop-by-hop one from the neighbour on that port; so no host can pose as another."""
        if pkt.flags & ROUTE:
            return self.ctx.routes.get(pkt.src) != port
        return self.config.neighbors.get(port) != pkt.src

    def _execute(self, result: HandlerResult, out: Out) -> None:
        if result is None:
            return
        actions: Iterable[Action] = (result,) if not isinstance(result, (list, tuple)) else result
        last: tuple[EmitMany, np.ndarray] | None = None  # the block EmitMany built last
        action: object = None
        try:
            for action in actions:
                if isinstance(action, Emit):
                    self._send(action.port, action.packet, out, action.priority)
                elif isinstance(action, Multicast):
                    self._send_to(action.ports, action.packet, out, action.priority)
                elif isinstance(action, Drop):
                    self.ctx.count("drop:" + action.reason)
                elif isinstance(action, ToPBox):
                    self._to_pbox(action.packet, out)
                elif isinstance(action, EmitMany):
                    last = self._send_many(action, out, last)
                else:
                    raise UserError(f"program file {self.program.source or self.program.name}: a handler of "
                                    f"{type(self.program).__name__} returned {_short(action)}, which is not an "
                                    "action; return Emit, Multicast, Drop, ToPBox, EmitMany, a list of them, or None")
        except (AttributeError, TypeError, ValueError):  # the one way an action fails without a line of its own
            packet = getattr(action, "packet", None)
            if not isinstance(action, (Emit, Multicast, ToPBox)) or isinstance(packet, Packet):
                raise
            raise UserError(f"{self._where()}: a handler of {type(self.program).__name__} returned "
                            f"{type(action).__name__} of {_short(packet)}, which is not a Packet; give it "
                            "pkt.replace(values, ...) or make_packet(values, ...)") from None

    def _bad_port(self, port: object) -> UserError:
        """A handler's packet to a port this switch does not have, as one line naming the program."""
        return UserError(f"{self._where()}: a handler of {type(self.program).__name__} sent a packet to port "
                         f"{port!r}, which switch {self.config.name} does not have; its ports are "
                         f"{', '.join(map(str, sorted(self.stats)))} (ctx.ports)")

    def _to_pbox(self, pkt: Packet, out: Out) -> None:
        job = self.ctx.jobs.get(pkt.job)
        if job is None or job.pbox is None or job.pbox not in self.ctx.routes:
            self.ctx.count("drop:no_pbox")
            return
        flags = int(pkt.hdr["flags"]) | ROUTE | FALLBACK
        fwd = pkt.replace(flags=flags)
        fwd.src, fwd.dst = self.config.node, job.pbox
        self.ctx.count("fallback")
        self._send(self.ctx.routes[job.pbox], fwd, out, pkt.band)

    def _send_many(self, action: EmitMany, out: Out, last: tuple[EmitMany, np.ndarray] | None = None
                   ) -> tuple[EmitMany, np.ndarray] | None:
        """Write an EmitMany's frames. The same rows to another port (a multicast's: ``last`` sent them) are
        a copy of that block with the headers for this hop."""
        if action.port not in self.stats:
            raise self._bad_port(action.port)
        if len(action.hdr) == 0:
            return last
        band = self._band(action.priority)
        if action.frames is not None:
            block = action.frames
        elif action.src is not None and action.dst is not None:
            block = build_frames(action.src, action.dst, action.hdr, action.values, band)
        elif (last is not None and last[0].hdr is action.hdr and last[0].values is action.values and last[0].src is None
              and self._band(last[0].priority) == band):
            block = last[1].copy()
            block[:, :HEADER_OFFSET] = np.frombuffer(frame_prefix(self.config.node, self.config.neighbors[action.port],
                                                                  block.shape[1] - HEADER_OFFSET, band), np.uint8)
        else:
            block = build_frames(self.config.node, self.config.neighbors[action.port], action.hdr, action.values, band)
        stats = self.stats[action.port]
        stats.tx_packets += block.shape[0]
        stats.tx_bytes += block.size
        messages = int(np.count_nonzero(action.hdr["job"] == P2P_JOB))
        if messages:
            stats.message_tx_bytes += messages * block.shape[1]
        if action.src is not None:
            self._count_input(int(np.count_nonzero(action.hdr["job"] == INPUT_JOB)) * block.shape[1])
        out.append((action.port, block))
        return action, block

    @staticmethod
    def _band(priority: int) -> int:
        return min(max(int(priority), 0), BANDS - 1)

    def _send(self, port: int, pkt: Packet, out: Out, priority: int = 0) -> None:
        self._send_to((port,), pkt, out, priority)

    def _send_to(self, ports: Iterable[int], pkt: Packet, out: Out, priority: int = 0) -> None:
        """``pkt`` out of each of ``ports`` in turn (a Multicast's), its payload serialised once."""
        band = self._band(priority)
        routed = pkt.flags & ROUTE
        input_job, message = pkt.job == INPUT_JOB, pkt.job == P2P_JOB
        payload = pkt.payload()
        node, neighbors, all_stats = self.config.node, self.config.neighbors, self.stats
        for port in ports:
            stats = all_stats.get(port)
            if stats is None:
                raise self._bad_port(port)
            if routed:
                frame = frame_prefix(pkt.src, pkt.dst, len(payload), band) + payload
            else:
                frame = frame_prefix(node, neighbors[port], len(payload), band) + payload
            stats.tx_packets += 1
            stats.tx_bytes += len(frame)
            if message:
                stats.message_tx_bytes += len(frame)
            if input_job:
                self._count_input(len(frame))
            out.append((port, frame))

    def _count_input(self, nbytes: int) -> None:
        """Bytes of the ensemble's input stream sent (innet.hosts.ensemble), apart from the rest."""
        if nbytes:
            self.ctx.count("input_bytes", nbytes)

    def report(self) -> SwitchReport:
        """Counters, drops and register memory, for the control channel and results."""
        return SwitchReport(
            name=self.config.name, memory_bytes=self.memory_bytes, memory_capacity=self.config.memory_bytes,
            jobs={job.job: JobSlots(job.aggregate, job.slot_base, job.slots) for job in self.ctx.jobs.values()},
            ports={self.config.ports[p]: replace(s) for p, s in self.stats.items()},
            counters=dict(self.ctx.counters),
            slots_held=tuple(self.slot_log or ()), slots=self.slots,
        )


def _short(value: object) -> str:
    """``repr(value)`` cut to a line's worth."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
