"""A run made ready: what ``innet.prepare`` returns and every backend takes.

Preparing checks every rule once (the options alone, against the graph, against memory), loads the program
once and places every job once; a backend builds and runs what it is given and checks nothing again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import networkx as nx

from innet.planning.spec import RunSpec
from innet.schemes.modes import RunPlan
from innet.switch.program import SwitchProgram


@dataclass(frozen=True)
class ModeRun:
    """One run of a prepared run: its spec (its mode and the backend that runs it among them), its plan, placed
    once, and its program, sized for the plan's fan-in."""

    spec: RunSpec
    plan: RunPlan | None = None
    program: type[SwitchProgram] | None = None
    dilation: float = 1.0  # Mininet's time dilation factor, resolved ("auto" calibrated) while preparing
    dilation_bound: str = ""  # with "auto": the bound that chose it (innet.planning.timing.dilation.auto_bounds)


@dataclass(frozen=True)
class Prepared:
    """A run ready to go: its spec, its topology (roles and link attributes checked and completed), and one
    ``ModeRun`` per mode it runs (``--mode all``: innet, pbox, ring, and the gloo backend where it applies)."""

    spec: RunSpec
    graph: nx.Graph = field(repr=False)
    runs: tuple[ModeRun, ...]
    cluster: Any = None  # the servers of --cluster, checked for form (innet.backends.cluster.servers.Cluster)
    notes: tuple[str, ...] = ()  # what preparing decided that changes what runs (a baseline left out), said once
