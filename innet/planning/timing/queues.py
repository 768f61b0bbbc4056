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
from innet.wire.collectives import Collective

QUEUED_FRAMES = 20000  # a call of at most this many worker frames is followed frame by frame

Trip = Callable[[list[tuple[str, str]], float], float]  # one frame's one-way time along a path


def back(path: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """``path`` the other way."""
    return [(v, u) for u, v in reversed(path)]


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
