"""One torch collective on the in-process fabric: every rank's tensor in, every rank's result out, the bytes per link
and the virtual seconds counted (what the ``innet`` process group's rank 0 runs; innet.integrations.torch.group).

A collective reaches the fabric as innet's own (innet.wire.collectives) with the program of its operator. Values the
switches only move (all-gather, broadcast) travel as int32 bit patterns through the bit-or program, so any dtype
arrives bit for bit; values they combine go through fixed point (floats) or exactly (integers small enough for it,
see ``exact_ints``).

torch shards a tensor evenly; innet's shards are whole packets (``Collective.shards``). So a reduce-scatter's input
and an all-gather's whole are laid out as N pieces, each padded to whole packets (``padded``), innet's shard r then
being torch's piece r; the call's packets are as short as hold a piece in as few of them as the job's packets would
(``unit``), so a piece pads by less than one value a packet.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import networkx as nx
import numpy as np

from innet.backends.local.run import LocalRun
from innet.hosts.worker.process import WorkerProcess
from innet.planning.spec import RunSpec, program_of
from innet.wire import fixedpoint
from innet.wire.collectives import COLLECTIVES

PROGRAMS = {"sum": "sum_allreduce", "avg": "sum_allreduce", "min": "min_allreduce", "max": "max_allreduce",
            "bor": "or_allreduce", "band": "and_allreduce", "bits": "or_allreduce"}
EXACT_FLOAT = 2**24  # integers a float32 holds exactly: fixed point carries an integer sum below it unrounded


@dataclass
class Tally:
    """What collectives cost on the fabric, summed over calls (a group's, or a launch's over its groups)."""

    link_bytes: Counter[str] = field(default_factory=Counter)
    virtual_s: float = 0.0
    calls: Counter[str] = field(default_factory=Counter)
    side_plane: set[str] = field(default_factory=set)  # the calls that went over the side plane instead

    def add(self, other: Tally) -> None:
        """Add ``other``'s counts to these."""
        self.link_bytes.update(other.link_bytes)
        self.virtual_s += other.virtual_s
        self.calls.update(other.calls)
        self.side_plane.update(other.side_plane)


def exact_ints(tensors: list[np.ndarray], op: str) -> bool:
    """Whether integer ``tensors`` reduce exactly on the wire with ``op``: bit operators on int32 values; sums,
    minima and maxima whose fixed-point scale is whole (no bit dropped) and whose every partial result a float32
    holds exactly."""
    if op in ("bor", "band"):
        return all(np.all((t >= -(2**31)) & (t < 2**31)) for t in tensors)
    q = max(fixedpoint.magnitude_exponent(t.astype(np.float64)) for t in tensors)
    bound = sum(int(np.abs(t.astype(np.int64)).max(initial=0)) for t in tensors)
    return bound < EXACT_FLOAT and fixedpoint.scale_for(q, len(tensors) if op == "sum" else 1) >= 0


def as_words(tensor: np.ndarray) -> np.ndarray:
    """A tensor's bytes as int32 words (padded to a whole word)."""
    raw = np.ascontiguousarray(tensor).view(np.uint8).ravel()
    return np.concatenate([raw, np.zeros(-len(raw) % 4, np.uint8)]).view(np.int32)


def from_words(words: np.ndarray, like: np.ndarray, count: int) -> np.ndarray:
    """``count`` values of ``like``'s dtype from int32 ``words`` (``as_words``' inverse)."""
    return np.ascontiguousarray(words, np.int32).view(np.uint8)[: count * like.itemsize].view(like.dtype).copy()


def unit(piece: int, elements: int) -> int:
    """The values a packet of a call of ``piece``-value pieces carries: the fewest packets of at most ``elements``
    that hold a piece, as evenly filled as they can be."""
    packets = max(1, -(-piece // elements))
    return max(1, -(-piece // packets))


def padded(pieces: np.ndarray, unit: int) -> np.ndarray:
    """The rows of ``pieces`` each padded with zeros to whole packets of ``unit`` values, as one flat array."""
    width = max(1, -(-pieces.shape[1] // unit)) * unit
    out = np.zeros((pieces.shape[0], width), pieces.dtype)
    out[:, : pieces.shape[1]] = pieces
    return out.reshape(-1)


def unpadded(whole: np.ndarray, pieces: int, piece: int) -> np.ndarray:
    """``padded``'s inverse: the first ``piece`` values of each of the ``pieces`` rows of ``whole``, as one array."""
    return whole.reshape(pieces, -1)[:, :piece].reshape(-1)


class FabricCollectives:
    """Rank 0's fabric: ``graph`` and ``run`` (topology, mode, faults), one ``LocalRun`` per collective call."""

    def __init__(self, graph: nx.Graph, run: RunSpec) -> None:
        self.graph, self.run = graph, run
        self.tally = Tally()
        self.per_packet = program_of(run).elements  # the job's values a packet

    def collective(self, name: str, op: str, inputs: list[np.ndarray], root: int = 0, per_packet: int = 0) -> list[np.ndarray]:
        """Every rank's result of collective ``name`` (innet.wire.collectives) with operator ``op`` over ``inputs``
        (rank r's flat numpy array at r), ``per_packet`` values a packet (default: the run's): the whole result for
        each rank, its own part for routed collectives being assembled from the parts each rank received."""
        run = replace(self.run, collective=name, root=root, program=PROGRAMS[op], workers=len(inputs),
                      elements=max(1, len(inputs[0])), iterations=1, packet_elements=per_packet or self.run.packet_elements)
        local = LocalRun(self.graph, run, given={r: [t] for r, t in enumerate(inputs)})
        self.tally.virtual_s += local.fabric.run()
        self.tally.link_bytes.update(local.fabric.link_bytes())
        self.tally.calls[name] += 1
        procs = sorted((p for p in local.procs if isinstance(p, WorkerProcess)), key=lambda p: p.spec.rank)
        for proc in procs:
            failed = proc.error or proc.calls[-1].error
            if failed is not None:
                raise RuntimeError(f"innet: {name} failed on the fabric: {failed}")
        values = [np.asarray(p.calls[-1].result) for p in procs]
        if COLLECTIVES[name].delivers == "owner":  # each rank got its shard: the whole is their concatenation
            spec = procs[0].spec
            whole = np.concatenate([COLLECTIVES[name].kept(v, r, len(values), root, spec.elements)
                                    for r, v in enumerate(values)])
            values = [whole for _ in values]
        return values


UFUNCS = {"sum": np.add, "avg": np.add, "min": np.minimum, "max": np.maximum, "band": np.bitwise_and, "bor": np.bitwise_or}


def served(dtype: np.dtype, op: str, inputs: list[np.ndarray]) -> bool:
    """Whether the wire reduces ``inputs`` with ``op`` as torch would: floats by fixed point (not the bit operators),
    integers exactly (``exact_ints``; no average, whose integer rounding torch leaves to the backend)."""
    if dtype.kind == "f" and dtype.itemsize >= 4:
        return op in ("sum", "avg", "min", "max")
    return dtype.kind in "iu" and op != "avg" and exact_ints(inputs, op)


def compute(fabric: FabricCollectives | None, name: str, op: str, inputs: list[np.ndarray], root: int,
            warn: Callable[[str], None]) -> list[np.ndarray]:
    """Every rank's result (each of one length and ``inputs``' dtype) of torch collective ``name``: allreduce,
    reduce_scatter and reduce (the whole reduction: each rank takes its part), all_gather (the concatenation),
    broadcast (the root's), barrier. What the wire cannot carry (with no ``fabric``: anything) is done here, after
    ``warn`` names it."""
    dtype, size = inputs[0].dtype, len(inputs)
    if name in ("all_gather", "broadcast"):
        if fabric is None:
            warn(name)
            return [np.concatenate(inputs) if name == "all_gather" else inputs[root]] * size
        if name == "broadcast":
            return [from_words(g, inputs[root], len(inputs[root]))
                    for g in fabric.collective(name, "bits", [as_words(x) for x in inputs], root)]
        words = np.stack([as_words(x) for x in inputs])
        short = unit(words.shape[1], fabric.per_packet)
        got = fabric.collective(name, "bits", [padded(words, short)] * size, root, short)  # each rank sends its piece
        return [np.concatenate([from_words(row, inputs[0], len(inputs[0])) for row in g.reshape(size, -1)]) for g in got]
    if name == "barrier":
        if fabric is None:
            warn(name)
        else:
            fabric.collective(name, "sum", [np.zeros(1, np.float32)] * size)
        return list(inputs)
    if fabric is None or not served(dtype, op, inputs):
        warn(f"{name} ReduceOp.{op.upper()} on {dtype}")
        exact = UFUNCS[op].reduce(np.stack(inputs), axis=0)
        total = exact / size if op == "avg" else exact
        return [np.asarray(total).astype(dtype) for _ in inputs]
    wire = [x.astype(np.int32 if op in ("bor", "band") else np.float32) for x in inputs]
    if name == "reduce_scatter":  # torch's pieces, each in whole packets of its own
        piece = len(inputs[0]) // size
        short = unit(piece, fabric.per_packet)
        got = [unpadded(g, size, piece) for g in fabric.collective(
            name, op, [padded(x.reshape(size, piece), short) for x in wire], root, short)]
    else:
        got = fabric.collective(name, op, wire, root)
    if dtype.kind in "iu":
        return [np.rint(g).astype(dtype) if g.dtype.kind == "f" else g.astype(dtype) for g in got]
    return [(g / size if op == "avg" else g).astype(dtype) for g in got]
