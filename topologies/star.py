"""One switch, N hosts (and optionally a PBox): the SwitchML rack."""

from __future__ import annotations

import networkx as nx

from innet.errors import UserError


def star(workers: int = 4, bw: float = 1000.0, pbox: bool = True) -> nx.Graph:
    if workers < 1:
        raise UserError(f"star needs at least 1 worker, got {workers}")
    graph = nx.Graph(name=f"star-{workers}")
    graph.add_node("s1", role="tor")
    for i in range(1, workers + 1):
        graph.add_node(f"h{i}", role="host")
        graph.add_edge(f"h{i}", "s1", bw=bw)
    if pbox:
        graph.add_node("p1", role="pbox")
        graph.add_edge("p1", "s1", bw=bw)
    return graph
