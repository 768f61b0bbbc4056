"""Where a PBox job's keys are summed (``--pbox-layout``), beside the central PBox of ``plan_job``:

- ``rack``: PHub's hierarchical reduction. Every rack's PBox (a PBox host on the workers' ToR) sums its
  rack's copies of a key; the central PBox sums the racks' partial sums and returns the total to each
  rack's PBox, which hands it to its workers. Cross-rack links carry one partial up and one result down per
  rack, as in-network aggregation's rack-then-root tree does.
- ``sharded``: a stock parameter server (MXNet's KVStore over ps-lite): the keys are spread by slot over
  every server on the workers' ToRs (key k to server ``k % S``, as ``--pbox-cores`` spreads them over a
  PBox's cores), every worker pushes each key to its server and gets the sum back from it.
"""

from __future__ import annotations

from dataclasses import replace

import networkx as nx

from innet.errors import UserError
from innet.graph import natural_key, pboxes
from innet.planning.planner import JobPlan
from innet.wire.packet import PAYLOAD_OFFSET

LAYOUTS = ("central", "rack", "sharded")


def _boxes(graph: nx.Graph, worker: str) -> list[str]:
    """The PBox hosts on ``worker``'s ToR."""
    tor = next(iter(graph[worker]))
    return sorted((n for n in graph[tor] if graph.nodes[n].get("role") == "pbox"), key=natural_key)


def rack_servers(graph: nx.Graph, workers: tuple[str, ...]) -> dict[str, str]:
    """The (first) PBox host on each worker's ToR (a worker whose ToR has none is left out)."""
    return {w: boxes[0] for w in workers if (boxes := _boxes(graph, w))}


def laid_out(graph: nx.Graph, plan: JobPlan, layout: str) -> JobPlan:
    """``plan`` (a PBox job's) with its keys laid out as ``layout`` says."""
    if layout == "central":
        return plan
    if layout not in LAYOUTS:
        raise ValueError(f"unknown PBox layout {layout!r}; expected one of {', '.join(LAYOUTS)}")
    at = rack_servers(graph, plan.workers)
    missing = [w for w in plan.workers if w not in at]
    if missing:
        raise UserError(f"{{pbox_layout}} {layout} needs a PBox host on every worker's ToR; {missing[0]}'s has none "
                        "(phub-rack builds them with {pbox_layout} rack or sharded)")
    if layout == "sharded":  # every server on the workers' ToRs
        ordered = tuple(sorted({b for w in plan.workers for b in _boxes(graph, w)}, key=natural_key))
        return replace(plan, layout=layout, servers=ordered, pbox=ordered[0])
    servers = tuple(at[w] for w in plan.workers)  # rack: each worker's rack PBox, rank by rank
    central = [p for p in pboxes(graph) if p not in servers]
    if not central:
        raise UserError("{pbox_layout} rack sums the racks' sums at a central PBox: the topology has none apart "
                        "from the racks' (role 'pbox', on no worker's ToR)")
    return replace(plan, layout=layout, servers=servers, pbox=central[0])


def server_of(plan: JobPlan, worker: str) -> str:
    """The PBox ``worker`` sends to and hears from (for a sharded plan: its first server; every key has its own)."""
    if plan.layout == "rack":
        return plan.servers[plan.workers.index(worker)]
    if plan.layout == "sharded":
        return plan.servers[0]
    assert plan.pbox is not None
    return plan.pbox


def sharded_reorder(graph: nx.Graph, plan: JobPlan, elements: int) -> float:
    """Seconds a sharded plan's results may come back out of order by design: each server answers at its own
    pace, so a result may trail one sent after it by as much as a window of every worker's keys takes through
    the slowest server's link (a worker's loss detection must not take that for a loss)."""
    if plan.layout != "sharded":
        return 0.0
    bits = 8 * (PAYLOAD_OFFSET + 4 * elements) * plan.slots * len(plan.workers)
    slowest = min(float(graph.edges[s, next(iter(graph[s]))]["bw"]) for s in plan.servers) * 1e6
    return bits / slowest
