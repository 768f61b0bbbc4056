"""What ships with innet beside its code, wherever innet runs from: the topology builders, the switch programs,
the experiment files and (a source checkout only) the benchmarks.

A checkout keeps them where its users know them, beside ``innet/``: ``topologies/``, ``switch_programs/``,
``experiments/``, ``scripts/``. An installed wheel carries the first three inside the package
(``innet.topologies``, ``innet/switch_programs/``, ``innet/experiments/shipped/``: pyproject.toml's package-dir),
so that installing innet adds no generic top-level name such as ``topologies``; the benchmarks stay in the
checkout. innet's own code finds them through here, never by a path of its own.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from importlib.machinery import PathFinder
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import networkx as nx

PACKAGE = os.path.dirname(os.path.abspath(__file__))  # innet/
CHECKOUT = os.path.dirname(PACKAGE)  # what holds innet/: a source checkout, or site-packages
INSTALLED = os.path.isdir(os.path.join(PACKAGE, "topologies"))  # the wheel's layout
PROGRAMS = os.path.join(PACKAGE if INSTALLED else CHECKOUT, "switch_programs")
EXPERIMENTS = os.path.join(PACKAGE, "experiments", "shipped") if INSTALLED else os.path.join(CHECKOUT, "experiments")
SCRIPTS = None if INSTALLED else os.path.join(CHECKOUT, "scripts")  # site-packages/scripts would be someone else's


def topologies(module: str = "") -> ModuleType:
    """The topology builders' package (or its ``module``): ``innet.topologies`` when installed; in a checkout its
    ``topologies/`` under that name, as the checkout's scripts and tests import it, found beside ``innet/``
    whatever ``sys.path`` holds (an editable install run from another folder has no ``topologies`` on it)."""
    if INSTALLED:
        package = importlib.import_module("innet.topologies")
    elif "topologies" in sys.modules:
        package = sys.modules["topologies"]
    else:
        spec = PathFinder.find_spec("topologies", [CHECKOUT])
        assert spec is not None and spec.loader is not None, f"no topologies/ beside {PACKAGE}"
        package = importlib.util.module_from_spec(spec)
        sys.modules["topologies"] = package
        try:
            spec.loader.exec_module(package)
        except BaseException:
            del sys.modules["topologies"]
            raise
    return importlib.import_module(f"{package.__name__}.{module}") if module else package


def build(name: str, **params: Any) -> nx.Graph:
    """A registered topology built (``star``, ``leaf-spine``, ...; unknown params are ignored) or a file loaded."""
    graph: nx.Graph = topologies().build(name, **params)
    return graph


def load_file(path: str) -> nx.Graph:
    """A GraphML or node-link JSON topology file, its roles inferred and checked."""
    graph: nx.Graph = topologies("files").load_file(path)
    return graph


def save_file(graph: nx.Graph, path: str) -> None:
    """``graph`` written as GraphML (``.graphml``, ``.xml``) or node-link JSON (``.json``)."""
    topologies("files").save_file(graph, path)


def complete(graph: nx.Graph, where: str = "graph") -> nx.Graph:
    """A copy of a hand-built ``graph`` with what a topology file may leave out inferred (roles, latency from
    Mininet's delay), as a file's would be."""
    done: nx.Graph = topologies("files").complete(graph, where)
    return done
