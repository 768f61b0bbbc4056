"""Placement planner: which switches aggregate which job, over which tree.

Like a networkx algorithm: graph in, plain frozen data out, nothing touches
the network. ``plan_job(G, workers, method=...)`` picks the root and the
aggregating switches, then builds the job's tree from shortest paths to the
root (ties broken by name), and tells every switch on it its ports.

Methods (``METHODS``):
- ``root``: one switch, the one closest to all workers, aggregates everything;
- ``tor``: every worker's ToR aggregates its rack, the root aggregates the ToRs;
- ``tree``: a Steiner tree spanning the workers, links weighted by time per byte (1/bandwidth);
  every switch on it aggregates;
- ``pbox``: no switch aggregates; workers send to the PBox host.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cached_property

import networkx as nx
import numpy as np
from networkx.algorithms.approximation import steiner_tree

from innet.errors import UserError
from innet.graph import bfs_parents, indexed, is_switch, natural_key, pboxes, ports
from innet.switch.program import JobPort


@dataclass(frozen=True)
class JobPlan:
    """One job's placement: its tree, who aggregates, and how workers reach it."""

    job: int
    method: str
    workers: tuple[str, ...]
    root: str | None
    aggregators: tuple[str, ...]
    parents: dict[str, str]
    switch_ports: dict[str, JobPort]
    first_hop: dict[str, str]
    slots: int
    pbox: str | None
    layout: str = "central"  # a PBox job's keys (innet.schemes.layouts): central, rack (hierarchy) or sharded
    servers: tuple[str, ...] = ()  # rack: each worker's rack PBox, rank by rank; sharded: the key servers (k at k % len)

    def children(self, node: str) -> list[str]:
        return self._children.get(node, [])

    def way_up(self, node: str) -> list[str]:
        """``node`` and every node above it in the tree, up to the root."""
        way = [node]
        while way[-1] != self.root and way[-1] in self.parents:
            way.append(self.parents[way[-1]])
        return way

    @cached_property
    def _children(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for c, p in self.parents.items():
            out.setdefault(p, []).append(c)
        return {p: sorted(cs, key=natural_key) for p, cs in out.items()}


def _closest_switch(graph: nx.Graph, candidates: Sequence[str], workers: Sequence[str]) -> str:
    """The candidate with the least total hop count to the workers, then the least farthest, then by name
    (unreachable: 10**9 hops). A worker is one hop past its switch, so scipy's breadth-first searches run
    between switches only, some hundred candidates at a time."""
    from scipy.sparse import csr_matrix  # scipy comes with scikit-learn; loaded here, as few runs need it
    from scipy.sparse.csgraph import shortest_path

    switch = [n for n in graph if is_switch(graph, n)]
    at = {n: i for i, n in enumerate(switch)}
    pairs = [(at[u], at[v]) for u in switch for v in graph[u] if v in at]
    edges = np.array(pairs, np.int64).reshape(-1, 2)
    adjacency = csr_matrix((np.ones(len(edges)), (edges[:, 0], edges[:, 1])), shape=(len(switch), len(switch)))
    hop_counts: dict[int, int] = {}  # a worker's switch -> how many workers hang off it
    for w in workers:
        tor = next(iter(graph[w]))
        hop_counts[at[tor]] = hop_counts.get(at[tor], 0) + 1
    tors = np.array(list(hop_counts), np.int64)
    counts = np.array(list(hop_counts.values()), np.int64)
    best: tuple[int, int, tuple[str, int, str]] | None = None
    choice = candidates[0]
    for start in range(0, len(candidates), 256):
        batch = candidates[start:start + 256]
        dist = shortest_path(adjacency, directed=False, unweighted=True, indices=[at[s] for s in batch])[:, tors]
        hops = np.where(np.isinf(dist), 10**9, dist + 1).astype(np.int64)
        for s, total, far in zip(batch, (hops * counts).sum(axis=1).tolist(), hops.max(axis=1).tolist(), strict=True):
            cost = (total, far, natural_key(s))
            if best is None or cost < best:
                best, choice = cost, s
    return choice


_last_root: list[tuple[weakref.ref[nx.Graph], tuple[object, ...], str]] = []


def _choose_root(graph: nx.Graph, workers: Sequence[str]) -> str:
    """The switch closest to ``workers``. The last answer is kept (the ``root`` and ``tor`` placements, and so
    ``--placement auto``, ask it of the same graph and workers; a k=32 fat-tree's search takes a second); a
    subgraph view is known by the graph it views, and its workers, which decide which nodes it keeps."""
    base = getattr(graph, "_graph", graph)
    key = (graph.number_of_nodes(), graph.number_of_edges(), *workers)
    if _last_root and _last_root[0][0]() is base and _last_root[0][1] == key:
        return _last_root[0][2]
    root = _closest_switch(graph, [n for n in graph if is_switch(graph, n)], workers)
    _last_root[:] = [(weakref.ref(base), key, root)]
    return root


def _method_root(graph: nx.Graph, workers: Sequence[str]) -> tuple[str, set[str], nx.Graph]:
    root = _choose_root(graph, workers)
    return root, {root}, graph


def _method_tor(graph: nx.Graph, workers: Sequence[str]) -> tuple[str, set[str], nx.Graph]:
    root = _choose_root(graph, workers)
    return root, {root} | {next(iter(graph[w])) for w in workers}, graph


def _method_tree(graph: nx.Graph, workers: Sequence[str]) -> tuple[str, set[str], nx.Graph]:
    """A worker is a leaf on its one link, so every tree spanning the workers is their links plus a tree
    spanning their switches: the Steiner search runs between those switches, over switches only (at k=32,
    512 terminals on 1280 nodes instead of 8191 on 9471)."""
    tors = sorted({next(iter(graph[w])) for w in workers}, key=natural_key)
    if len(tors) == 1:
        tree_nodes = set(tors)
    else:  # links weighted by time per byte: a slow link costs what several fast ones do
        switch = nx.Graph()
        switch.add_edges_from((u, v, {"bw": float(d.get("bw", 1.0))}) for u, v, d in graph.edges(data=True)
                              if is_switch(graph, u) and is_switch(graph, v))
        fastest = max((d["bw"] for _, _, d in switch.edges(data=True)), default=1.0)
        for _, _, d in switch.edges(data=True):
            d["cost"] = fastest / d["bw"]
        tree_nodes = set(steiner_tree(switch, tors, weight="cost", method="mehlhorn").nodes)
    sub = graph.subgraph(tree_nodes | set(workers))
    sw = [n for n in sub if is_switch(graph, n)]
    root = _closest_switch(sub, sw, workers)
    return root, set(sw), sub


METHODS: dict[str, Callable[[nx.Graph, Sequence[str]], tuple[str, set[str], nx.Graph]]] = {
    "root": _method_root,
    "tor": _method_tor,
    "tree": _method_tree,
}


def plan_job(graph: nx.Graph, workers: Sequence[str], method: str = "tor", job: int = 1,
             slots: int = 128, pbox: str | None = None) -> JobPlan:
    """Plan one job's aggregation over ``graph``.

    Examples
    --------
    >>> from innet.shipped import build
    >>> plan = plan_job(build("leaf-spine", racks=2, hosts_per_rack=2), ["h1", "h2", "h3", "h4"])
    >>> plan.root, plan.aggregators
    ('s1', ('s1', 't1', 't2'))
    """
    workers = tuple(sorted(workers, key=natural_key))
    if not workers:
        raise UserError("a job needs at least one worker")
    if pbox is None and pboxes(graph):
        pbox = pboxes(graph)[0]
    first_hop = {w: next(iter(graph[w])) for w in workers}
    if method == "pbox":
        if pbox is None:
            raise UserError("placement 'pbox' needs a PBox host in the topology (role 'pbox')")
        return JobPlan(job, method, workers, None, (), {}, {}, first_hop, slots, pbox)
    if method not in METHODS:
        raise ValueError(f"unknown placement method {method!r}; expected one of {', '.join([*METHODS, 'pbox'])}")
    # hosts that are not workers are leaves (validate: one link each) that never relay: they can stay
    root, aggregators, tree_graph = METHODS[method](graph, workers)
    parents = bfs_parents(tree_graph, root)
    missing = [w for w in workers if w not in parents]
    if missing:
        raise UserError(f"workers {', '.join(missing)} cannot reach switch {root}")
    on_tree: set[str] = set()
    for w in workers:
        node = w
        while node != root:
            node = parents[node]
            on_tree.add(node)
    rank = {w: i for i, w in enumerate(workers)}
    parents = {c: p for c, p in parents.items() if c in on_tree or c in rank}
    plan = JobPlan(job, method, workers, root, tuple(sorted(aggregators & on_tree, key=natural_key)),
                   parents, {}, first_hop, slots, pbox)
    below: dict[str, list[int]] = {}  # the ranks of the workers under each tree node

    def ranks_below(node: str) -> list[int]:
        if node not in below:
            below[node] = [rank[node]] if node in rank else [r for c in plan.children(node) for r in ranks_below(c)]
        return below[node]

    ranks_below(root)
    return replace(plan, switch_ports={s: _job_port(graph, plan, s, rank, below) for s in sorted(on_tree, key=natural_key)})


def _job_port(graph: nx.Graph, plan: JobPlan, switch: str, rank: dict[str, int], below: dict[str, list[int]]) -> JobPort:
    index = indexed(graph).index
    aggregators = set(plan.aggregators)

    def contributors(node: str, port: int) -> dict[int, int]:
        """What reaches ``switch`` through ``node``: a worker, a partial sum, or both via a relay."""
        if node in rank:
            return {rank[node]: port}
        if node in aggregators:
            return {min(below[node]): port}
        return {r: p for c in plan.children(node) for r, p in contributors(c, port).items()}

    children = plan.children(switch)
    port_of = {n: p for p, n in ports(graph, switch).items()}  # port_to's numbering, sorted once per switch
    child_ports = {c: port_of[c] for c in children}
    contrib: dict[int, int] = {}
    rank_ports: dict[int, int] = {}
    for c in children:
        contrib.update(contributors(c, child_ports[c]))
        rank_ports.update(dict.fromkeys(below[c], child_ports[c]))
    parent = plan.parents.get(switch)
    return JobPort(
        job=plan.job,
        nworkers=len(plan.workers),
        children=tuple(child_ports[c] for c in children),
        parent=None if parent is None else port_of[parent],
        aggregate=switch in aggregators,
        contributors=contrib,
        rank=min(rank_ports),
        rank_ports=rank_ports,
        slot_base=0,
        slots=plan.slots,
        pbox=None if plan.pbox is None else index[plan.pbox],
    )


@dataclass(frozen=True)
class JobRequest:
    """A job to place: its workers, and how many slots it would like on each switch."""

    job: int
    workers: tuple[str, ...]
    slots: int = 128
    pbox: str | None = None


@dataclass(frozen=True)
class Placement:
    """Several jobs placed together; ``outcomes`` says what each job got."""

    plans: tuple[JobPlan, ...]
    outcomes: dict[int, str]
    free_slots: dict[str, int]


def plan_jobs(graph: nx.Graph, requests: Sequence[JobRequest], method: str = "tor", pool_slots: int = 128,
              place: Callable[..., JobPlan] | None = None) -> Placement:
    """Place jobs one after another in the switches' shared slot pools.

    Each aggregating switch has ``pool_slots`` slots. A job gets the slots it
    asks for where every switch of its tree has them; otherwise as many as the
    fullest of its switches still has ("reduced"); where one has none left,
    (``place``: how one job is planned, ``plan_job`` by default; innet.planning.dynamic's for dynamic trees)
    its aggregation goes to the PBox instead ("fallback", ATP-style). With no
    PBox to fall back to, the request is impossible: UserError.

    Examples
    --------
    >>> from innet.shipped import build
    >>> g = build("star", workers=4)
    >>> p = plan_jobs(g, [JobRequest(1, ("h1", "h2"), 96), JobRequest(2, ("h3", "h4"), 96)], pool_slots=128)
    >>> p.outcomes
    {1: 'full: 96 slots', 2: 'reduced: 32 of 96 slots'}
    """
    free: dict[str, int] = {}
    plans: list[JobPlan] = []
    outcomes: dict[int, str] = {}
    seen_jobs: set[int] = set()
    for req in requests:
        if req.job in seen_jobs:
            raise UserError(f"job id {req.job} is used twice")
        seen_jobs.add(req.job)
        if req.slots < 1:
            raise UserError(f"job {req.job} asks for {req.slots} slots; it needs at least 1")
        plan = (place or plan_job)(graph, req.workers, method=method, job=req.job, slots=req.slots, pbox=req.pbox)
        if method == "pbox":
            plans.append(plan)
            outcomes[req.job] = f"pbox: {plan.pbox}"
            continue
        have = min(free.setdefault(s, pool_slots) for s in plan.aggregators)
        if have == 0:
            if plan.pbox is None:
                full = [s for s in plan.aggregators if free[s] == 0]
                raise UserError(f"job {req.job} does not fit: switch {full[0]} has no free slots and there is no PBox to fall back to")
            plans.append(plan_job(graph, req.workers, method="pbox", job=req.job, slots=req.slots, pbox=plan.pbox))
            outcomes[req.job] = f"fallback: switch memory full, aggregated by {plan.pbox}"
            continue
        slots = min(have, req.slots)
        ports = {s: replace(jp, slot_base=pool_slots - free[s] if jp.aggregate else 0, slots=slots)
                 for s, jp in plan.switch_ports.items()}
        for s in plan.aggregators:
            free[s] -= slots
        plans.append(replace(plan, switch_ports=ports, slots=slots))
        outcomes[req.job] = f"full: {slots} slots" if slots == req.slots else f"reduced: {slots} of {req.slots} slots"
    return Placement(tuple(plans), outcomes, free)
