"""Collectives as values, as reduce operators are (innet.wire.operators): one engine, one stream of
chunks through the job's slots, and the collective says what goes in and where each complete slot goes.

A collective names:

- ``combines``: the slot reduces every rank's contribution with the job's operator (all-reduce,
  reduce-scatter, reduce, barrier), or one rank's values are replicated (all-gather, broadcast);
- ``sources``: whose values a chunk carries: ``all``, its ``owner`` (all-gather: the rank whose shard
  it is) or the ``root`` (broadcast); ``none`` for a barrier (no payload);
- ``delivers``: which ranks a complete slot's values go to: ``all``, its ``owner`` (reduce-scatter),
  the ``root`` (reduce) or ``none`` (barrier). A rank a slot's values do not go to still hears that
  the slot is complete: a header without values, its acknowledgement.

Shards are whole packets: a tensor of ``length`` values is cut into chunks of ``unit`` values (the
packet), and rank ``r`` owns chunks ``r*C//N .. (r+1)*C//N - 1`` of its ``C``, so no chunk spans two
owners and a switch can send each chunk's result to one rank. Shards are then uneven by up to a
packet (and the last one carries the short last chunk).

A rank's values for a non-combining collective enter the slot stream at their place in the whole
tensor, every other place holding the operator's identity; the result is then the gathered tensor.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from innet.errors import UserError
from innet.wire.operators import Operator

PARTS = ("all", "owner", "root", "none")


@dataclass(frozen=True)
class Collective:
    """A collective: ``name``, whether slots ``combines``, whose values a chunk carries (``sources``) and
    whom a complete slot's values go to (``delivers``); see the module doc."""

    name: str
    combines: bool = True
    sources: str = "all"
    delivers: str = "all"

    def __post_init__(self) -> None:
        if self.sources not in PARTS or self.delivers not in PARTS:
            raise UserError(f"collective {self.name}: sources and delivers are each one of {', '.join(PARTS)}")

    @property
    def rooted(self) -> bool:
        """The collective has a root rank (``--root``)."""
        return "root" in (self.sources, self.delivers)

    @property
    def routed(self) -> bool:
        """A complete slot's values go to one rank, not to every rank."""
        return self.delivers in ("owner", "root")

    @property
    def payload(self) -> bool:
        return self.sources != "none"

    # -- shards --------------------------------------------------------------
    @staticmethod
    def shards(length: int, nworkers: int, unit: int) -> np.ndarray:
        """Rank r's shard is ``[b[r], b[r+1])`` of the returned ``b`` (whole chunks of ``unit``; module doc)."""
        chunks = -(-length // unit)
        first = (np.arange(nworkers + 1) * chunks) // nworkers
        return np.minimum(first * unit, length)

    def dest(self, chunks: int, nworkers: int, root: int) -> np.ndarray | None:
        """The one rank each data chunk's result goes to, or None: every rank."""
        return self.rank_per_chunk(self.delivers, chunks, nworkers, root)

    @staticmethod
    def owner_of(chunks: int, nworkers: int) -> np.ndarray:
        """The rank owning each of ``chunks`` data chunks."""
        starts = (np.arange(nworkers + 1) * chunks) // nworkers
        return np.searchsorted(starts, np.arange(chunks), side="right") - 1

    def source(self, chunks: int, nworkers: int, root: int) -> np.ndarray | None:
        """The one rank whose values each data chunk carries, or None: every rank's (a combining collective)."""
        return self.rank_per_chunk(self.sources, chunks, nworkers, root)

    @classmethod
    def rank_per_chunk(cls, who: str, chunks: int, nworkers: int, root: int) -> np.ndarray | None:
        """The rank ``who`` names for each data chunk ("owner": its shard's, "root": the root), or None: every rank."""
        if who == "owner":
            return cls.owner_of(chunks, nworkers)
        if who == "root":
            return np.full(chunks, root, np.int64)
        return None

    # -- what goes in and what comes out -------------------------------------
    def contribution(self, tensor: np.ndarray, rank: int, nworkers: int, root: int, unit: int, fill: float) -> np.ndarray:
        """What rank ``rank`` streams through the slots for its input ``tensor`` (the whole tensor's length)."""
        tensor = np.asarray(tensor)
        if not self.payload:
            return tensor[:0]
        if self.sources == "all":
            return tensor
        mine = np.full_like(tensor, fill)
        if self.sources == "root":
            return tensor if rank == root else mine
        b = self.shards(len(tensor), nworkers, unit)
        mine[b[rank] : b[rank + 1]] = tensor[b[rank] : b[rank + 1]]
        return mine

    def streams(self, tensors: Sequence[np.ndarray], rank: int, nworkers: int, root: int, unit: int,
                operator: Operator) -> list[np.ndarray]:
        """``contribution`` of each of a rank's call inputs, the rest filled with ``operator``'s identity."""
        if self.sources == "all":
            return list(tensors)
        fill = float(operator.identity or 0) if operator.rule == "bits" else 0.0
        return [self.contribution(t, rank, nworkers, root, unit, fill) for t in tensors]

    def kept(self, result: np.ndarray, rank: int, nworkers: int, root: int, unit: int) -> np.ndarray:
        """What rank ``rank`` holds of a call's whole result: its shard, the whole, or nothing."""
        if self.delivers == "owner":
            b = self.shards(len(result), nworkers, unit)
            return result[b[rank] : b[rank + 1]]
        if self.delivers == "none" or (self.delivers == "root" and rank != root):
            return result[:0]
        return result


ALLREDUCE = Collective("allreduce")
REDUCE_SCATTER = Collective("reduce_scatter", delivers="owner")
REDUCE = Collective("reduce", delivers="root")
ALL_GATHER = Collective("all_gather", combines=False, sources="owner")
BROADCAST = Collective("broadcast", combines=False, sources="root")
BARRIER = Collective("barrier", sources="none", delivers="none")
COLLECTIVES = {c.name: c for c in (ALLREDUCE, REDUCE_SCATTER, ALL_GATHER, BROADCAST, REDUCE, BARRIER)}


def collective_named(name: str) -> Collective:
    """The collective ``name`` (``all-gather`` reads as ``all_gather``), or a one-line ``UserError``."""
    found = COLLECTIVES.get(name.replace("-", "_"))
    if found is None:
        raise UserError(f"unknown collective {name!r}; expected one of {', '.join(COLLECTIVES)}")
    return found
