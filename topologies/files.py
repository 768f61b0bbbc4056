"""Load a topology from GraphML or networkx node-link JSON.

Roles come from a ``role`` node attribute; where it is missing, nodes of degree
one are hosts and the others switches (``tor`` when a host hangs off them,
``spine`` otherwise). ``bw`` (Mbit/s) and ``latency`` (s) are optional link
attributes. Anything unusable is one UserError naming the file and the problem.
"""

from __future__ import annotations

import json
import os
from xml.etree.ElementTree import ParseError

import networkx as nx

from innet.errors import UserError
from innet.graph import ROLES, validate


def load_file(path: str) -> nx.Graph:
    where = f"topology file {path}"
    if not os.path.isfile(path):
        raise UserError(f"{where} does not exist")
    try:
        if path.endswith(".json"):
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
            graph = nx.node_link_graph(data, edges="links" if "links" in data else "edges")
        else:
            graph = nx.read_graphml(path)
    except (ParseError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{where} is not valid {'JSON' if path.endswith('.json') else 'GraphML'}: {exc}") from None
    except (nx.NetworkXError, KeyError, TypeError, AttributeError) as exc:
        raise UserError(f"{where} is not a networkx graph: {exc}") from None
    graph = nx.Graph(graph)
    graph = nx.relabel_nodes(graph, {n: str(n) for n in graph})
    for node in graph:
        data = graph.nodes[node]
        if "role" not in data:
            data["role"] = "host" if graph.degree(node) == 1 else None
    for node in graph:
        data = graph.nodes[node]
        if data["role"] is None:
            has_host = any(graph.nodes[n]["role"] == "host" for n in graph[node])
            data["role"] = "tor" if has_host else "spine"
        elif data["role"] not in ROLES:
            raise UserError(f"{where}: node {node!r} has unknown role {data['role']!r}; expected one of {', '.join(ROLES)}")
    graph.graph.setdefault("name", os.path.splitext(os.path.basename(path))[0])
    return validate(graph, where)
