"""The PBox endpoints of a run on the local fabric, host by host, for every ``--pbox-layout``
(innet.schemes.layouts): the central PBox's shards; a rack PBox per rack and the central PBox over the
racks; or a stock PS's servers, key k at server ``k % S``."""

from __future__ import annotations

import networkx as nx

from innet.graph import node_indices
from innet.hosts.pbox import PBoxJob, PBoxServer, RackPBox
from innet.planning.spec import RunSpec
from innet.schemes.modes import RunPlan, pbox_servers


def pbox_endpoints(graph: nx.Graph, run: RunSpec, rp: RunPlan, cores: int) -> list[tuple[str, PBoxServer | RackPBox]]:
    """(host, endpoint) for every PBox process the run needs."""
    layout = next((p for p in rp.plans if p.method == "pbox" and p.layout != "central"), None) if run.mode != "ring" else None
    if layout is None:
        host, servers = pbox_servers(graph, run, rp, cores)
        return [(str(host), s) for s in servers]
    index = node_indices(graph)
    specs = rp.specs[layout.job]
    first = next(iter(specs.values()))
    members = {s.rank: s.node for s in specs.values()}
    job = PBoxJob(layout.job, members, first.slots, first.elements, run.timeout / 2, operator=first.operator)
    if layout.layout == "sharded":
        n = len(layout.servers)
        return [(host, PBoxServer(index[host], [job], n, core)) for core, host in enumerate(layout.servers)]
    at = dict(zip(layout.workers, layout.servers, strict=True))
    racks = {box: {s.rank: s.node for w, s in specs.items() if at[w] == box} for box in dict.fromkeys(layout.servers)}
    assert layout.pbox is not None
    up = index[layout.pbox]
    top = PBoxJob(layout.job, {min(ranks): index[box] for box, ranks in racks.items()}, first.slots, first.elements,
                  run.timeout / 2, operator=first.operator)
    out: list[tuple[str, PBoxServer | RackPBox]] = [(layout.pbox, PBoxServer(up, [top]))]
    for box, ranks in racks.items():
        rack_job = PBoxJob(layout.job, ranks, first.slots, first.elements, run.timeout / 2, operator=first.operator)
        out.append((box, RackPBox(index[box], rack_job, up, len(racks), len(members))))
    return out
