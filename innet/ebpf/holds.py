"""What a host holds the frames it receives (and sends) for on a dilated run on eBPF switches, beyond its own link's
hop: the hops between switches they crossed unheld (``path_holds``; innet.backends.mininet.dataplane says where
they are held and why that is exact where it is).

In-network, up the job's tree to its root and down again; from host to host (pbox, ring), along each frame's route,
a sender holding its frames for the hops its flow crossed beyond the others' before the queues they share. Exact
where every frame into a queue crossed the same unheld hops (then every queue's input is the Python switch's,
shifted by one constant); elsewhere "" is the reason, for the run's one line."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from itertools import pairwise

import networkx as nx

from innet.graph import is_switch, node_indices
from innet.planning.planner import JobPlan
from innet.planning.spec import RunSpec
from innet.wire.faults import Hold


@dataclass(frozen=True)
class HostHold:
    """What a host's port holds beyond its own link's hop on a dilated run on eBPF switches (``path_holds``): each
    frame it receives (``into``; from the sources in ``by_source``, node indices, theirs), each frame it sends
    (``out``)."""

    into: Hold = (0.0, 0.0)
    by_source: dict[int, Hold] = field(default_factory=dict)
    out: Hold = (0.0, 0.0)


Holds = dict[str, HostHold]  # per host


def _hop(graph: nx.Graph, run: RunSpec, sender: str, receiver: str) -> Hold:
    """What the Python switch's port would hold a frame for on this hop: its latency (and --delay), and its
    serialization per byte."""
    return run.faults_on(sender, receiver).delay + graph.edges[sender, receiver]["latency"], 8 / (graph.edges[sender, receiver]["bw"] * 1e6)


def _plus(a: Hold, b: Hold) -> Hold:
    return a[0] + b[0], a[1] + b[1]


def _minus(a: Hold, b: Hold) -> Hold:
    return a[0] - b[0], a[1] - b[1]


def _same(holds: Sequence[Hold]) -> bool:
    return all(math.isclose(h[0], holds[0][0], rel_tol=1e-9, abs_tol=1e-12)
               and math.isclose(h[1], holds[0][1], rel_tol=1e-9, abs_tol=1e-15) for h in holds)


def _up(graph: nx.Graph, run: RunSpec, plan: JobPlan, node: str) -> Hold | None:
    """The hops between switches crossed unheld behind what ``node`` sends up its job's tree (None: its children's
    differ, or theirs)."""
    if not is_switch(graph, node):
        return 0.0, 0.0
    kids = []
    for child in plan.children(node):
        got = _up(graph, run, plan, child)
        if got is None:
            return None
        kids.append(_plus(got, _hop(graph, run, child, node)) if is_switch(graph, child) else got)
    if kids and not _same(kids):
        return None
    return kids[0] if kids else (0.0, 0.0)


def path_holds(graph: nx.Graph, run: RunSpec, plans: Sequence[JobPlan]) -> tuple[Holds, str]:
    """On a dilated run on eBPF switches, what each host holds the frames it receives (and sends) for beyond its
    own link's hop: the hops between switches they crossed unheld (``HostHold``). "" or why that is not exact.
    In-network, up the job's tree to its root and down again
    (``_tree_holds``); with ``--mode pbox`` or ``ring`` (or jobs placed on a PBox), along each frame's route from
    host to host (``_routed_holds``)."""
    if run.mode != "innet" or (plans and all(plan.root is None for plan in plans)):
        return _routed_holds(graph, run, plans)
    return _tree_holds(graph, run, plans)


def _tree_holds(graph: nx.Graph, run: RunSpec, plans: Sequence[JobPlan]) -> tuple[Holds, str]:
    """In-network: a worker holds its results for the hops up its job's tree and down again. Not exact where a
    switch hears its children after unequal hops (its queue up, and the result's instant, would differ from the
    Python switch's), where jobs' trees' hops differ (sharing a queue), for a job through a PBox."""
    holds: Holds = {}
    roots: list[Hold] = []
    for plan in plans:
        if plan.root is None:
            if switch_links(graph):
                return {}, (f"job {plan.job} goes through a PBox beside jobs aggregating in switches, over links "
                            "between switches, which nobody would hold")
            continue
        root = _up(graph, run, plan, plan.root)
        if root is None:
            return {}, (f"job {plan.job}'s switches hear their children after unequal hops between switches, which "
                        "the hosts cannot hold for them")
        if root != (0.0, 0.0):
            roots.append(root)
        for w in plan.workers:
            way = plan.way_up(plan.first_hop[w])
            hold = root
            for child, parent in pairwise(way):
                hold = _plus(hold, _hop(graph, run, parent, child))
            if w in holds and not _same([holds[w].into, hold]):
                return {}, f"{w} is in jobs whose trees cross different hops between switches"
            holds[w] = HostHold(hold)
    if roots and not _same(roots):
        return {}, "the jobs' trees cross different hops between switches (their frames would share queues)"
    return holds, ""


def _flows(run: RunSpec, plan: JobPlan) -> list[tuple[str, str, bool]]:
    """A routed job's flows from host to host: (source, destination, whether it carries values). A ring rank's
    frames to its successor, and its acknowledgements back (header-sized, band 0: innet.hosts.ring); a PBox job's
    worker's frames to its server(s) and their answers back."""
    if run.mode == "ring":
        ring = list(plan.workers)  # in rank order (innet.planning.configs.worker_specs)
        if len(ring) < 2:
            return []
        return [flow for a, b in zip(ring, ring[1:] + ring[:1], strict=True) for flow in ((a, b, True), (b, a, False))]
    from innet.schemes.layouts import server_of

    out = []
    for w in plan.workers:
        for server in dict.fromkeys(plan.servers if plan.layout == "sharded" else (server_of(plan, w),)):
            out += [(w, server, True), (server, w, True)]
    return out


def _route(graph: nx.Graph, run: RunSpec, src: str, dst: str) -> list[tuple[str, str]]:
    """The links a routed frame crosses: the route tables' path (a PBox's answer retraces its worker's path,
    innet.planning.configs.pbox_pins)."""
    from innet.planning.prediction import path_links

    if run.mode != "ring" and not is_switch(graph, dst) and graph.nodes[src].get("role") == "pbox":
        return [(v, u) for u, v in reversed(path_links(graph, dst, src))]
    return path_links(graph, src, dst)


def _routed_holds(graph: nx.Graph, run: RunSpec, plans: Sequence[JobPlan]) -> tuple[Holds, str]:
    """Frames from host to host: each crossed its route's hops between switches unheld. Exact where every flow of
    values into a switch's port is as early there as the others (then the port's queue is the Python switch's,
    shifted by one constant): a flow that crossed more hops before a queue it shares is held that much longer by its
    sender (``HostHold.out``: a fat-tree's workers in other pods than the PBox, two hops through the core), its
    destination holds what is left. Not exact ("" names a queue): flows of one sender, or two flows into one
    queue, that would need other holds. A ring's acknowledgements may cross other hops than the values they share
    a queue with (on a leaf-spine a rank hears its predecessor from across the spine and its successor's ACKs
    from its own rack): each is a header's serialization (2% of a jumbo frame's), held for its own route."""
    index = node_indices(graph)
    flows = [(src, dst, values) for plan in plans for src, dst, values in _flows(run, plan)]
    early: list[dict[tuple[str, str], Hold]] = []  # per flow, per switch port it leaves by: how early it is there
    whole: list[Hold] = []  # per flow: every hop between switches on its route
    for src, dst, _ in flows:
        held, ports = (0.0, 0.0), {}
        for u, v in _route(graph, run, src, dst):
            if is_switch(graph, u):
                ports[u, v] = held
                if is_switch(graph, v):
                    held = _plus(held, _hop(graph, run, u, v))
        early.append(ports)
        whole.append(held)
    queues: dict[tuple[str, str], list[int]] = {}
    for f, (_, _, values) in enumerate(flows):
        for port in early[f] if values else ():
            queues.setdefault(port, []).append(f)
    pre, why = _pre_holds(flows, early, queues)
    if why:
        return {}, why
    out: dict[str, Hold] = {}
    for f, (src, _, values) in enumerate(flows):
        if values and not _same([out.setdefault(src, pre[f]), pre[f]]):
            return {}, (f"{src}'s flows would need other holds to meet the others' as on the Python switch "
                        f"(--mode {run.mode})")
    holds: dict[str, HostHold] = {}
    for f, (src, dst, values) in enumerate(flows):
        sent = out.get(src, (0.0, 0.0))
        left = max(0.0, whole[f][0] - sent[0]), max(0.0, whole[f][1] - sent[1])
        mine = holds.setdefault(dst, HostHold())
        if values:
            holds[dst] = replace(mine, into=left)
        else:
            mine.by_source[index[src]] = left
    for host, sent in out.items():
        holds[host] = replace(holds.get(host, HostHold()), out=sent)
    for mine in holds.values():  # an acknowledgement held as the values are needs no entry of its own
        for source in [s for s, h in mine.by_source.items() if _same([h, mine.into])]:
            del mine.by_source[source]
    return holds, ""


def _pre_holds(flows: Sequence[tuple[str, str, bool]], early: Sequence[dict[tuple[str, str], Hold]],
               queues: dict[tuple[str, str], list[int]]) -> tuple[dict[int, Hold], str]:
    """Per flow of values, what its sender holds it for so that every flow into a queue is as early there as the
    others (the least such: a flow with none earlier holds nothing), or why none does."""
    pre: dict[int, Hold] = {}
    linked: dict[int, list[tuple[int, tuple[str, str]]]] = {}
    for port, fs in queues.items():
        for f in fs[1:]:
            linked.setdefault(fs[0], []).append((f, port))
            linked.setdefault(f, []).append((fs[0], port))
    for start in sorted(linked):
        if start in pre:
            continue
        pre[start], group, todo = (0.0, 0.0), [start], [start]
        while todo:
            f = todo.pop()
            for g, (u, v) in linked[f]:
                want = _plus(pre[f], _minus(early[g][u, v], early[f][u, v]))
                if g not in pre:
                    pre[g] = want
                    group.append(g)
                    todo.append(g)
                elif not _same([pre[g], want]):
                    a, b = flows[f], flows[g]
                    return {}, (f"{a[0]}->{a[1]} and {b[0]}->{b[1]} share {u}->{v}'s queue after hops between switches "
                                "that no hold at their senders evens out")
        low = min(pre[g][0] for g in group), min(pre[g][1] for g in group)
        for g in group:
            pre[g] = _minus(pre[g], low)
    return {f: pre.get(f, (0.0, 0.0)) for f in range(len(flows)) if flows[f][2]}, ""


def switch_links(graph: nx.Graph) -> int:
    return sum(1 for a, b in graph.edges if is_switch(graph, a) and is_switch(graph, b))
