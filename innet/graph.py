"""Conventions for topology graphs: roles, node indices, ports, tiers.

A topology is an undirected networkx graph. Node attribute ``role`` is one of
ROLES; edge attributes ``bw`` (Mbit/s) and ``latency`` (seconds) describe links.
Node indices (which give addresses) follow sorted node names; a node's ports
are numbered in sorted order of its neighbours, and port ``i`` of node ``n`` is
the interface ``n-eth<i>`` inside Mininet.
"""

from __future__ import annotations

import weakref
from functools import lru_cache

import networkx as nx

from innet.errors import UserError

HOST_ROLES = ("host", "pbox")
SWITCH_ROLES = ("tor", "agg", "spine", "core", "switch")
ROLES = HOST_ROLES + SWITCH_ROLES
TIER_ORDER = {"host": 0, "pbox": 0, "tor": 1, "switch": 1, "agg": 2, "spine": 3, "core": 4}
DEFAULT_BW = 1000.0
DEFAULT_LATENCY = 2e-6


def role(graph: nx.Graph, node: str) -> str:
    return str(graph.nodes[node]["role"])


def is_switch(graph: nx.Graph, node: str) -> bool:
    return role(graph, node) in SWITCH_ROLES


def hosts(graph: nx.Graph) -> list[str]:
    """Worker-capable hosts (role ``host``), in natural name order."""
    return sorted((n for n in graph if role(graph, n) == "host"), key=natural_key)


def pboxes(graph: nx.Graph) -> list[str]:
    return sorted((n for n in graph if role(graph, n) == "pbox"), key=natural_key)


def switches(graph: nx.Graph) -> list[str]:
    return sorted((n for n in graph if is_switch(graph, n)), key=natural_key)


@lru_cache(maxsize=1 << 16)
def natural_key(name: str) -> tuple[str, int, str]:
    """Sort h2 before h10."""
    stem = name.rstrip("0123456789")
    digits = name[len(stem):]
    return (stem, int(digits) if digits else -1, name)


def node_indices(graph: nx.Graph) -> dict[str, int]:
    return {n: i for i, n in enumerate(sorted(graph, key=natural_key))}


def ports(graph: nx.Graph, node: str) -> dict[int, str]:
    """Port number -> neighbour, for one node."""
    return dict(enumerate(sorted(graph[node], key=natural_key)))


def port_to(graph: nx.Graph, node: str, neighbor: str) -> int:
    return sorted(graph[node], key=natural_key).index(neighbor)


def link_name(u: str, v: str) -> str:
    """Canonical name of the link between u and v ("a--b", in name order)."""
    a, b = sorted((u, v), key=natural_key)
    return f"{a}--{b}"


def tier(graph: nx.Graph, u: str, v: str) -> str:
    """A link's tier, from its ends' roles, lower tier first: ``host-tor``, ``tor-spine``."""
    a, b = sorted((role(graph, u), role(graph, v)), key=lambda r: (TIER_ORDER[r], r))
    return f"{a}-{b}"


def validate(graph: nx.Graph, where: str = "topology") -> nx.Graph:
    """Check roles and links, fill link defaults; raise UserError naming the problem."""
    if graph.number_of_nodes() == 0:
        raise UserError(f"{where} has no nodes")
    if graph.is_directed() or graph.is_multigraph():
        graph = nx.Graph(graph)
    for node, data in graph.nodes(data=True):
        if data.get("role") not in ROLES:
            raise UserError(f"{where}: node {node!r} has role {data.get('role')!r}; expected one of {', '.join(ROLES)}")
        if len(str(node)) > 10 or not str(node).replace("_", "").isalnum():
            raise UserError(f"{where}: node name {node!r} must be alphanumeric and at most 10 characters")
        if data["role"] in HOST_ROLES and graph.degree(node) != 1:
            raise UserError(f"{where}: host {node!r} must have exactly one link, it has {graph.degree(node)}")
    for u, v, data in graph.edges(data=True):
        if u == v:
            raise UserError(f"{where}: node {u!r} has a link to itself")
        try:
            data["bw"] = float(data.get("bw", DEFAULT_BW))
            data["latency"] = float(data.get("latency", DEFAULT_LATENCY))
        except (TypeError, ValueError):
            raise UserError(f"{where}: link {link_name(u, v)} has a non-numeric bw or latency") from None
        if not data["bw"] > 0 or data["latency"] < 0:
            raise UserError(f"{where}: link {link_name(u, v)} needs bw > 0 and latency >= 0")
    sw = [n for n in graph if is_switch(graph, n)]
    if not sw:
        raise UserError(f"{where} has no switch")
    if not nx.is_connected(graph):
        raise UserError(f"{where} is not connected")
    return graph


def bfs_parents(graph: nx.Graph, root: str) -> dict[str, str]:
    """Shortest-path tree from ``root`` (node -> its parent towards root), ties broken by name.

    Hosts never relay: only ``root`` itself and switches are expanded.
    """
    parents: dict[str, str] = {}
    seen, frontier = {root}, [root]
    while frontier:
        nxt = []
        for u in frontier:
            if u != root and not is_switch(graph, u):
                continue
            for w in sorted(graph[u], key=natural_key):
                if w not in seen:
                    seen.add(w)
                    parents[w] = u
                    nxt.append(w)
        frontier = nxt
    return parents


_ROUTES: weakref.WeakKeyDictionary[nx.Graph, tuple[int, dict[str, dict[str, str]]]] = weakref.WeakKeyDictionary()


def routes(graph: nx.Graph, node: str) -> dict[str, str]:
    """Destination node -> next hop from ``node``, by shortest paths through switches (see bfs_parents).
    Computed once per graph and node while the graph keeps its nodes (the predictor asks for every node
    of every worker's path: a 1024-host fat-tree's would be minutes otherwise); not to be changed."""
    shape = len(graph)
    cached = _ROUTES.get(graph)
    if cached is None or cached[0] != shape:
        cached = _ROUTES[graph] = (shape, {})
    if node not in cached[1]:
        cached[1][node] = _routes(graph, node)
    return cached[1][node]


def _routes(graph: nx.Graph, node: str) -> dict[str, str]:
    parents = bfs_parents(graph, node)
    first: dict[str, str] = {}

    def hop(dst: str) -> str:
        if dst not in first:
            up = parents[dst]
            first[dst] = dst if up == node else hop(up)
        return first[dst]

    return {dst: hop(dst) for dst in parents}
