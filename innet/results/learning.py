"""A training run's figures: test accuracy and loss per epoch, emulated time per epoch, time to a target
accuracy; and how each scheme compares with the exact float baseline."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from innet.planning.spec import RunSpec


def scheme(run: RunSpec) -> str:
    """How a training run reduced its gradients: innet, pbox or ring; topk; or bsp, ssp or asp at the PBox."""
    return "topk" if run.topk else run.consistency or run.mode


@dataclass(frozen=True)
class Epoch:
    epoch: int
    accuracy: float  # test accuracy after it
    loss: float
    time_s: float  # emulated seconds from the first step's start to the epoch's last reduction


@dataclass(frozen=True)
class TrainingFigures:
    """A training run's figures in its record (results.json's fields of that name)."""

    train: str
    model: str
    scheme: str
    epochs: list[Epoch]
    accuracy: float
    loss: float
    target_accuracy: float
    time_to_target_s: float | None
    time_per_epoch_s: float


def training_figures(run: RunSpec, outcomes: Sequence[Any]) -> TrainingFigures:
    """From job 1's rank 0 (every worker of an all-reduce holds the same weights; under SSP/ASP rank 0's
    are its own stale view until the final read): accuracy and loss after each epoch, and when the
    epoch's last reduction came back, in emulated seconds from the start of its first step."""
    first = min((o for o in outcomes), key=lambda o: (o.job, o.rank))
    task = run.task(sum(1 for o in outcomes if o.job == first.job))
    origin = first.compute_starts[0] if first.compute_starts else first.started[0] if first.started else 0.0
    epochs = []
    for e, (accuracy, loss) in enumerate(first.history):
        end = (e + 1) * task.steps_per_epoch - 1
        time_s = first.finished[end] - origin if end < len(first.finished) else float("nan")
        epochs.append(Epoch(e + 1, accuracy, loss, time_s))
    reached = [ep.time_s for ep in epochs if ep.accuracy >= task.target]
    return TrainingFigures(
        run.train, run.model, scheme(run), epochs, epochs[-1].accuracy if epochs else float("nan"),
        epochs[-1].loss if epochs else float("nan"), task.target, reached[0] if reached else None,
        epochs[-1].time_s / len(epochs) if epochs else float("nan"),
    )


def learning_lines(runs: Sequence[Any], exact: float | None) -> list[str]:
    """One line per training run: its final accuracy against the exact baseline's, its time to the target."""
    lines = [f"exact float baseline: test accuracy {exact:.4f}"] if exact is not None else []
    for r in runs:
        if not r.get("train"):
            continue
        gap = f" ({100 * (r['accuracy'] - exact):+.2f} points vs exact)" if exact is not None else ""
        target = r["time_to_target_s"]
        reach = f"{target:.3f}s" if target is not None else "not reached"
        lines.append(f"{r['scheme']:>5}: test accuracy {r['accuracy']:.4f}{gap}; {r['time_per_epoch_s']:.3f}s per epoch; "
                     f"{100 * r['target_accuracy']:g}% at {reach}")
    return lines
