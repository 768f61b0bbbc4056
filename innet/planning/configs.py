"""What each switch and worker is configured with, from a topology and the job plans."""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import replace

import networkx as nx
import numpy as np

from innet.errors import UserError
from innet.graph import first_hops, hosts, indexed, is_switch, node_indices, port_to, ports, role, switches
from innet.hosts.job import JobSpec
from innet.planning.planner import JobPlan
from innet.planning.prediction import path_links
from innet.planning.spec import RunSpec
from innet.switch.program import SwitchProgram
from innet.switch.runtime import DEFAULT_SWITCH_MEMORY, SwitchConfig
from innet.wire.operators import SUM
from innet.wire.packet import PAYLOAD_OFFSET


def pick_workers(graph: nx.Graph, count: int | None) -> list[str]:
    available = hosts(graph)
    if count is None:
        return available
    if count < 1:
        raise UserError(f"{{workers}} must be at least 1, got {count}")
    if count > len(available):
        raise UserError(f"{{workers}} {count} is more than the {len(available)} hosts of this topology")
    return available[:count]


def switch_configs(graph: nx.Graph, plans: Sequence[JobPlan], memory: int = DEFAULT_SWITCH_MEMORY,
                   stall_timeout: float = 0.0, bands: dict[int, int] | None = None,
                   groups: dict[str, dict[int, tuple[int, ...]]] | None = None,
                   routed: bool = True, pboxed: Sequence[JobPlan] = ()) -> dict[str, SwitchConfig]:
    """What each switch's control channel installs; jobs abort after ``stall_timeout`` s stuck (0: never),
    and their packets leave in band ``bands[job]`` (0 when not given); ``groups``: each switch's multicast
    group table; ``routed=False`` leaves the route tables empty (a plan that starts nothing needs none);
    ``pboxed``: the jobs sent to a PBox, whose results go back the way their workers' frames came (``pbox_pins``)."""
    index = node_indices(graph)
    bands = bands or {}
    pins = pbox_pins(graph, pboxed) if routed else {}
    configs = {}
    for sw in switches(graph):
        port_map = ports(graph, sw)
        by_neighbor = {n: p for p, n in port_map.items()}
        configs[sw] = SwitchConfig(
            name=sw,
            node=index[sw],
            tier=role(graph, sw),
            ports={p: f"{sw}-eth{p}" for p in port_map},
            neighbors={p: index[n] for p, n in port_map.items()},
            routes={**_route_ports(graph, sw, by_neighbor), **pins.get(sw, {})} if routed else {},
            jobs={plan.job: replace(plan.switch_ports[sw], stall_timeout=stall_timeout, priority=bands.get(plan.job, 0))
                  for plan in plans if sw in plan.switch_ports},
            memory_bytes=memory,
            groups=(groups or {}).get(sw, {}),
        )
    return configs


def pbox_pins(graph: nx.Graph, plans: Sequence[JobPlan]) -> dict[str, dict[int, int]]:
    """Per switch, the route back to each PBox job's worker (its node index -> port) along the worker's path to the
    PBox. Equal-cost paths there and back may differ (Aarnet: h1's eight hops to p1 and p1's back), and the
    switches' reverse-path check then drops a result for coming in off its source's route (``drop:spoofed_source``);
    a frame from the PBox now retraces the worker's path (still a shortest one), the path the planner's bytes take.
    Where the paths are symmetric already (every built-in topology) nothing changes."""
    index = node_indices(graph)
    pins: dict[str, dict[int, int]] = {}
    for plan, pbox in ((p, p.pbox) for p in plans if p.pbox is not None):
        for w in plan.workers:
            for u, v in path_links(graph, w, pbox):
                if is_switch(graph, v):
                    pins.setdefault(v, {})[index[w]] = port_to(graph, v, u)
    return pins


def _route_ports(graph: nx.Graph, switch: str, by_neighbor: dict[str, int]) -> dict[int, int]:
    """``routes(graph, switch)`` as the switch holds it: destination node index -> output port."""
    first = first_hops(graph, switch)
    port_of = np.full(len(first), -1, np.int64)
    port_of[[indexed(graph).index[n] for n in by_neighbor]] = list(by_neighbor.values())
    dst = np.flatnonzero(first >= 0)
    return dict(zip(dst.tolist(), port_of[first[dst]].tolist(), strict=True))


def initial_rtos(graph: nx.Graph, plan: JobPlan, elements: int, run: RunSpec) -> dict[str, float]:
    """Per worker, the RTO before a round trip is measured: the run's, else (``initial_rto`` 0, auto) four unloaded
    round trips of a full frame to the farthest node the worker's job answers from (root, PBox or a ring peer),
    never below the RTO floor (``worker_specs`` adds what reordering may hold the answer back, unless the links also
    lose: a lone header resent early costs a frame, one waited for costs the call a reordering window). RFC 6298's 1 s is
    for paths nobody knows; the plan knows this one. A host on one link reaches everything through its switch, so
    one search per switch the workers hang off serves them all, all at once and kept for the run's other plans
    (``_path_costs``; a search per worker took minutes at 8192, a dijkstra per switch 20 s)."""
    if run.initial_rto:
        return dict.fromkeys(plan.workers, run.initial_rto)
    bits, extra = 8 * (PAYLOAD_OFFSET + 4 * elements), run.faults.delay + max((f.delay for _, f in run.link_faults), default=0.0)
    index = indexed(graph).index
    vias = {w: next(iter(graph[w])) if graph.degree(w) == 1 else w for w in plan.workers}
    far = _path_costs(graph, sorted(set(vias.values()), key=index.__getitem__), bits, extra)
    peers = np.array(sorted({index[n] for n in (plan.root, plan.pbox, *plan.workers) if n in index}))
    two: dict[str, list[tuple[float, int]]] = {}  # per switch searched from: its two farthest peers
    out = {}
    for w, via in vias.items():
        if via not in two:
            d = far[via][peers]
            top = np.argsort(np.where(np.isfinite(d), -d, np.inf), kind="stable")[:2]
            two[via] = [(float(d[i]), int(peers[i])) for i in top if np.isfinite(d[i])]
        first = 0.0 if via == w else _link_cost(graph.edges[w, via], bits, extra)
        farthest = next((first + d for d, n in two[via] if n != index[w]), 0.0)  # a worker is not its own peer
        out[w] = max(run.min_rto, 8 * farthest)
    return out


def _link_cost(link: dict, bits: int, extra: float) -> float:
    """A link's unloaded round trip share for a frame of ``bits``: its latency, the run's injected --delay and
    the frame's serialisation."""
    return link.get("latency", 0.0) + extra + bits / (link.get("bw", 1000.0) * 1e6)


_COSTS: weakref.WeakKeyDictionary[nx.Graph, tuple[bytes, dict[int, np.ndarray]]] = weakref.WeakKeyDictionary()


def _path_costs(graph: nx.Graph, sources: list[str], bits: int, extra: float) -> dict[str, np.ndarray]:
    """Per source, every node's least ``_link_cost`` sum from it (by node index): searched once per graph and
    link costs (the run plans every placement and mode; their jobs hang off the same switches)."""
    ix = indexed(graph)
    weights = np.fromiter((_link_cost(graph.edges[v, ix.names[u]], bits, extra) for v in ix.names
                           for u in ix.indices[ix.indptr[ix.index[v]]:ix.indptr[ix.index[v] + 1]]), float, len(ix.indices))
    key, rows = _COSTS.get(graph, (b"", {}))
    if key != weights.tobytes():
        key, rows = weights.tobytes(), {}
        _COSTS[graph] = key, rows
    todo = [ix.index[s] for s in sources if ix.index[s] not in rows]
    if todo:
        rows.update(zip(todo, ix.distances(np.array(todo), weights), strict=True))
    return {s: rows[ix.index[s]] for s in sources}


def reorder_window(run: RunSpec) -> float:
    """How long reordering may hold a frame back on one link, when the run injects it: up to 1.5 ``reorder_delay``
    (innet.wire.faults), so order alone proves nothing for that long per link a worker's answer crosses
    (``held_links``: a worker waits that many times this before it takes a suspect for lost).
    The run knows its links as a TCP stack knows its ``tcp_reordering``; 0 without reordering. (What a switch
    program reorders by design is ``reorder_allowance``.)"""
    return max((1.5 * f.reorder_delay for f in (run.faults, *(f for _, f in run.link_faults)) if f.reorder > 0), default=0.0)


def held_links(graph: nx.Graph, plan: JobPlan) -> dict[str, int]:
    """Per worker, the links on which reordering can hold back the result it waits for, one after another: the
    root's (or the PBox's) result waits for every worker's contribution on its way up, then comes down to this
    worker. Each may add a held-back frame's wait (``reorder_window``), so a result can be that much late per link.
    (A ring rank waits one link's worth: its successor ACKs every hole at once, and the window delays every loss:
    5% loss and 5% reordering, star of 4, 34 -> 88 ms with its round trip's four links.)"""
    far = plan.pbox if plan.method == "pbox" else plan.root
    if far is None or far not in graph:
        return {}
    hops = nx.single_source_shortest_path_length(graph, far)
    up = max(hops[w] for w in plan.workers)
    return {w: up + hops[w] for w in plan.workers}


def reorder_allowance(plan: JobPlan, program: type[SwitchProgram]) -> float:
    """Seconds a job's results may come back out of order by design: the program's ``hold`` at each switch on the
    longest way from a worker to the root (dynamic trees' partials wait out a window at every switch but the root;
    a chunk's result waits for its slowest partial, whoever's)."""
    if not program.hold:
        return 0.0
    own = getattr(program, "window", 0.0)  # a dynamic tree's job may wait longer than the program's own window
    hold = program.hold + max(0.0, max((jp.window for jp in plan.switch_ports.values()), default=0.0) - own)
    return hold * max(len(plan.way_up(w)) - 2 for w in plan.workers)  # the switches below the root


def worker_specs(graph: nx.Graph, plan: JobPlan, program: type[SwitchProgram], run: RunSpec) -> dict[str, JobSpec]:
    index, per_link = node_indices(graph), reorder_window(run)
    lossy = any(f.loss > 0 for f in (run.faults, *(f for _, f in run.link_faults)))
    links = held_links(graph, plan) if per_link and run.mode != "ring" else {}
    specs, rto = {}, initial_rtos(graph, plan, program.elements, run)
    for rank, w in enumerate(plan.workers):
        held = per_link * links.get(w, 1)
        specs[w] = JobSpec(job=plan.job, rank=rank, nworkers=len(plan.workers), slots=plan.slots,
                           elements=program.elements, node=index[w], first_hop=index[plan.first_hop[w]],
                           min_rto=run.min_rto, initial_rto=rto[w] + (0.0 if lossy else held),
                           reorder_window=held, reorder_link=per_link, timeout=run.timeout, sparse=run.topk > 0, band=run.band(plan.job),
                           operator=getattr(program, "operator", SUM), collective=run.collective, root=run.root,
                           reorder=reorder_allowance(plan, program), lossy=lossy,
                           nic_bps=graph.edges[w, plan.first_hop[w]]["bw"] * 1e6)
    return specs
