"""Dynamic trees (``--placement dynamic``) beside open-loop background traffic, as fluid through the links' queues.

The links, their strict-priority FIFOs, store and forward and the background's seeded frames are the static tree's
(innet.planning.timing.fluid), each frame landing at its own instant (``_Frames``: who came first to a shared link goes
first, and a small frame's hop costs no whole step); what differs is which way each chunk goes, decided as the
``dynamic_tree`` program decides it, frame by frame. Every frame the job sends is its own class in the queues: a
worker's contribution, a switch's partial (its ranks), a chunk's result. A switch that climbs towards the root picks
a chunk's uplink when the chunk's first contribution arrives: the rotation's (``chunk // stride``), unless that
uplink's decayed count of background bytes sent is more than ``margin`` times the least's and ``slack`` bytes. It
sends the chunk's partial on once every rank of its cone is in it, or ``window`` after the first arrival (siblings
that chose another uplink never come: the partial goes on incomplete, later arrivals follow alone). The root sends
the result down to its children and up one chosen uplink; a switch a result reaches from below floods it down and on
up, one from above floods it down. A worker sends its exponent's frame, then its chunks as results free their slots
(chunk ``c`` frees ``c + slots``), and its next call's exponent once it has every result of one. Several jobs'
switches decide each for its own job (its windows, its latecomers), counting the background alike.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields
from typing import cast

import networkx as nx

from innet.graph import natural_key, ports
from innet.planning.planner import JobPlan
from innet.planning.timing.fluid import _Fluid, _Frames, jobs_of, run_fluid


@dataclass(frozen=True)
class Choices:
    """What a dynamic tree's switch does by (the program's own class attributes, ``of``): the least seconds a partial
    waits, the most values a partial carries after its chunk's (its ranks), the timer's tick, the decay of a port's byte
    count, how much more an uplink must carry to be left (``margin`` times the least's, and ``slack`` bytes), and how
    many windows a switch's wait may widen to for its latecomers."""

    window: float
    extra_values: float
    tick: float
    tau: float
    margin: float
    slack: float
    late_cap: float

    @classmethod
    def of(cls, program: object) -> Choices | None:
        """The figures ``program`` decides by; None where it lacks one (a program that is not ``dynamic_tree``'s kind)."""
        got = [float(v) for f in fields(cls) if isinstance(v := getattr(program, f.name, None), int | float)]
        return cls(*got) if len(got) == len(fields(cls)) else None


def trees_fluid_s(graph: nx.Graph, plan: JobPlan | Sequence[JobPlan], flows: Sequence[tuple[str, str, float]],
                  chunks: int, frame_bytes: int, choices: Choices, band: int | Sequence[int] = 0,
                  background_band: int = 0, lead_s: float = 0.0, background_frame: int = 0, exponent_bytes: int = 0,
                  first_s: Sequence[float] | None = None, last_bytes: int = 0, calls: int = 1) -> float:
    """Seconds ``plan``'s dynamic trees take to all-reduce ``chunks`` frames of ``frame_bytes`` per worker, deciding
    by ``choices``; every other argument (several jobs together too) as ``innet.planning.timing.fluid.tree_fluid_s``
    takes it."""
    plans, bands = jobs_of(plan, band)
    fluid = _Trees(graph, plans, flows, chunks, frame_bytes, bands, background_band, background_frame, exponent_bytes,
                   last_bytes, calls, choices)
    return run_fluid(fluid, [rate for _, _, rate in flows], background_frame, lead_s, first_s)


@dataclass
class _Chunk:
    """A chunk at a switch: ranks folded and not sent, ranks sent on, when its partial's first arrival came (None:
    sent on, or not yet opened), the neighbour its partials go to and when its first arrival came."""

    have: int
    sent: int
    since: float | None
    way: str
    first: float = 0.0


class _Trees(_Fluid):
    """``trees_fluid_s``'s links and the job's frames over them."""

    steps = 64  # whether a chunk's result or another flow's frame comes first to a shared link decides when a worker
    # sends on, and whether a partial waits its window out a frame later; a frame landing within a step is passed
    # on from the next: at 16 steps a frame (0.4 ms at 10 Mbit/s) the fat-tree's seeds 1-3 were 41%, 29%, -3% off
    # the fabric, at 32 0.0%, 31%, 0.0%, at 64 0.0% each (and every dynamic point of the grid)
    link_kind = _Frames  # each frame lands at its instant

    def __init__(self, graph: nx.Graph, plans: Sequence[JobPlan], flows: Sequence[tuple[str, str, float]],
                 chunks: int, frame_bytes: int, bands: Sequence[int], background_band: int, background_frame: int,
                 exponent_bytes: int, last_bytes: int, calls: int, choices: Choices) -> None:
        self.choices, self.chunks = choices, chunks  # a call's data chunks: chunk k * (chunks + 1) is call k's exponent
        super().__init__(graph, plans, flows, chunks, frame_bytes, bands, background_band, background_frame,
                         exponent_bytes, last_bytes, calls)

    def job_links(self, graph: nx.Graph, plan: JobPlan) -> list[tuple[str, str]]:
        """Every link direction between the job's workers and switches: a chunk may take any of them."""
        nodes = {*plan.workers, *plan.switch_ports}
        ends = sorted((tuple(sorted((a, b), key=natural_key)) for a, b in graph.edges if a in nodes and b in nodes),
                      key=lambda e: (natural_key(e[0]), natural_key(e[1])))
        return [*((a, b) for a, b in ends), *((b, a) for a, b in ends)]

    def start(self, graph: nx.Graph, plans: Sequence[JobPlan]) -> None:
        """Each job's switches (keyed by (job, switch)) and workers; job ``j``'s frames are its own classes."""
        self.plans, self.now = list(plans), 0.0
        each = [(j, s, jp) for j, plan in enumerate(plans) for s, jp in plan.switch_ports.items()]
        name = {s: ports(graph, s) for _, s, _ in each}
        self.ups = {(j, s): [name[s][p] for p in jp.uplinks] for j, s, jp in each}
        self.down = {(j, s): [name[s][p] for p in jp.children] for j, s, jp in each}
        self.parent = {(j, s): name[s][jp.parent] for j, s, jp in each if jp.parent is not None}
        self.climbs = {(j, s) for j, s, jp in each if jp.parent is not None and jp.parent in jp.uplinks}
        self.stride = {(j, s): jp.stride for j, s, jp in each}
        self.cone = {(j, s): sum(1 << r for r in jp.contributors) for j, s, jp in each}
        windows = {(j, s): jp.window for j, s, jp in each}  # the job's (innet.planning.dynamic.partial_window)
        self.wait = {js: max(self.choices.window, w) for js, w in windows.items()}
        self.late = dict.fromkeys(windows, 0.0)  # what each switch learnt a job's latecomers need (``_learn``)
        self.tau = max([self.choices.tau, *(2 * w for w in windows.values())])  # the longest job's, as the program
        self.rank = {w: (j, i) for j, plan in enumerate(plans) for i, w in enumerate(plan.workers)}
        self.frames: list[tuple[int, bool, int, int, float]] = []  # per class -1 - k: (its job, a result?, its chunk,
        # its ranks, its bytes: a partial's ranks make it longer than a worker's frame or a result)
        self.data_frame = self.frame_bytes - 4 * self.choices.extra_values  # a worker's: no ranks after its values
        self.bitmaps = [4 * -(-len(plan.workers) // 32) for plan in plans]  # a partial's ranks: a bit each, in words
        self.results: dict[tuple[int, int], int] = {}  # (job, chunk) -> its result's class
        self.at: dict[tuple[int, str, int], _Chunk] = {}  # (job, switch, chunk) -> its state
        self.load: dict[tuple[str, str], tuple[float, float]] = {}  # link -> background bytes sent, decayed; when
        self.timers: list[tuple[float, int, str, int]] = []  # (when, job, switch, chunk)
        self.back = dict.fromkeys(self.rank, 0)  # results each worker has
        self.returns = {(j, (plan.first_hop[w], w)) for j, plan in enumerate(plans) for w in plan.workers}  # the
        # links results come back over
        self.done = 0
        self.started = False
        self.sources: list[tuple[float, tuple[str, str], int, float]] = []  # the background's puts due this step

    def due(self) -> bool:
        return not self.started

    def send_job(self) -> None:
        """At the job's start, each worker's exponent (the job's other frames go on as what they answer lands)."""
        self.started, self.idle = True, 0.0
        for w in self.rank:
            self._send(w, 0)

    def source(self, hop: tuple[str, str], cls: int, amount: float, step: int, at: float) -> None:
        """At its instant, with what lands in the step (``landed``)."""
        self.sources.append((at, hop, cls, amount))

    def landed(self, step: int) -> Iterator[tuple[tuple[str, str], float, int, float]]:
        """What lands at ``step``'s end, in the order it came (the far ends pass it on in that order), the
        background's frames put in and the partials whose wait is over sent on at their instants between; of
        frames that come at once, the one put into its link first, as the fabric delivers them (frames of one
        size on links of one rate tie often). What lands at ``due`` came at ``due + 1`` (in steps)."""
        out = list(super().landed(step))
        came = [cast(_Frames, self.links[hop]).came.popleft() for hop, *_ in out]
        order = sorted(range(len(out)), key=lambda k: (round(out[k][1], 6), came[k]))
        events = sorted([*((out[k][1] + 1, 0, n) for n, k in enumerate(order)),
                         *((at, 1, n) for n, (at, *_) in enumerate(self.sources))])
        timers, end = self.timers, step + 1
        for at, kind, n in events:
            while timers and timers[0][0] / self.dt <= at:
                self._timeout(end)
            if kind == 0:
                yield out[order[n]]
            else:
                _, hop, cls, amount = self.sources[n]
                self.idle = end - at
                self.put(hop, self.background_band, cls, amount)
        self.sources = []
        while timers and timers[0][0] / self.dt < end:
            self._timeout(end)

    def _timeout(self, end: int) -> None:
        """The earliest partial whose wait is over goes on, if it has not."""
        at, j, s, chunk = heapq.heappop(self.timers)
        since = self.at[j, s, chunk].since
        if since is None:
            return
        due = self._due(j, s, since)
        if due > at + 1e-12:  # the switch widened its wait since (``_learn``): it looks again then
            heapq.heappush(self.timers, (due, j, s, chunk))
            return
        self.idle = end - at / self.dt
        self._flush(j, s, chunk)

    def serve(self, step: int) -> None:
        self.now = (step + 1) * self.dt  # what lands in this step lands at its end
        super().serve(step)

    def put(self, hop: tuple[str, str], band: int, cls: int, amount: float) -> None:
        if cls >= 0:  # the background: its sender's decayed byte count of the port (the program's ``load``)
            now = self._instant()
            got, when = self.load.get(hop, (0.0, now))
            self.load[hop] = (got * math.exp(-(now - when) / self.tau) + amount, now)
        link = self.links[hop]
        assert isinstance(link, _Frames)
        link.take(band, cls, amount, self._instant() / self.dt)
        self.waiting[hop] = link

    # -- the jobs' frames -------------------------------------------------------
    def _size(self, j: int, chunk: int, partial: bool) -> float:
        k = chunk % (self.chunks + 1)  # within its call
        return ((self.head if k == 0 else self.data_frame - (self.short if k == self.chunks else 0))
                + (self.bitmaps[j] if partial else 0.0))

    def _emit(self, hop: tuple[str, str], j: int, result: bool, chunk: int, ranks: int) -> None:
        if result:
            if (j, chunk) not in self.results:
                self.frames.append((j, True, chunk, 0, self._size(j, chunk, False)))
                self.results[j, chunk] = -len(self.frames)
            cls = self.results[j, chunk]
        else:
            self.frames.append((j, False, chunk, ranks, self._size(j, chunk, hop[0] not in self.back)))
            cls = -len(self.frames)
        self.put(hop, self.bands[j], cls, self.frames[-1 - cls][4])

    def _send(self, worker: str, chunk: int) -> None:
        j, rank = self.rank[worker]
        self._emit((worker, self.plans[j].first_hop[worker]), j, False, chunk, 1 << rank)

    def _arrive(self, hop: tuple[str, str], cls: int, amount: float) -> None:
        """A frame of a job came whole over ``hop`` (its links pass frames whole: ``_Frames``)."""
        j, result, chunk, ranks, _ = self.frames[-1 - cls]
        came, node = hop
        if node in self.back:
            self._result_at_worker(node, chunk)
        elif result:
            above = came in self.ups[j, node]
            for n in self.down[j, node]:
                if n != came:
                    self._emit((node, n), j, True, chunk, 0)
            if not above and self.ups[j, node]:
                self._emit((node, self._choose(j, node, chunk)), j, True, chunk, 0)
        else:
            self._contribution(j, node, chunk, ranks)

    def _result_at_worker(self, worker: str, chunk: int) -> None:
        """A result at ``worker``: its window moves on within the call; a call's every result starts the next."""
        n, j = self.chunks + 1, self.rank[worker][0]
        self.back[worker] += 1
        if self.back[worker] % n == 0:
            call = self.back[worker] // n - 1
            self.ended(j, call, self._instant())
            self.done += call + 1 == self.calls
            if call + 1 < self.calls:
                self._send(worker, (call + 1) * n)
            return
        slots, end = self.plans[j].slots, (chunk // n + 1) * n  # the call's chunks are below ``end``
        for nxt in range(chunk + 1, chunk + 1 + slots) if chunk % n == 0 else (chunk + slots,):
            if nxt < end:
                self._send(worker, nxt)

    def _contribution(self, j: int, s: str, chunk: int, ranks: int) -> None:
        js = (j, s)
        if s == self.plans[j].root:
            root = self.at.setdefault((j, s, chunk), _Chunk(0, 0, None, ""))
            if root.have == self.cone[js] or root.have & ranks:  # a repeat, or an overlap: dropped
                return
            root.have |= ranks
            if root.have == self.cone[js]:
                for n in self.down[js]:
                    self._emit((s, n), j, True, chunk, 0)
                if self.ups[js]:
                    self._emit((s, self._choose(j, s, chunk)), j, True, chunk, 0)
            return
        state = self.at.get((j, s, chunk))
        if state is None:
            way = self._choose(j, s, chunk) if js in self.climbs else self.parent[js]
            now = self._instant()
            state = self.at[j, s, chunk] = _Chunk(0, 0, now, way, now)
            heapq.heappush(self.timers, (self._due(j, s, now), j, s, chunk))
        elif state.since is None:  # its partial went on: a latecomer follows alone
            self._learn(j, s, state)
            state.sent |= ranks
            self._emit((s, state.way), j, False, chunk, ranks)
            return
        state.have |= ranks
        if state.have | state.sent == self.cone[js]:
            self._flush(j, s, chunk)

    def _due(self, j: int, s: str, since: float) -> float:
        """The timer's tick at which job ``j``'s partial at ``s`` waiting since ``since`` goes on."""
        tick = self.choices.tick
        return math.ceil((since + max(self.wait[j, s], self.late[j, s])) / tick - 1e-9) * tick

    def _learn(self, j: int, s: str, state: _Chunk) -> None:
        """A latecomer to ``state``'s chunk: ``s`` waits that long for job ``j`` from now on (a tenth and a tick
        more), up to ``late_cap`` windows (the program's ``_learn``)."""
        lag = self._instant() - state.first
        if lag > max(self.wait[j, s], self.late[j, s]):
            self.late[j, s] = min(1.1 * lag + self.choices.tick, self.choices.late_cap * self.wait[j, s])

    def _flush(self, j: int, s: str, chunk: int) -> None:
        state = self.at[j, s, chunk]
        state.since = None
        if state.have:
            self._emit((s, state.way), j, False, chunk, state.have)
            state.sent |= state.have
            state.have = 0

    def _choose(self, j: int, s: str, chunk: int) -> str:
        """``s``'s uplink for job ``j``'s ``chunk``: the rotation's, unless its background is clearly more than the
        least's."""
        ups = self.ups[j, s]
        loads = [self._load((s, u)) for u in ups]
        turn = (chunk // self.stride[j, s]) % len(ups)
        least = loads.index(min(loads))
        return ups[least] if loads[turn] > self.choices.margin * loads[least] + self.choices.slack else ups[turn]

    def _load(self, hop: tuple[str, str]) -> float:
        now = self._instant()
        got, when = self.load.get(hop, (0.0, now))
        return got * math.exp(-(now - when) / self.tau)

    def _instant(self) -> float:
        """Seconds from the job's start to the instant what is being taken came."""
        return self.now - self.idle * self.dt
