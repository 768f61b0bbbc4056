"""Training a real model through the network (``train``): one run per scheme, and the exact float baseline.

Every scheme trains from the same initial weights on the same shards (both follow from the run's seed):
in-network, through the PBox, as a ring, top-k with error feedback (in-network), and against the PBox as a
parameter server under SSP and ASP. The baseline sums every step's gradients exactly, in float64.
"""

from __future__ import annotations

from dataclasses import replace

from innet.hosts.learning.learner import exact_training
from innet.planning.spec import RunSpec

SCHEMES = ("innet", "pbox", "ring", "topk", "ssp", "asp")


def scheme_spec(run: RunSpec, scheme: str, topk: float = 0.01, staleness: int = 3) -> RunSpec:
    """``run`` set to train with ``scheme`` (one of ``SCHEMES``)."""
    plain = replace(run, topk=0.0, consistency="", staleness=0,
                    program="sum_allreduce" if run.program == "topk_sparse" else run.program)
    if scheme == "topk":
        return replace(plain, mode="innet", topk=topk, program="topk_sparse")
    if scheme in ("ssp", "asp"):
        return replace(plain, mode="pbox", consistency=scheme, staleness=staleness if scheme == "ssp" else 0)
    return replace(plain, mode=scheme)


def scheme_specs(run: RunSpec, topk: float = 0.01, staleness: int = 3) -> list[RunSpec]:
    """``run`` once per scheme, in ``SCHEMES`` order."""
    return [scheme_spec(run, s, topk, staleness) for s in SCHEMES]


def exact_history(run: RunSpec, workers: int) -> list[tuple[float, float]]:
    """The exact float baseline's (test accuracy, loss) per epoch, with ``workers`` workers."""
    return exact_training(run.task(workers))
