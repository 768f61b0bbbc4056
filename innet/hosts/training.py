"""A training loop's clock: when each gradient is ready to be all-reduced (Pipe-SGD's schedule).

A worker's calls are the layers of each iteration in backward order (last layer
first, as backpropagation produces them), each layer possibly cut into slices
(one call each). FIFO sends them in that order (wait-free backpropagation: a
call starts once its gradient is computed and the previous call is done). P3
(priority-based parameter propagation) instead starts, whenever the previous
call is done, the ready call whose layer the next forward pass needs first
(lowest forward index): layer 0's slices overtake the rest of a later layer,
so the next forward pass can begin sooner. Calls are sequential, so a call is
preempted only at a slice boundary: the slice size is the preemption grain.
Every worker of an all-reduce must send the same call at the same time, and
wall clocks jitter, so P3's order is planned once (``p3_order``, from the
timing model's call durations) and every worker follows it.
Iteration ``i``'s compute (forward, then backward) starts at

    start[i] = max(start[i-1] + compute, comm_end[i - width])

``width`` 1 is BSP: the next forward pass needs this iteration's whole result.
With P3 (``layerwise``) it needs it layer by layer instead: layer l's forward
pass starts once layer l-1's is done and layer l's parameters are back, so
layer 0's early return lets the forward pass overlap the rest's communication.
``width`` 2 is Pipe-SGD's pipelining: iteration i+1 computes while iteration i
communicates, on weights one iteration stale. The worker (emulation, with
measured all-reduce times) and the timing model (innet.planning.timing, with predicted
ones) run this same schedule.

Sharded training (FSDP, ZeRO-3: ``phases``) keeps only a shard of each layer: every iteration
all-gathers layer l's parameters before its forward pass and again before its backward pass, and
reduce-scatters its gradient after it (``ShardedClock``). The calls run one at a time in FSDP's
order (forward all-gathers; then backward-prefetch: the all-gather of layer l-1 before the
reduce-scatter of layer l); each all-gather is issued when the compute step before the one it feeds
begins (one layer of prefetch), and a step begins once its parameters are back.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass
from itertools import accumulate

from innet.errors import UserError


@dataclass(frozen=True)
class Training:
    forward: float  # seconds of one forward pass
    backward: tuple[float, ...]  # seconds of backward compute before each call of an iteration (FIFO order)
    width: int = 1  # iterations in flight: 1 (BSP) or 2 (pipelined, one iteration stale)
    layer: tuple[int, ...] = ()  # each call's layer, by forward index (0: needed first); () = one layer each
    order: tuple[int, ...] = ()  # the calls of an iteration in send order (P3's, from p3_order); () = FIFO
    forward_layers: tuple[float, ...] = ()  # seconds of each layer's forward pass, by forward index
    layerwise: bool = False  # P3: layer l's next forward pass starts once layer l's parameters are back
    phases: tuple[str, ...] = ()  # sharded: each call's PHASES entry (FSDP's schedule); () = all-reduce (DDP)

    def __post_init__(self) -> None:
        if self.width not in (1, 2):
            raise UserError(f"{{pipeline}} must be 1 or 2, got {self.width}")

    @property
    def layers(self) -> int:
        return len(self.backward)

    @property
    def compute(self) -> float:
        return self.forward + sum(self.backward)

    def collective(self, k: int) -> str | None:
        """Call k's collective in a sharded schedule (None: the run's own)."""
        return PHASES[self.phases[k % len(self.phases)]] if self.phases else None


PS_SCHEMES = ("kvstore", "whole", "sliced", "priority", "p3")  # --ps: innet.planning.timing.kvstore's parameter servers
PHASES = {"forward": "all_gather", "backward": "all_gather", "gradient": "reduce_scatter"}  # a sharded call's collective


def sharded_calls(layers: int) -> list[tuple[str, int]]:
    """One sharded iteration's calls in FSDP's order, as (phase, layer by forward index): the forward
    all-gathers, then backward-prefetch's (the all-gather of layer l-1 before layer l's reduce-scatter)."""
    out = [("forward", i) for i in range(layers)] + [("backward", layers - 1)]
    for i in reversed(range(layers)):
        out += ([("backward", i - 1)] if i else []) + [("gradient", i)]
    return out


class ShardedClock:
    """``TrainingClock``'s interface for a sharded schedule (module doc): the calls go in their fixed order,
    each once its trigger step (compute) has begun, or for a reduce-scatter once its layer's backward ended."""

    def __init__(self, training: Training, start: float) -> None:
        self.training = training
        self.starts = [start]  # compute start of each iteration known so far
        self.first = 0
        t, n = training, len(training.forward_layers)
        backward = dict(zip(t.layer, t.backward, strict=True))  # a gradient call carries its layer's backward time
        self.seconds = list(t.forward_layers) + [backward.get(i, 0.0) for i in reversed(range(n))]  # step by step
        self.step = [i if p == "forward" else 2 * n - 1 - i for p, i in zip(t.phases, t.layer, strict=True)]

    def _steps(self, i: int, finished: Callable[[int], float | None]) -> list[tuple[float, float]]:
        """Iteration i's compute steps (forward 0..n-1, backward n-1..0) as (start, end), as far as known."""
        base, out, at = i * len(self.step), [], self.starts[i]
        gate = {s: base + j for j, s in enumerate(self.step) if self.training.phases[j] != "gradient"}
        for s, seconds in enumerate(self.seconds):
            back = finished(gate[s])
            if back is None:
                break
            out.append((max(at, back), max(at, back) + seconds))
            at = out[-1][1]
        return out

    def ready(self, k: int, finished: Callable[[int], float | None]) -> float | None:
        """When call k may begin; None while that depends on calls not yet finished."""
        i, j = divmod(k, len(self.step))
        while len(self.starts) <= i:  # the next iteration's forward follows this one's backward
            steps = self._steps(len(self.starts) - 1, finished)
            if len(steps) < len(self.seconds):
                return None
            self.starts.append(steps[-1][1])
        steps, s = self._steps(i, finished), self.step[j]
        if self.training.phases[j] == "gradient":
            return steps[s][1] if s < len(steps) else None
        return self.starts[i] if s == 0 else steps[s - 1][0] if s - 1 < len(steps) else None

    def next_call(self, begun: Container[int], total: int, now: float,
                  finished: Callable[[int], float | None]) -> tuple[int | None, float | None]:
        """As ``TrainingClock.next_call``, in the fixed order."""
        while self.first < total and self.first in begun:
            self.first += 1
        if self.first == total:
            return None, None
        ready = self.ready(self.first, finished)
        return (self.first, None) if ready is not None and ready <= now else (None, ready)


def clock_of(training: Training, start: float) -> TrainingClock | ShardedClock:
    """The clock ``training``'s schedule runs on."""
    return ShardedClock(training, start) if training.phases else TrainingClock(training, start)


class TrainingClock:
    """When each call may start, and which to start next, given when earlier iterations' communication ended.

    Calls are numbered in FIFO order, iteration after iteration; ``finished(k)``
    is when call k ended (None: not yet).
    """

    def __init__(self, training: Training, start: float) -> None:
        self.training = training
        self.starts = [start]  # compute start of each iteration known so far
        self.offsets = [training.forward + t for t in accumulate(training.backward)]
        self.first = 0  # no call before this one is still to begin (calls only ever begin)

    def ready(self, k: int, finished: Callable[[int], float | None]) -> float | None:
        """When call k's gradient exists; None while that depends on communication not yet finished.
        ``finished(k)``: when call k ended (None: not yet)."""
        i, j = divmod(k, self.training.layers)
        while len(self.starts) <= i:
            start = self._next_start(finished)
            if start is None:
                return None
            self.starts.append(start)
        return self.starts[i] + self.offsets[j]

    def _next_start(self, finished: Callable[[int], float | None]) -> float | None:
        """The next iteration's compute start: when the iteration ``width`` back has communicated; with
        ``layerwise``, when its forward pass, gated layer by layer by its parameters' arrival, would have
        begun had it run ungated (the backward pass follows the whole forward pass either way)."""
        t = self.training
        before = len(self.starts) - t.width  # the iteration whose communication must be done
        if before < 0:
            return self.starts[-1] + t.compute
        if t.layerwise:
            at = self.starts[-1] + t.compute  # the previous backward pass is done
            for layer, seconds in enumerate(t.forward_layers):
                back = layer_end(t, finished, before, layer)
                if back is None:
                    return None
                at = max(at, back) + seconds
            return at - t.forward
        end = iteration_end(t, finished, before)
        return None if end is None else max(self.starts[-1] + t.compute, end)

    def next_call(self, begun: Container[int], total: int, now: float,
                  finished: Callable[[int], float | None]) -> tuple[int | None, float | None]:
        """(the call to start at ``now``, None), or (None, when to ask again; None: after more calls end):
        the next call of the send order (FIFO, or ``order`` in each iteration), once its gradient exists."""
        while self.first < total and self.first in begun:
            self.first += 1
        if self.first == total:
            return None, None
        first = self.first
        base = first - first % self.training.layers
        k = next(base + j for j in self.training.order if base + j not in begun) if self.training.order else first
        ready = self.ready(k, finished)
        return (k, None) if ready is not None and ready <= now else (None, ready)


def p3_order(training: Training, durations: Sequence[float]) -> tuple[int, ...]:
    """P3's send order of one iteration's calls, given their durations (FIFO numbering): whenever a call
    ends, the ready call of the lowest layer (then FIFO) starts, so layer 0 overtakes at the next call."""
    ready = [training.forward + t for t in accumulate(training.backward)]
    layer = training.layer or tuple(range(training.layers - 1, -1, -1))
    pending, order, now = set(range(training.layers)), [], 0.0
    while pending:
        due = [k for k in pending if ready[k] <= now]
        if not due:
            now = min(ready[k] for k in pending)
            continue
        k = min(due, key=lambda k: (layer[k], k))
        pending.remove(k)
        order.append(k)
        now += durations[k]
    return tuple(order)


def iteration_end(training: Training, ends: Callable[[int], float | None], i: int) -> float | None:
    """When iteration i's communication ended: its calls' latest end (None while one is unfinished)."""
    times = [ends(k) for k in range(i * training.layers, (i + 1) * training.layers)]
    return None if any(t is None for t in times) else max(t for t in times if t is not None)


def layer_end(training: Training, ends: Callable[[int], float | None], i: int, layer: int) -> float | None:
    """When iteration i's calls of ``layer`` (forward index: its slices) all ended; None while one is unfinished."""
    layers = training.layer or tuple(range(training.layers - 1, -1, -1))
    times = [ends(i * training.layers + j) for j in range(training.layers) if layers[j] == layer]
    return None if any(t is None for t in times) else max((t for t in times if t is not None), default=0.0)


def run_schedule(training: Training, durations: Sequence[float], start: float = 0.0) -> tuple[list[float], list[float]]:
    """Run the schedule with known all-reduce durations (FIFO numbering): (each iteration's compute
    start, each call's end)."""
    clock = clock_of(training, start)
    ends: dict[int, float] = {}
    begun: set[int] = set()
    now = start
    while len(begun) < len(durations):
        k, when = clock.next_call(begun, len(durations), now, ends.get)
        if k is None:
            assert when is not None  # every earlier call has ended
            now = when
            continue
        begun.add(k)
        now = ends[k] = now + durations[k]
    clock.ready(len(durations), ends.get)  # close the last iteration's compute start too
    return clock.starts, [ends[k] for k in range(len(durations))]


WARMUP = 1  # iterations the figures leave out: the first (its forward pass waits on nothing; a pipeline fills)


def warmup(iterations: int) -> int:
    """How many of ``iterations`` the steady-state figures leave out: ``WARMUP``, fewer where none would remain."""
    return max(0, min(WARMUP, iterations - 1))


def iteration_stats(training: Training, starts: Sequence[float], ends: Sequence[float]) -> dict[str, float]:
    """The steady state, warm-up iterations (``warmup``) left out: the time per iteration (from the end of the
    last warm-up iteration's communication to the last call's end, over the iterations between; with none left
    out, from the first compute start), the time compute sat idle waiting on communication, and the time from
    each backward pass's end until its layer 0 was all-reduced, so the next forward pass could begin (means per
    iteration). One warm-up iteration is enough for every schedule here: from the second on, each iteration
    ends one period after the one before (tests/test_training.py)."""
    layers = training.layers
    iterations = len(ends) // layers
    if not iterations:
        return {}
    done = list(accumulate((max(ends[i * layers:(i + 1) * layers]) for i in range(iterations)), max))
    skip = warmup(iterations)
    counted = iterations - skip
    total = done[-1] - (done[skip - 1] if skip else starts[0])
    layer = training.layer or tuple(range(layers - 1, -1, -1))
    first = [j for j in range(layers) if layer[j] == 0]
    waits = [max(ends[i * layers + j] for j in first) - (starts[i] + training.compute) for i in range(skip, iterations)]
    return {"iteration_s": total / counted, "compute_s": training.compute,
            "comm_wait_s": max(0.0, total - counted * training.compute) / counted,
            "next_forward_wait_s": sum(waits) / counted}
