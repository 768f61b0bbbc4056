"""Topology builders and their registry.

Each builder returns a networkx graph following innet.graph's conventions
(node ``role``; edge ``bw`` in Mbit/s and ``latency`` in seconds). ``build``
takes a registered name or a path to a GraphML / node-link JSON file.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import networkx as nx

from innet.errors import UserError
from innet.graph import validate

from .fat_tree import fat_tree  # relative: the package is `topologies` in a checkout, `innet.topologies` installed
from .files import load_file
from .leaf_spine import leaf_spine, phub_rack
from .star import star

REGISTRY: dict[str, Callable[..., nx.Graph]] = {
    "star": star,
    "leaf-spine": leaf_spine,
    "fat-tree": fat_tree,
    "phub-rack": phub_rack,
}


def build(name: str, **params: Any) -> nx.Graph:
    """Build a registered topology (unknown params are ignored) or load a file."""
    if name in REGISTRY:
        builder = REGISTRY[name]
        names = builder.__code__.co_varnames[: builder.__code__.co_argcount]
        graph = builder(**{k: v for k, v in params.items() if k in names and v is not None})
        return validate(graph, name)
    if os.path.sep in name or name.endswith((".graphml", ".json", ".xml")) or os.path.exists(name):
        return load_file(name)
    raise UserError(f"unknown topology {name!r}; choose one of {', '.join(REGISTRY)} or give a .graphml/.json file")
