"""How many of a run's nodes one Mininet process serves (``--node-group``), and how long to wait for them.

A Python process per switch and per worker costs its interpreter's start (numpy, scapy and innet
imported: ~1-1.5 s of CPU, ~45 MiB) before it serves a frame; a fat-tree k=8 on 2 cores starts 208 of
them. A node group is one process serving several nodes, each still in its own namespace with its own
interfaces, links and shaping (innet.node opens every node's sockets inside its namespace).
Small runs keep a process per switch and a process per core for the workers; grouping starts only when a kind of
node (switches, or workers) outnumbers ``PER_CORE`` per core, and then makes ``GROUPS_PER_CORE`` groups per core.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence

PER_CORE = 12  # processes of one kind per core a run may start before they are grouped (fat-tree k=4: 20 switches)
GROUPS_PER_CORE = 4  # the groups per core when they are: enough to keep every core busy, few enough to start fast
START_BASE_S = 20.0  # what one process is given to come up on an idle machine
START_CPU_S = 1.5  # the CPU seconds one process's interpreter and imports take on this kind of machine


def group_size(count: int, cores: int, wanted: int | None = None, hosts: bool = False) -> int:
    """Nodes per process for ``count`` nodes of one kind on ``cores`` cores: ``wanted`` when given
    (``--node-group G``; 1 is a process per node), else 1 up to ``PER_CORE`` per core and otherwise
    enough to make ``GROUPS_PER_CORE`` groups per core. ``hosts`` (the workers): a process per core, never more,
    where they would have one each: what their hosts do falls due at one instant (the go, the exponent's answer,
    a window's hop end), and more processes than cores woke one after the other (the calibration's star on the eBPF
    switch, 4 workers on 2 cores, 5 runs each: 1.022 of its links' time at 80 Mbit/s, in 2 processes 1.011, in 1
    1.019; at 160 Mbit/s 1.060, 1.025, 1.045; on the Python switch at 5 Mbit/s 1.0115 against 1.0058).

    >>> group_size(20, 2), group_size(80, 2), group_size(128, 2), group_size(80, 2, wanted=1)
    (1, 10, 16, 1)
    >>> group_size(4, 2, hosts=True), group_size(1, 2, hosts=True), group_size(128, 2, hosts=True)
    (2, 1, 16)
    """
    if wanted is not None:
        if wanted < 1:
            raise ValueError(f"a node group has at least 1 node, got {wanted}")
        return wanted
    cores = max(1, cores)
    if count <= PER_CORE * cores:
        return math.ceil(count / cores) if hosts else 1
    return math.ceil(count / (GROUPS_PER_CORE * cores))


def node_groups(names: Sequence[str], size: int, placement: Mapping[str, str] | None = None) -> list[list[str]]:
    """``names`` (in their order) cut into groups of at most ``size``; with a cluster's ``placement``,
    only nodes on the same server share a group (a process serves the namespaces of its own machine).

    >>> node_groups(["a1", "a2", "a3"], 2)
    [['a1', 'a2'], ['a3']]
    >>> node_groups(["a1", "a2", "a3"], 2, {"a1": "s1", "a2": "s2", "a3": "s1"})
    [['a1', 'a3'], ['a2']]
    """
    by_server: dict[str, list[str]] = {}
    for name in names:
        by_server.setdefault((placement or {}).get(name, ""), []).append(name)
    return [members[i:i + size] for members in by_server.values() for i in range(0, len(members), size)]


def group_label(members: Sequence[str]) -> str:
    """How reports name a group's process: its node's name when alone, else its first and last node."""
    return members[0] if len(members) == 1 else f"{members[0]}..{members[-1]}"


def process_count(count: int, cores: int, wanted: int | None = None, hosts: bool = False) -> int:
    """How many processes ``count`` nodes of one kind take."""
    return math.ceil(count / group_size(count, cores, wanted, hosts)) if count else 0


def start_timeout(processes: int, cores: int | None = None, load: float | None = None) -> float:
    """Seconds to wait for the last of ``processes`` starting processes: ``START_BASE_S``, plus their
    interpreters' CPU spread over the cores, stretched by how loaded the machine already is (the load
    average per core; other programs share the cores). A process that dies is noticed at once anyway.

    >>> start_timeout(10, cores=2, load=0.0), start_timeout(80, cores=2, load=8.0)
    (27.5, 260.0)
    """
    cores = cores or os.cpu_count() or 1
    load = os.getloadavg()[0] if load is None else load
    return START_BASE_S + START_CPU_S * processes / cores * max(1.0, load / cores)
