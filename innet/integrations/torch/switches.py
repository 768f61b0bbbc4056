"""A Mininet rank's torch collectives through the switches: the worker client on its host's interface
(innet.node.client) runs each call as innet's own collective (innet.wire.collectives), as the fabric does for the
``innet`` group's rank 0 on the local backend (innet.integrations.torch.fabric).

The switches run the sum program, so the calls they serve are those it can: float sums and means (all_reduce,
reduce_scatter_tensor, reduce) by fixed point, all_gather_into_tensor and broadcast of any dtype as int32 bit
patterns (the switches only replicate them: the bit-or operator on the workers, no fixed point), and barrier. The
group takes every other call (integers, MIN, MAX, ...) over the side plane.

A reduce-scatter's input and an all-gather's whole are laid out as torch's N even pieces, each padded to whole
packets (innet.integrations.torch.fabric: ``unit``, ``padded``), as on the fabric.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from innet.hosts.worker.process import WorkerProcess
from innet.integrations.torch.fabric import as_words, from_words, padded, unit
from innet.node.client import AllreduceClient
from innet.wire.collectives import COLLECTIVES
from innet.wire.operators import BOR, SUM, Operator

REDUCING = ("allreduce", "reduce_scatter", "reduce")


def serves(name: str, op: str, dtype: np.dtype) -> bool:
    """Whether the sum program's switches carry torch's ``name`` with ``op`` on ``dtype`` as torch computes it."""
    if name in REDUCING:
        return op in ("sum", "avg") and dtype.kind == "f" and dtype.itemsize >= 4
    return name in ("all_gather", "broadcast", "barrier")


class SwitchCollectives:
    """The calls ``serves`` names, run by ``client`` as rank ``rank`` of ``size``; each returns this rank's result
    (what torch leaves in the output tensor; None for a reduce's non-root)."""

    def __init__(self, client: AllreduceClient, rank: int, size: int) -> None:
        self.client, self.rank, self.size = client, rank, size
        self.spec = client.proc.spec  # the job's: every call is its collective on the job's slots, in order

    def _call(self, name: str, operator: Operator, tensor: np.ndarray, root: int = 0, elements: int = 0) -> np.ndarray:
        """innet's collective ``name`` of ``tensor`` (float32, or int32 words for a bit operator), ``elements`` values
        a packet (default: the job's): what this rank keeps of its result."""
        spec = replace(self.spec, collective=name, operator=operator, root=root, elements=elements or self.spec.elements)
        collective = COLLECTIVES[name]
        self.client.proc.spec = spec  # the next call's (WorkerProcess.call_spec)
        self.client.run([collective.contribution(spec.as_input(tensor), self.rank, self.size, root, spec.elements, 0)])
        assert isinstance(self.client.proc, WorkerProcess)
        call = self.client.proc.calls[-1]
        if call.error is not None:
            raise call.error
        return collective.kept(np.asarray(call.result), self.rank, self.size, root, spec.elements)

    def run(self, name: str, op: str, mine: np.ndarray, root: int = 0) -> np.ndarray | None:
        """torch's ``name`` on this rank's flat ``mine`` (see ``serves``)."""
        if not len(mine) and name != "barrier":  # every rank's is empty: nothing to move
            return mine
        if name == "barrier":
            self._call(name, SUM, np.zeros(1, np.float32))
            return mine
        if name == "broadcast":
            return from_words(self._call(name, BOR, as_words(mine), root), mine, len(mine))
        if name == "all_gather":
            words = as_words(mine)
            short = unit(len(words), self.spec.elements)
            whole = padded(np.zeros((self.size, len(words)), np.int32), short)
            width = len(whole) // self.size
            whole[self.rank * width : self.rank * width + len(words)] = words
            got = self._call(name, BOR, whole, elements=short).reshape(self.size, width)[:, : len(words)]
            return np.concatenate([from_words(row, mine, len(mine)) for row in got])
        floats = mine.astype(np.float32)
        if name == "reduce_scatter":
            piece = len(mine) // self.size
            short = unit(piece, self.spec.elements)
            got = self._call(name, SUM, padded(floats.reshape(self.size, piece), short), elements=short)[:piece]
        else:
            got = self._call(name, SUM, floats, root)
            if name == "reduce" and self.rank != root:
                return None
        return (got.astype(np.float64) / (self.size if op == "avg" else 1)).astype(mine.dtype)

    def close(self) -> None:
        self.client.close()
