"""Leaf-spine racks, and PHub's rack-scale cloud setting built on it."""

from __future__ import annotations

import networkx as nx

from innet.errors import UserError


def leaf_spine(racks: int = 2, hosts_per_rack: int = 2, spines: int = 1, bw: float = 1000.0,
               oversubscription: float = 1.0, pbox: bool = True) -> nx.Graph:
    """R racks of H hosts, each ToR linked to every spine.

    ``oversubscription`` divides each ToR's total uplink capacity: at 1.0 the
    uplinks carry as much as the rack's hosts can send, at 4.0 a quarter of it.
    The PBox (when asked for) hangs off the first spine, outside every rack.
    """
    if racks < 1 or hosts_per_rack < 1 or spines < 1:
        raise UserError("leaf-spine needs racks, hosts-per-rack and spines of at least 1")
    if oversubscription <= 0:
        raise UserError("oversubscription must be positive")
    graph = nx.Graph(name=f"leaf-spine-{racks}x{hosts_per_rack}-s{spines}")
    uplink = bw * hosts_per_rack / spines / oversubscription
    for s in range(1, spines + 1):
        graph.add_node(f"s{s}", role="spine")
    host = 0
    for r in range(1, racks + 1):
        graph.add_node(f"t{r}", role="tor", rack=r)
        for s in range(1, spines + 1):
            graph.add_edge(f"t{r}", f"s{s}", bw=uplink)
        for _ in range(hosts_per_rack):
            host += 1
            graph.add_node(f"h{host}", role="host", rack=r)
            graph.add_edge(f"h{host}", f"t{r}", bw=bw)
    if pbox:
        graph.add_node("p1", role="pbox")
        graph.add_edge("p1", "s1", bw=bw)
    return graph


def phub_rack(racks: int = 2, hosts_per_rack: int = 4, bw: float = 1000.0,
              oversubscription: float = 4.0, rack_servers: str = "") -> nx.Graph:
    """PHub's cloud setting: worker racks behind ToRs, an oversubscribed core.

    PHub puts the PBox in its own rack, on a ToR of its own with a full-rate
    link, so only the core is oversubscribed: the ``tp`` ToR holds the PBox.
    ``rack_servers`` adds servers to every worker rack: ``"pbox"``, one PBox as
    balanced as the central one (``pr1``, ``pr2``, ...: a link of the rack's rate,
    for PHub's hierarchical reduction), or ``"host"``, a server per worker on an
    ordinary machine (``ps1``, ``ps2``, ...: a worker's link; a stock sharded
    parameter server, as MXNet launches as many servers as workers).
    """
    if rack_servers not in ("", "pbox", "host"):
        raise ValueError(f"rack_servers is '', 'pbox' or 'host', not {rack_servers!r}")
    graph = leaf_spine(racks, hosts_per_rack, 1, bw, oversubscription, pbox=False)
    graph.graph["name"] = f"phub-rack-{racks}x{hosts_per_rack}"
    graph.add_node("tp", role="tor", rack=0)
    graph.add_edge("tp", "s1", bw=bw * hosts_per_rack)
    graph.add_node("p1", role="pbox", rack=0)
    graph.add_edge("p1", "tp", bw=bw * hosts_per_rack)
    for r in range(1, racks + 1) if rack_servers == "pbox" else ():
        graph.add_node(f"pr{r}", role="pbox", rack=r)
        graph.add_edge(f"pr{r}", f"t{r}", bw=bw * hosts_per_rack)
    for k in range(racks * hosts_per_rack) if rack_servers == "host" else ():
        graph.add_node(f"ps{k + 1}", role="pbox", rack=k // hosts_per_rack + 1)
        graph.add_edge(f"ps{k + 1}", f"t{k // hosts_per_rack + 1}", bw=bw)
    return graph
