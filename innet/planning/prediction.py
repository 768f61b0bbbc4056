"""What each mode should put on every link, computed from the plan alone.

The planner's promise made checkable: the bytes one all-reduce moves over
each link (frames as sent: Ethernet+IPv4+UDP+innet header+values), and a
lower bound per tier that no mode can beat. Tests compare these with the
bytes measured at the interfaces.
"""

from __future__ import annotations

import math
import weakref
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from functools import lru_cache

import networkx as nx
import numpy as np

from innet.graph import link_name, link_totals, natural_key, next_hop, ports, tier
from innet.hosts.p2p.wire import message_bytes
from innet.hosts.ring.acks import ACK_EVERY, ACK_SPAN
from innet.hosts.ring.geometry import ring_geometry, ring_phases
from innet.planning.planner import JobPlan
from innet.wire.collectives import ALLREDUCE, Collective
from innet.wire.packet import PAYLOAD_OFFSET


def frame_bytes(count: int) -> int:
    return PAYLOAD_OFFSET + 4 * count


def union_density(density: float, contributors: int) -> float:
    """Top-k: the density of a sum of ``contributors`` independent k-sparse vectors of ``density``
    (an index is non-zero in the sum when it is in any of them): sums densify up the tree."""
    return 1.0 - (1.0 - density) ** contributors


@lru_cache(maxsize=4096)
def chunk_bytes(count: int, density: float = 1.0) -> float:
    """A chunk of ``count`` values' expected frame bytes when each value is non-zero with probability
    ``density``: SPARSE ``[count, i0, v0, ...]`` with x non-zero values is 1 + 2x words, sent only when
    shorter than the ``count`` dense ones (innet.wire.sparse.encode); x is binomial."""
    if density >= 1.0 or count == 0:
        return float(frame_bytes(count))
    words = 0.0
    for x in range(count + 1):
        if density <= 0.0:
            words = min(count, 1)
            break
        log_p = (math.lgamma(count + 1) - math.lgamma(x + 1) - math.lgamma(count - x + 1)
                 + x * math.log(density) + (count - x) * math.log1p(-density))
        words += math.exp(log_p) * (count if 1 + 2 * x >= count else 1 + 2 * x)
    return PAYLOAD_OFFSET + 4 * words


def stream_bytes(elements: int, per_packet: int, density: float = 1.0) -> float:
    """One worker's stream for one call: the exponent packet, then the data chunks (with top-k each in
    its shorter form, expected bytes at ``density``; exact when dense)."""
    full, rest = divmod(elements, per_packet)
    if density >= 1.0:
        return frame_bytes(0) + full * frame_bytes(per_packet) + (frame_bytes(rest) if rest else 0)
    return frame_bytes(0) + full * chunk_bytes(per_packet, density) + (chunk_bytes(rest, density) if rest else 0)


def routed_stream(elements: int, per_packet: int, dest: np.ndarray | None, ranks: set[int] | None) -> float:
    """A call's results towards the workers of ``ranks`` (None: every rank): the exponent's, then each
    data chunk's values where its ``dest`` rank is among them (or ``dest`` is None: every chunk's),
    else its header alone (innet.switch.routed)."""
    full, rest = divmod(elements, per_packet)
    if dest is None or ranks is None:
        return stream_bytes(elements, per_packet)
    counts = np.full(full + (1 if rest else 0), per_packet, np.int64)
    if rest:
        counts[-1] = rest
    counts[~np.isin(dest, sorted(ranks))] = 0
    return float(frame_bytes(0) * (1 + len(counts)) + 4 * int(counts.sum()))


def link_rate(graph: nx.Graph, u: str, v: str) -> float:
    """Link u-v's rate in bytes per second (``bw`` is Mbit/s)."""
    return float(graph.edges[u, v]["bw"]) * 1e6 / 8


def one_way(graph: nx.Graph, path: list[tuple[str, str]], size: float, hop: float,
            delay: Callable[[str, str], float], links: dict[tuple[str, str], tuple[float, float, float, float]] | None = None,
            ) -> float:
    """One frame of ``size`` bytes along ``path``: each hop's serialization, propagation, ``hop`` seconds
    of processing and ``delay(u, v)`` (``--delay``, a link's ``delay=`` fault). The hop is paid where the frame
    arrives: at every node, or where ``graph.graph["woken"]`` is set only at the nodes it names (the processes a
    frame wakes: on the eBPF switch its hosts and PBoxes, not its switches). ``links``: where to keep
    each link's (rate, latency, delay, hop paid) between calls (the timing model walks a path per worker, 8191 at k=32)."""
    links = {} if links is None else links
    woken = graph.graph.get("woken")
    total = 0.0
    for uv in path:
        cost = links.get(uv)
        if cost is None:
            cost = links[uv] = (link_rate(graph, *uv), graph.edges[uv]["latency"], delay(*uv),
                                1.0 if woken is None or uv[1] in woken else 0.0)
        total += size / cost[0] + cost[1] + hop * cost[3] + cost[2]
    return total


def path_links(graph: nx.Graph, src: str, dst: str) -> list[tuple[str, str]]:
    """The routed path from ``src`` to ``dst``, as (from, to) link directions. A host's path is its one
    link, then its switch's path, which is kept per graph (the model walks one path per worker, 8191 at k=32)."""
    if src != dst and graph.degree(src) == 1:
        first = next(iter(graph[src]))
        return [(src, first), *_switch_path(graph, first, dst)]
    return list(_switch_path(graph, src, dst))


_PATHS: weakref.WeakKeyDictionary[nx.Graph, tuple[int, dict[tuple[str, str], tuple[tuple[str, str], ...]]]] = (
    weakref.WeakKeyDictionary())


def _switch_path(graph: nx.Graph, src: str, dst: str) -> tuple[tuple[str, str], ...]:
    cached = _PATHS.get(graph)
    if cached is None or cached[0] != len(graph):  # like innet.graph.indexed: the graph keeps its nodes
        cached = _PATHS[graph] = (len(graph), {})
    known = cached[1]
    if (src, dst) not in known:
        hops, node = [], src
        while node != dst:
            nxt = next(iter(graph[node])) if graph.degree(node) == 1 else next_hop(graph, node, dst)
            hops.append((node, nxt))
            node = nxt
        known[src, dst] = tuple(hops)
    return known[src, dst]


def innet_contributions(plan: JobPlan) -> dict[str, list[int]]:
    """In-network: per tree node below the root, the contributions it sends up to its parent, each as
    the number of workers summed in it (one where it aggregates or is a worker, else its children's)."""
    return {node: [len(ranks) for ranks in sent] for node, sent in innet_contributors(plan).items()}


def innet_contributors(plan: JobPlan) -> dict[str, list[set[int]]]:
    """In-network: per tree node below the root, the contributions it sends up to its parent, each as the
    set of ranks combined in it (a worker's own; an aggregator's, the union of its children's; a relay's, theirs)."""
    rank = {w: r for r, w in enumerate(plan.workers)}
    crossing: dict[str, list[set[int]]] = {}
    aggregators = set(plan.aggregators)

    def up(node: str) -> list[set[int]]:
        below = [c for child in plan.children(node) for c in up(child)]
        sent = [{rank[node]}] if node in rank else [set().union(*below)] if node in aggregators else below
        if node in plan.parents:
            crossing[node] = sent
        return sent

    assert plan.root is not None
    up(plan.root)
    return crossing


def innet_crossings(plan: JobPlan) -> dict[str, int]:
    """In-network: per tree node below the root, how many contributions it sends up to its parent."""
    return {node: len(sent) for node, sent in innet_contributions(plan).items()}


def ranks_below(plan: JobPlan) -> dict[str, set[int]]:
    """Per tree node, the ranks of the workers at or below it."""
    rank = {w: r for r, w in enumerate(plan.workers)}
    out: dict[str, set[int]] = {}

    def below(node: str) -> set[int]:
        out[node] = ({rank[node]} if node in rank else set()).union(*(below(c) for c in plan.children(node)))
        return out[node]

    assert plan.root is not None
    below(plan.root)
    return out


def innet_direction_bytes(plan: JobPlan, elements: int, per_packet: int, density: float = 1.0,
                          dest: np.ndarray | None = None, source: np.ndarray | None = None) -> dict[tuple[str, str], float]:
    """In-network: per tree edge, up one stream per contribution crossing it, and one stream down (with
    top-k, a contribution summing m workers at the density of their union; the result at all N's; with
    ``dest``, each chunk's values only towards its rank; with ``source``, each chunk's values only up from
    the contribution holding its rank, headers from the others)."""
    down = stream_bytes(elements, per_packet, union_density(density, len(plan.workers)))
    below = ranks_below(plan) if dest is not None else {}
    out: dict[tuple[str, str], float] = {}
    for child, sent in innet_contributions(plan).items():
        out[(child, plan.parents[child])] = sum(stream_bytes(elements, per_packet, union_density(density, m)) for m in sent)
        if source is not None:
            out[(child, plan.parents[child])] = sum(routed_stream(elements, per_packet, source, ranks)
                                                    for ranks in innet_contributors(plan)[child])
        out[(plan.parents[child], child)] = down if dest is None else routed_stream(elements, per_packet, dest, below[child])
    return out


def pbox_direction_bytes(graph: nx.Graph, plan: JobPlan, elements: int, per_packet: int,
                         density: float = 1.0, dest: np.ndarray | None = None,
                         source: np.ndarray | None = None) -> dict[tuple[str, str], float]:
    """PBox: every worker's stream to the PBox and every result back (with top-k, the union of all N's
    indices; with ``dest``, each chunk's values only to its rank), on the routed paths."""
    assert plan.pbox is not None
    if plan.layout != "central":
        return laid_out_bytes(graph, plan, elements, per_packet)
    stream = stream_bytes(elements, per_packet, density)
    result = stream_bytes(elements, per_packet, union_density(density, len(plan.workers)))
    out: defaultdict[tuple[str, str], float] = defaultdict(float)
    for rank, w in enumerate(plan.workers):
        if dest is not None:
            result = routed_stream(elements, per_packet, dest, {rank})
        if source is not None:
            stream = routed_stream(elements, per_packet, source, {rank})
        for u, v in path_links(graph, w, plan.pbox):
            out[(u, v)] += stream
            out[(v, u)] += result
    return dict(out)


def laid_out_bytes(graph: nx.Graph, plan: JobPlan, elements: int, per_packet: int) -> dict[tuple[str, str], float]:
    """A dense all-reduce's bytes on each link direction with the PBox layouts of innet.schemes.layouts (one
    call, its first chunk numbered 0). ``rack``: each worker's stream to its rack's PBox and the result back,
    each rack PBox's partial sums to the central PBox and the totals back. ``sharded``: chunk c (the
    exponent's first) of every worker to server ``c % slots % S`` and its result back."""
    out: defaultdict[tuple[str, str], float] = defaultdict(float)
    if plan.layout == "rack":
        assert plan.pbox is not None
        stream = stream_bytes(elements, per_packet)
        legs = [*zip(plan.workers, plan.servers, strict=True), *((b, plan.pbox) for b in dict.fromkeys(plan.servers))]
        for a, b in legs:
            for u, v in path_links(graph, a, b):
                out[(u, v)] += stream
                out[(v, u)] += stream
        return dict(out)
    full, rest = divmod(elements, per_packet)
    sizes = [frame_bytes(0)] + [frame_bytes(per_packet)] * full + ([frame_bytes(rest)] if rest else [])
    share = [0.0] * len(plan.servers)
    for c, size in enumerate(sizes):
        share[c % plan.slots % len(plan.servers)] += size
    for w in plan.workers:
        for server, part in zip(plan.servers, share, strict=True):
            for u, v in path_links(graph, w, server):
                out[(u, v)] += part
                out[(v, u)] += part
    return dict(out)


def ring_direction_bytes(graph: nx.Graph, workers: Sequence[str], elements: int, per_packet: int,
                         collective: str = "allreduce", root: int = 0) -> dict[tuple[str, str], int]:
    """Ring, per link direction: each rank sends N-1 exponent packets, 2(N-1) segments (N-1 for a collective of
    one half: reduce-scatter, all-gather, reduce, broadcast) and a DONE to the next, and the next sends bitmap ACKs back."""
    n = len(workers)
    if n < 2:
        return {}
    segments, pieces = ring_geometry(elements, n, per_packet, collective, root)
    reduces, gathers = ring_phases(collective)
    steps = [k for k in range(2 * (n - 1)) if (reduces if k < n - 1 else gathers)]
    ack = frame_bytes(1 + ACK_SPAN // 32)
    out: Counter[tuple[str, str]] = Counter()
    for r in range(n):
        src, dst = workers[r], workers[(r + 1) % n]
        sent = n * frame_bytes(0)  # the exponent packets and the DONE
        for k in steps:
            seg = (r - k) % n if k < n - 1 else (r + 1 - (k - (n - 1))) % n
            size = segments[seg][1] - segments[seg][0]
            sent += sum(frame_bytes(max(0, min(per_packet, size - j * per_packet))) for j in range(pieces))
        acks = (n - 1) * ack + len(steps) * (-(-pieces // ACK_EVERY)) * ack
        for u, v in path_links(graph, src, dst):
            out[(u, v)] += sent
            out[(v, u)] += acks
    return dict(out)


def exchange_direction_bytes(graph: nx.Graph, messages: Sequence[tuple[str, str, int]],
                             per_packet: int) -> dict[tuple[str, str], int]:
    """Point-to-point messages (innet.hosts.p2p: torch's send/recv, all-to-all, gather, scatter), each (sender's
    host, receiver's host, bytes): per link direction (from, to), its frames along the routed path and its ACKs
    back."""
    out: Counter[tuple[str, str]] = Counter()
    for src, dst, nbytes in messages:
        data, acks = message_bytes(nbytes, per_packet)
        for u, v in path_links(graph, src, dst):
            out[(u, v)] += data
            out[(v, u)] += acks
    return dict(out)


def exchange_link_bytes(graph: nx.Graph, messages: Sequence[tuple[str, str, int]], per_packet: int) -> dict[str, int]:
    """``exchange_direction_bytes`` per link, both directions together."""
    return link_totals(exchange_direction_bytes(graph, messages, per_packet))


def tier_lower_bounds(graph: nx.Graph, workers: Sequence[str], elements: int, per_packet: int) -> dict[str, int]:
    """Bytes every all-reduce must move across each tier.

    Removing a tier's links splits the graph into parts. An all-reduce joins the T parts holding
    workers by a tree of the tier's links, and each of its links carries at least one copy of
    the data up and one of the result down. Such a tree has at least T - 1 links, and at least T
    when no tier link joins two of those parts directly (it must pass a part without workers: a
    spine, a core). Exact on every built-in topology.
    """
    from scipy.sparse import csr_matrix  # the parts of an 8,000-host graph without copying it per tier
    from scipy.sparse.csgraph import connected_components

    stream = stream_bytes(elements, per_packet)
    index = {n: i for i, n in enumerate(graph)}
    tiers = {(u, v): tier(graph, u, v) for u, v in graph.edges}
    edges = [(index[u], index[v], t) for (u, v), t in tiers.items()]
    bounds: dict[str, int] = {}
    for t in sorted({e[2] for e in edges}):
        kept = np.array([(a, b) for a, b, tt in edges if tt != t], np.int64).reshape(-1, 2)
        adjacency = csr_matrix((np.ones(len(kept)), (kept[:, 0], kept[:, 1])), shape=(len(index), len(index)))
        labels = connected_components(adjacency, directed=False)[1]
        part = {n: int(labels[i]) for n, i in index.items()}
        cut = [uv for uv, tt in tiers.items() if tt == t]
        holding = {part[w] for w in workers}
        joined = nx.Graph()
        joined.add_nodes_from(holding)
        joined.add_edges_from((part[u], part[v]) for u, v in cut if part[u] in holding and part[v] in holding)
        links = 0 if len(holding) < 2 else len(holding) - 1 if nx.is_connected(joined) else len(holding)
        bounds[t] = int(2 * stream * links)
    return bounds


def direction_bytes(graph: nx.Graph, mode: str, plan: JobPlan, elements: int, per_packet: int,
                    density: float = 1.0, collective: Collective = ALLREDUCE, root: int = 0) -> dict[tuple[str, str], float]:
    """Bytes one call of ``mode`` puts on each link direction (``density``: top-k's fraction; the ring sends dense;
    ``collective``: which ranks each chunk's result goes to)."""
    if mode == "ring":
        return dict(ring_direction_bytes(graph, plan.workers, elements, per_packet, collective.name, root))
    chunks, n = -(-elements // per_packet), len(plan.workers)
    dest, source = collective.dest(chunks, n, root), collective.source(chunks, n, root)
    if plan.method == "pbox":
        return pbox_direction_bytes(graph, plan, elements, per_packet, density, dest, source)
    if plan.method == "dynamic" and density >= 1.0 and collective is ALLREDUCE:
        return dynamic_direction_bytes(graph, plan, elements, per_packet)
    return innet_direction_bytes(plan, elements, per_packet, density, dest, source)


def dynamic_direction_bytes(graph: nx.Graph, plan: JobPlan, elements: int, per_packet: int) -> dict[tuple[str, str], float]:
    """``--placement dynamic`` (switch_programs/dynamic_tree.py), nothing congested: chunk by chunk (the exponent's
    first, numbered 0), every worker's frame to its switch and one partial (the chunk's values and the ranks' bitmap)
    from every switch it reaches, up the uplink the rotation names (``JobPort.stride``) while the root is not below,
    else down the routed way; the result from the root down every branch to a worker and up the rotation's uplink,
    each switch passing it down its other branches (and up again, where it came from below)."""
    assert plan.root is not None
    nb = {s: ports(graph, s) for s in plan.switch_ports}
    port_of = {s: {n: p for p, n in m.items()} for s, m in nb.items()}
    sizes = [frame_bytes(0), *(frame_bytes(min(per_packet, elements - c)) for c in range(0, elements, per_packet))]
    bitmap = 4 * -(-len(plan.workers) // 32)
    out: defaultdict[tuple[str, str], float] = defaultdict(float)

    def turn(s: str, k: int) -> int:
        ups, stride = plan.switch_ports[s].uplinks, plan.switch_ports[s].stride
        return ups[(k // stride) % len(ups)]

    for k, size in enumerate(sizes):
        todo = []
        for w in plan.workers:
            out[(w, plan.first_hop[w])] += size
            todo.append(plan.first_hop[w])
        reached: set[str] = set()
        while todo:
            s = todo.pop()
            if s in reached or s == plan.root:
                continue
            reached.add(s)
            jp = plan.switch_ports[s]
            assert jp.parent is not None
            up = nb[s][turn(s, k) if jp.parent in jp.uplinks else jp.parent]
            out[(s, up)] += size + bitmap
            todo.append(up)
        down: list[tuple[str, str | None]] = [(plan.root, None)]
        while down:
            s, came = down.pop()
            jp = plan.switch_ports[s]
            arrived = -1 if came is None else port_of[s][came]
            hops = [p for p in jp.children if p != arrived]
            if arrived not in jp.uplinks and jp.uplinks:
                hops.append(turn(s, k))
            for p in hops:
                out[(s, nb[s][p])] += size
                if nb[s][p] in plan.switch_ports:
                    down.append((nb[s][p], s))
    return dict(out)


def predicted_link_bytes(graph: nx.Graph, mode: str, plan: JobPlan, elements: int, per_packet: int,
                         iterations: int = 1, density: float = 1.0, collective: Collective = ALLREDUCE,
                         root: int = 0) -> dict[str, int]:
    """Predicted bytes per link, both directions (every link named, zero where the job sends nothing)."""
    per_call: defaultdict[str, float] = defaultdict(float)
    for (u, v), b in direction_bytes(graph, mode, plan, elements, per_packet, density, collective, root).items():
        per_call[link_name(u, v)] += b
    names = sorted((link_name(u, v) for u, v in graph.edges), key=natural_key)
    return {name: round(per_call.get(name, 0) * iterations) for name in names}


def run_link_bytes(graph: nx.Graph, mode: str, plans: Sequence[JobPlan], per_packet: int,
                   calls: Sequence[tuple[int, Collective]], density: float = 1.0, root: int = 0) -> dict[str, int]:
    """Predicted bytes per link of a whole run: every job's plan, every call (``calls``: its elements and
    collective, ``RunSpec.calls``)."""
    out: dict[str, int] = {}
    for plan in plans:
        for (size, collective), count in Counter(calls).items():
            for name, b in predicted_link_bytes(graph, mode, plan, size, per_packet, count, density, collective, root).items():
                out[name] = out.get(name, 0) + b
    return out


def run_direction_bytes(graph: nx.Graph, mode: str, plans: Sequence[JobPlan], per_packet: int,
                        calls: Sequence[tuple[int, Collective]], density: float = 1.0,
                        root: int = 0) -> dict[tuple[str, str], int]:
    """Predicted bytes of a whole run on each link direction, (from, to): ``run_link_bytes`` one direction at a
    time (only the directions something crosses)."""
    out: Counter[tuple[str, str]] = Counter()
    for plan in plans:
        for (size, collective), count in Counter(calls).items():
            for uv, b in direction_bytes(graph, mode, plan, size, per_packet, density, collective, root).items():
                out[uv] += round(b * count)
    return dict(out)
