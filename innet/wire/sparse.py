"""Top-k sparse gradients (Shi et al.; OmniReduce): selection with error feedback, and the wire form.

A worker keeps the ``k = ceil(fraction * n)`` largest-magnitude entries of each
gradient plus what it dropped before (error feedback: the remainder of a layer
is added to that layer's next gradient), so nothing is lost, only delayed.

On the wire a chunk stays in its slot protocol; only its payload changes. A
chunk whose (index, value) pairs are shorter than its dense values travels as
``SPARSE``: ``[dense_count, i0, v0, i1, v1, ...]`` (int32, indices ascending,
relative to the chunk), else dense as usual. Switches and the PBox densify what
they receive, sum exactly as for dense chunks, and send each sum back sparse
whenever that is shorter (the union of what was sent).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from innet.wire.packet import SPARSE, Packet


def topk_with_feedback(tensors: Sequence[np.ndarray], fraction: float, period: int = 1) -> list[np.ndarray]:
    """What a worker sends of each tensor: its top-k entries after adding the remainder kept from
    the previous tensor of the same layer (``tensors[i]`` and ``tensors[i + period]`` are one layer)."""
    residual: dict[int, np.ndarray] = {}
    out = []
    for i, tensor in enumerate(tensors):
        acc = tensor.astype(np.float32) + residual.get(i % period, np.float32(0))
        k = min(acc.size, max(1, math.ceil(fraction * acc.size)))
        keep = np.argpartition(-np.abs(acc), k - 1)[:k] if acc.size else np.zeros(0, np.int64)
        sent = np.zeros_like(acc)
        sent[keep] = acc[keep]
        residual[i % period] = acc - sent
        out.append(sent)
    return out


def encode(values: np.ndarray) -> np.ndarray | None:
    """The SPARSE payload of a chunk's int32 ``values``, or None when the dense form is no longer."""
    nonzero = np.flatnonzero(values)
    if 1 + 2 * len(nonzero) >= len(values):
        return None
    out = np.empty(1 + 2 * len(nonzero), np.int32)
    out[0], out[1::2], out[2::2] = len(values), nonzero, values[nonzero]
    return out


def decode(payload: np.ndarray, limit: int) -> np.ndarray | None:
    """The dense int32 values of a SPARSE payload, or None when it is malformed (odd pairs, a dense
    count over ``limit``, indices out of range or not strictly ascending)."""
    if len(payload) % 2 != 1:
        return None
    count, index, value = int(payload[0]), payload[1::2].astype(np.int64), payload[2::2]
    if not 0 <= count <= limit or (len(index) and (index[0] < 0 or index[-1] >= count or (np.diff(index) <= 0).any())):
        return None
    dense = np.zeros(count, np.int32)
    dense[index] = value
    return dense


def densify(pkt: Packet, limit: int) -> Packet | None:
    """``pkt`` with a SPARSE payload made dense (the flag cleared); None when it is malformed."""
    if not pkt.has(SPARSE):
        return pkt
    dense = decode(pkt.values, limit)
    return None if dense is None else pkt.replace(dense, flags=int(pkt.hdr["flags"]) & ~SPARSE)


def sparse_bytes(values: np.ndarray) -> int:
    """Payload bytes ``values`` take on the wire: the shorter of the two forms."""
    encoded = encode(values)
    return 4 * (len(values) if encoded is None else len(encoded))


def densify_rows(counts: np.ndarray, values: np.ndarray, limit: int) -> tuple[np.ndarray, np.ndarray]:
    """``decode`` for rows of SPARSE payloads at once (row k's first ``counts[k]`` values): (dense values,
    the rows decoded). Decoded rows stop at the first row of another dense length than the first good
    row's (a short last chunk), so arrival order holds for what is left."""
    counts = counts.astype(np.int64)
    pairs = (counts - 1) // 2
    width = (values.shape[1] - 1) // 2
    index, value = values[:, 1 : 1 + 2 * width : 2].astype(np.int64), values[:, 2 : 2 + 2 * width : 2]
    real = np.arange(width) < pairs[:, None]
    ascending = np.ones_like(real)
    ascending[:, 1:] = index[:, 1:] > index[:, :-1]
    lengths = values[:, 0].astype(np.int64) if values.shape[1] else np.full(len(counts), -1)
    good = ((counts % 2 == 1) & (0 <= lengths) & (lengths <= limit)
            & ~(real & ((index < 0) | (index >= lengths[:, None]) | ~ascending)).any(axis=1))
    if not good.any():
        return np.zeros((len(counts), 0), np.int32), good
    length = lengths[np.argmax(good)]
    other = np.flatnonzero(good & (lengths != length))
    good &= np.arange(len(counts)) < (other[0] if len(other) else len(counts))
    dense = np.zeros((len(counts), length), np.int32)
    take = real & good[:, None]
    dense[np.nonzero(take)[0], index[take]] = value[take]
    return dense, good
