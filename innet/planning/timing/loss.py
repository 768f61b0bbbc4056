"""The loss term: a call's expected time under per-link loss (see innet.planning.timing)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import networkx as nx
import numpy as np

from innet.hosts.ring.acks import WINDOW as RING_WINDOW
from innet.hosts.ring.geometry import ring_geometry, ring_phases
from innet.planning.planner import JobPlan
from innet.planning.prediction import direction_bytes, frame_bytes, one_way
from innet.planning.timing.calls import busiest_direction, hops, link_rate

MOST_LOST = 0.999  # a try's chance of loss the loss term reckons with, at most (all of them: the call never ends)
# In-network and PBox: retransmissions that were not needed, per one that was, on a link past the workers' own. A
# round's answers come back in the slowest contributor's order, not the sender's, so RACK resends a chunk again
# while its first retransmission still waits for another worker's: traced, 0.7-1.0 per needed one on the PBox's
# link (star and leaf-spine, 262144 values, 5-20% loss). A worker's own link carries next to none (0.15 per needed
# one, star in-network at 20%): a copy still in its queue is not resent (innet.hosts.worker.window: ``Window.queue``).
SPURIOUS = 1.0


def _retry_delays(fail: float, first: float, pace: float, units: int, limit: int = 24) -> np.ndarray:
    """Where the k-th retransmission of a unit lost ``k`` times answers, after its first send would have
    (k = 0..limit): each loss costs a reordering window and a round trip (``first``) plus the units still
    out at that round draining at ``pace`` (a tail probe waits for them). Not doubled per try: a worker's probes
    back off only while no result comes, and mid-stream results keep coming (doubled, the term was 38-58% high
    at 20% loss)."""
    spells = [first + units * fail ** k * pace for k in range(1, limit + 1)]
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
    delay per try lost (``_retry_delays``): the expected last end is the call's, unless the busiest link takes
    longer to carry every retransmission: those a worker resending every round needs (``_resends``) and as
    many again that it did not (``SPURIOUS``; on a worker's own link, none), each link only the share that
    survives the hops before it (``_reaching``: at 20% loss the star's PBox link carries 0.8 of what the workers
    send; counted whole, the term was 25% high there); what is still out at a try drains at the pace of the
    busiest link, which carries that share too (leaf-spine PBox at 20%: +10% -> -3%). Ring: each piece's chain of
    hops stalls per loss, and the call ends with its slowest chain (``_ring_lossy``)."""
    paths = hops(graph, mode, plan)
    lossy = [min(MOST_LOST, 1.0 - float(np.prod([1.0 - loss(u, v) for u, v in p]))) for p in paths]
    loads = direction_bytes(graph, mode, plan, elements, per_packet)
    stream = busiest_direction(graph, loads)[1]
    full, ack = frame_bytes(min(per_packet, elements)), frame_bytes(0)
    rtt = max(one_way(graph, p, full, 0.0, lambda u, v: 0.0) + one_way(graph, [(v, u) for u, v in reversed(p)], ack, 0.0,
                                                                       lambda u, v: 0.0) for p in paths)
    back = _back_losses(paths, loss)
    if mode == "ring":
        return _ring_lossy(plan, elements, per_packet, lossless, stream, lossy, back, rtt, window)
    first = window + rtt
    chunks = -(-elements // per_packet)
    if mode == "innet":  # each link of the tree, both ways
        legs = {tuple(sorted(uv)) for p in paths for uv in p}
        fails = [min(MOST_LOST, 1.0 - (1.0 - loss(u, v)) * (1.0 - loss(v, u))) for u, v in sorted(legs)]
    else:
        fails = [min(MOST_LOST, 1.0 - (1.0 - f) * (1.0 - b)) for f, b in zip(lossy, back, strict=True)]
    resends, senders = _resends(lossy, back), {p[0][0] for p in paths if p}
    carried = {uv: loads[uv] / link_rate(graph, *uv) * _reaching(paths, uv, loss)
               * (1 + (1 + (0.0 if uv[0] in senders else SPURIOUS)) * resends) for uv in loads}
    busiest = max(sorted(carried), key=carried.__getitem__)
    busy = (lossless - stream) + carried[busiest]
    worst = max(fails)
    stretched = stream / (1 - worst)
    starts = (lossless - stream) + stretched * np.arange(1, chunks + 1) / chunks
    return max(lossless, busy, _expected_last(starts, fails, first, stream / chunks * _reaching(paths, busiest, loss)))



def _ring_lossy(plan: JobPlan, elements: int, per_packet: int, lossless: float, stream: float, lossy: list[float],
                back: list[float], rtt: float, window: float) -> float:
    """``lossy_time`` of a ring (innet.hosts.ring). First the exponent chains: N-1 hops of one lone packet each,
    every rank's at once, before any data; nothing shows a lone packet lost but its RTO (four unloaded round trips
    at least: the initial one, ``configs.initial_rtos``), then a tail probe's spacing per loss of its retransmission
    (or the RTO doubled, if sooner). Then each piece
    of a segment is a chain of 2(N-1) hops, one ring neighbour to the next (``lossy[r]``: the path from rank r to
    r+1 loses a frame, ``back[r]`` the way back, an ACK). A hop whose frame is lost stalls its chain: the next
    piece shows the hole and the ACK says so at once (if that ACK is lost, the next piece's duplicate ACK, one
    arrival on, and so on), and the retransmission waits behind the sender's queue: a round trip, a frame, the
    lost ACKs' wait and that queue. Each rank sends its first step's pieces at once, then one for each it receives, so without loss
    the queue holds a step's pieces; under loss it lacks those still stalled upstream (star of 4, the queue ahead
    of a piece: 33 frames at 1%, 21 at 5%, 13 at 20%, traced). A lost retransmission is sent again when its own
    timer expires (``RingCall._retry_due``: it is acknowledged on arrival, so two round trips, at least the RTO
    floor ``window``, a tail probe's spacing). A step's last piece has no next one:
    its loss waits for a tail probe (every two round trips, at least the RTO floor ``window``). Chains delayed
    less than the queue catch up (the links stay busy meanwhile). The call ends as late as the slowest exponent
    chain plus the slowest data chain past the queue (expected), the stream stretched by the retransmissions it
    carries."""
    n = len(plan.workers)
    if n < 2 or not stream:
        return lossless
    pieces = ring_geometry(elements, n, per_packet)[1]
    steps = sum(ring_phases("allreduce")) * (n - 1)
    frame = stream / (steps * pieces)  # the busiest link's time per frame: the grid the delays are counted in
    queue, trip = min(pieces, RING_WINDOW), round(rtt / frame)
    probe, rto = round(max(window, 2 * rtt) / frame), round(max(window, 4 * rtt) / frame)
    kinds = [(min(MOST_LOST, f), min(MOST_LOST, b)) for f, b in zip(lossy, back, strict=True)]
    late = steps / 2 * sum(lossy) / len(lossy)  # losses per piece on the hops a piece has crossed, on average
    hops: dict[tuple[tuple[float, float], str], np.ndarray] = {}
    for kind in set(kinds):
        fwd, acks = kind
        ack = round(acks / (1 - acks) / (1 - fwd))  # each lost ACK: the next piece's (duplicate ACKs), one arrival on
        # the queue ahead of a retransmission lacks the pieces still stalled upstream (Little: ``late`` a piece, each
        # stalled as long as this stall, which waits behind that queue): held = queue - late * stall
        held = max(0.0, (queue - late * (trip + 1 + ack)) / (1 + late))
        stall = trip + 1 + round(held) + ack
        hops[kind, "data"] = _ring_hop(kind[0], stall, probe)
        hops[kind, "last"] = _ring_hop(kind[0], probe + trip, probe)
        hops[kind, "exp"] = _ring_hop(kind[0], rto, min(2 * rto, probe))

    def chains(part: str, length: int) -> Counter:  # the chains that start at each rank, by the hops they cross
        return Counter(tuple(sorted(Counter((kinds[(r + i) % n], part) for i in range(length)).items())) for r in range(n))

    exponent = _slowest(hops, chains("exp", n - 1), 1)
    data = _both(_slowest(hops, chains("data", steps), pieces - 1), _slowest(hops, chains("last", steps), 1))

    def mean(cdf: np.ndarray, past: int = 0) -> float:
        return float(np.sum(np.diff(cdf, prepend=0.0) * np.maximum(0, np.arange(len(cdf)) - past)))

    late = mean(exponent) + mean(data, queue)  # the data's slowest chain past the queue's slack
    return lossless / (1 - sum(lossy) / len(lossy)) + late * frame


def _both(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The CDF of the slower of two independent delays, from theirs (each 1 past its end)."""
    size = max(len(a), len(b))
    return np.pad(a, (0, size - len(a)), constant_values=1.0) * np.pad(b, (0, size - len(b)), constant_values=1.0)


def _slowest(hops: dict, chains: Counter, each: int) -> np.ndarray:
    """The CDF, over delays on the hops' grid, of the slowest of ``chains`` (how many chains cross which hops, each
    counted ``each`` times): a chain's delay is the sum of its hops' (the product of their spectra)."""
    size = max(sum(count * len(hops[key]) for key, count in chain) for chain in chains)
    log_cdf = np.zeros(size)
    for chain, starts in chains.items():
        spectrum = np.prod([np.fft.rfft(hops[key], size) ** count for key, count in chain], axis=0)
        with np.errstate(divide="ignore"):
            log_cdf += starts * each * np.log(np.clip(np.cumsum(np.fft.irfft(spectrum, size)), 0.0, 1.0))
    return np.exp(log_cdf)


def _ring_hop(fail: float, first: int, again: int) -> np.ndarray:
    """A ring hop's delay, in frames, by probability: none if its frame got through, ``first`` for its first loss,
    ``again`` more for each loss of a retransmission, as long as a loss is not negligible."""
    if fail <= 0:
        return np.ones(1)
    losses = int(min(16, max(2, np.ceil(np.log(1e-9) / np.log(fail)))))
    dist = np.zeros(first + (losses - 2) * again + 1)
    dist[[0] + [first + k * again for k in range(losses - 1)]] = (1 - fail) * fail ** np.arange(losses)
    return dist



def _resends(up: list[float], down: list[float]) -> float:
    """A worker's expected retransmissions of a chunk, were it to resend every round until its result comes
    (``up[w]``, ``down[w]``: worker w's way to the aggregation point, and back, loses a frame): the slot completes
    in the round the last contribution arrives (the most of the workers' geometric tries); a worker whose result
    was lost then resends until a resend and its answer both get through. Averaged over the workers."""
    q = 1 - np.minimum(MOST_LOST, np.array(up))
    k = np.arange(400)[:, None]
    rounds = float(np.sum(1 - np.prod(1 - (1 - q[None, :]) ** k, axis=1)))  # E[the last contribution's round]
    extra = np.mean([d / max(1e-9, (1 - u) * (1 - d)) for u, d in zip(up, down, strict=True)])
    return rounds - 1 + float(extra)



def _reaching(paths: list[list[tuple[str, str]]], link: tuple[str, str], loss: Callable[[str, str], float]) -> float:
    """The share of the frames a worker sends that load ``link``: those that survive the hops before it on the way
    to the aggregation point, or, on the way back, every hop there (an answer is sent for each that arrives).
    Averaged over the workers whose paths cross it."""
    shares = []
    for p in paths:
        down = (link[1], link[0]) in p
        if link in p or down:
            before = p if down else p[:p.index(link)]
            shares.append(float(np.prod([1.0 - loss(u, v) for u, v in before])))
    return float(np.mean(shares)) if shares else 1.0


def _back_losses(paths: list[list[tuple[str, str]]], loss: Callable[[str, str], float]) -> list[float]:
    return [1.0 - float(np.prod([1.0 - loss(v, u) for u, v in p])) for p in paths]
