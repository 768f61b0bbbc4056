"""A training loop's clock: when each gradient is ready to be all-reduced (Pipe-SGD's schedule).

A worker's calls are the layers of each iteration in backward order (last layer
first, as backpropagation produces them), sent FIFO (wait-free backpropagation:
a layer's all-reduce starts once its gradient is computed and the previous
all-reduce is done). Iteration ``i``'s compute (forward, then backward) starts at

    start[i] = max(start[i-1] + compute, comm_end[i - width])

``width`` 1 is BSP: the next forward pass needs this iteration's whole result.
``width`` 2 is Pipe-SGD's pipelining: iteration i+1 computes while iteration i
communicates, on weights one iteration stale. The worker (emulation, with
measured all-reduce times) and the timing model (innet.timing, with predicted
ones) run this same schedule.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import accumulate

from innet.errors import UserError


@dataclass(frozen=True)
class Training:
    forward: float  # seconds of one forward pass
    backward: tuple[float, ...]  # seconds of backward compute before each call of an iteration (send order)
    width: int = 1  # iterations in flight: 1 (BSP) or 2 (pipelined, one iteration stale)

    def __post_init__(self) -> None:
        if self.width not in (1, 2):
            raise UserError(f"--pipeline must be 1 or 2, got {self.width}")

    @property
    def layers(self) -> int:
        return len(self.backward)

    @property
    def compute(self) -> float:
        return self.forward + sum(self.backward)


class TrainingClock:
    """When call ``k`` may start, given the finish time of earlier iterations' last calls."""

    def __init__(self, training: Training, start: float) -> None:
        self.training = training
        self.starts = [start]  # compute start of each iteration known so far
        self.offsets = [training.forward + t for t in accumulate(training.backward)]

    def ready(self, k: int, finished: Callable[[int], float | None]) -> float | None:
        """When call k's gradient exists, given when each call finished (None: not yet);
        None while that depends on communication not yet finished."""
        layers = self.training.layers
        i, j = divmod(k, layers)
        while len(self.starts) <= i:
            before = len(self.starts) - self.training.width  # the iteration whose last call must be done
            end = finished((before + 1) * layers - 1) if before >= 0 else self.starts[0]
            if end is None:
                return None
            self.starts.append(max(self.starts[-1] + self.training.compute, end))
        return self.starts[i] + self.offsets[j]


def run_schedule(training: Training, durations: Sequence[float], start: float = 0.0) -> tuple[list[float], list[float]]:
    """Run the schedule with known all-reduce durations: (each iteration's compute start, each call's end)."""
    clock = TrainingClock(training, start)
    ends: list[float] = []

    def finished(k: int) -> float | None:
        return ends[k] if k < len(ends) else None

    for k, duration in enumerate(durations):
        ready = clock.ready(k, finished)
        assert ready is not None  # every earlier call has ended
        ends.append(max(ready, ends[-1] if ends else start) + duration)
    clock.ready(len(durations), finished)  # close the last iteration's compute start too
    return clock.starts, ends


def iteration_stats(training: Training, starts: Sequence[float], ends: Sequence[float]) -> dict[str, float]:
    """Per-iteration time (mean over the run, from the first compute start to the last call's end)
    and the time compute sat idle waiting on communication (mean per iteration)."""
    iterations = len(ends) // training.layers
    if not iterations:
        return {}
    total = ends[iterations * training.layers - 1] - starts[0]
    busy = iterations * training.compute
    return {"iteration_s": total / iterations, "compute_s": training.compute,
            "comm_wait_s": max(0.0, total - busy) / iterations}
