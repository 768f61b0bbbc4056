"""A real model to train through the network: a numpy MLP classifier on scikit-learn's handwritten digits.

``Task`` says what to train (data set, model, epochs, global batch, learning rate,
seed); ``Data`` is the data set, split once (seeded) into a training and a test
set, the training set dealt round-robin into one shard per worker. ``MLP`` is
one hidden ReLU layer and a softmax output, its parameters one flat float32
vector (what a worker all-reduces each step), with the mean cross-entropy's
gradient over a batch. Nothing is downloaded: ``load_digits`` ships with
scikit-learn (1,797 8x8 images).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np

from innet.errors import UserError

DATASETS = ("digits",)
MODELS = ("mlp",)


@dataclass(frozen=True)
class Task:
    """What to train, the same on every backend and for every mode."""

    dataset: str = "digits"
    model: str = "mlp"
    epochs: int = 10
    batch: int = 32  # the global batch: every step each of the N workers takes batch / N samples of its shard
    lr: float = 0.5
    hidden: int = 64
    seed: int = 0
    workers: int = 4
    target: float = 0.95  # the accuracy whose time to reach is reported

    def __post_init__(self) -> None:
        if self.dataset not in DATASETS:
            raise UserError(f"unknown data set {self.dataset!r}; choose from {', '.join(DATASETS)}")
        if self.model not in MODELS:
            raise UserError(f"unknown model {self.model!r}; choose from {', '.join(MODELS)}")
        if self.epochs < 1 or self.hidden < 1 or not self.lr > 0:
            raise UserError(f"{{epochs}} and the hidden width must be at least 1 and {{lr}} positive, "
                            f"got {self.epochs}, {self.hidden}, {self.lr:g}")
        if self.batch < self.workers or self.batch % self.workers or self.batch > len(self.data.y_train):
            raise UserError(f"{{batch}} {self.batch} does not divide among the {self.workers} workers: "
                            f"give a multiple of {self.workers}, at most the {len(self.data.y_train)} training samples")

    @property
    def per_worker(self) -> int:
        return self.batch // self.workers

    @cached_property
    def data(self) -> Data:
        return load_data(self.dataset, self.seed, self.workers)

    @property
    def steps_per_epoch(self) -> int:
        """The training set once per epoch, a global batch a step (the same for any number of workers)."""
        return len(self.data.y_train) // self.batch

    @property
    def steps(self) -> int:
        return self.epochs * self.steps_per_epoch

    @cached_property
    def mlp(self) -> MLP:
        return MLP(self.data.features, self.hidden, self.data.classes)


@dataclass(frozen=True)
class Data:
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    workers: int

    @property
    def features(self) -> int:
        return int(self.x_train.shape[1])

    @property
    def classes(self) -> int:
        return int(max(self.y_train.max(), self.y_test.max()) + 1)

    @property
    def shard_size(self) -> int:
        """Samples every worker's shard has (the shards are cut to the smallest)."""
        return len(self.y_train) // self.workers

    def shard(self, rank: int) -> tuple[np.ndarray, np.ndarray]:
        take = np.arange(rank, len(self.y_train), self.workers)[: self.shard_size]
        return self.x_train[take], self.y_train[take]


@lru_cache(maxsize=8)
def load_data(name: str, seed: int, workers: int, test_fraction: float = 0.2) -> Data:
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng([seed, 19]).permutation(len(y))
    x, y = (x[order] / 16.0).astype(np.float32), y[order].astype(np.int64)
    cut = int(round(len(y) * (1 - test_fraction)))
    return Data(x[:cut], y[:cut], x[cut:], y[cut:], workers)


class MLP:
    """``features -> hidden (ReLU) -> classes (softmax)``; parameters as one flat float32 vector."""

    def __init__(self, features: int, hidden: int, classes: int) -> None:
        self.shapes = [(features, hidden), (hidden,), (hidden, classes), (classes,)]
        self.sizes = [int(np.prod(s)) for s in self.shapes]
        self.size = sum(self.sizes)

    def init(self, seed: int) -> np.ndarray:
        """He-initialised weights, zero biases (seeded: every worker and every mode starts the same)."""
        rng = np.random.default_rng([seed, 20])
        parts = [rng.standard_normal(s) * np.sqrt(2.0 / s[0]) if len(s) == 2 else np.zeros(s) for s in self.shapes]
        return np.concatenate([p.ravel() for p in parts]).astype(np.float32)

    def unpack(self, flat: np.ndarray) -> list[np.ndarray]:
        cuts = np.cumsum(self.sizes)[:-1]
        return [p.reshape(s) for p, s in zip(np.split(flat, cuts), self.shapes, strict=True)]

    def _forward(self, w: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
        """(hidden activations, softmax probabilities, mean cross-entropy), the loss from the log-softmax:
        it grows without bound as the model diverges, as it should, instead of saturating."""
        w1, b1, w2, b2 = self.unpack(w)
        h = np.maximum(x @ w1 + b1, 0)
        z = h @ w2 + b2
        z = z - z.max(axis=1, keepdims=True)
        e = np.exp(z)
        total = e.sum(axis=1, keepdims=True)
        loss = float(np.mean(np.log(total[:, 0]) - z[np.arange(len(y)), y]))
        return h, e / total, loss

    def loss_and_gradient(self, w: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
        """Mean cross-entropy over the batch and its gradient (flat, float32)."""
        w1, _, w2, _ = self.unpack(w)
        h, p, loss = self._forward(w, x, y)
        dz = p.copy()
        dz[np.arange(len(y)), y] -= 1
        dz /= len(y)
        dh = (dz @ w2.T) * (h > 0)
        grads = [x.T @ dh, dh.sum(axis=0), h.T @ dz, dz.sum(axis=0)]
        return loss, np.concatenate([g.ravel() for g in grads]).astype(np.float32)

    def evaluate(self, w: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
        """(accuracy, mean cross-entropy) on ``x, y``."""
        _, p, loss = self._forward(w, x, y)
        return float(np.mean(p.argmax(axis=1) == y)), loss
