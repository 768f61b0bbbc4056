"""The loss term: a call's expected time under per-link loss (see innet.planning.timing)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import networkx as nx
import numpy as np

from innet.hosts.ring import ring_phases
from innet.planning.planner import JobPlan
from innet.planning.prediction import direction_bytes, frame_bytes, one_way
from innet.planning.timing.calls import busiest_direction, hops

MOST_LOST = 0.999  # a try's chance of loss the loss term reckons with, at most (all of them: the call never ends)


def _retry_delays(fail: float, first: float, pace: float, units: int, limit: int = 24) -> np.ndarray:
    """Where the k-th retransmission of a unit lost ``k`` times answers, after its first send would have
    (k = 0..limit): each loss costs a reordering window and a round trip (``first``) plus the units still
    out at that round draining at ``pace`` (a tail probe waits for them), doubled per probe up to four times."""
    spells = [(first + units * fail ** k * pace) * 2 ** min(k - 1, 2) for k in range(1, limit + 1)]
    return np.concatenate([[0.0], np.cumsum(spells)])



def _expected_last(starts: np.ndarray, fails: list[float], first: float, pace: float) -> float:
    """E[the last unit's end]: unit i of every copy ends at ``starts[i]`` plus its retransmissions' delay, copy c
    losing each try with probability ``fails[c]`` (independently): one minus the product of the ends' CDFs,
    integrated."""
    copies = Counter(fails)  # with the same loss everywhere, every copy alike: reckoned once
    ends = {f: _retry_delays(f, first, pace, len(starts)) for f in copies}
    x = np.linspace(0.0, float(starts.max() + max(d[-1] for d in ends.values())), 8000)
    log_cdf = np.zeros_like(x)
    for f, delays in ends.items():
        cdf = np.cumsum((1 - f) * f ** np.arange(len(delays)))
        cdf[-1] = 1.0
        k = np.searchsorted(delays, x[None, :] - starts[:, None], side="right") - 1  # the tries over by x, per unit
        with np.errstate(divide="ignore"):
            log_cdf += copies[f] * np.log(np.where(k < 0, 0.0, cdf[np.clip(k, 0, None)])).sum(axis=0)
    return float(np.sum(1.0 - np.exp(log_cdf)) * (x[1] - x[0]))



def lossy_time(graph: nx.Graph, mode: str, plan: JobPlan, elements: int, per_packet: int, lossless: float,
               loss: Callable[[str, str], float], window: float) -> float:
    """The expected time of a call that takes ``lossless`` without loss, when a frame from u to v is lost with
    probability ``loss(u, v)`` (innet.hosts.recovery: RACK declares a frame lost a reordering window,
    ``window``, after a later one's answer; tail probes; every retransmission repaired from a shadow copy).

    In-network and PBox: every chunk is in flight at once (a slot each), so a loss only delays its own
    chunk: each unit of the call, chunk i over an independent leg (in-network: a link of the tree, whose one
    aggregate or result frame crosses it each way; PBox: one worker's path there and back, N frames on the
    PBox's link), ends at its lossless end, the stream stretched by the retransmissions it carries, plus a
    delay per try lost (``_retry_delays``): the expected last end is the call's. Ring: a rank forwards a
    step's pieces in order, so a hole stalls its stream for the window and a round trip: each span of the
    stream that long stalls when any of its pieces is lost, and a lost retransmission stalls it again."""
    paths = hops(graph, mode, plan)
    lossy = [min(MOST_LOST, 1.0 - float(np.prod([1.0 - loss(u, v) for u, v in p]))) for p in paths]
    loads = direction_bytes(graph, mode, plan, elements, per_packet)
    stream = busiest_direction(graph, loads)[1]
    full, ack = frame_bytes(min(per_packet, elements)), frame_bytes(0)
    rtt = max(one_way(graph, p, full, 0.0, lambda u, v: 0.0) + one_way(graph, [(v, u) for u, v in reversed(p)], ack, 0.0,
                                                                       lambda u, v: 0.0) for p in paths)
    first = window + rtt
    if mode == "ring":
        fail = sum(lossy) / len(lossy)
        segment = -(-elements // len(plan.workers))
        pieces = sum(ring_phases("allreduce")) * (len(plan.workers) - 1) * -(-segment // per_packet)
        stretched = lossless / (1 - fail)
        span = max(1.0, first * pieces / stretched)  # pieces a stall's span of the stream holds
        again = sum(min(2 ** k, 4) * fail ** k for k in range(32))  # a stall, and its retransmission's own losses
        return stretched + pieces / span * (1 - (1 - fail) ** span) * first * again
    chunks = -(-elements // per_packet)
    if mode == "innet":  # each link of the tree, both ways
        legs = {tuple(sorted(uv)) for p in paths for uv in p}
        fails = [min(MOST_LOST, 1.0 - (1.0 - loss(u, v)) * (1.0 - loss(v, u))) for u, v in sorted(legs)]
    else:
        fails = [min(MOST_LOST, 1.0 - (1.0 - f) * (1.0 - b)) for f, b in zip(lossy, _back_losses(paths, loss), strict=True)]
    worst = max(fails)
    stretched = stream / (1 - worst)
    starts = (lossless - stream) + stretched * np.arange(1, chunks + 1) / chunks
    return max(lossless, _expected_last(starts, fails, first, stream / chunks))



def _back_losses(paths: list[list[tuple[str, str]]], loss: Callable[[str, str], float]) -> list[float]:
    return [1.0 - float(np.prod([1.0 - loss(v, u) for u, v in p])) for p in paths]
