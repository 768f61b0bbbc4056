"""Conventions for topology graphs: roles, node indices, ports, tiers.

A topology is an undirected networkx graph. Node attribute ``role`` is one of
ROLES; edge attributes ``bw`` (Mbit/s) and ``latency`` (seconds) describe links.
Node indices (which give addresses) follow sorted node names; a node's ports
are numbered in sorted order of its neighbours, and port ``i`` of node ``n`` is
the interface ``n-eth<i>`` inside Mininet.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Mapping
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from innet.errors import UserError

if TYPE_CHECKING:  # networkx itself is loaded where a graph is made or checked: a node process (a switch, a
    import networkx as nx  # worker) reads graphs' routes and never loads it (~0.17 s of CPU each)

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
    return dict(indexed(graph).index)


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


def link_totals(directions: Mapping[tuple[str, str], int]) -> dict[str, int]:
    """Bytes per link name, both directions together, from bytes per direction (from, to)."""
    out: dict[str, int] = {}
    for (u, v), n in directions.items():
        out[link_name(u, v)] = out.get(link_name(u, v), 0) + n
    return out


def uplink(graph: nx.Graph, u: str, v: str) -> tuple[str, str]:
    """Link u-v's "up" direction, (from, to): from the end its tier names first to the other (host to ToR, ToR
    to spine); between ends of one role, from the first in name order (the one its link name puts first)."""
    a, b = sorted((u, v), key=lambda n: (TIER_ORDER[role(graph, n)], role(graph, n), natural_key(n)))
    return a, b


def validate(graph: nx.Graph, where: str = "topology") -> nx.Graph:
    """Check roles and links, fill link defaults; raise UserError naming the problem."""
    import networkx as nx

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
        given = {k: data.get(k, default) for k, default in (("bw", DEFAULT_BW), ("latency", DEFAULT_LATENCY))}
        try:
            if any(isinstance(x, bool) for x in given.values()):
                raise TypeError("a boolean is no rate")
            data["bw"], data["latency"] = float(given["bw"]), float(given["latency"])
        except (TypeError, ValueError):
            raise UserError(f"{where}: link {link_name(u, v)} has a non-numeric bw or latency "
                            f"({given['bw']!r}, {given['latency']!r})") from None
        if not 0 < data["bw"] < math.inf or not 0 <= data["latency"] < math.inf:
            raise UserError(f"{where}: link {link_name(u, v)} needs a finite bw > 0 and a finite latency >= 0, "
                            f"got bw {data['bw']:g}, latency {data['latency']:g}")
    sw = [n for n in graph if is_switch(graph, n)]
    if not sw:
        raise UserError(f"{where} has no switch")
    if not any(role == "host" for _, role in graph.nodes(data="role")):
        raise UserError(f"{where} has no host: a job needs worker hosts (role host)")
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


class GraphIndex:
    """A graph as arrays, for the searches a 10,000-node topology needs: nodes in natural order (their
    node indices), every node's neighbours in natural order (CSR: ``indptr``, ``indices``), which are
    switches. Built once per graph (``indexed``); the graph must not change afterwards."""

    def __init__(self, graph: nx.Graph) -> None:
        self.names = sorted(graph, key=natural_key)
        self.index = {n: i for i, n in enumerate(self.names)}
        self.switch = np.array([is_switch(graph, n) for n in self.names], bool)
        rows = [sorted(self.index[m] for m in graph[n]) for n in self.names]  # index order is natural order
        self.indptr, self.indices = _csr(rows)
        # the same between switches only: hosts never relay, so searches run over switches, then add hosts
        self.switch_indptr, self.switch_indices = _csr([[m for m in r if self.switch[m]] if self.switch[i] else []
                                                        for i, r in enumerate(rows)])
        self.hosts = np.flatnonzero(~self.switch)
        self.host_link = np.array([rows[h][0] if len(rows[h]) == 1 else -1 for h in self.hosts], np.int64)

    def first_hops(self, src: int) -> np.ndarray:
        """``bfs_parents`` from ``src``, level by level in numpy: per node index, the first hop towards it
        (-1: ``src`` itself, or unreachable). A node's parent is the first node of the level before to list
        it, as in the queue of a breadth-first search visiting neighbours in name order. Switches are
        searched first; a host with one link is reached through its switch (a host never relays)."""
        if not self.switch[src] or (self.host_link < 0).any():
            return self._first_hops(src, self.indptr, self.indices, relay=self.switch)
        first = self._first_hops(src, self.switch_indptr, self.switch_indices, relay=None)
        tor = self.host_link
        first[self.hosts] = np.where(tor == src, self.hosts, first[tor])
        return first

    def distances(self, sources: np.ndarray, weights: np.ndarray) -> np.ndarray:
        """Per source node index (a row), every node's least path cost from it (inf: unreachable), where the
        link ``indices[i]`` -> row node costs ``weights[i]`` (CSR order) and every node relays, as networkx's
        dijkstra on the same graph. Bellman-Ford, all sources at once in numpy; from switches, over switches
        only, then to each host with one link from its switch (a k=32 fat-tree's 512 ToRs in about a second;
        a dijkstra from each took ~20 s)."""
        if not self.switch[sources].all() or (self.host_link < 0).any():
            return _bellman_ford(sources, self.indptr, self.indices, weights)
        entry_row = np.repeat(np.arange(len(self.names)), np.diff(self.indptr))
        between = self.switch[entry_row] & self.switch[self.indices]  # the entries switch_indices keeps
        out = _bellman_ford(sources, self.switch_indptr, self.switch_indices, weights[between])
        out[:, self.hosts] = out[:, self.host_link] + weights[self.indptr[self.hosts]]
        return out

    def _first_hops(self, src: int, indptr: np.ndarray, indices: np.ndarray, relay: np.ndarray | None) -> np.ndarray:
        first = np.full(len(self.names), -1, np.int64)
        seen = np.zeros(len(self.names), bool)
        seen[src] = True
        frontier = indices[indptr[src]:indptr[src + 1]]
        first[frontier], seen[frontier] = frontier, True
        while True:
            if relay is not None:
                frontier = frontier[relay[frontier]]
            if not frontier.size:
                return first
            lens = indptr[frontier + 1] - indptr[frontier]
            listed = indices[np.repeat(indptr[frontier] - (np.cumsum(lens) - lens), lens) + np.arange(int(lens.sum()))]
            via = np.repeat(frontier, lens)
            fresh = ~seen[listed]
            listed, via = listed[fresh], via[fresh]
            order = np.sort(np.unique(listed, return_index=True)[1])  # each node's first listing, in listing order
            frontier = listed[order]
            first[frontier], seen[frontier] = first[via[order]], True


def _bellman_ford(sources: np.ndarray, indptr: np.ndarray, indices: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """``GraphIndex.distances`` over one CSR, a block of sources at a time (about 32 MB of candidates)."""
    has = np.diff(indptr) > 0
    out = np.full((len(sources), len(indptr) - 1), np.inf)
    out[np.arange(len(sources)), sources] = 0.0
    if not has.any():
        return out
    block = max(1, (1 << 22) // max(1, len(indices)))
    for lo in range(0, len(sources), block):
        dist = out[lo:lo + block]
        while True:
            via = np.minimum.reduceat(dist[:, indices] + weights, indptr[:-1][has], axis=1)
            if not (via < dist[:, has]).any():
                break
            dist[:, has] = np.minimum(dist[:, has], via)
    return out


def _csr(rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    indptr = np.zeros(len(rows) + 1, np.int64)
    indptr[1:] = np.cumsum([len(r) for r in rows])
    return indptr, np.fromiter((i for r in rows for i in r), np.int64, int(indptr[-1]))


_INDEX: weakref.WeakKeyDictionary[nx.Graph, tuple[int, GraphIndex, dict[int, np.ndarray]]] = weakref.WeakKeyDictionary()


def indexed(graph: nx.Graph) -> GraphIndex:
    """The graph's GraphIndex, built once while the graph keeps its nodes."""
    return _cached(graph)[1]


def _cached(graph: nx.Graph) -> tuple[int, GraphIndex, dict[int, np.ndarray]]:
    shape = len(graph)
    cached = _INDEX.get(graph)
    if cached is None or cached[0] != shape:
        cached = _INDEX[graph] = (shape, GraphIndex(graph), {})
    return cached


def first_hops(graph: nx.Graph, node: str) -> np.ndarray:
    """Per node index, the next hop (a node index) from ``node`` towards it, -1 where none (see routes).
    Computed once per graph and node (the predictor asks for every node of every worker's path)."""
    _, ix, table = _cached(graph)
    src = ix.index[node]
    if src not in table:
        table[src] = ix.first_hops(src).astype(np.int32)
    return table[src]


def next_hop(graph: nx.Graph, node: str, dst: str) -> str:
    ix = indexed(graph)
    hop = int(first_hops(graph, node)[ix.index[dst]])
    if hop < 0:
        raise KeyError(dst)
    return ix.names[hop]


def routes(graph: nx.Graph, node: str) -> dict[str, str]:
    """Destination node -> next hop from ``node``, by shortest paths through switches (see bfs_parents)."""
    names, first = indexed(graph).names, first_hops(graph, node)
    dst = np.flatnonzero(first >= 0)
    return {names[d]: names[h] for d, h in zip(dst.tolist(), first[dst].tolist(), strict=True)}


def host_link_rate(graph: nx.Graph) -> float:
    """The highest rate of a link to a host, Mbit/s: the rate the dilation must bring within reach (the
    calibration's star has only host links; its switch carries every one of them)."""
    return max((float(d["bw"]) for u, v, d in graph.edges(data=True)
                if "host" in (graph.nodes[u].get("role"), graph.nodes[v].get("role"))), default=0.0)
