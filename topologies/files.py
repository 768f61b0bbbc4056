"""Topology files: GraphML and networkx node-link JSON, read and written.

A node's role is its ``role`` attribute; without one, p4-utils' flags say host or switch
(``isHost``; ``isSwitch``, ``isP4Switch``, ``isRouter``... as p4-utils' ``topology.json`` marks
nodes); without either, nodes of degree one are hosts and the others switches. A switch without
a role is a ``tor`` when a host hangs off it, a ``spine`` otherwise. Links take ``bw`` (Mbit/s) and
``latency`` (s), or Mininet's ``delay`` ("2ms", "100us"; a bare number is ms, as p4-utils documents).
Anything unusable is one UserError naming the file and the problem.

``save_file`` writes a topology with innet's attributes and those p4-utils' ``load_topo`` looks up
(``isHost``/``isSwitch``, ``ip``; per link ``node1``/``node2``, ``port1``/``port2``, ``intfName1``/``intfName2``
as innet numbers ports); ``load_file`` reads it back.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from typing import Any
from xml.etree import ElementTree
from xml.etree.ElementTree import ParseError

import networkx as nx

from innet.errors import UserError
from innet.graph import HOST_ROLES, ROLES, link_name, natural_key, node_indices, port_to, validate
from innet.results.files import write_text_atomic, writing
from innet.wire.packet import ip_str, node_ip

P4UTILS_SWITCH_FLAGS = ("isSwitch", "isP4Switch", "isP4RuntimeSwitch", "isTofino", "isRouter")
_DELAY = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(us|ms|s)?\s*")
_UNIT = {"us": 1e-6, "ms": 1e-3, "s": 1.0, None: 1e-3}


def _read(path: str, where: str) -> nx.Graph:
    is_json = path.endswith(".json")
    try:
        if not is_json:
            _declared(ElementTree.parse(path).getroot(), where)
            return nx.read_graphml(path)
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (ParseError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{where} is not valid {'JSON' if is_json else 'GraphML'}: {exc}") from None
    except RecursionError:
        raise UserError(f"{where} is nested too deeply to be a topology") from None
    except OSError as exc:
        raise UserError(f"{where} cannot be read: {exc.strerror}") from None
    except (nx.NetworkXError, KeyError, TypeError, ValueError) as exc:
        raise UserError(f"{where} is not a networkx graph: {exc}") from None
    if isinstance(data, dict) and "topology" in data and "nodes" not in data:
        raise UserError(f"{where} is a p4run configuration (p4app.json), not a topology: give the topology.json p4run writes")
    if not isinstance(data, dict) or not isinstance(data.get("nodes"), list):
        raise UserError(f"{where} is not a networkx graph: node-link JSON has a \"nodes\" list and a \"links\" list")
    links = data.get("links", data.get("edges", []))
    if not isinstance(links, list) or not all(isinstance(n, dict) for n in [*data["nodes"], *links]):
        raise UserError(f"{where} is not a networkx graph: its nodes and links must be objects")
    _unique([n.get("id") for n in data["nodes"]], [(e.get("source"), e.get("target")) for e in links], where)
    try:
        return nx.node_link_graph(data, edges="links" if "links" in data else "edges")
    except (nx.NetworkXError, KeyError, TypeError, AttributeError) as exc:
        raise UserError(f"{where} is not a networkx graph: {exc!r} in its nodes or links") from None


def _declared(root: ElementTree.Element, where: str) -> None:
    """A GraphML file's node ids are unique and its edges join declared nodes (networkx would keep the last of
    two nodes with one id, and make a node of an edge's undeclared end)."""
    ns = root.tag[: root.tag.index("}") + 1] if root.tag.startswith("{") else ""
    nodes = [n.get("id") for n in root.iter(f"{ns}node")]
    _unique(nodes, [(e.get("source"), e.get("target")) for e in root.iter(f"{ns}edge")], where)


def _unique(nodes: list[Any], links: list[tuple[Any, Any]], where: str) -> None:
    seen: set[Any] = set()
    for node in nodes:
        if node in seen:
            raise UserError(f"{where}: node id {node!r} is declared twice")
        seen.add(node)
    for u, v in links:
        if u is None or v is None:
            raise UserError(f"{where}: a link has no {'source' if u is None else 'target'} (link {u}--{v})")
        for end in (u, v):
            if end not in seen:
                raise UserError(f"{where}: link {u}--{v} joins node {end!r}, which the file does not declare")


def _seconds(delay: Any, where: str) -> float:
    match = _DELAY.fullmatch(str(delay))
    if isinstance(delay, bool) or match is None:
        raise UserError(f"{where} has delay {delay!r}; give it as a number of ms or with a unit: '2ms', '100us'")
    return float(match.group(1)) * _UNIT[match.group(2)]


def _host_or_switch(data: dict[str, Any]) -> str | None:
    """What p4-utils' flags make a node: "host", "switch", or None when they say nothing."""
    if data.get("isHost"):
        return "host"
    return "switch" if any(data.get(flag) for flag in P4UTILS_SWITCH_FLAGS) else None


def load_file(path: str) -> nx.Graph:
    where = f"topology file {path}"
    if not os.path.exists(path):
        raise UserError(f"{where} does not exist")
    if os.path.isdir(path):
        raise UserError(f"{where} is a folder; name a .graphml or .json file")
    if not os.path.isfile(path):
        raise UserError(f"{where} is not a regular file (a device, FIFO or socket); name a .graphml or .json file")
    graph = _read(path, where)
    if graph.is_multigraph():
        pairs = Counter(tuple(sorted(map(str, e))) for e in graph.edges() if e[0] != e[1])
        (u, v), n = max(pairs.items(), key=lambda p: p[1], default=(("", ""), 0))
        if n > 1:
            raise UserError(f"{where}: {u} and {v} are joined by {n} links; innet takes one link per pair of nodes")
    graph = complete(graph, where)
    graph.graph.setdefault("name", os.path.splitext(os.path.basename(path))[0])
    return validate(graph, where)


def complete(graph: nx.Graph, where: str = "topology") -> nx.Graph:
    """A copy of ``graph`` with what a file may leave out inferred, as for a topology file: node names as text,
    each node's role (p4-utils' flags, else a host has one link, a switch with hosts is a tor, the rest spines),
    a link's ``latency`` from Mininet's ``delay``. ``validate`` then checks it and fills the link defaults."""
    graph = nx.relabel_nodes(nx.Graph(graph), {n: str(n) for n in graph})
    for node, data in graph.nodes(data=True):
        if "role" not in data:
            kind = _host_or_switch(data) or ("host" if graph.degree(node) == 1 else "switch")
            data["role"] = "host" if kind == "host" else None
    for node, data in graph.nodes(data=True):
        if data["role"] is None:
            data["role"] = "tor" if any(graph.nodes[n]["role"] == "host" for n in graph[node]) else "spine"
        elif data["role"] not in ROLES:
            raise UserError(f"{where}: node {node!r} has unknown role {data['role']!r}; expected one of {', '.join(ROLES)}")
    for u, v, data in graph.edges(data=True):
        if data.get("bw") is None:
            data.pop("bw", None)
        if data.get("latency") is None and data.get("delay") is not None:
            data["latency"] = _seconds(data["delay"], f"{where}: link {link_name(u, v)}")
    return graph


def save_file(graph: nx.Graph, path: str) -> None:
    """Write ``graph`` as GraphML (``.graphml``, ``.xml``) or node-link JSON with links under "links" (``.json``)."""
    if not path.endswith((".json", ".graphml", ".xml")):
        raise UserError(f"cannot write topology file {path}: name it .json (node-link) or .graphml")
    index = node_indices(graph)
    out = nx.Graph(name=str(graph.graph.get("name", "topology")))
    for node in sorted(graph, key=natural_key):
        role = str(graph.nodes[node]["role"])
        out.add_node(node, role=role, isHost=role in HOST_ROLES, isSwitch=role not in HOST_ROLES,
                     ip=f"{ip_str(node_ip(index[node]))}/16")
    for u, v, data in sorted(graph.edges(data=True), key=lambda e: link_name(e[0], e[1])):
        a, b = sorted((u, v), key=natural_key)
        pa, pb = port_to(graph, a, b), port_to(graph, b, a)
        out.add_edge(a, b, bw=float(data["bw"]), latency=float(data["latency"]), node1=a, node2=b, port1=pa, port2=pb,
                     intfName1=f"{a}-eth{pa}", intfName2=f"{b}-eth{pb}")
    if path.endswith(".json"):
        write_text_atomic(path, json.dumps(nx.node_link_data(out, edges="links"), indent=1))
    else:
        with writing(path) as fh:
            nx.write_graphml(out, fh)
