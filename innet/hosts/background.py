"""Background traffic: other tenants' flows that compete with a job for the links (``--background PATTERN:LOAD``).

A pattern names which hosts send to which, at a fraction of link rate:

- ``permutation``: every host sends to one other (a seeded derangement) at LOAD of its link;
- ``all-to-all``: every host sends to every other, LOAD of its link in all;
- ``incast``: every other host sends to one (seeded) host, LOAD of that host's link in all;
- ``hotspot:LINK``: host pairs whose routed path crosses LINK (``a--b``) load it to LOAD of its rate.

A trailing ``:tcp`` makes every flow elastic (innet.hosts.elastic: window-based, ACK-clocked, backing off); the
default, ``:udp`` or nothing, is open-loop. Open-loop flows are constant-rate streams of MTU-sized frames routed by
address (the ROUTE flag, job ``BACKGROUND_JOB``): every switch forwards them as it forwards ring and PBox
traffic, and no job's endpoint takes them. A ``BackgroundHost`` is the endpoint of one host: it sends its flows, paced, and
counts what arrives for it. It is a daemon: the run ends when the job's endpoints are done.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import networkx as nx
import numpy as np

from innet.graph import hosts, link_name, natural_key, next_hop, node_indices
from innet.wire.packet import PAYLOAD_OFFSET, ROUTE, frame_fields, make_packet

BACKGROUND_JOB = 0xFFFE  # the job number of background frames: no training job has it
BACKGROUND_ELEMENTS = 2048  # values per frame: 8250-byte frames, the size of the jobs' default ones (jumbo links)
PATTERNS = ("permutation", "all-to-all", "incast", "hotspot")
BACKGROUND_BAND = 0  # open-loop flows' priority band: the jobs' own (0, unless --job-priority), one FIFO with them
TRANSPORTS = ("udp", "tcp")  # open-loop constant-rate streams; elastic, TCP-like flows


@dataclass(frozen=True)
class BackgroundSpec:
    """A background pattern and its load (a fraction of link rate); ``link`` is a hotspot's; ``transport`` udp
    (open-loop) or tcp (elastic). Inactive when ``load`` is 0."""

    pattern: str = ""
    load: float = 0.0
    link: str = ""
    transport: str = "udp"

    @property
    def active(self) -> bool:
        return bool(self.pattern) and self.load > 0

    @property
    def elastic(self) -> bool:
        return self.transport == "tcp"

    def __str__(self) -> str:
        if not self.pattern:
            return "none"
        return f"{self.pattern}{':' + self.link if self.link else ''}:{self.load:g}{':tcp' if self.elastic else ''}"


def parse_background(text: str) -> BackgroundSpec:
    """``--background PATTERN:LOAD[:TRANSPORT]`` (``hotspot:LINK:LOAD[:TRANSPORT]``), or ``none``."""
    if text in ("", "none"):
        return BackgroundSpec()
    parts = text.split(":")
    transport = parts.pop() if len(parts) > 2 and parts[-1] in TRANSPORTS else "udp"
    try:
        load = float(parts[-1])
    except ValueError:
        load = -1.0
    pattern, link = parts[0], ":".join(parts[1:-1])
    if len(parts) < 2 or pattern not in PATTERNS or not 0 <= load <= 1 or bool(link) != (pattern == "hotspot"):
        raise ValueError(f"wants PATTERN:LOAD[:udp|:tcp] with a pattern of {', '.join(PATTERNS)} (hotspot:LINK:LOAD) "
                         f"and a load in [0, 1], got {text!r}")
    return BackgroundSpec(pattern, load, link, transport)


@dataclass(frozen=True)
class Flow:
    src: str
    dst: str
    bps: float  # offered bits per second


def _rate(graph: nx.Graph, host: str) -> float:
    """A host's link rate, bits per second."""
    return float(next(d["bw"] for _, _, d in graph.edges(host, data=True))) * 1e6


def _path(graph: nx.Graph, src: str, dst: str) -> list[str]:
    path = [src]
    while path[-1] != dst:
        path.append(next_hop(graph, path[-1], dst))
    return path


def background_flows(graph: nx.Graph, bg: BackgroundSpec, seed: int = 0) -> list[Flow]:
    """The flows of ``bg`` on ``graph`` (seeded), at the rates they get: where routed paths share a link and
    would ask more than ``LINK_SHARE`` of its rate, the flows on it are slowed in proportion (as elastic
    flows settle; open-loop ones would fill its queue without end)."""
    return fit_links(graph, asked_flows(graph, bg, seed))


LINK_SHARE = 0.9  # the most of a link's rate background flows take together


def carried_mbps(graph: nx.Graph, bg: BackgroundSpec, seed: int = 0) -> float:
    """Mbit/s the background's flows put on all link directions together, at the rates they get
    (``background_flows``): each flow's rate once for every link on its path."""
    return sum(f.bps * (len(_path(graph, f.src, f.dst)) - 1) for f in background_flows(graph, bg, seed)) / 1e6


def fit_links(graph: nx.Graph, flows: list[Flow]) -> list[Flow]:
    """``flows`` slowed, the most overloaded link first, until no link direction carries more than
    ``LINK_SHARE`` of its rate."""
    paths = [list(zip(p, p[1:], strict=False)) for p in (_path(graph, f.src, f.dst) for f in flows)]
    rates = [f.bps for f in flows]
    for _ in range(4 * graph.number_of_edges()):
        load: dict[tuple[str, str], float] = {}
        for path, rate in zip(paths, rates, strict=True):
            for hop in path:
                load[hop] = load.get(hop, 0.0) + rate
        over = {hop: total / (LINK_SHARE * float(graph.edges[hop]["bw"]) * 1e6) for hop, total in load.items()}
        worst = max(over, key=lambda h: over[h], default=None)
        if worst is None or over[worst] <= 1 + 1e-9:
            break
        rates = [r / over[worst] if worst in path else r for path, r in zip(paths, rates, strict=True)]
    return [Flow(f.src, f.dst, r) for f, r in zip(flows, rates, strict=True)]


def asked_flows(graph: nx.Graph, bg: BackgroundSpec, seed: int = 0) -> list[Flow]:
    """The flows of ``bg`` at the rates the pattern asks."""
    if not bg.active:
        return []
    names = hosts(graph)
    n, rng = len(names), np.random.default_rng([seed, 35])
    if n < 2:
        return []
    if bg.pattern == "permutation":
        shift = rng.permutation(n)  # a derangement: each host sends to the next in a seeded cycle
        return [Flow(names[shift[i]], names[shift[(i + 1) % n]], bg.load * _rate(graph, names[shift[i]]))
                for i in range(n)]
    if bg.pattern == "all-to-all":
        return [Flow(a, b, bg.load * _rate(graph, a) / (n - 1)) for a in names for b in names if a != b]
    if bg.pattern == "incast":
        target = names[int(rng.integers(n))]
        return [Flow(a, target, bg.load * _rate(graph, target) / (n - 1)) for a in names if a != target]
    return _hotspot(graph, bg, names, rng)


def _hotspot(graph: nx.Graph, bg: BackgroundSpec, names: list[str], rng: np.random.Generator) -> list[Flow]:
    """Pairs whose path crosses ``bg.link``, distinct senders, each at most its own link's rate, until the link
    carries ``bg.load`` of its rate."""
    ends = bg.link.split("--")
    if len(ends) != 2 or not graph.has_edge(*ends):
        raise ValueError(f"hotspot link {bg.link} is not a link of this topology")
    target = link_name(*ends)
    want = bg.load * float(graph.edges[ends]["bw"]) * 1e6
    flows: list[Flow] = []
    for src in [names[i] for i in rng.permutation(len(names))]:
        for dst in [names[i] for i in rng.permutation(len(names))]:
            path = _path(graph, src, dst) if src != dst else []
            if any(link_name(a, b) == target for a, b in zip(path, path[1:], strict=False)):
                bps = min(want, _rate(graph, src))
                flows.append(Flow(src, dst, bps))
                want -= bps
                break
        if want <= 0:
            break
    if not flows:
        raise ValueError(f"no two hosts' path crosses link {bg.link}")
    return flows


def background_frame(src: int, dst: int) -> bytes:
    """One background frame from node ``src`` to node ``dst``."""
    pkt = make_packet(np.zeros(BACKGROUND_ELEMENTS, np.int32), job=BACKGROUND_JOB, flags=ROUTE)
    return pkt.to_frame(src, dst, BACKGROUND_BAND)


FRAME_BYTES = PAYLOAD_OFFSET + 4 * BACKGROUND_ELEMENTS
LEAD_FRAMES = 4  # open-loop flows run alone for this many of the sparsest flow's frames before the job starts


def lead_s(flows: Sequence[Flow]) -> float:
    """How long open-loop ``flows`` run before the job starts (on the run's timeline): on Mininet their senders
    start first and the job meets them in full flow, so the fabric starts them first too. Started with the job
    they would queue behind its whole tensor in its hosts' own queues and stay out of the network while it climbs
    (fat-tree k=4, 10 Mbit/s, 32768 elements, 50% permutation: 0.165 s against Mininet's 0.208; led: 0.224)."""
    return LEAD_FRAMES * max((FRAME_BYTES * 8 / f.bps for f in flows if f.bps > 0), default=0.0)


class BackgroundHost:
    """The background endpoint of one host: its flows' frames, paced at their rates (each flow's first frame
    at a seeded phase), and the background bytes that arrive for it."""

    daemon = True
    done = False

    def __init__(self, node: int, flows: list[tuple[int, float]], seed: int = 0) -> None:
        """``flows``: (destination node index, bits per second) of each flow from node ``node``."""
        self.node = node
        self.flows = [(background_frame(node, dst), FRAME_BYTES * 8 / bps) for dst, bps in flows]
        self._due = list(zip(phases(node, [gap for _, gap in self.flows], seed), range(len(self.flows)), strict=True))
        heapq.heapify(self._due)
        self.sent_bytes = self.received_bytes = 0
        self.offered_bps = sum(bps for _, bps in flows)

    def start(self, now: float) -> list[bytes]:
        return self.on_timeout(now)

    def receive(self, frame: bytes, now: float) -> list[bytes]:
        fields = frame_fields(frame)
        if fields is not None and fields[3] == BACKGROUND_JOB and fields[1] == self.node:
            self.received_bytes += len(frame)
        return []

    def next_deadline(self) -> float | None:
        return self._due[0][0] if self._due else None

    def on_timeout(self, now: float) -> list[bytes]:
        out = []
        while self._due and self._due[0][0] <= now:
            at, k = heapq.heappop(self._due)
            frame, gap = self.flows[k]
            out.append(frame)
            heapq.heappush(self._due, (at + gap, k))
        self.sent_bytes += sum(len(f) for f in out)
        return out


def phases(node: int, gaps: Sequence[float], seed: int = 0) -> list[float]:
    """When each flow of node ``node`` (frames ``gaps`` seconds apart) sends its first frame after the background
    starts: at a seeded phase of its gap."""
    rng = np.random.default_rng([seed, node, 35])
    return [float(rng.random() * gap) for gap in gaps]


def first_frames(graph: nx.Graph, flows: Sequence[Flow], seed: int = 0) -> list[float]:
    """When each of ``flows`` sends its first frame after the background starts, as its host's endpoint sends it
    (``BackgroundHost``, on both backends): what the timing model's background replays."""
    index, gaps = node_indices(graph), [FRAME_BYTES * 8 / f.bps if f.bps > 0 else math.inf for f in flows]
    at: dict[str, Iterator[float]] = {}
    for host in dict.fromkeys(f.src for f in flows):
        at[host] = iter(phases(index[host], [gap for f, gap in zip(flows, gaps, strict=True) if f.src == host], seed))
    return [next(at[f.src]) for f in flows]


def background_hosts(graph: nx.Graph, bg: BackgroundSpec, seed: int = 0) -> dict[str, BackgroundHost]:
    """One endpoint per host of the topology, sending its flows of ``bg``."""
    return {h: BackgroundHost(node_indices(graph)[h], flows, seed) for h, flows in host_flows(graph, bg, seed).items()}


def host_flows(graph: nx.Graph, bg: BackgroundSpec, seed: int = 0) -> dict[str, list[tuple[int, float]]]:
    """Per host that sends or receives background traffic, its flows as (destination node index, bits per second)."""
    flows, index = background_flows(graph, bg, seed), node_indices(graph)
    return {h: [(index[f.dst], f.bps) for f in flows if f.src == h]
            for h in sorted({f.src for f in flows} | {f.dst for f in flows}, key=natural_key)}


@dataclass(frozen=True)
class BackgroundSummary:
    """What the background carried while the job ran: offered and delivered rates (all flows together) and
    its bytes on the links (what the job competed with)."""

    pattern: str
    load: float
    flows: int
    asked_mbps: float  # what the pattern asks
    offered_mbps: float  # what the flows send: no link above LINK_SHARE of its rate
    delivered_mbps: float
    sent_bytes: int
    received_bytes: int
    link_bytes: dict[str, int]
    transport: str = "udp"
    # elastic flows (tcp): delivered_mbps and the bytes are payload, and beside them what the same flows deliver
    # without the job, the share of it the job took, and the job's completion without them over with them
    alone_mbps: float = 0.0  # 0: not measured
    goodput_loss: float = 0.0  # 1 - delivered_mbps / alone_mbps
    job_alone_s: float = 0.0  # 0: not measured
    slowdown: float = 0.0  # the job's completion_s / job_alone_s


@dataclass(frozen=True)
class BackgroundStats:
    """What one host's background endpoint did: its flows, the rate they offer, bytes sent and received."""

    flows: int
    offered_bps: float
    sent_bytes: int
    received_bytes: int
    seconds: float = 0.0  # how long it ran (where that is not the run's time: Mininet's senders start first)


class Counted(Protocol):
    """A host's background endpoint, open-loop or elastic (innet.hosts.elastic.ElasticHost), as its stats see it."""

    offered_bps: float

    @property
    def flows(self) -> Sequence[object]: ...

    @property
    def sent_bytes(self) -> int: ...

    @property
    def received_bytes(self) -> int: ...


def stats_of(end: Counted, seconds: float = 0.0) -> BackgroundStats:
    return BackgroundStats(len(end.flows), end.offered_bps, end.sent_bytes, end.received_bytes, seconds)


def background_summary(bg: BackgroundSpec, ends: list[BackgroundStats], seconds: float,
                       link_bytes: dict[str, int], asked: float) -> BackgroundSummary:
    """``ends``' figures over a run of ``seconds`` (``asked``: the bits per second the pattern asked)."""
    received = sum(e.received_bytes for e in ends)
    return BackgroundSummary(str(bg), bg.load, sum(e.flows for e in ends), round(asked / 1e6, 3),
                             round(sum(e.offered_bps for e in ends) / 1e6, 3),
                             round(received * 8 / seconds / 1e6, 3) if seconds > 0 else 0.0,
                             sum(e.sent_bytes for e in ends), received, {k: v for k, v in link_bytes.items() if v},
                             bg.transport)


def with_alone(summary: BackgroundSummary, alone_mbps: float, completion_s: float = 0.0,
               job_alone_s: float = 0.0) -> BackgroundSummary:
    """``summary`` beside what the background delivers alone (``alone_mbps``) and the job's completion with it
    (``completion_s``) and without (``job_alone_s``; 0 where not measured)."""
    loss = 1 - summary.delivered_mbps / alone_mbps if alone_mbps > 0 else 0.0
    slowdown = completion_s / job_alone_s if job_alone_s > 0 else 0.0
    return replace(summary, alone_mbps=round(alone_mbps, 3), goodput_loss=round(loss, 4),
                   job_alone_s=round(job_alone_s, 6), slowdown=round(slowdown, 4))
