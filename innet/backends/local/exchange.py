"""Point-to-point messages on the fabric: every rank's host runs a ``MessageHost`` (innet.hosts.p2p), the switches
the run's program, which forwards the messages' routed frames by address; the run ends when every message is
acknowledged whole. What torch's send/recv, all-to-all, gather and scatter put on the links, and their time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import networkx as nx
import numpy as np

from innet.backends.local.fabric import Fabric
from innet.hosts.p2p.host import Message, MessageHost
from innet.planning.spec import RunSpec
from innet.schemes.modes import RunPlan, installed_configs
from innet.switch.program import SwitchProgram
from innet.switch.runtime import SwitchRuntime


@dataclass(frozen=True)
class Post:
    """A message to send: from rank ``src`` to rank ``dst`` on ``channel``, its bytes and tag."""

    src: int
    dst: int
    channel: int
    data: bytes | np.ndarray
    tag: int = 0


@dataclass(frozen=True)
class Exchanged:
    """What an exchange did: each rank's messages received (in order per sender and channel), the bytes each link
    direction (from, to) carried, and its seconds of virtual time."""

    received: list[list[Message]]
    direction_bytes: dict[tuple[str, str], int]
    seconds: float


def exchange(graph: nx.Graph, run: RunSpec, rp: RunPlan, program: type[SwitchProgram], posts: Sequence[Post]) -> Exchanged:
    """Send ``posts`` on a fabric of ``graph`` (``run``'s faults and seed; the switches of plan ``rp`` running
    ``program``), each of rank r's from the host of the job's rank r, all at once."""
    fabric = Fabric(graph, faults=run.faults_on, seed=run.seed)
    for name, cfg in installed_configs(graph, run, rp).items():
        fabric.add_switch(name, SwitchRuntime(cfg, program))
    job = rp.plans[0].job
    by_rank = sorted(rp.specs[job].items(), key=lambda hs: hs[1].rank)
    nodes = [spec.node for _, spec in by_rank]
    hosts: list[MessageHost] = []
    for (host, spec) in by_rank:
        end = MessageHost(spec, nodes, expected=sum(p.dst == spec.rank for p in posts))
        hosts.append(end)
        fabric.attach(host, end)
    for post in posts:
        hosts[post.src].post(post.dst, post.channel, post.data, post.tag)
    seconds = fabric.run() if posts else 0.0
    for end in hosts:
        if end.error is not None:
            raise RuntimeError(str(end.error))
        if not end.done:
            raise RuntimeError(f"innet: rank {end.spec.rank}'s messages did not arrive on the fabric")
    return Exchanged([end.received for end in hosts], fabric.direction_bytes(), seconds)
