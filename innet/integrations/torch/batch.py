"""What the ``innet`` group's rank 0 makes of the torch calls every rank has made (innet.integrations.torch.plane):
each through the fabric as innet's collective where the wire carries it exactly (innet.integrations.torch.fabric),
else computed here, with a warning naming it; small all-reduces in flight together travel as one collective when
that leaves every value as it would be alone (``fuse``).

Fusing. A script that issues thousands of one-float all-reduces without waiting (a test suite, a loop of metrics)
would cost a fabric run each. All-reduces of at most one packet each, waiting at rank 0 together, with the same
operator and dtype, whose values agree on the same fixed-point exponent (the max over the ranks, what the workers'
first round agrees on), travel as one collective of their concatenation, up to ``FUSED_PACKETS`` packets: the scale
every worker quantizes with is the one each call would have had, and the switches combine element by element, so
every value is bit for bit what the call alone gives. What the links carry is what a framework that fuses small
tensors (Horovod's tensor fusion, DDP's buckets) would send: one exponent round and full packets. The launcher
says how many calls travelled so.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from innet.hosts.p2p.wire import EXCHANGE
from innet.integrations.torch.fabric import (
    PROGRAMS,
    FabricCollectives,
    as_words,
    exact_ints,
    from_words,
    padded,
    unit,
    unpadded,
)
from innet.integrations.torch.forms import torch_name
from innet.switch.loader import load_program
from innet.wire.operators import BAND, BOR, MAX, MIN, SUM, Operator

UFUNCS = {"sum": np.add, "avg": np.add, "min": np.minimum, "max": np.maximum, "band": np.bitwise_and,
          "bor": np.bitwise_or, "bxor": np.bitwise_xor, "prod": np.multiply}


def _operator(op: str) -> Operator:
    """The operator of the program innet runs torch's ``op`` with."""
    operator = getattr(load_program(PROGRAMS[op]), "operator", None)
    assert isinstance(operator, Operator)
    return operator


OPERATORS: dict[str, Operator] = {"sum": SUM, "avg": SUM, "min": MIN, "max": MAX, "band": BAND, "bor": BOR,
                                  "bxor": _operator("bxor"), "prod": _operator("prod")}
FUSED_PACKETS = 64  # the most packets a fused collective takes
EXCHANGES = ("all_to_all", "gather", "scatter")  # torch's calls that are messages between pairs of ranks
Warn = Callable[[str], None]
Inputs = list[np.ndarray]  # one call's flat values, rank r's at r
Taken = list["np.ndarray | None"]  # what each rank takes of a call's result (None: nothing, as a reduce's non-root)


def carried(name: str, op: str, dtype: np.dtype) -> bool:
    """Whether the wire can carry torch's ``name`` with ``op`` on ``dtype`` at all (whatever the values): moves of
    any dtype; reductions of float32 and float64 (sum, avg, min, max) and of integers (sum, min, max, band, bor, prod,
    and avg, done here). What it cannot, the group hands to the side plane's gloo itself."""
    if name in ("all_gather", "broadcast", "barrier", *EXCHANGES):
        return True
    if dtype.kind == "f" and dtype.itemsize >= 4:
        return op in ("sum", "avg", "min", "max")
    return dtype.kind in "iu"


def product_fits(inputs: Inputs) -> bool:
    """Whether the product of integer ``inputs`` (as torch computes it: int64, modulo 2**64) fits int32, so the
    wire's product modulo 2**32 is the same."""
    total = np.multiply.reduce(np.stack([x.astype(np.int64) for x in inputs]), axis=0)
    return bool(np.all((total >= -(2**31)) & (total < 2**31)))


def served(dtype: np.dtype, op: str, inputs: Inputs) -> bool:
    """Whether the wire reduces ``inputs`` with ``op`` as torch would: floats by fixed point (not the bit operators),
    integers exactly (``exact_ints``; a product modulo 2**32: ``product_fits`` for wider integers; no average, whose
    integer rounding torch leaves to the backend)."""
    if dtype.kind == "f" and dtype.itemsize >= 4:
        return op in ("sum", "avg", "min", "max")
    if dtype.kind not in "iu" or op == "avg":
        return False
    if op == "prod":
        return dtype.itemsize <= 4 or product_fits(inputs)
    return exact_ints(inputs, op)


def _wire(op: str, inputs: Inputs) -> Inputs:
    return [x.astype(np.int32 if OPERATORS[op].rule == "bits" else np.float32) for x in inputs]


def _back(got: np.ndarray, dtype: np.dtype, op: str, size: int) -> np.ndarray:
    """A wire result as torch's dtype (a mean divided here)."""
    if dtype.kind in "iu":
        return (np.rint(got) if got.dtype.kind == "f" else got).astype(np.int64).astype(dtype)
    return (got / size if op == "avg" else got).astype(dtype)


def sizes_and_bytes(values: np.ndarray, size: int) -> tuple[list[int], np.ndarray]:
    """An exchange's values as a rank sent them (``exchange_values``): the bytes it sends each rank, and those bytes."""
    raw = values.view(np.uint8)
    return np.frombuffer(raw[: 8 * size].tobytes(), "<i8").tolist(), raw[8 * size :]


def exchange_values(sizes: list[int], payload: np.ndarray) -> np.ndarray:
    """A rank's values of an exchange call: the bytes it sends to each rank (int64 each), then those bytes in rank
    order, as one uint8 array (what the call plane carries)."""
    return np.concatenate([np.asarray(sizes, "<i8").view(np.uint8), payload.view(np.uint8).ravel()])


def exchange_pairs(name: str, size: int, root: int) -> list[tuple[int, int]]:
    """The messages (sender, receiver) an exchange of ``size`` ranks sends, whatever their sizes: all_to_all one
    from every rank to every other, gather one from every other rank to ``root``, scatter one from ``root`` to every
    other. Empty ones too: a rank in a host of its own (Mininet) cannot know which of the bytes it awaits are none,
    so both backends send the same messages and the planner predicts them alike."""
    if name == "all_to_all":
        return [(s, d) for s in range(size) for d in range(size) if s != d]
    if name == "gather":
        return [(s, root) for s in range(size) if s != root]
    return [(root, d) for d in range(size) if d != root]


def exchange_parts(values: np.ndarray, size: int) -> list[bytes]:
    """A rank's values of an exchange call (``exchange_values``) as the bytes it sends each rank, in rank order."""
    sizes, raw = sizes_and_bytes(values, size)
    ends = np.cumsum([0, *sizes])
    return [raw[ends[d] : ends[d + 1]].tobytes() for d in range(size)]


def exchanged(fabric: FabricCollectives | None, name: str, inputs: Inputs, root: int, warn: Warn) -> Taken:
    """An exchange (all_to_all, gather, scatter: ``EXCHANGES``): every rank's bytes to each rank ``exchange_pairs``
    names as messages through the network (innet.hosts.p2p), its own kept; what each rank takes is what it received,
    in rank order."""
    size = len(inputs)
    parts = [exchange_parts(values, size) for values in inputs]
    posts = [(s, d, parts[s][d]) for s, d in exchange_pairs(name, size, root)]
    if fabric is None:
        warn(name)
        got: list[list[list[bytes]]] = [[[] for _ in range(size)] for _ in range(size)]
        for s, d, data in posts:
            got[d][s].append(data)
    else:
        fabric.tally.calls[name] += 1
        got = fabric.messages(size, posts, EXCHANGE)
    return [np.frombuffer(b"".join(parts[d][d] if s == d else b"".join(got[d][s]) for s in range(size)), np.uint8)
            for d in range(size)]


def compute(fabric: FabricCollectives | None, name: str, op: str, inputs: Inputs, root: int, warn: Warn) -> Taken:
    """What each rank takes of torch collective ``name`` (allreduce, reduce_scatter: its piece, reduce: the root
    alone, all_gather: the concatenation, broadcast: the root's, barrier: nothing; an exchange: ``exchanged``). What
    the wire cannot carry (with no ``fabric``: anything) is done here, after ``warn`` names it."""
    if name in EXCHANGES:
        return exchanged(fabric, name, inputs, root, warn)
    whole = _whole(fabric, name, op, inputs, root, warn)
    size = len(inputs)
    if name == "reduce_scatter":
        return list(np.split(whole, size))
    if name == "reduce":
        return [whole if r == root else None for r in range(size)]
    return [None if name == "barrier" else whole] * size


def _whole(fabric: FabricCollectives | None, name: str, op: str, inputs: Inputs, root: int, warn: Warn) -> np.ndarray:
    """The whole result of ``compute``'s call; a call that goes through the network counted."""
    dtype, size = inputs[0].dtype, len(inputs)
    if fabric is not None and (name in ("all_gather", "broadcast", "barrier") or served(dtype, op, inputs)):
        fabric.tally.calls[name] += 1
    if name in ("all_gather", "broadcast"):
        if fabric is None:
            warn(name)
            return np.concatenate(inputs) if name == "all_gather" else inputs[root]
        if name == "broadcast":
            got = fabric.collective(name, "bits", [as_words(x) for x in inputs], root)[0]
            return from_words(got, inputs[root], len(inputs[root]))
        words = np.stack([as_words(x) for x in inputs])
        short = unit(words.shape[1], fabric.per_packet)
        got = fabric.collective(name, "bits", [padded(words, short)] * size, root, short)[0]  # each sends its piece
        return np.concatenate([from_words(row, inputs[0], len(inputs[0])) for row in got.reshape(size, -1)])
    if name == "barrier":
        if fabric is None:
            warn(name)
        else:
            fabric.collective(name, "sum", [np.zeros(1, np.float32)] * size)
        return inputs[0][:0]
    if fabric is None or not served(dtype, op, inputs):
        warn(f"{name} ReduceOp.{torch_name(op)} on {dtype}")
        exact = UFUNCS[op].reduce(np.stack(inputs), axis=0)
        return np.asarray(exact / size if op == "avg" else exact).astype(dtype)
    wire = _wire(op, inputs)
    if name == "reduce_scatter":  # torch's pieces, each in whole packets of its own
        piece = len(inputs[0]) // size
        short = unit(piece, fabric.per_packet)
        got = unpadded(fabric.collective(name, op, [padded(x.reshape(size, piece), short) for x in wire], root, short)[0],
                       size, piece)
    else:
        got = fabric.collective(name, op, wire, root)[root]  # a reduce's result is its root's
    return _back(got, dtype, op, size)


def fusion_key(fabric: FabricCollectives, name: str, op: str, inputs: Inputs) -> tuple[object, ...] | None:
    """What an all-reduce of at most one packet must share with others to travel fused with them (None: it travels
    alone): its operator, dtype and agreed exponent."""
    if name != "allreduce" or not 0 < len(inputs[0]) <= fabric.per_packet or not served(inputs[0].dtype, op, inputs):
        return None
    operator = OPERATORS[op]
    return op, inputs[0].dtype.str, max(operator.exponent(w) for w in _wire(op, inputs))


def fuse(fabric: FabricCollectives, op: str, calls: list[Inputs]) -> list[Taken]:
    """All-reduces ``calls`` (of one ``fusion_key``) as one collective of their concatenation: each one's result."""
    size, dtype = len(calls[0]), calls[0][0].dtype
    whole = [np.concatenate([c[r] for c in calls]) for r in range(size)]
    planned = 1 << (len(whole[0]) - 1).bit_length()  # one plan for sizes up to a power of two
    got = _back(fabric.collective("allreduce", op, _wire(op, whole), planned=planned)[0], dtype, op, size)
    ends = np.cumsum([len(c[0]) for c in calls])[:-1]
    fabric.tally.calls["allreduce"] += len(calls)
    fabric.tally.fused += len(calls)
    fabric.tally.fusions += 1
    return [[part] * size for part in np.split(got, ends)]


def compute_batch(fabric: FabricCollectives | None, calls: list[tuple[str, str, int, Inputs]],
                  warn: Warn) -> list[Taken | Exception]:
    """``compute`` of each of ``calls`` (name, operator, root, every rank's values), those that may travel fused
    (``fusion_key``) together, up to ``FUSED_PACKETS`` packets each time: each call's result, or what failed it."""
    out: list[Taken | Exception | None] = [None] * len(calls)
    groups: dict[tuple[object, ...], list[int]] = {}
    for i, (name, op, root, inputs) in enumerate(calls):
        key = fusion_key(fabric, name, op, inputs) if fabric is not None else None
        if key is not None:
            groups.setdefault(key, []).append(i)
            continue
        try:
            out[i] = compute(fabric, name, op, inputs, root, warn)
        except Exception as exc:  # noqa: BLE001 (this call's, on every rank)
            out[i] = exc
    assert fabric is not None or not groups
    for key, members in groups.items():
        op = str(key[0])
        start = 0
        while start < len(members):
            take: list[int] = []
            values = 0
            for i in members[start:]:
                if take and values + len(calls[i][3][0]) > FUSED_PACKETS * fabric.per_packet:  # type: ignore[union-attr]
                    break
                take.append(i)
                values += len(calls[i][3][0])
            start += len(take)
            try:
                if len(take) == 1:
                    results: list[Taken] = [compute(fabric, "allreduce", op, calls[take[0]][3], 0, warn)]
                else:
                    results = fuse(fabric, op, [calls[i][3] for i in take])  # type: ignore[arg-type]
            except Exception as exc:  # noqa: BLE001
                results = [exc] * len(take)  # type: ignore[list-item]
            for i, result in zip(take, results, strict=True):
                out[i] = result
    return [r if r is not None else RuntimeError("innet: call not run") for r in out]
