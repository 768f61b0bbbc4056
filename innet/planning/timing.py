"""An analytic timing model of every mode (Pipe-SGD's, made exact for innet's protocols).

One all-reduce call of ``e`` elements per worker takes

    T(e) = T_bw(e) + T_lat

- ``T_bw``: the busiest link direction's bytes over its rate. The bytes are
  innet.planning.prediction's exact per-mode frame counts: in-network, a worker link
  carries one stream each way; PBox, the PBox link carries N streams each way;
  ring, each neighbour link carries 2(N-1)/N of a stream (plus ACKs back).
- ``T_lat``: the round trips the protocol waits for, each hop costing one full
  frame's serialization plus ``hop`` seconds of processing. In-network and PBox:
  the exponent round trip (small frames) and the last chunk's round trip to the
  aggregation point (less the last frame's serialization on the busiest
  link, already in ``T_bw``); at a PBox, plus the N-1 frames its first key
  waits for before results can flow back. Ring: the exponent passes N-1 hops; each of the
  2(N-1) steps then takes the longer of its share of ``T_bw`` and one piece's
  trip from the predecessor (a step's first piece waits for it), summed along
  the ring's slowest chain of neighbour paths, plus the last piece's arrival.

With a workload, the calls follow the training schedule (innet.hosts.training) with
these durations: iteration time and communication wait come from the same
recurrence the emulated workers run, so model and measurement differ only by
the call times. ``hop``: 0 on the fabric (it models links, not CPUs); on
Mininet, a Python switch or host takes ~0.6 ms to pass a frame on when
several share 2 cores (``MININET_HOP``: measured with ``run_topology.py
--predict`` on star and leaf-spine at 10 Mbit/s; ``--hop-latency`` sets it).
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace

import networkx as nx
import numpy as np

from innet.hosts.ring import ACK_EVERY, WINDOW, ring_geometry, ring_phases
from innet.hosts.training import Training, iteration_stats, p3_order, run_schedule
from innet.planning.consistency import consistency_time
from innet.planning.planner import JobPlan
from innet.planning.prediction import (
    chunk_bytes,
    direction_bytes,
    frame_bytes,
    innet_crossings,
    link_rate,
    one_way,
    path_links,
    ranks_below,
)
from innet.planning.spec import LOCAL_MIN_RTO, RunSpec
from innet.wire.collectives import ALLREDUCE, Collective

MININET_HOP = 0.0006
MOST_LOST = 0.999  # a try's chance of loss the loss term reckons with, at most (all of them: the call never ends)
QUEUED_FRAMES = 20000  # a PBox call of at most this many frames is followed frame by frame (_pbox_queue)


def busiest_direction(graph: nx.Graph, loads: dict[tuple[str, str], float]) -> tuple[tuple[str, str], float]:
    """The link direction whose bytes take longest at its rate, and those seconds (the model's bottleneck)."""
    if not loads:
        return ("", ""), 0.0
    busiest = max(sorted(loads), key=lambda uv: loads[uv] / link_rate(graph, *uv))
    return busiest, loads[busiest] / link_rate(graph, *busiest)


def _hops(graph: nx.Graph, mode: str, plan: JobPlan) -> list[list[tuple[str, str]]]:
    """The paths a call's latency runs along: worker to aggregation point, or ring neighbour to neighbour."""
    if mode == "ring":
        n = len(plan.workers)
        return [path_links(graph, plan.workers[r], plan.workers[(r + 1) % n]) for r in range(n)] if n > 1 else [[]]
    target = plan.pbox if plan.method == "pbox" else plan.root
    assert target is not None
    return [path_links(graph, w, target) for w in plan.workers]


def _back(path: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(v, u) for u, v in reversed(path)]


def _ring_time(plan: JobPlan, elements: int, per_packet: int, collective: Collective, root: int, bw: float, slowest: float,
               paths: list[list[tuple[str, str]]], trip: Callable[[list[tuple[str, str]], float], float]) -> float:
    """``call_time`` of a ring: N-1 exponent hops; then each step takes its stream or one piece's hop, whichever
    is longer, along the ring's slowest chain, and the last piece still has to arrive. Broadcast and reduce are
    one pipelined chain instead: the first piece down N-1 hops, the rest behind it at the busiest link's rate."""
    n = len(plan.workers)
    if n < 2:
        return 0.0
    steps = sum(ring_phases(collective.name)) * (n - 1)

    def chain(per_rank: list[float], length: int) -> float:  # ``length`` consecutive neighbour paths
        return max(sum(per_rank[(r - i) % n] for i in range(length)) for r in range(n))

    chained = collective.name in ("broadcast", "reduce")
    # what a rank passes on in a step, in elements: the longest segment (a collective's are its shards, whole
    # packets: with fewer chunks than ranks, one rank's is a whole chunk and others' are empty)
    segment = max(b - a for a, b in ring_geometry(elements, n, per_packet, collective.name, root)[0])
    full = chunk_bytes(min(per_packet, segment))
    exponent = chain([trip(p, frame_bytes(0)) for p in paths], n - 1)
    last = max(trip(p, full) for p in paths)
    if chained:
        linked = exponent + chain([trip(p, full) for p in paths], steps) + bw - full / slowest
    else:  # each rank's steps, its predecessor's pieces gating them (_ring_steps); and the longest segment's
        # first piece passes ``steps`` hops in turn, its other pieces behind it (a shard of one chunk: its steps
        # are shorter than that piece's hop, and only that chain sets the pace)
        linked = max(_ring_steps(exponent, bw / steps, full / slowest, [trip(p, full) for p in paths], steps),
                     exponent + chain([trip(p, full) for p in paths], steps) + sum(
                         frame_bytes(min(per_packet, segment - j)) for j in range(per_packet, segment, per_packet)) / slowest)
    # a rank has at most ``window`` packets unacknowledged: with long round trips the window paces it
    window = max(WINDOW, ACK_EVERY * steps)
    sent = steps * -(-segment // per_packet)
    rtt = max(trip(p, full) + trip(_back(p), frame_bytes(0)) for p in paths)
    return max(linked, exponent + -(-sent // window) * rtt + last)


def call_time(graph: nx.Graph, mode: str, plan: JobPlan, elements: int, per_packet: int, hop: float,
              delay: Callable[[str, str], float] = lambda u, v: 0.0, density: float = 1.0,
              sharing: Sequence[JobPlan] = (), collective: Collective = ALLREDUCE, root: int = 0) -> float:
    """Predicted seconds of one all-reduce call of ``elements`` per worker. ``delay(u, v)``: the extra
    one-way delay of frames from u to v (``--delay``, a link's ``delay=`` fault); ``density``: top-k's
    fraction (frames and streams at their expected sparse sizes; the ring sends dense); ``sharing``: the
    other jobs calling at the same time (their bytes share the links); ``collective``: which ranks send and
    get each chunk's values (innet.planning.prediction), and which halves of the ring run."""
    density = 1.0 if mode == "ring" else density
    loads = direction_bytes(graph, mode, plan, elements, per_packet, density, collective, root)
    for other in sharing:
        if other is not plan:
            for uv, b in direction_bytes(graph, mode, other, elements, per_packet, density, collective, root).items():
                loads[uv] = loads.get(uv, 0.0) + b
    bw = busiest_direction(graph, loads)[1]
    slowest = min((link_rate(graph, u, v) for u, v in loads), default=1.0)
    n = len(plan.workers)
    full = chunk_bytes(min(per_packet, elements), density)

    links: dict[tuple[str, str], tuple[float, float, float]] = {}  # one_way's reading of each link, kept

    def trip(path: list[tuple[str, str]], size: float) -> float:  # one way, one frame
        return one_way(graph, path, size, hop, delay, links)

    paths = _hops(graph, mode, plan)
    if mode == "ring":
        return _ring_time(plan, elements, per_packet, collective, root, bw, slowest, paths, trip)
    # the exponent's round trip, the stream through the busiest link, the last chunk's round trip
    # (less its serialization on that link, which the stream already counts); at a PBox the first key
    # also waits for all N workers' first chunks to pass its link before any result can flow back.
    # The stream is the longer of the busiest link's bytes and the window's pace: chunk j + W goes out
    # one round trip after chunk j, so a window of W slots sends its C chunks in floor((C-1)/W) round
    # trips plus the rest of the last window.
    small = max(trip(p, frame_bytes(0)) + trip(_back(p), frame_bytes(0)) for p in paths)
    rtt = max(trip(p, full) + trip(_back(p), full) for p in paths)
    chunks = -(-elements // per_packet)
    if not chunks:  # a barrier: the exponent's round trip is the call (at a PBox, N frames in and N out)
        return small + (2 * (n - 1) * full / slowest if plan.method == "pbox" else 0.0)
    windows, rest = divmod(max(chunks - 1, 0), max(plan.slots, 1))
    stream = max(bw, windows * rtt + bw * (rest + 1) / max(chunks, 1)) if windows else bw
    incast = (n - 1) * full / slowest if plan.method == "pbox" else 0.0
    sizes = [frame_bytes(min(per_packet, elements - c * per_packet)) for c in range(chunks)]
    analytic = stream + rtt - full / slowest + incast
    if plan.method == "pbox" and density >= 1.0 and chunks <= plan.slots and n * chunks <= QUEUED_FRAMES:
        # another collective's headers make ``incast`` too long (a key waits only for its values): the queue alone,
        # unless other jobs share the links (the queue follows this job's frames only)
        alone = collective is not ALLREDUCE and not [p for p in sharing if p is not plan]
        queued = _pbox_queue(graph, paths, sizes, collective, root, trip)
        return small + (queued if alone else max(analytic, queued))
    if plan.method != "pbox" and density >= 1.0 and n * chunks <= QUEUED_FRAMES and not any(
            p.uplinks for p in plan.switch_ports.values()):  # the tree's FIFOs (not --placement dynamic's spread)
        return small + max(analytic, _tree_queue(graph, plan, sizes, collective, root, trip))
    return small + analytic


def _ring_steps(exponent: float, seg: float, frame: float, trips: list[float], steps: int) -> float:
    """When the ring's last piece arrives: every rank sends ``steps`` steps of ``seg`` seconds each (``frame`` a piece),
    ``trips[r]`` being a piece's trip from rank r to its successor. A step starts once the rank's last one is sent and
    its predecessor's first piece is in; its last piece goes once the predecessor's last is in."""
    n = len(trips)
    starts, ends = [exponent] * n, [exponent + seg - frame] * n  # ``ends``: when each step starts its last piece
    for _ in range(steps - 1):
        starts = [max(ends[r] + frame, starts[r - 1] + trips[r - 1]) for r in range(n)]
        ends = [max(starts[r] + seg - frame, ends[r - 1] + trips[r - 1]) for r in range(n)]
    return max(ends[r] + trips[r] for r in range(n))


def _pbox_queue(graph: nx.Graph, paths: list[list[tuple[str, str]]], sizes: list[int], collective: Collective, root: int,
                trip: Callable[[list[tuple[str, str]], float], float]) -> float:
    """A PBox call's data phase, frame by frame (chunk c's values ``sizes[c]`` bytes, or only its header where the
    collective says): every worker's chunks cross their paths' links, each link serving frames in arrival order
    (paths that meet share it); a key's N results leave the PBox, in turn, once its last contribution is in, and
    the last reaches the farthest worker. Over long, unequal paths the near workers' streams fill the PBox's queue
    before a far worker's first chunk joins it; with a collective's headers, a key waits only for its values."""
    n, chunks, head = len(paths), len(sizes), frame_bytes(0)
    source, dest = collective.source(chunks, n, root), collective.dest(chunks, n, root)

    def size(w: int, c: int, who: np.ndarray | None) -> int:
        return sizes[c] if who is None or int(who[c]) == w else head

    events = [(0.0, w, c, 0) for w in range(n) for c in range(chunks)]
    heapq.heapify(events)
    free: dict[tuple[str, str], float] = {}
    complete = [0.0] * chunks
    while events:
        at, w, c, i = heapq.heappop(events)
        link = paths[w][i]
        free[link] = max(at, free.get(link, 0.0)) + size(w, c, source) / link_rate(graph, *link)
        if i + 1 < len(paths[w]):
            heapq.heappush(events, (free[link] + trip([link], 0.0), w, c, i + 1))
        else:
            complete[c] = max(complete[c], free[link] + trip([link], 0.0))
    out = _back(paths[0])[0]
    busy = 0.0
    for done, c in sorted(zip(complete, range(chunks), strict=True)):
        busy = max(done, busy) + sum(size(w, c, dest) for w in range(n)) / link_rate(graph, *out)
    last = max(range(chunks), key=complete.__getitem__)
    return busy + max(trip(_back(p), size(w, last, dest)) - size(w, last, dest) / link_rate(graph, *out) for w, p in enumerate(paths))


def _tree_queue(graph: nx.Graph, plan: JobPlan, sizes: list[int], collective: Collective, root: int,
                trip: Callable[[list[tuple[str, str]], float], float]) -> float:
    """An in-network call's data phase, frame by frame (chunk c's values ``sizes[c]`` bytes): each worker sends a
    window of chunks in chunk order and chunk c + slots when c's result is back; every link serves frames in
    arrival order; an aggregating switch sends a chunk's partial up once every contribution below it is in, a
    relay passes each on as it comes, the root sends the result down the tree. A contribution or result carries
    values, or only the header where the collective says (innet.planning.prediction's bytes): all-gather's header
    partials then queue behind full frames in a relay's FIFO (docs/collectives.md)."""
    n, chunks, head = len(plan.workers), len(sizes), frame_bytes(0)
    source, dest = collective.source(chunks, n, root), collective.dest(chunks, n, root)
    below, rank = ranks_below(plan), {w: r for r, w in enumerate(plan.workers)}
    crossing = innet_crossings(plan)
    assert plan.root is not None
    aggregators = {*plan.aggregators, plan.root}
    expected = {v: sum([crossing[u] for u in plan.children(v)]) for v in aggregators}
    heard: Counter[tuple[str, int]] = Counter()
    free: dict[tuple[str, str], float] = {}
    cost: dict[tuple[str, str], tuple[float, float]] = {}  # each link's rate and latency
    events: list[tuple[float, int, tuple[tuple[str, str], ...], int, int, int, bool, str]] = []
    order = itertools.count()  # frames due at once go in the order they were sent
    end = 0.0

    def send(at: float, a: str, b: str, c: int, size: int, up: bool) -> None:
        heapq.heappush(events, (at, next(order), tuple(path_links(graph, a, b)), 0, c, size, up, b))

    def values(ranks: set[int], c: int, who: np.ndarray | None) -> int:
        return sizes[c] if who is None or int(who[c]) in ranks else head

    for w in plan.workers:
        for c in range(min(chunks, plan.slots)):
            send(0.0, w, plan.parents[w], c, values(below[w], c, source), True)
    while events:
        at, _, path, i, c, size, up, node = heapq.heappop(events)
        if i < len(path):  # on to the path's next link, behind the frames already queued on it
            link = path[i]
            if link not in cost:
                cost[link] = (link_rate(graph, *link), trip([link], 0.0))
            free[link] = max(at, free.get(link, 0.0)) + size / cost[link][0]
            heapq.heappush(events, (free[link] + cost[link][1], next(order), path, i + 1, c, size, up, node))
            continue
        if up and node in aggregators:
            heard[node, c] += 1
            if heard[node, c] < expected[node]:
                continue
            size = values(below[node], c, source)
        if up and node != plan.root:  # a partial up, or a relay passing a contribution on
            send(at, node, plan.parents[node], c, size, True)
        elif node in rank:  # a result at a worker: its slot takes the chunk a window later
            end = max(end, at)
            if c + plan.slots < chunks:
                send(at, node, plan.parents[node], c + plan.slots, values(below[node], c + plan.slots, source), True)
        else:
            for u in plan.children(node):
                send(at, node, u, c, values(below[u], c, dest), False)
    return end


def _retry_delays(fail: float, first: float, pace: float, units: int, limit: int = 24) -> np.ndarray:
    """Where the k-th retransmission of a unit lost ``k`` times answers, after its first send would have
    (k = 0..limit): each loss costs a reordering window and a round trip (``first``) plus the units still
    out at that round draining at ``pace`` (a tail probe waits for them), doubled per probe up to four times."""
    spells = [(first + units * fail ** k * pace) * 2 ** min(k - 1, 2) for k in range(1, limit + 1)]
    return np.concatenate([[0.0], np.cumsum(spells)])


def _expected_last(starts: np.ndarray, fails: list[float], first: float, pace: float) -> float:
    """E[the last unit's end]: unit i of every copy ends at ``starts[i]`` plus its retransmissions' delay, copy c
    losing each try with probability ``fails[c]`` (independently): one minus the product of the ends' CDFs,
    integrated."""
    copies = Counter(fails)  # with the same loss everywhere, every copy alike: reckoned once
    ends = {f: _retry_delays(f, first, pace, len(starts)) for f in copies}
    x = np.linspace(0.0, float(starts.max() + max(d[-1] for d in ends.values())), 8000)
    log_cdf = np.zeros_like(x)
    for f, delays in ends.items():
        cdf = np.cumsum((1 - f) * f ** np.arange(len(delays)))
        cdf[-1] = 1.0
        k = np.searchsorted(delays, x[None, :] - starts[:, None], side="right") - 1  # the tries over by x, per unit
        with np.errstate(divide="ignore"):
            log_cdf += copies[f] * np.log(np.where(k < 0, 0.0, cdf[np.clip(k, 0, None)])).sum(axis=0)
    return float(np.sum(1.0 - np.exp(log_cdf)) * (x[1] - x[0]))


def lossy_time(graph: nx.Graph, mode: str, plan: JobPlan, elements: int, per_packet: int, lossless: float,
               loss: Callable[[str, str], float], window: float) -> float:
    """The expected time of a call that takes ``lossless`` without loss, when a frame from u to v is lost with
    probability ``loss(u, v)`` (innet.hosts.recovery: RACK declares a frame lost a reordering window,
    ``window``, after a later one's answer; tail probes; every retransmission repaired from a shadow copy).

    In-network and PBox: every chunk is in flight at once (a slot each), so a loss only delays its own
    chunk: each unit of the call, chunk i over an independent leg (in-network: a link of the tree, whose one
    aggregate or result frame crosses it each way; PBox: one worker's path there and back, N frames on the
    PBox's link), ends at its lossless end, the stream stretched by the retransmissions it carries, plus a
    delay per try lost (``_retry_delays``): the expected last end is the call's. Ring: a rank forwards a
    step's pieces in order, so a hole stalls its stream for the window and a round trip: each span of the
    stream that long stalls when any of its pieces is lost, and a lost retransmission stalls it again."""
    paths = _hops(graph, mode, plan)
    lossy = [min(MOST_LOST, 1.0 - float(np.prod([1.0 - loss(u, v) for u, v in p]))) for p in paths]
    loads = direction_bytes(graph, mode, plan, elements, per_packet)
    stream = busiest_direction(graph, loads)[1]
    full, ack = frame_bytes(min(per_packet, elements)), frame_bytes(0)
    rtt = max(one_way(graph, p, full, 0.0, lambda u, v: 0.0) + one_way(graph, [(v, u) for u, v in reversed(p)], ack, 0.0,
                                                                       lambda u, v: 0.0) for p in paths)
    first = window + rtt
    if mode == "ring":
        fail = sum(lossy) / len(lossy)
        segment = -(-elements // len(plan.workers))
        pieces = sum(ring_phases("allreduce")) * (len(plan.workers) - 1) * -(-segment // per_packet)
        stretched = lossless / (1 - fail)
        span = max(1.0, first * pieces / stretched)  # pieces a stall's span of the stream holds
        again = sum(min(2 ** k, 4) * fail ** k for k in range(32))  # a stall, and its retransmission's own losses
        return stretched + pieces / span * (1 - (1 - fail) ** span) * first * again
    chunks = -(-elements // per_packet)
    if mode == "innet":  # each link of the tree, both ways
        legs = {tuple(sorted(uv)) for p in paths for uv in p}
        fails = [min(MOST_LOST, 1.0 - (1.0 - loss(u, v)) * (1.0 - loss(v, u))) for u, v in sorted(legs)]
    else:
        fails = [min(MOST_LOST, 1.0 - (1.0 - f) * (1.0 - b)) for f, b in zip(lossy, _back_losses(paths, loss), strict=True)]
    worst = max(fails)
    stretched = stream / (1 - worst)
    starts = (lossless - stream) + stretched * np.arange(1, chunks + 1) / chunks
    return max(lossless, _expected_last(starts, fails, first, stream / chunks))


def _back_losses(paths: list[list[tuple[str, str]]], loss: Callable[[str, str], float]) -> list[float]:
    return [1.0 - float(np.prod([1.0 - loss(v, u) for u, v in p])) for p in paths]


def call_times(graph: nx.Graph, run: RunSpec, plans: list[JobPlan], per_packet: int, hop: float) -> list[float]:
    """The model's time of each call of a worker (FIFO order), for the slowest job; under loss (``--loss``, a
    link's ``loss=``), an all-reduce's expected time (``lossy_time``)."""
    calls = run.calls()
    def delay(u: str, v: str) -> float:
        return run.faults_on(u, v).delay

    def loss(u: str, v: str) -> float:
        return run.faults_on(u, v).loss

    lossy = any(loss(u, v) or loss(v, u) for u, v in graph.edges)
    known: dict[tuple[int, int, Collective], float] = {}

    def time(plan: JobPlan, n: int, collective: Collective) -> float:
        if (id(plan), n, collective) not in known:
            t = call_time(graph, run.mode, plan, n, per_packet, hop, delay, run.topk or 1.0, plans, collective, run.root)
            if lossy and run.mode in ("innet", "pbox", "ring") and collective.name == "allreduce":
                t = lossy_time(graph, run.mode, plan, n, per_packet, t, loss, LOCAL_MIN_RTO if hop else run.min_rto)
            known[id(plan), n, collective] = t
        return known[id(plan), n, collective]

    slowest = max(plans, key=lambda p: time(p, *max(calls, key=lambda c: c[0])))
    return [time(slowest, n, c) for n, c in calls]


def planned_training(graph: nx.Graph, run: RunSpec, plans: list[JobPlan], per_packet: int) -> Training | None:
    """The run's training schedule; with ``--priority p3``, with P3's send order planned from the model's
    call times (every worker must send the same call at once, so they follow one plan, not their clocks)."""
    training = run.training()
    if training is None or run.priority != "p3":
        return training
    return replace(training, order=p3_order(training, call_times(graph, run, plans, per_packet, 0.0)[: training.layers]))


def predict(graph: nx.Graph, run: RunSpec, plans: list[JobPlan], per_packet: int, hop: float) -> dict[str, float]:
    """The model's figures for a run: per-call time (``completion_s``) and, with a workload,
    ``iteration_s``, ``compute_s``, ``comm_wait_s`` and ``next_forward_wait_s``. Jobs call at once, sharing links."""
    if run.consistency:  # a training loop against the PBox, not all-reduce calls
        def delay(u: str, v: str) -> float:
            return run.faults_on(u, v).delay

        return {"completion_s": max(consistency_time(graph, run, p, per_packet, hop, delay) for p in plans)}
    durations = call_times(graph, run, plans, per_packet, hop)
    out: dict[str, float] = {"completion_s": sorted(durations)[len(durations) // 2]}
    training = planned_training(graph, run, plans, per_packet)
    if training is not None:
        starts, ends = run_schedule(training, durations)
        out.update(iteration_stats(training, starts, ends))
    return out
