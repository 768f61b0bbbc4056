"""The timing model of training against the PBox under BSP, SSP(s) or ASP (innet.hosts.ssp).

Each worker computes iteration t (its own seeded times: stragglers included), pushes its gradient's
keys, and reads the parameters back; the PBox answers a push of iteration t once every worker has
pushed iteration ``t - s`` (BSP: s = 0; ASP: never waits; the final empty push T is answered under
BSP). The model runs that loop at stream granularity, in events:

- a worker's push is one stream on the PBox's incoming link, an answer one stream on its outgoing
  link; each link is shared equally among the streams on it (processor sharing), each stream
  capped by its worker's own link and by its window of slots per round trip;
- an answer stream starts when the push starts and every worker it waits for has started pushing
  iteration ``t - s`` (keys are answered as they arrive), and ends no earlier than one key's round
  trip after its own last key and the last key it waits for have arrived.

``completion_s`` is what the run measures: from the first compute to the last worker's final read.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable

import networkx as nx

from innet.planning.planner import JobPlan
from innet.planning.prediction import frame_bytes, link_rate, one_way, path_links
from innet.planning.spec import RunSpec

Delay = Callable[[str, str], float]


class _SharedLink:
    """One link direction shared equally by its active streams (each capped at its own rate)."""

    def __init__(self, rate: float) -> None:
        self.rate, self.now = rate, 0.0
        self.left: dict[tuple[int, int], float] = {}  # bytes each active stream still has to send
        self.cap: dict[tuple[int, int], float] = {}

    def _share(self) -> dict[tuple[int, int], float]:
        """Max-min fair rates: streams capped below the equal share keep their cap, the rest share what is left."""
        out: dict[tuple[int, int], float] = {}
        rate, open_ = self.rate, sorted(self.left, key=lambda k: self.cap[k])
        while open_:
            fair = rate / len(open_)
            k = open_[0]
            if self.cap[k] > fair:
                out.update({k: fair for k in open_})
                break
            out[k], rate = self.cap[k], rate - self.cap[k]
            open_.pop(0)
        return out

    def add(self, key: tuple[int, int], size: float, cap: float) -> None:
        self.left[key], self.cap[key] = size, cap

    def next_done(self) -> float:
        share = self._share()
        return min((self.now + self.left[k] / share[k] for k in self.left), default=math.inf)

    def advance(self, to: float) -> list[tuple[int, int]]:
        """Move to time ``to``; the streams that finished by then."""
        share = self._share()
        for k in self.left:
            self.left[k] -= share[k] * (to - self.now)
        self.now = to
        done = [k for k, b in self.left.items() if b <= 1e-6]
        for k in done:
            del self.left[k], self.cap[k]
        return done


def _tails_and_caps(graph: nx.Graph, paths: list[list[tuple[str, str]]], slots: int, per_packet: int, hop: float,
                    delay: Delay) -> tuple[list[float], list[float]]:
    """Each worker's round trip for one packet to the PBox and back, and the rate its pushes can reach: its
    path's slowest link, or the slots' window over that round trip."""
    tails, caps = [], []
    for path in paths:
        back = [(v, u) for u, v in reversed(path)]
        tail = one_way(graph, path, frame_bytes(per_packet), hop, delay) + one_way(graph, back, frame_bytes(per_packet + 1), hop, delay)
        tails.append(tail)
        caps.append(min(min(link_rate(graph, u, v) for u, v in path), slots * frame_bytes(per_packet) / tail))
    return tails, caps


def consistency_time(graph: nx.Graph, run: RunSpec, plan: JobPlan, per_packet: int, hop: float,
                     delay: Delay = lambda u, v: 0.0) -> float:
    """Predicted seconds from the first compute to the last worker's final read (see module doc)."""
    assert plan.pbox is not None
    workers, iterations = list(plan.workers), run.iterations
    n, cons = len(workers), run.parameter_server()
    sizes = [min(per_packet, run.elements - k) for k in range(0, run.elements, per_packet)]
    push, answer = float(sum(frame_bytes(c) for c in sizes)), float(sum(frame_bytes(c + 1) for c in sizes))
    final_push = float(len(sizes) * frame_bytes(0))
    compute = [run.compute_times(w, plan.job, rank) + [0.0] for rank, w in enumerate(workers)]
    paths = [path_links(graph, w, plan.pbox) for w in workers]
    into = paths[0][-1]
    incoming, outgoing = _SharedLink(link_rate(graph, *into)), _SharedLink(link_rate(graph, into[1], into[0]))
    tails, caps = _tails_and_caps(graph, paths, plan.slots, per_packet, hop, delay)

    def waits_for(t: int) -> int:  # the iteration every worker must have pushed before (w, t) is answered
        return t if t >= iterations else t - int(min(cons.bound, t + 1))

    started: dict[tuple[int, int], float] = {}
    arrived: dict[tuple[int, int], float] = {}
    answered: dict[tuple[int, int], float] = {}
    unreleased: set[tuple[int, int]] = set()
    unfinished: set[tuple[int, int]] = set()
    # the exponent's answers leave the PBox one after another, by rank: that lead is what desynchronizes SSP and ASP
    offset = frame_bytes(0) / outgoing.rate
    ready = [(compute[r][0] + r * offset, r, 0) for r in range(n)]  # (push-ready time, rank, iteration)
    heapq.heapify(ready)
    done = 0.0
    while ready or incoming.left or outgoing.left or unreleased or unfinished:
        now = min(ready[0][0] if ready else math.inf, incoming.next_done(), outgoing.next_done())
        if now == math.inf:
            raise RuntimeError("consistency model stalled")  # pragma: no cover - a bug, not a user error
        for k in incoming.advance(now):
            arrived[k] = now
        for k in outgoing.advance(now):
            answered[k] = now
        while ready and ready[0][0] <= now:
            _, r, t = heapq.heappop(ready)
            started[(r, t)] = now
            incoming.add((r, t), final_push if t == iterations else push, caps[r])
            unreleased.add((r, t))
            unfinished.add((r, t))
        for r, t in sorted(unreleased):
            need = waits_for(t)
            if need < 0 or all((v, need) in started for v in range(n)):
                unreleased.discard((r, t))
                outgoing.add((r, t), answer, caps[r])
        for r, t in sorted(unfinished):
            need = waits_for(t)
            others = [(v, need) for v in range(n)] if need >= 0 else []
            if (r, t) in answered and (r, t) in arrived and all(o in arrived for o in others):
                unfinished.discard((r, t))
                end = max(answered[(r, t)], max(arrived[o] for o in [(r, t), *others]) + tails[r])
                if t == iterations:
                    done = max(done, end)
                else:
                    heapq.heappush(ready, (end + compute[r][t + 1], r, t + 1))
    return done
