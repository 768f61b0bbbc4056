"""The seeded gradients a run all-reduces: the same on every backend and in every process (a worker inside a
namespace makes its own from the seed), and checked against the same."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from innet.wire.sparse import topk_with_feedback


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
