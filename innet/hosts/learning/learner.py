"""One worker's share of data-parallel training, as the gradient tensors the all-reduce endpoints read.

A ``Learner`` is a lazy sequence: ``learner[k]`` is step k's gradient (the mean
cross-entropy's over this worker's batch of its shard), computed when the
endpoint begins step k, on the weights the reductions of steps 0..k-1 gave. So
a real model's gradients go through the very machinery seeded tensors do
(``WorkerProcess`` calls in-network, through the PBox or as a ring;
``SSPWorker``'s pushes to the PBox under BSP, SSP or ASP), on either backend.

``bind`` tells the learner where a reduction comes from: a call's result (the
sum of every worker's gradient of that step), or the PBox's parameters read
(``cumulative``: the sum of every gradient pushed so far, stale under SSP/ASP).
Either way the weights are ``w0 - lr / N * (sum of the reduced gradients)``:
plain SGD on the global batch. With ``topk`` a worker sends its gradient's top-k
entries and keeps the rest for its next step (error feedback); with ``clip``
(one fixed-point exponent for a whole SSP run) each value is clipped into range.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from innet.errors import UserError
from innet.hosts.learning.model import Task
from innet.hosts.ssp import SSPWorker
from innet.hosts.worker.process import WorkerProcess
from innet.wire import fixedpoint
from innet.wire.sparse import topk_with_feedback

CLIP_MARGIN = 3  # bits above the first gradient's magnitude an SSP run's one exponent leaves room for
DIVERGED = 10.0  # a batch loss this many times the first step's means training diverged


class Learner(Sequence[np.ndarray]):
    """Worker ``rank``'s gradients of ``task``, step by step (see module doc)."""

    def __init__(self, task: Task, rank: int, topk: float = 0.0) -> None:
        self.task, self.rank, self.topk = task, rank, topk
        self.mlp = task.mlp
        self.x, self.y = task.data.shard(rank)
        self.w0 = self.mlp.init(task.seed)
        self.w = self.w0.copy()
        self.total = np.zeros(self.mlp.size, np.float64)  # the reduced gradients applied so far, summed
        self.applied = 0  # steps whose reduction is in ``w``
        self.reduced: Callable[[int], np.ndarray] = _unbound
        self.cumulative = False
        self.clip: float | None = None
        self.residual = np.zeros(self.mlp.size, np.float32)
        self.first_loss: float | None = None
        self.sent: list[np.ndarray] = []  # what this worker put into each step's reduction
        self.snapshots: list[np.ndarray] = []  # the weights at each epoch's end

    def __len__(self) -> int:
        return self.task.steps

    def bind(self, reduced: Callable[[int], np.ndarray], cumulative: bool = False) -> None:
        self.reduced, self.cumulative = reduced, cumulative

    def _batch(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        epoch, step = divmod(k, self.task.steps_per_epoch)
        order = np.random.default_rng([self.task.seed, self.rank, epoch]).permutation(len(self.y))
        take = order[step * self.task.per_worker : (step + 1) * self.task.per_worker]
        return self.x[take], self.y[take]

    def _apply(self, k: int) -> None:
        """Bring the weights to after step k - 1's reduction."""
        while self.applied < k:
            got = np.asarray(self.reduced(self.applied), np.float64)
            self.total = got if self.cumulative else self.total + got
            self.w = (self.w0 - self.task.lr / self.task.workers * self.total).astype(np.float32)
            self.applied += 1
            if self.applied % self.task.steps_per_epoch == 0:
                self.snapshots.append(self.w)

    def gradient(self, k: int) -> np.ndarray:
        """Step k's gradient on the current weights, before top-k and clipping."""
        with np.errstate(all="ignore"):  # a diverging model overflows: said below, in one line
            loss, grad = self.mlp.loss_and_gradient(self.w, *self._batch(k))
        first = self.first_loss = self.first_loss if self.first_loss is not None else loss
        if not (math.isfinite(loss) and np.isfinite(grad).all()) or loss > DIVERGED * first:
            epoch = k // self.task.steps_per_epoch + 1
            raise UserError(f"training diverged at step {k} (epoch {epoch}): the batch loss is {loss:g} (it started at "
                            f"{first:.3g}); {{lr}} {self.task.lr:g} is too large, try a smaller one")
        return grad

    def __getitem__(self, k: int) -> np.ndarray:  # type: ignore[override]  # a step, never a slice
        if k != len(self.sent) or k >= len(self):
            raise IndexError(f"step {k} asked for, but the learner is at step {len(self.sent)} of {len(self)}")
        self._apply(k)
        grad = self.gradient(k)
        if self.topk:
            acc = grad + self.residual
            grad = topk_with_feedback([acc], self.topk)[0]
            self.residual = acc - grad
        if self.clip is not None:
            grad = np.clip(grad, -self.clip, self.clip)
        self.sent.append(grad)
        return grad

    def bound_exponent(self) -> int:
        """One magnitude exponent for a whole run (SSP's): the first gradient's, plus ``CLIP_MARGIN``
        bits; from now on every gradient is clipped below it, so the run's one scale always fits."""
        q = fixedpoint.magnitude_exponent(self.gradient(0)) + CLIP_MARGIN
        self.clip = math.ldexp(1.0, q) * (1 - 2.0**-20)
        return q

    def history(self) -> list[tuple[float, float]]:
        """(test accuracy, test loss) after each epoch, once every step's reduction came back."""
        self._apply(len(self))
        data = self.task.data
        return [self.mlp.evaluate(w, data.x_test, data.y_test) for w in self.snapshots]


def _unbound(k: int) -> np.ndarray:
    raise RuntimeError("the learner was not bound to an endpoint")


def bind_learner(endpoint: WorkerProcess | SSPWorker, learner: Learner) -> None:
    """Feed ``endpoint``'s reductions back to ``learner`` (its calls' results, or the PBox's parameters read)."""
    if isinstance(endpoint, SSPWorker):
        learner.bind(lambda k: endpoint.read_values(), cumulative=True)
    else:
        learner.bind(lambda k: endpoint.by_tensor[k].result)


def exact_training(task: Task) -> list[tuple[float, float]]:
    """The baseline no network touches: the same learners, each step's gradients summed exactly in float64."""
    learners = [Learner(task, rank) for rank in range(task.workers)]
    sums: list[np.ndarray] = []
    for learner in learners:
        learner.bind(lambda k: sums[k])
    for k in range(task.steps):
        sums.append(np.sum([learner[k].astype(np.float64) for learner in learners], axis=0))
    return learners[0].history()
