"""A static tree's all-reduce beside open-loop background traffic, as fluid through the links' queues.

Every link direction is a strict-priority queue with one FIFO per band, as on both backends (the fabric's
``LinkDirection``, Mininet's pfifo_fast): a band is served only while every more urgent band is empty, and within
a band bytes leave in the order they came. A link passes a frame on whole (store and forward): the far end has it
the link's latency after its last byte left. The job's bytes are fluid in whole frames: each worker first sends its
exponent's one small frame and waits for the round's answer (as the workers do), then puts its chunks into its own
link's queue as its window allows (at most ``slots`` chunks ahead of the results it has); a switch passes on a
partial as soon as all its children's parts have arrived (the lowest of their whole frames), the root sends
results down as its aggregate grows. Each background flow puts a whole frame into its first link every frame's
worth of its rate, from ``lead_s`` before the job starts, as both backends start it (innet.hosts.background.lead_s),
its first frame at the phase its host's sender gives it (``first_s``, innet.hosts.background.first_frames). So a
job whose whole tensor fits its window is queued ahead of the background its own hosts send, in the same band,
and is slowed by what is already in the network (its exponent's round most: one frame behind the background's at
every hop) and by the backlog its hosts release when its tensor has left; a job with a short window competes with
the background for each link; a job in a less urgent band gets only what the background leaves. Several jobs go
through the same queues at once, each its own class in its own band (another job's tensor queued in its hosts holds
back the background they send, as it does its own); with several calls a worker starts the next, its exponent's round
again, once it has every result of one, and the figure is the median call's (as a job's ``completion_s``).
"""

from __future__ import annotations

import heapq
import math
import statistics
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import networkx as nx

from innet.planning.planner import JobPlan
from innet.planning.prediction import path_links

JOB = -1  # the first job's class in a queue (job j's: JOB - j); background flows are 0, 1, ...
STEPS_PER_FRAME = 16  # steps a job's frame takes to serialise on its fastest link: the exponent's frame takes one a hop
MAX_STEPS = 200_000  # a run that takes longer is one the background starves (inf)


@dataclass
class _Link:
    """One link direction: bytes it serves a step, steps a frame takes to the far end once its last byte left,
    its queues (per band, FIFO segments of [class, bytes]) and what left it, in flight to the far end (due step,
    class, bytes)."""

    per_step: float
    delay: int
    queues: list[deque[list[float]]]
    flight: deque[tuple[float, int, float]] = field(default_factory=deque)

    def put(self, band: int, cls: int, amount: float) -> None:
        queue = self.queues[band]
        if queue and queue[-1][0] == cls:
            queue[-1][1] += amount
        else:
            queue.append([cls, amount])

    def serve(self, step: int) -> bool:
        """Serve a step's worth of bytes, the most urgent band first; whether the queues are empty then."""
        budget, due, flight = self.per_step, step + self.delay, self.flight
        for queue in self.queues:
            while queue:
                head = queue[0]
                if head[1] > budget:
                    head[1] -= budget
                    flight.append((due, int(head[0]), budget))
                    if head[1] > 1e-9:
                        return False
                    queue.popleft()  # a rounding's crumb
                    return not any(self.queues)
                budget -= head[1]
                flight.append((due, int(head[0]), head[1]))
                queue.popleft()
                if budget <= 0:
                    return not any(self.queues)
        return True


@dataclass
class _Frames(_Link):
    """A link direction whose far end takes only whole frames, each at the instant it would: each put is a frame of
    its own, in flight once its last byte left (no pieces: bookkeeping per frame, not per step), due at that instant
    less one step (in steps: it lands at the end of the step it falls in). A frame put into it idle is served from
    when it came (or the link came free), not from the next step's start: a small frame's hop costs no whole step,
    and who came first to a shared link goes first (``take``)."""

    start: float | None = None  # when the frame put into it idle may start, in steps
    free: float = -math.inf  # when its last frame's last byte left, in steps
    came: deque[float] = field(default_factory=deque)  # when each frame in flight was put in, in steps

    def take(self, band: int, cls: int, amount: float, came: float) -> None:
        """``put``, the frame having come at ``came`` (in steps)."""
        if not any(self.queues):
            self.start = max(came, self.free)
        self.queues[band].append([cls, amount, amount, came])

    def serve(self, step: int) -> bool:
        budget = self.per_step * (1 + step - self.start) if self.start is not None else self.per_step
        self.start = None
        for queue in self.queues:
            while queue:
                head = queue[0]
                if head[1] > budget + 1e-9:
                    head[1] -= budget
                    return False
                budget -= head[1]
                self.free = step + (self.per_step - budget) / self.per_step
                self.flight.append((self.free + self.delay - 1, int(head[0]), head[2]))
                self.came.append(head[3])
                queue.popleft()
                if budget <= 0:
                    return not any(self.queues)
        return True


def _links(graph: nx.Graph, bps: dict[tuple[str, str], float], dt: float, bands: int,
           kind: type[_Link] = _Link) -> dict[tuple[str, str], _Link]:
    """Each link direction of ``bps`` (its rate) as a queue served every step of ``dt`` seconds; what it served
    in a step reaches the far end the link's latency after that step's end."""
    return {hop: kind(rate / 8 * dt, round(graph.edges[hop].get("latency", 0.0) / dt), [deque() for _ in range(bands)])
            for hop, rate in bps.items()}


def _sources(paths: list[list[tuple[str, str]]], rates: list[float], frame: int, dt: float, lead_s: float,
             first_s: Sequence[float] | None) -> tuple[list[tuple[tuple[str, str], int, float, float]], list[float]]:
    """Each background flow as a source: its first link, its class, the bytes it puts in (a frame, or a step's
    worth of fluid where ``frame`` is 0) and its gap in steps; and the step of its first put, ``lead_s`` before the
    job, frames at ``first_s`` after that (each flow's, else spread over their gaps)."""
    each = [(path[0], i, frame or rate / 8 * dt, (frame * 8 / rate if frame else dt) / dt)
            for i, (path, rate) in enumerate(zip(paths, rates, strict=True)) if path and rate > 0]
    if not frame:
        return each, [-lead_s / dt for _ in each]
    return each, [(first_s[i] - lead_s) / dt if first_s is not None else -lead_s / dt + gap * (i * 0.618034 % 1)
                  for _, i, _, gap in each]


def tree_fluid_s(graph: nx.Graph, plan: JobPlan | Sequence[JobPlan], flows: Sequence[tuple[str, str, float]],
                 chunks: int, frame_bytes: int, band: int | Sequence[int] = 0, background_band: int = 0,
                 lead_s: float = 0.0, background_frame: int = 0, exponent_bytes: int = 0,
                 first_s: Sequence[float] | None = None, last_bytes: int = 0, calls: int = 1) -> float:
    """Seconds ``plan``'s static tree takes to all-reduce ``chunks`` frames of ``frame_bytes`` per worker (the last
    one ``last_bytes``, 0: as the others) with a window of ``plan.slots`` frames, after a round of one
    ``exponent_bytes`` frame (0: none), its frames in priority ``band``, beside open-loop background ``flows``
    (source, destination, bits per second) in ``background_band``, frames of ``background_frame`` bytes (0: a fluid
    stream) started ``lead_s`` before the job, each flow's first ``first_s`` after that (None: spread over its gap;
    see the module doc); inf where the background leaves it too little to finish. Several jobs (``plan`` and
    ``band`` one each) run together, each its own class in the queues: the slowest one's. ``calls`` of it one after
    another (a worker starts the next once it has every result of one): the median call's (the slowest job's)."""
    plans, bands = jobs_of(plan, band)
    return run_fluid(_Fluid(graph, plans, flows, chunks, frame_bytes, bands, background_band, background_frame,
                            exponent_bytes, last_bytes, calls), [rate for _, _, rate in flows], background_frame, lead_s,
                     first_s)


def jobs_of(plan: JobPlan | Sequence[JobPlan], band: int | Sequence[int]) -> tuple[list[JobPlan], list[int]]:
    """The jobs a fluid runs and each one's band (one plan: one job)."""
    plans = [plan] if isinstance(plan, JobPlan) else list(plan)
    bands = [band] * len(plans) if isinstance(band, int) else list(band)
    if len(bands) != len(plans):
        raise ValueError(f"{len(plans)} jobs want as many bands, got {len(bands)}")
    return plans, bands


def run_fluid(fluid: _Fluid, rates: list[float], background_frame: int, lead_s: float,
              first_s: Sequence[float] | None) -> float:
    """Step ``fluid`` until every worker has its results (seconds from the job's start; inf past ``MAX_STEPS``), the
    background flows of ``rates`` putting their frames in from ``lead_s`` before the job."""
    each, due = _sources(fluid.paths, rates, background_frame, fluid.dt, lead_s, first_s)
    soon = [(at, k) for k, at in enumerate(due)]  # each source's next put
    heapq.heapify(soon)
    for step in range(-round(lead_s / fluid.dt), MAX_STEPS):
        if fluid.done == len(fluid.returns):
            return fluid.figure(step)
        if soon and soon[0][0] < step + 1:
            now = []
            while soon and soon[0][0] < step + 1:
                at, k = heapq.heappop(soon)
                now.append((k, at))
                heapq.heappush(soon, (at + each[k][3], k))
            for k, at in sorted(now):  # in the flows' order, as each flow puts in its frames due this step
                fluid.source(each[k][0], each[k][1], each[k][2], step, at)
        if step >= 0 and fluid.due():
            fluid.send_job()
        fluid.serve(step)
    return float("inf")


class _Fluid:
    """``tree_fluid_s``'s links and the job's progress over them: what arrived over each of the job's links (and of
    it, whole frames, what the far end can pass on), what went into each one's queue, the background's frames
    partly come over each link, the links with bytes queued, and what lands at each step's end."""

    steps = STEPS_PER_FRAME
    link_kind: type[_Link] = _Link

    def __init__(self, graph: nx.Graph, plans: Sequence[JobPlan], flows: Sequence[tuple[str, str, float]],
                 chunks: int, frame_bytes: int, bands: Sequence[int], background_band: int, background_frame: int,
                 exponent_bytes: int, last_bytes: int = 0, calls: int = 1) -> None:
        self.head, self.frame_bytes, self.bands = float(exponent_bytes), frame_bytes, list(bands)
        self.background_band, self.background_frame = background_band, background_frame
        self.short = frame_bytes - last_bytes if last_bytes else 0  # what the last chunk's frames lack
        self.call = self.head + chunks * frame_bytes - self.short  # a call's stream, each way
        self.calls, self.data = calls, calls * self.call
        # per job, per call: its first worker's start and its last worker's end (seconds)
        self.spans = [[[0.0 if k == 0 else math.inf, -math.inf] for k in range(calls)] for _ in plans]
        self.windows = [float(plan.slots * frame_bytes) for plan in plans]
        assert all(plan.root is not None for plan in plans)
        job_links = list(dict.fromkeys(hop for plan in plans for hop in self.job_links(graph, plan)))
        self.paths = [path_links(graph, src, dst) for src, dst, _ in flows]
        used = dict.fromkeys([*job_links, *(hop for path in self.paths for hop in path)])  # in order: not the hash seed's
        bps = {hop: graph.edges[hop]["bw"] * 1e6 for hop in used}
        alone = self.data * 8 / min(bps[hop] for hop in job_links)
        self.dt = max(min(8 * frame_bytes / bps[hop] for hop in job_links) / self.steps, alone / 20_000)
        self.links = _links(graph, bps, self.dt, max(*self.bands, background_band) + 1, self.link_kind)
        self.onward = [{hop: path[k + 1] if k + 1 < len(path) else None for k, hop in enumerate(path)}
                       for path in self.paths]
        self.partial = [dict.fromkeys(path, 0.0) for path in self.paths]
        self.order = {hop: k for k, hop in enumerate(self.links)}
        self.names = list(self.links)
        self.waiting: dict[tuple[str, str], _Link] = {}
        self.landing: dict[int, set[int]] = {}  # step -> the links (by order) with something arriving at its end
        self.idle = 0.0  # steps what is put in now came before the step's start (negative: due within the step)
        self.landed_at = 0.0  # seconds: when what is being taken landed
        self.start(graph, plans)

    def job_links(self, graph: nx.Graph, plan: JobPlan) -> list[tuple[str, str]]:
        """The link directions the job's frames may take: its tree's, up and down."""
        up = list(plan.parents.items())
        return [*up, *((p, c) for c, p in up)]

    def start(self, graph: nx.Graph, plans: Sequence[JobPlan]) -> None:
        """The jobs' progress before they start: nothing sent, each worker's link about to. Job ``j``'s state is
        keyed by (j, link direction), its frames are class ``-1 - j`` in the queues."""
        # what each of a job's links sends: the lowest of the whole frames come over ``inputs`` (a worker: its window
        # past the results come back, once the exponent's round is back); it changes only when one of them does
        self.inputs: dict[tuple[int, tuple[str, str]], list[tuple[int, tuple[str, str]]]] = {}
        for j, plan in enumerate(plans):
            up = list(plan.parents.items())
            children = {p: [c for c, q in up if q == p] for p in set(plan.parents.values())}
            for a, b in self.job_links(graph, plan):
                came = ([(plan.first_hop[a], a)] if a in plan.workers and plan.parents.get(a) == b
                        else [(c, a) for c in children[a]] if plan.parents.get(a) == b or a == plan.root
                        else [(plan.parents[a], a)])
                self.inputs[j, (a, b)] = [(j, way) for way in came]
        self.needs: dict[tuple[int, tuple[str, str]], list[tuple[int, tuple[str, str]]]] = {}
        for key, ways in self.inputs.items():
            for way in ways:
                self.needs.setdefault(way, []).append(key)
        ups = [(j, (w, plan.parents[w])) for j, plan in enumerate(plans) for w in plan.workers]
        self.workers_up = set(ups)
        self.returns = {(j, (plan.first_hop[w], w)) for j, plan in enumerate(plans) for w in plan.workers}
        self.arrived = dict.fromkeys(self.inputs, 0.0)
        self.got = dict.fromkeys(self.inputs, 0.0)
        self.sent = dict.fromkeys(self.inputs, 0.0)
        self.changed = dict.fromkeys(ups)  # the jobs' links whose inputs moved since they last sent
        self.done = 0

    def ended(self, j: int, call: int, at: float) -> None:
        """A worker of job ``j`` has every result of ``call`` at ``at`` (seconds), and starts the next."""
        span = self.spans[j][call]
        span[1] = max(span[1], at)
        if call + 1 < self.calls:
            self.spans[j][call + 1][0] = min(self.spans[j][call + 1][0], at)

    def figure(self, step: int) -> float:
        """The figure once every worker has every result at ``step``: its time (one call), else the slowest job's
        median call (as a job's ``completion_s``)."""
        if self.calls == 1:
            return step * self.dt
        return max(statistics.median(end - start for start, end in spans) for spans in self.spans)

    def due(self) -> bool:
        """Whether the job has something to send (or decide) at the step's start."""
        return bool(self.changed)

    def put(self, hop: tuple[str, str], band: int, cls: int, amount: float) -> None:
        link = self.links[hop]
        link.put(band, cls, amount)
        self.waiting[hop] = link

    def send_job(self) -> None:
        """Each of the job's links whose inputs moved queues what they now let it send."""
        for key in self.changed:
            j, hop = key
            came = self.inputs[key]
            if key in self.workers_up:  # within its call: the exponent's round first, then its window
                back = self.got[came[0]]
                base = min(self.calls - 1, math.floor(back / self.call + 1e-9)) * self.call
                back -= base
                can = base + (min(self.call, back + self.windows[j]) if back >= self.head - 1e-6 else self.head)
            else:
                can = min(self.got[way] for way in came)
            more = can - self.sent[key]
            if more > 1e-9:
                self.put(hop, self.bands[j], JOB - j, more)
                self.sent[key] += more
        self.changed = {}

    def serve(self, step: int) -> None:
        """A step of every link with bytes queued; then what lands at the step's end is taken (the job's, counted;
        the background's, passed on, a whole frame at a time)."""
        for hop, link in list(self.waiting.items()):
            left = len(link.flight)
            if link.serve(step):
                del self.waiting[hop]
            if len(link.flight) > left:  # something left it this step
                self.landing.setdefault(step + link.delay, set()).add(self.order[hop])
        self.landed_at = (step + 1) * self.dt  # what lands in this step lands at its end
        for hop, due, cls, amount in self.landed(step):
            self.idle = step - due
            if cls < 0:
                self._arrive(hop, cls, amount)
            else:
                self._forward(hop, cls, amount)

    def source(self, hop: tuple[str, str], cls: int, amount: float, step: int, at: float) -> None:
        """Background flow ``cls`` puts ``amount`` into its first link ``hop``, due at ``at`` (in steps) within
        ``step``: at the step's start."""
        self.idle = step - at
        self.put(hop, self.background_band, cls, amount)

    def landed(self, step: int) -> Iterable[tuple[tuple[str, str], float, int, float]]:
        """What lands at ``step``'s end: (link, due, class, bytes), link by link, each link's in the order it left."""
        out: list[tuple[tuple[str, str], float, int, float]] = []
        for k in sorted(self.landing.pop(step, ())):
            hop = self.names[k]
            flight = self.links[hop].flight
            while flight and flight[0][0] <= step:
                due, cls, amount = flight.popleft()
                out.append((hop, due, cls, amount))
        return out

    def _arrive(self, hop: tuple[str, str], cls: int, amount: float) -> None:
        """``amount`` of job ``JOB - cls``'s bytes (one stream a job here) came over ``hop``."""
        key = (JOB - cls, hop)
        self.arrived[key] += amount
        whole = _whole(self.arrived[key], self.head, self.frame_bytes, self.call, self.calls)
        if whole != self.got[key]:
            if key in self.returns:
                self.done += self.got[key] < self.data - 1e-6 <= whole
                for k in range(self.calls):  # the calls it finished (the worker starts the next at once)
                    if self.got[key] < (k + 1) * self.call - 1e-6 <= whole:
                        self.ended(key[0], k, self.landed_at)
            self.got[key] = whole
            self.changed.update(dict.fromkeys(self.needs.get(key, ())))

    def _forward(self, hop: tuple[str, str], cls: int, amount: float) -> None:
        nxt = self.onward[cls][hop]
        if nxt is None:
            return
        if not self.background_frame:
            self.put(nxt, self.background_band, cls, amount)
            return
        self.partial[cls][hop] += amount
        if self.partial[cls][hop] >= self.background_frame - 1e-6:  # store and forward: a whole frame goes on
            self.partial[cls][hop] -= self.background_frame
            self.put(nxt, self.background_band, cls, self.background_frame)


def _whole(arrived: float, head: float, frame_bytes: int, call: float, calls: int) -> float:
    """Of ``arrived`` bytes of a job's stream of ``calls`` of ``call`` bytes each (the exponent's ``head``, then
    frames, the last one perhaps shorter), those of whole frames."""
    base = min(calls - 1, math.floor(arrived / call + 1e-9)) * call
    arrived -= base
    if arrived < head - 1e-6:
        return base
    if arrived >= call - 1e-6:
        return base + call
    return base + head + frame_bytes * math.floor((arrived - head) / frame_bytes + 1e-6)
