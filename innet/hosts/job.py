"""What a worker knows of its job (``JobSpec``), the value every worker endpoint is made from: the in-network
and PBox calls (innet.hosts.worker), the ring (innet.hosts.ring) and the SSP worker (innet.hosts.ssp). The
planner makes one per worker (innet.planning.configs); a node process gets it as JSON (innet.node.config).
And the seeded gradients a run all-reduces (``worker_tensors``): the same on every backend and in every process (a
worker inside a namespace makes its own from the seed), and checked against the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from innet.wire.operators import SUM, Operator
from innet.wire.sparse import topk_with_feedback


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
    servers: tuple[int, ...] = ()  # set (a stock sharded PS): chunk c goes to servers[c % slots % len(servers)]
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
        if isinstance(self.servers, list):  # from JSON
            object.__setattr__(self, "servers", tuple(self.servers))

    @property
    def peer(self) -> int:
        """The node an in-network or PBox worker sends to and hears results from: its switch, or the PBox."""
        return self.first_hop if self.pbox is None else self.pbox

    def peer_of(self, chunks: np.ndarray) -> int | np.ndarray:
        """The node each of ``chunks`` goes to: ``peer``, or with ``servers`` its key's server."""
        if not self.servers:
            return self.peer
        return np.asarray(self.servers, np.int64)[chunks % self.slots % len(self.servers)]

    def hears(self, src: np.ndarray) -> np.ndarray:
        """Which of the nodes ``src`` this worker takes results from: its peer, or any of its servers."""
        return np.isin(src, self.servers) if self.servers else src == self.peer

    def as_input(self, tensor: Any) -> np.ndarray:
        """A caller's tensor as the worker holds it: float32, or int32 bit patterns for a bit operator."""
        return np.ascontiguousarray(tensor, np.int32 if self.operator.rule == "bits" else np.float32).ravel()

    def chunks(self, length: int) -> int:
        """Chunks one call uses for a tensor of ``length`` (one more for the exponent)."""
        return 1 + -(-length // self.elements)


def make_tensors(seed: int, job: int, rank: int, sizes: Sequence[int]) -> list[np.ndarray]:
    """Seeded gradients: per call, normal values with a per-worker magnitude."""
    rng = np.random.default_rng([seed, job, rank])
    return [(rng.standard_normal(n) * 10.0 ** rng.uniform(-3, 1)).astype(np.float32) for n in sizes]


def make_bitsets(seed: int, job: int, rank: int, sizes: Sequence[int]) -> list[np.ndarray]:
    """Seeded int32 bit sets for the bit operators: each bit set with probability 1/8."""
    rng = np.random.default_rng([seed, job, rank])
    return [(rng.integers(0, 2**32, n, np.uint32) & rng.integers(0, 2**32, n, np.uint32)
             & rng.integers(0, 2**32, n, np.uint32)).view(np.int32) for n in sizes]


def worker_tensors(seed: int, job: int, rank: int, sizes: Sequence[int], topk: float = 0.0,
                   layers: int = 1, bits: bool = False) -> list[np.ndarray]:
    """The seeded gradients (bit sets with ``bits``), or with ``topk`` what top-k with error feedback per
    layer keeps of them."""
    if bits:
        return make_bitsets(seed, job, rank, sizes)
    tensors = make_tensors(seed, job, rank, sizes)
    return topk_with_feedback(tensors, topk, layers) if topk else tensors
