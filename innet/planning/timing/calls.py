"""One call's time without loss (the analytic model: see innet.planning.timing)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import networkx as nx

from innet.hosts.ring.acks import ACK_EVERY, WINDOW
from innet.hosts.ring.geometry import ring_geometry, ring_phases
from innet.planning.planner import JobPlan
from innet.planning.prediction import chunk_bytes, direction_bytes, frame_bytes, link_rate, one_way, path_links
from innet.planning.timing.queues import Trip, back, queued
from innet.wire.collectives import ALLREDUCE, Collective

MININET_HOP = 0.0006


def busiest_direction(graph: nx.Graph, loads: dict[tuple[str, str], float]) -> tuple[tuple[str, str], float]:
    """The link direction whose bytes take longest at its rate, and those seconds (the model's bottleneck)."""
    if not loads:
        return ("", ""), 0.0
    busiest = max(sorted(loads), key=lambda uv: loads[uv] / link_rate(graph, *uv))
    return busiest, loads[busiest] / link_rate(graph, *busiest)



def hops(graph: nx.Graph, mode: str, plan: JobPlan) -> list[list[tuple[str, str]]]:
    """The paths a call's latency runs along: worker to aggregation point, or ring neighbour to neighbour."""
    if mode == "ring":
        n = len(plan.workers)
        return [path_links(graph, plan.workers[r], plan.workers[(r + 1) % n]) for r in range(n)] if n > 1 else [[]]
    target = plan.pbox if plan.method == "pbox" else plan.root
    assert target is not None
    return [path_links(graph, w, target) for w in plan.workers]



def _ring_time(plan: JobPlan, elements: int, per_packet: int, collective: Collective, root: int, bw: float, slowest: float,
               paths: list[list[tuple[str, str]]], trip: Trip) -> float:
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
    rtt = max(trip(p, full) + trip(back(p), frame_bytes(0)) for p in paths)
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

    links: dict[tuple[str, str], tuple[float, float, float, float]] = {}  # one_way's reading of each link, kept

    def trip(path: list[tuple[str, str]], size: float) -> float:  # one way, one frame
        return one_way(graph, path, size, hop, delay, links)

    paths = hops(graph, mode, plan)
    if mode == "ring":
        return _ring_time(plan, elements, per_packet, collective, root, bw, slowest, paths, trip)
    # the exponent's round trip, the stream through the busiest link, the last chunk's round trip
    # (less its serialization on that link, which the stream already counts); at a PBox the first key
    # also waits for all N workers' first chunks to pass its link before any result can flow back.
    # The stream is the longer of the busiest link's bytes and the window's pace: chunk j + W goes out
    # one round trip after chunk j, so a window of W slots sends its C chunks in floor((C-1)/W) round
    # trips plus the rest of the last window. A dense call is also followed frame by frame (queues.queued).
    small = max(trip(p, frame_bytes(0)) + trip(back(p), frame_bytes(0)) for p in paths)
    rtt = max(trip(p, full) + trip(back(p), full) for p in paths)
    chunks = -(-elements // per_packet)
    if not chunks:  # a barrier: the exponent's round trip is the call (at a PBox, N frames in and N out)
        return small + (2 * (n - 1) * full / slowest if plan.method == "pbox" else 0.0)
    windows, rest = divmod(max(chunks - 1, 0), max(plan.slots, 1))
    stream = max(bw, windows * rtt + bw * (rest + 1) / max(chunks, 1)) if windows else bw
    incast = (n - 1) * full / slowest if plan.method == "pbox" else 0.0
    closed = stream + rtt - full / slowest + incast
    if density < 1.0:
        return small + closed
    return small + queued(graph, plan, paths, elements, per_packet, collective, root, trip, closed,
                          any(p is not plan for p in sharing))


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
