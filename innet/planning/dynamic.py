"""``--placement dynamic``: what every switch needs to build a job's aggregation trees on the fly (Canary).

No tree is fixed. The job has one meeting point, the root ``R``: the switch nearest all workers on the highest
tier that still leaves some switch a choice of uplinks (a fat-tree's aggregation switch, a leaf-spine's worker
ToR: a core or a spine would leave none). A partial aggregate heads for ``R`` in two phases, as up-down routing
in a Clos network does: while ``R`` is not below a switch, the switch sends it up through any of its uplinks that
lead to ``R`` (its own choice, chunk by chunk: innet's ``dynamic_tree`` program picks the least congested); once
``R`` is below, it goes down the routed path. Results go the other way: from ``R`` up through one uplink per
switch and flooded down from wherever they rise to, every worker once.

Each switch's ``JobPort`` says: ``uplinks`` (the higher switches it may send to), ``stride`` (so that
switches of every tier rotate through their uplinks in step when nothing is congested, and a chunk's
partials meet), ``parent`` (the routed port towards ``R``: retransmissions take it), ``children`` (the
ports below that lead to workers: results flood down them) and ``contributors``: every rank whose
contributions may pass through it (its cone), mapped to the rank's host port when the worker hangs
off this switch (-1 otherwise). A switch whose cone it has heard in full sends its partial on at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import networkx as nx

from innet.errors import UserError
from innet.graph import indexed, is_switch, natural_key, next_hop, ports, role
from innet.planning.planner import JobPlan, _closest_switch
from innet.planning.timing.fluid import jobs_of, tree_fluid_s
from innet.planning.timing.trees import Choices, trees_fluid_s
from innet.switch.program import JobPort

MAX_RANKS = 256  # ranks a partial's bitmap holds (switch_programs/dynamic_tree.py: 8 words)
WINDOW_FRAMES = 1.5  # a partial waits this many frames of its job's slowest link for more contributions (at least)


def partial_window(graph: nx.Graph, plan: JobPlan, frame_bytes: int) -> float:
    """Seconds, on the run's timeline, a dynamic tree's partial waits for more contributions at most: ``WINDOW_FRAMES``
    frames of ``frame_bytes`` on the slowest link between the job's nodes (a dilated graph, ``graph.graph["dilation"]``,
    gives the same figure). The workers' streams drift apart by about a frame: another flow's frame on a host's link,
    a Mininet process waiting for a core. A window much shorter than a frame splits every chunk's partial in two from
    then on (twice the bytes up; on Mininet, leaf-spine 2:1 at 10 Mbit/s beside 50% permutation, every chunk's at the
    ToR: 0.78 s, local 0.38 s). The program's own window (400 µs) is the least: a frame at 1 Gbit/s is 66 µs."""
    nodes = {*plan.workers, *plan.switch_ports}
    bw = min((d["bw"] for u, v, d in graph.edges(data=True) if u in nodes and v in nodes), default=0.0)
    if bw <= 0:
        return 0.0
    return WINDOW_FRAMES * 8 * frame_bytes / (bw * 1e6 * float(graph.graph.get("dilation", 1.0)))


def levels(graph: nx.Graph) -> dict[str, int]:
    """Hops from each node to the nearest host (hosts 0, ToRs 1, aggregation 2, core 3 in a fat-tree; a PBox
    does not count: leaf-spine hangs its PBox off a spine)."""
    ends = [n for n in graph if role(graph, n) == "host"]
    return dict(nx.multi_source_dijkstra_path_length(graph, ends, weight=None))


def plan_dynamic(graph: nx.Graph, workers: Sequence[str], job: int = 1, slots: int = 128,
                 pbox: str | None = None, method: str = "dynamic") -> JobPlan:
    """The dynamic placement of one job (see the module doc); ``UserError`` where a worker cannot reach the
    root up then down (not a Clos-like topology)."""
    workers = tuple(sorted(workers, key=natural_key))
    if len(workers) > MAX_RANKS:
        raise UserError(f"placement dynamic: a partial's bitmap holds {MAX_RANKS} ranks; this job has {len(workers)}")
    tor = {w: next(iter(graph[w])) for w in workers}
    level = levels(graph)
    up = {s: sorted((n for n in graph[s] if is_switch(graph, n) and level[n] > level[s]), key=natural_key)
          for s in graph if is_switch(graph, s)}
    ways = [w for w in (_ways(graph, workers, tor, level, up, r) for r in _roots(graph, workers, tor, level))
            if w is not None]
    if not ways:
        raise UserError(f"placement dynamic: no switch every worker reaches up then down (workers {', '.join(workers)})")
    root, up, toward, climbing, reach = next((w for w in ways if w[5]), ways[-1])[:5]
    on = sorted(set().union(*reach.values()), key=natural_key)
    widths = {level[s]: len(up[s]) for s in on if s in climbing}
    rank = {w: i for i, w in enumerate(workers)}
    index = indexed(graph).index
    answers = _answer_ports(graph, workers, tor, toward, root)
    switch_ports = {}
    for s in on:
        port_of = {n: p for p, n in ports(graph, s).items()}
        below = [n for n in graph[s] if level[n] < level[s] and _leads_to_workers(graph, n, s, level, set(workers))]
        stride = 1
        for lv in range(1, level[s]):
            stride *= max(1, widths.get(lv, 1))
        cone = {rank[w]: port_of[w] if w in port_of else -1 for w in workers if s in reach[w]}
        switch_ports[s] = JobPort(
            job=job, nworkers=len(workers), children=tuple(sorted(port_of[n] for n in below)),
            parent=None if s == root else port_of[toward[s]], aggregate=True, contributors=cone,
            rank=min(cone), rank_ports=answers.get(s, {}), slot_base=0, slots=slots,
            pbox=None if pbox is None else index[pbox], uplinks=tuple(port_of[n] for n in up[s]), stride=stride)
    parents = {w: tor[w] for w in workers} | {s: toward[s] for s in on if s != root}
    return JobPlan(job, "dynamic", workers, root, tuple(on), parents, switch_ports, tor, slots, pbox)


Ways = tuple[str, dict[str, list[str]], dict[str, str], set[str], dict[str, set[str]], bool]


def _answer_ports(graph: nx.Graph, workers: Sequence[str], tor: dict[str, str], toward: dict[str, str],
                  root: str) -> dict[str, dict[int, int]]:
    """Per switch, rank -> the port back towards that rank's worker along the way its retransmissions climb (each
    switch's ``toward`` hop, the parent port): the way the root's answer to a retransmission retraces, to that rank
    alone."""
    out: dict[str, dict[int, int]] = {}
    for r, w in enumerate(workers):
        below, s = w, tor[w]
        while True:
            out.setdefault(s, {})[r] = next(p for p, n in ports(graph, s).items() if n == below)
            if s == root:
                break
            below, s = s, toward[s]
    return out


def _roots(graph: nx.Graph, workers: Sequence[str], tor: dict[str, str], level: dict[str, int]) -> list[str]:
    """Candidate meeting points, nearest the workers first: per tier from the top down, the switch of that tier
    closest to all workers (the lowest, the worker ToRs', last)."""
    tors = sorted(set(tor.values()), key=natural_key)
    tiers = sorted({level[s] for s in graph if is_switch(graph, s) and level[s] > 1}, reverse=True)
    above = [_closest_switch(graph, sorted((s for s in graph if is_switch(graph, s) and level[s] == lv),
                                           key=natural_key), workers) for lv in tiers]
    return [*above, _closest_switch(graph, tors, workers)]


def _ways(graph: nx.Graph, workers: Sequence[str], tor: dict[str, str], level: dict[str, int],
          up: dict[str, list[str]], root: str) -> Ways | None:
    """How partials reach ``root`` up then down: each switch's uplinks that still lead there, its routed hop
    towards it, which switches climb, each worker's switches on the way, and whether any switch has a choice
    (two uplinks or more); None where a worker cannot reach ``root`` so."""
    below = {root}  # switches with the root below them (or the root): they go down the route
    for lv in sorted({level[s] for s in up if level[s] > level[root]}):
        below |= {s for s in up if level[s] == lv and any(n in below for n in graph[s] if level.get(n, 0) < lv)}
    leads = set(below)
    for lv in sorted({level[s] for s in up}, reverse=True):
        leads |= {s for s in up if level[s] == lv and s not in below and any(u in leads for u in up[s])}
    ups = {s: [u for u in up[s] if u in leads] for s in up}
    toward = {}
    for s in up:
        if s in below and s != root:
            hop = next_hop(graph, s, root)
            ok = hop in below and level[hop] < level[s]
            toward[s] = hop if ok else next(n for n in sorted(graph[s], key=natural_key) if n in below
                                           and level.get(n, 0) < level[s])
        elif s not in below and ups[s]:
            toward[s] = next_hop(graph, s, root) if next_hop(graph, s, root) in ups[s] else ups[s][0]
    climbing = {s for s in up if s not in below}
    reach: dict[str, set[str]] = {}
    for w in workers:
        seen, todo = set(), [tor[w]]
        while todo:
            s = todo.pop()
            if s in seen:
                continue
            seen.add(s)
            if s != root:
                todo += ups[s] if s in climbing else [toward[s]]
        if root not in seen or tor[w] not in leads:
            return None
        reach[w] = seen
    on = set().union(*reach.values())
    ups = {s: [n for n in u if n in on] for s, u in ups.items()}
    choice = any(len(ups[s]) > 1 for s in on if s in climbing)
    return root, ups, toward, climbing, reach, choice


def _leads_to_workers(graph: nx.Graph, node: str, above: str, level: dict[str, int], workers: set[str]) -> bool:
    """Whether going down from ``above`` through ``node`` reaches a worker."""
    if node in workers:
        return True
    if role(graph, node) in ("host", "pbox"):
        return False
    return any(_leads_to_workers(graph, n, node, level, workers) for n in graph[node] if level[n] < level[node])


def background_model_s(graph: nx.Graph, plan: JobPlan | Sequence[JobPlan], flows: Sequence[tuple[str, str, float]],
                       chunks: int, frame_bytes: int, band: int | Sequence[int] = 0, background_band: int = 0,
                       lead_s: float = 0.0, background_frame: int = 0, exponent_bytes: int = 0,
                       first_s: Sequence[float] | None = None, choices: Choices | None = None,
                       last_bytes: int = 0, calls: int = 1) -> float:
    """The timing model's completion time of ``plan``'s all-reduce beside background ``flows`` (source,
    destination, bits per second), ``chunks`` frames of ``frame_bytes`` each way per worker (the last one
    ``last_bytes``, 0: as the others) and a window of ``plan.slots`` frames, the job's frames in priority ``band``,
    the background's in ``background_band``: the fluid through the links' strict-priority queues, a static tree's
    (innet.planning.timing.fluid.tree_fluid_s) or dynamic trees' chunk by chunk as their switches, deciding by
    ``choices``, send them (innet.planning.timing.trees.trees_fluid_s). Several jobs (a plan and a band each) go
    through the same queues together, each its own classes: the slowest one's completion; ``calls`` of it one after
    another, the median call's (as a job's ``completion_s``)."""
    plans, bands = jobs_of(plan, band)
    if {p.method == "dynamic" for p in plans} == {False}:
        return tree_fluid_s(graph, plans, flows, chunks, frame_bytes, bands, background_band, lead_s, background_frame,
                            exponent_bytes, first_s, last_bytes, calls)
    if any(p.method != "dynamic" for p in plans):
        raise ValueError("the model runs static trees or dynamic trees together, not both")
    if choices is None:
        raise ValueError("dynamic trees' model needs the program's choices (innet.planning.timing.trees.Choices.of)")
    plans = [replace(p, switch_ports={s: replace(jp, window=jp.window or partial_window(graph, p, frame_bytes))
                                      for s, jp in p.switch_ports.items()}) for p in plans]
    return trees_fluid_s(graph, plans, flows, chunks, frame_bytes, choices, bands, background_band, lead_s,
                         background_frame, exponent_bytes, first_s, last_bytes, calls)
