"""The k-ary fat-tree (Al-Fares et al.): k pods, k^3/4 hosts, 5k^2/4 switches."""

from __future__ import annotations

import networkx as nx

from innet.errors import UserError


def fat_tree(k: int = 4, bw: float = 1000.0, pbox: bool = True) -> nx.Graph:
    """k=4: 16 hosts, 8 edge (tor) + 8 aggregation + 4 core switches.

    The PBox, when asked for, takes the place of the last host.
    """
    if k < 2 or k % 2:
        raise UserError(f"fat-tree needs an even k >= 2, got {k}")
    half = k // 2
    graph = nx.Graph(name=f"fat-tree-k{k}")
    cores = [f"c{i + 1}" for i in range(half * half)]
    for c in cores:
        graph.add_node(c, role="core")
    host = 0
    for pod in range(k):
        aggs = [f"a{pod * half + i + 1}" for i in range(half)]
        tors = [f"t{pod * half + i + 1}" for i in range(half)]
        for i, a in enumerate(aggs):
            graph.add_node(a, role="agg", pod=pod)
            for j in range(half):
                graph.add_edge(a, cores[i * half + j], bw=bw)
        for t in tors:
            graph.add_node(t, role="tor", pod=pod, rack=t)
            for a in aggs:
                graph.add_edge(t, a, bw=bw)
            for _ in range(half):
                host += 1
                graph.add_node(f"h{host}", role="host", pod=pod, rack=t)
                graph.add_edge(f"h{host}", t, bw=bw)
    if pbox:
        last = f"h{host}"
        tor = next(iter(graph[last]))
        graph.remove_node(last)
        graph.add_node("p1", role="pbox")
        graph.add_edge("p1", tor, bw=bw)
    return graph
