"""What one worker got, whichever backend ran it: its ``WorkerOutcome``, made by the fabric or inside a Mininet
host's own process (which imports this, and nothing of the planner's), then checked (innet.results.check)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from innet.hosts.learning.learner import Learner
from innet.hosts.ssp import SSPWorker
from innet.hosts.worker.process import WorkerProcess
from innet.wire import fixedpoint
from innet.wire.collectives import COLLECTIVES


@dataclass
class WorkerOutcome:
    """What one worker got, whichever backend ran it."""

    job: int
    rank: int
    ints: list[np.ndarray]
    floats: list[np.ndarray]
    started: list[float]
    finished: list[float]
    retransmissions: int
    error: str = ""
    compute_starts: list[float] = field(default_factory=list)  # with a workload: each iteration's
    staleness: list[int] = field(default_factory=list)  # consistency runs: the staleness of every read
    scale: int = 0  # consistency runs: the run's fixed-point scale
    inputs: list[np.ndarray] = field(default_factory=list)  # training runs: the gradients the worker put in, step by step
    history: list[tuple[float, float]] = field(default_factory=list)  # training runs: (test accuracy, loss) per epoch
    spurious: int = 0  # of ``retransmissions``: answered sooner than a round trip could (innet.hosts.recovery)
    host_queued: int = 0  # resends not made: the chunk's last copy was still in this host's queue


def learned(tensors: object, error: object) -> tuple[list[np.ndarray], list[tuple[float, float]]]:
    """A training run's worker's figures: the gradients it sent and, if it finished (no ``error``), its test
    accuracy and loss per epoch; nothing for a worker that reduced seeded tensors."""
    if not isinstance(tensors, Learner):
        return [], []
    return list(tensors.sent), tensors.history() if error is None else []


def training_outcome(worker: SSPWorker) -> WorkerOutcome:
    """A finished SSPWorker's outcome: its final parameters, iterations and the staleness it read."""
    final = [worker.final] if worker.done_at is not None else []
    floats = [fixedpoint.dequantize(worker.final, worker.scale)] if final and worker.scale is not None else []
    return WorkerOutcome(worker.spec.job, worker.spec.rank, final, floats, worker.started, worker.finished,
                         worker.retransmissions, str(worker.error) if worker.error else "", [], worker.staleness,
                         worker.scale or 0, *learned(worker.tensors, worker.error if final else "unfinished"))


def outcome_of(proc: WorkerProcess) -> WorkerOutcome:
    """A finished WorkerProcess's outcome (the fabric's, or a Mininet host's before it saves it)."""
    calls = proc.calls_in_order()  # by tensor: a P3 worker begins them in another order
    done = [(k, c) for k, c in enumerate(calls) if c.finished_at is not None]

    def keep(k: int, values: np.ndarray) -> np.ndarray:
        s = proc.call_spec(k)
        return COLLECTIVES[s.collective].kept(values, s.rank, s.nworkers, s.root, s.elements)

    return WorkerOutcome(
        proc.spec.job, proc.spec.rank, [keep(k, c.result_int) for k, c in done], [keep(k, c.result) for k, c in done],
        [c.started_at if c.started_at is not None else float("nan") for c in calls],
        [c.finished_at if c.finished_at is not None else float("nan") for c in calls],
        sum(c.retransmissions for c in calls), str(proc.error) if proc.error else "", proc.compute_starts, [], 0,
        *learned(proc.tensors, proc.error if len(done) == len(proc.tensors) else "unfinished"),
        spurious=sum(getattr(c, "spurious", 0) for c in calls), host_queued=sum(getattr(c, "host_queued", 0) for c in calls),
    )
