"""What a worker knows of its job (``JobSpec``), the value every worker endpoint is made from: the in-network
and PBox calls (innet.hosts.worker), the ring (innet.hosts.ring) and the SSP worker (innet.hosts.ssp). The
planner makes one per worker (innet.planning.configs); a node process gets it as JSON (innet.node.config).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from innet.wire.operators import SUM, Operator


@dataclass(frozen=True)
class JobSpec:
    """What a worker knows of its job: identity, pool geometry, and addressing."""

    job: int
    rank: int
    nworkers: int
    slots: int
    elements: int
    node: int
    first_hop: int
    min_rto: float = 0.001
    initial_rto: float = 1.0  # RFC 6298's: the first window may queue behind a slow link
    timeout: float = 10.0
    reorder_window: float = 0.0  # how long reordering may hold a frame back (innet.planning.configs.reorder_window)
    reorder_link: float = 0.0  # how long one link may hold a frame back: all a lossy run's window covers (Rack.held)
    pbox: int | None = None  # set: send every chunk to this PBox node instead of into the network
    sparse: bool = False  # send a chunk as (index, value) pairs when that is shorter (innet.wire.sparse)
    band: int = 0  # the priority band (DSCP) of every frame the worker sends (0: most urgent)
    operator: Operator = SUM  # what the job reduces with: its fixed-point rule decides what workers agree on
    collective: str = "allreduce"  # innet.wire.collectives: what goes in, and which ranks each result goes to
    root: int = 0  # broadcast's and reduce's root rank
    reorder: float = 0.0  # seconds results may come back out of order by design (switches that hold partials)
    lossy: bool = False  # the run's links lose frames: a tail probe may come before this call has lost anything
    nic_bps: float = 0.0  # this host's link rate: a frame still queued here is not sent again (0: not known)

    def __post_init__(self) -> None:
        if isinstance(self.operator, dict):  # from JSON
            object.__setattr__(self, "operator", Operator(**self.operator))

    @property
    def peer(self) -> int:
        """The node an in-network or PBox worker sends to and hears results from: its switch, or the PBox."""
        return self.first_hop if self.pbox is None else self.pbox

    def as_input(self, tensor: Any) -> np.ndarray:
        """A caller's tensor as the worker holds it: float32, or int32 bit patterns for a bit operator."""
        return np.ascontiguousarray(tensor, np.int32 if self.operator.rule == "bits" else np.float32).ravel()

    def chunks(self, length: int) -> int:
        """Chunks one call uses for a tensor of ``length`` (one more for the exponent)."""
        return 1 + -(-length // self.elements)
