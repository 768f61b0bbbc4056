"""Time dilation (time-warped emulation, Gupta et al., NSDI 2006): run a slower network on a slower clock.

With factor ``f`` every link's rate is divided by ``f`` and every time the run is given (link latency,
injected delays, compute, timeouts, retransmission timeouts, crash times) multiplied by ``f``; every time
it measures is divided by ``f`` on the way back. In the requested (virtual) timeline the links then
carry what was asked for, while the CPU sees ``f`` times longer to do each packet's work: what a 2-core
machine cannot do at 100 Gbit/s it does at 100 Gbit/s / ``f``. The arithmetic lives here; the
calibration that picks ``f`` (innet.backends.mininet.calibration) and the backend that applies it
(innet.backends.mininet.emulation) use it.
"""

from __future__ import annotations

from dataclasses import replace

import networkx as nx

from innet.graph import host_link_rate as host_link_rate
from innet.planning.spec import LOCAL_MIN_RTO, RunSpec
from innet.planning.spec import MININET_MIN_RTO as MININET_MIN_RTO
from innet.planning.spec import TCLINK_MAX_MBPS as TCLINK_MAX_MBPS
from innet.wire.faults import FaultSpec

CALIBRATION_WORKERS = 4  # hosts on the calibration's star (innet.backends.mininet.calibration), beside its PBox
CALIBRATION_DIRECTIONS = 2 * CALIBRATION_WORKERS  # link directions its run keeps busy at once: each host link, both ways


BANDWIDTH, BUSY, LATENCY = "bandwidth", "links busy at once", "latency"  # the bounds auto's factor is the largest of
LATENCY_SHARE = 0.02  # of a run's predicted time its process hops may add at auto's factor: a fifth of the 10% it is judged by,
# as the calibration's TOLERANCE: a hop costs 2-3 times the calibrated one when other programs load the machine
LATENCY_WALL_S = 300.0  # the latency bound never makes a run's calls take longer than this in real (wall) seconds


def auto_bounds(requested_mbps: float, faithful_mbps: float, carried_mbps: float = 0.0,
                latency: float = 0.0) -> dict[str, float]:
    """The factors ``--dilation auto`` needs, each for one reason: ``bandwidth``, the requested host-link rate over
    the rate this machine carries faithfully; ``links busy at once``, as much more as the run keeps more link
    directions busy than the calibration's star did (``carried_mbps``, see ``carried_rate``: every frame on a link
    is sent by one Python process and read by another, so the CPU's work per second grows with all the links'
    traffic, not one link's rate); ``latency``, the factor that makes the run's process hops cheap enough
    (``latency_factor``)."""
    return {BANDWIDTH: requested_mbps / faithful_mbps, BUSY: carried_mbps / (CALIBRATION_DIRECTIONS * faithful_mbps),
            LATENCY: latency}


def auto_factor(requested_mbps: float, faithful_mbps: float, carried_mbps: float = 0.0, latency: float = 0.0) -> float:
    """The factor ``--dilation auto`` takes: the largest of ``auto_bounds``, never below 1 (a run the machine keeps
    up with is not slowed down)."""
    return max(1.0, *auto_bounds(requested_mbps, faithful_mbps, carried_mbps, latency).values())


def auto_bound(bounds: dict[str, float]) -> str:
    """Which of ``auto_bounds`` chose the factor (the first of the largest); "" where none asked for more than 1."""
    name = max(bounds, key=lambda k: bounds[k])
    return name if bounds[name] > 1.0 else ""


HOP_EXPONENT = {"python": 0.5, "ebpf": 0.25}  # hop_cost's power of workers / CALIBRATION_WORKERS, per data plane


def hop_cost(hop_s: float, workers: int, plane: str = "python") -> float:
    """What a hop costs a run of ``workers`` (all jobs'), in wall seconds, from ``hop_s`` measured on the
    calibration's star: more where more frames set off at once than from its CALIBRATION_WORKERS (every worker
    sends at each step, and 2 cores wake and serve their hops in turn), with a power of their ratio
    (``HOP_EXPONENT``). The Python switch's, the square root: fat-tree k=8's ring (128 ranks relaying each piece)
    took 1.11x its links' time at the factor 8350 its links asked, ~12 ms a hop over its ~1000, 5 times the star's
    2.4 ms, where 128 / 4 = 32 and its root is 5.7. The eBPF switch's, the fourth root (2.4 at k=8): its switches
    wake no process, and k=8's ring (378 host hops) ran 1.0144x its model at 3000, 1.0065x at 4500, 1.0037x at 6520
    (~1.1-1.6 ms a hop, the star's own), but 1.061x at 2000, its processes then keeping 1.8 of the 2 cores busy
    (load 12-17, docs/performance.md): the fourth root takes 3800-6000 at a 1.1-1.8 ms hop, 1.3-2x that 3000. (Those
    hops were whole barrier calls; measured from each call's last start, calibration.from_last_start, they are ~0.6x
    that: 1.1 ms at load 9-12 took 3688, within 1.4% twice.)"""
    return hop_s * max(1.0, workers / CALIBRATION_WORKERS) ** HOP_EXPONENT[plane]


def latency_factor(hops: float, hop_s: float, predicted_s: float, calls: int = 1) -> float:
    """The factor at which ``hops`` process hops on a run's critical path, each costing ``hop_s`` of wall time
    (the calibration's ``hop_s``: a frame's wake-up, send and read; dilation divides it by the factor), add at
    most ``LATENCY_SHARE`` of the run's predicted (virtual) time ``predicted_s``. Capped where the run's
    ``calls`` would take ``LATENCY_WALL_S`` of real time: a short run is cheap to dilate (0.1 ms at 1000 takes
    0.1 s), a long one is not, and over a long one the hops weigh little anyway."""
    if hops <= 0 or hop_s <= 0 or predicted_s <= 0:
        return 0.0
    return min(hops * hop_s / (LATENCY_SHARE * predicted_s), LATENCY_WALL_S / (predicted_s * max(calls, 1)))


def woken_graph(graph: nx.Graph) -> nx.Graph:
    """``graph`` as the eBPF data plane runs it, for the timing model's process hops: a frame wakes a process only
    where it arrives at a host or a PBox (``graph.graph["woken"]``, innet.planning.prediction.one_way); its switches
    forward in the kernel (fat-tree k=8's ring: ~1 link in 2.6 of its ranks' paths ends at a host)."""
    from innet.graph import is_switch

    out = graph.copy()
    out.graph["woken"] = frozenset(n for n in graph if not is_switch(graph, n))
    return out


def process_links_rate(graph: nx.Graph, loads: dict[tuple[str, str], float], processes: set[str]) -> float:
    """Mbit/s of the fastest loaded link direction into or out of one of ``processes`` (PBox servers: Python
    processes on every data plane), 0 where none: ``auto_choice`` keeps it within the Python switch's faithful rate."""
    return max((float(graph.edges[u, v]["bw"]) for (u, v), b in loads.items() if b > 0 and {u, v} & processes),
               default=0.0)


def carried_rate(graph: nx.Graph, loads: dict[tuple[str, str], float]) -> float:
    """Mbit/s summed over the link directions of ``loads`` (bytes each) while the busiest of them is busy:
    the traffic a run asks the machine to move at once. A star of 4 at rate r carries 8 r."""
    if not loads:
        return 0.0
    busy = max(b * 8 / (float(graph.edges[u, v]["bw"]) * 1e6) for (u, v), b in loads.items())
    return sum(loads.values()) * 8 / 1e6 / busy if busy > 0 else 0.0


def dilate_graph(graph: nx.Graph, f: float) -> nx.Graph:
    """``graph`` with every link's rate divided by ``f`` and its latency multiplied by ``f`` (``f`` kept as its
    ``dilation``: what is planned on it in seconds of the run's timeline, innet.planning.dynamic.partial_window)."""
    out = graph.copy()
    out.graph["dilation"] = float(graph.graph.get("dilation", 1.0)) * f
    for _, _, data in out.edges(data=True):
        data["bw"] = data["bw"] / f
        data["latency"] = data.get("latency", 0.0) * f
    return out


def dilate_faults(spec: FaultSpec, f: float) -> FaultSpec:
    return replace(spec, delay=spec.delay * f, reorder_delay=spec.reorder_delay * f)


def dilate_spec(run: RunSpec, f: float) -> RunSpec:
    """``run`` on a clock ``f`` times slower: delays, compute, timeouts and RTOs multiplied by ``f``.

    The RTO floor is the local backend's (``LOCAL_MIN_RTO``, virtual) times ``f``, never below the
    ``run.min_rto`` the machine needs in real seconds: dilation divides the machine's scheduling jitter by
    ``f`` as seen from the virtual timeline, so the floor jitter forced need not be scaled with it.
    """
    if f == 1:
        return run
    return replace(run, faults=dilate_faults(run.faults, f),
                   link_faults=tuple((link, dilate_faults(spec, f)) for link, spec in run.link_faults),
                   timeout=run.timeout * f, initial_rto=run.initial_rto * f,
                   min_rto=max(run.min_rto, LOCAL_MIN_RTO * f),
                   compute_time=run.compute_time * f, compute_scale=run.compute_scale * f)


def dilate_times(times: dict[str, float], f: float) -> dict[str, float]:
    """Crash times and the like: virtual seconds to real ones."""
    return {k: v * f for k, v in times.items()}


def virtual(seconds: list[float], f: float) -> list[float]:
    """Measured (real) instants back on the requested timeline."""
    return [s / f for s in seconds]
