"""The timing model's frame-by-frame queues: a call followed frame by frame through the links' FIFOs, where the
closed form cannot see the order frames meet in (a PBox fed over long, unequal paths; a relay passing two
ToRs' streams up one link; a collective's headers beside its values)."""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from collections.abc import Callable

import networkx as nx
import numpy as np

from innet.planning.planner import JobPlan
from innet.planning.prediction import frame_bytes, innet_crossings, link_rate, path_links, ranks_below
from innet.wire.collectives import ALLREDUCE, Collective

QUEUED_FRAMES = 20000  # a call of at most this many worker frames is followed frame by frame

Trip = Callable[[list[tuple[str, str]], float], float]  # one frame's one-way time along a path


def back(path: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """``path`` the other way."""
    return [(v, u) for u, v in reversed(path)]


def queued(graph: nx.Graph, plan: JobPlan, paths: list[list[tuple[str, str]]], elements: int, per_packet: int,
           collective: Collective, root: int, trip: Trip, closed: float, shared: bool) -> float:
    """A dense call's data phase: frame by frame where that applies (at most QUEUED_FRAMES worker frames; a PBox's
    within one window; not --placement dynamic's spread over uplinks), else ``closed``, the closed form's. The
    longer of the two, as the queues follow this job's frames only where the closed form counts the other jobs'
    bytes (``shared``), except at a PBox for a collective but all-reduce: its headers make the closed form's
    incast too long (a key waits only for its values)."""
    chunks = -(-elements // per_packet)
    sizes = [frame_bytes(min(per_packet, elements - c * per_packet)) for c in range(chunks)]
    if len(plan.workers) * chunks > QUEUED_FRAMES or (plan.method == "pbox" and (chunks > plan.slots
                                                                                 or plan.layout != "central")):
        return closed  # a PBox layout's (innet.schemes.layouts) frames meet at several boxes: the closed form
    if plan.method == "pbox":
        frames = pbox_queue(graph, paths, sizes, collective, root, trip)
        return frames if collective is not ALLREDUCE and not shared else max(closed, frames)
    if any(p.uplinks for p in plan.switch_ports.values()):
        return closed
    return max(closed, tree_queue(graph, plan, sizes, collective, root, trip))


def fifos(graph: nx.Graph, trip: Trip) -> Callable[[tuple[str, str], float, float], float]:
    """Every link a FIFO: ``serve(link, at, size)`` is when a frame of ``size`` bytes, put on ``link`` at ``at``
    (behind the frames put on it before), reaches the link's far end."""
    free: dict[tuple[str, str], float] = {}
    cost: dict[tuple[str, str], tuple[float, float]] = {}  # each link's rate and latency

    def serve(link: tuple[str, str], at: float, size: float) -> float:
        if link not in cost:
            cost[link] = (link_rate(graph, *link), trip([link], 0.0))
        free[link] = max(at, free.get(link, 0.0)) + size / cost[link][0]
        return free[link] + cost[link][1]

    return serve


def pbox_queue(graph: nx.Graph, paths: list[list[tuple[str, str]]], sizes: list[int], collective: Collective, root: int,
                trip: Trip) -> float:
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
    serve = fifos(graph, trip)
    complete = [0.0] * chunks
    while events:
        at, w, c, i = heapq.heappop(events)
        at = serve(paths[w][i], at, size(w, c, source))
        if i + 1 < len(paths[w]):
            heapq.heappush(events, (at, w, c, i + 1))
        else:
            complete[c] = max(complete[c], at)
    out = back(paths[0])[0]
    busy = 0.0
    for done, c in sorted(zip(complete, range(chunks), strict=True)):
        busy = max(done, busy) + sum(size(w, c, dest) for w in range(n)) / link_rate(graph, *out)
    last = max(range(chunks), key=complete.__getitem__)
    return busy + max(trip(back(p), size(w, last, dest)) - size(w, last, dest) / link_rate(graph, *out) for w, p in enumerate(paths))


def tree_queue(graph: nx.Graph, plan: JobPlan, sizes: list[int], collective: Collective, root: int,
                trip: Trip) -> float:
    """An in-network call's data phase, frame by frame (chunk c's values ``sizes[c]`` bytes): each worker sends a
    window of chunks in chunk order and chunk c + slots when c's result is back; every link serves frames in
    arrival order; an aggregating switch sends a chunk's partial up once every contribution below it is in, a
    relay passes each on as it comes, the root sends the result down the tree. A contribution or result carries
    values, or only the header where the collective says (innet.planning.prediction's bytes): all-gather's header
    partials then queue behind full frames in a relay's FIFO (docs/collectives.md)."""
    n, chunks, head = len(plan.workers), len(sizes), frame_bytes(0)
    source, dest = collective.source(chunks, n, root), collective.dest(chunks, n, root)
    below, rank, expected = ranks_below(plan), {w: r for r, w in enumerate(plan.workers)}, _expected(plan)
    heard: Counter[tuple[str, int]] = Counter()
    serve = fifos(graph, trip)
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
            heapq.heappush(events, (serve(path[i], at, size), next(order), path, i + 1, c, size, up, node))
            continue
        if up and node in expected:
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


def _expected(plan: JobPlan) -> dict[str, int]:
    """Per aggregating switch (the root too), the contributions a chunk's slot waits for: one per child that
    aggregates or is a worker, a relay's children's through it."""
    crossing = innet_crossings(plan)
    assert plan.root is not None
    return {v: sum([crossing[u] for u in plan.children(v)]) for v in {*plan.aggregators, plan.root}}
