"""Time dilation (time-warped emulation, Gupta et al., NSDI 2006): run a slower network on a slower clock.

With factor ``f`` every link's rate is divided by ``f`` and every time the run is given (link latency,
injected delays, compute, timeouts, retransmission timeouts, crash times) multiplied by ``f``; every time
it measures is divided by ``f`` on the way back. In the requested (virtual) timeline the links then
carry what was asked for, while the CPU sees ``f`` times longer to do each packet's work: what a 2-core
machine cannot do at 100 Gbit/s it does at 100 Gbit/s / ``f``. The arithmetic lives here; the
calibration that picks ``f`` (innet.backends.calibration) and the backend that applies it
(innet.backends.mininet) use it.
"""

from __future__ import annotations

from dataclasses import replace

import networkx as nx

from innet.plan.spec import RunSpec
from innet.wire.faults import FaultSpec

TCLINK_MAX_MBPS = 1000.0  # the fastest rate Mininet's TCLink (tc htb) shapes: a dilation must bring links below it
LOCAL_MIN_RTO = 0.001  # the fabric's RTO floor: virtual time has no scheduling jitter
MININET_MIN_RTO = 0.02  # real seconds: a loaded 2-core machine delays an ACK this long now and then
CALIBRATION_WORKERS = 4  # hosts on the calibration's star (innet.backends.calibration), beside its PBox


def auto_factor(requested_mbps: float, faithful_mbps: float) -> float:
    """The factor ``--dilation auto`` takes: the requested rate (a graph's ``load_rate``) over the rate this
    machine carries faithfully, never below 1 (a run the machine keeps up with is not slowed down)."""
    return max(1.0, requested_mbps / faithful_mbps)


def host_link_rate(graph: nx.Graph) -> float:
    """The highest rate of a link to a host, Mbit/s."""
    return max((float(d["bw"]) for u, v, d in graph.edges(data=True)
                if "host" in (graph.nodes[u].get("role"), graph.nodes[v].get("role"))), default=0.0)


def load_rate(graph: nx.Graph) -> float:
    """The rate, Mbit/s, the dilation must bring within what the calibration found faithful: the calibration's
    star (``CALIBRATION_WORKERS`` hosts and a PBox, each on a link at one rate) at the rate that makes its
    links add up to ``graph``'s, or ``graph``'s fastest host link if that is higher.

    Every link's frames cost the CPU of the process that sends them and of the one that reads them, so what
    a dilated run asks of the machine grows with its links' total rate, not with the host links' alone: the
    default leaf-spine (4 hosts at 1000 Mbit/s, 2000 Mbit/s uplinks, a PBox: 9000 in all) carries 1.8 times
    what a star of 4 at 1000 does, with three switch processes instead of one. Dilated by the host-link rate
    alone (F = 100 here), its processes kept 1.6 of the 2 cores busy and it took 1.2-1.4x its virtual
    time; at F = 180-200 it is within 5% (docs/performance-dilation.md)."""
    total = sum(float(d["bw"]) for _, _, d in graph.edges(data=True))
    return max(host_link_rate(graph), total / (CALIBRATION_WORKERS + 1))


def dilate_graph(graph: nx.Graph, f: float) -> nx.Graph:
    """``graph`` with every link's rate divided by ``f`` and its latency multiplied by ``f``."""
    out = graph.copy()
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
