"""The in-process fabric: hosts, switches and links in virtual time.

It runs the very same switch runtime, programs and worker state machines as
the Mininet backend, with no root and no real time: every link has a
bandwidth (serialisation delay, a strict-priority queue per direction with
one FIFO per band, the band read from each frame's DSCP), a latency and a
FaultInjector. Deterministic for a given seed.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import networkx as nx
import numpy as np

from innet.events import Progress, waits
from innet.graph import link_name, link_totals, ports
from innet.hosts.background import BACKGROUND_JOB
from innet.hosts.elastic import marked
from innet.hosts.endpoint import Endpoint
from innet.switch.runtime import SwitchRuntime
from innet.wire.faults import FaultInjector, FaultSpec, fault_seed
from innet.wire.packet import BANDS, HEADER_OFFSET, TOS_OFFSET

Frame = bytes
BACKGROUND_TAG = BACKGROUND_JOB.to_bytes(2, "big")  # a background frame's job field


@dataclass
class LinkDirection:
    """One direction of a link: a strict-priority queue, one FIFO per band. A band-0 frame waits only for
    the band-0 frames before it (and the frame on the wire), so its start is known at once (``free_at``);
    a frame of a lower band waits in its FIFO until the link is free and no more urgent frame waits."""

    bps: float
    latency: float
    injector: FaultInjector
    peer: str = ""
    peer_port: int = -1  # the port the frames arrive on at ``peer``
    free_at: float = 0.0
    packets: int = 0
    bytes: int = 0
    background_bytes: int = 0  # of ``bytes``, background traffic's (innet.hosts.background)
    queues: list[deque[Frame]] = field(default_factory=lambda: [deque() for _ in range(BANDS)])
    waking: bool = False  # a wake-up is scheduled for when the link is free
    clean: bool = field(init=False)  # no faults: every frame arrives once, after the latency

    def __post_init__(self) -> None:
        self.clean = not self.injector.spec.active

    def queued(self) -> bool:
        return any(self.queues)


class Fabric:
    def __init__(self, graph: nx.Graph, faults: Callable[[str, str], FaultSpec] | FaultSpec | None = None,
                 seed: int = 0, switch_delay: float = 0.0) -> None:
        """``faults`` is one FaultSpec for every link, or a function of (sender, receiver)."""
        self.graph = graph
        self.now = 0.0
        self.switch_delay = switch_delay
        # the event calendar: each instant's events in the order they were scheduled, and a heap of the
        # instants (a synchronised fat-tree has thousands of events per instant: one heap entry for them all)
        self._due: dict[float, list[tuple[Callable[..., None], tuple[Any, ...]]]] = {}
        self._times: list[float] = []
        self.links: dict[tuple[str, str], LinkDirection] = {}
        for u, v, data in sorted(graph.edges(data=True), key=lambda e: link_name(e[0], e[1])):
            for a, b in ((u, v), (v, u)):
                spec = faults(a, b) if callable(faults) else (faults or FaultSpec())
                self.links[(a, b)] = LinkDirection(data["bw"] * 1e6, data["latency"],
                                                   FaultInjector(spec, fault_seed(seed, a, b)), b)
        self.port_peer = {n: ports(graph, n) for n in graph}
        self.port_of = {(n, peer): p for n, by_port in self.port_peer.items() for p, peer in by_port.items()}
        self.out_links: dict[str, dict[int, LinkDirection]] = {n: {} for n in graph}  # a node's links by port
        for (a, b), link in self.links.items():
            link.peer_port = self.port_of[(b, a)]
            self.out_links[a][self.port_of[(a, b)]] = link
        self.switches: dict[str, SwitchRuntime] = {}
        self.endpoints: dict[str, list[Endpoint]] = {}
        self._timer_at: dict[int, float] = {}
        self.events_run = 0
        self.hosts_moved = True  # an endpoint has run since the run loop last asked which are done
        self.background = False  # background traffic runs: count its bytes apart

    # -- wiring -----------------------------------------------------------
    def add_switch(self, name: str, runtime: SwitchRuntime) -> None:
        self.switches[name] = runtime

    def attach(self, host: str, endpoint: Endpoint) -> None:
        self.endpoints.setdefault(host, []).append(endpoint)

    # -- event loop -------------------------------------------------------
    def _at(self, time: float, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` at ``time`` (never in the past), after every event already due then."""
        time = max(time, self.now)
        events = self._due.get(time)
        if events is None:
            events = self._due[time] = []
            heapq.heappush(self._times, time)
        events.append((fn, args))

    def transmit(self, node: str, port: int, frame: bytes) -> None:
        link = self.out_links[node][port]
        link.packets += 1
        link.bytes += len(frame)
        if self.background and frame[HEADER_OFFSET:HEADER_OFFSET + 2] == BACKGROUND_TAG:
            link.background_bytes += len(frame)
            if frame[TOS_OFFSET] & 3:  # an elastic flow's: marked where a real interface's queue would be full
                frame = marked(frame, max(0.0, link.free_at - self.now) * link.bps / 8
                               + len(frame) * sum(len(q) for q in link.queues))
        band = frame[TOS_OFFSET] >> 2 if len(frame) > TOS_OFFSET else 0  # band_of, inline: once per frame and hop
        if band == 0 or (link.free_at <= self.now and not link.queued()):
            self._put_on_wire(link, frame)
            return
        band = min(band, BANDS - 1)
        peer = link.peer
        link.queues[band].append(frame)
        if not link.waking:
            link.waking = True
            self._at(link.free_at, self._link_free, node, peer)

    def _link_free(self, node: str, peer: str) -> None:
        """The link may be free: put the most urgent waiting frame on it (unless band-0 frames took it)."""
        link = self.links[(node, peer)]
        if link.free_at <= self.now:
            frame = next(q for q in link.queues if q).popleft()
            self._put_on_wire(link, frame)
        link.waking = link.queued()
        if link.waking:
            self._at(link.free_at, self._link_free, node, peer)

    def _put_on_wire(self, link: LinkDirection, frame: bytes) -> None:
        now = self.now
        free = link.free_at = (now if now > link.free_at else link.free_at) + len(frame) * 8 / link.bps
        if link.clean:  # what apply gives, without its list; _at inline (the arrival is never in the past)
            time = free + link.latency
            events = self._due.get(time)
            if events is None:
                events = self._due[time] = []
                heapq.heappush(self._times, time)
            events.append((self._deliver, (link.peer, link.peer_port, frame)))
            return
        for k, (extra, copy) in enumerate(link.injector.apply(frame)):
            if k:  # a duplicate goes on the wire after its original, as a real port sends it (Mininet's shaper does)
                link.free_at += len(copy) * 8 / link.bps
            self._at(link.free_at + link.latency + extra, self._deliver, link.peer, link.peer_port, copy)

    def _deliver(self, node: str, port: int, frame: bytes) -> None:
        runtime = self.switches.get(node)
        if runtime is not None:  # a frame never moves a switch's timers (only start and run_timers do)
            for out_port, out in runtime.receive(port, frame, self.now):
                self.transmit(node, out_port, out)
            return
        self.hosts_moved = True
        for endpoint in self.endpoints.get(node, ()):
            self._host_send(node, endpoint.receive(frame, self.now))
            self._schedule_endpoint(node, endpoint)

    def _host_send(self, host: str, frames: Sequence[bytes | np.ndarray]) -> None:
        for frame in frames:
            if isinstance(frame, bytes):
                self.transmit(host, 0, frame)
            else:  # a block of equal-length frames, one per row
                for row in frame:
                    self.transmit(host, 0, row.tobytes())

    def _schedule(self, owner: object, due: float | None, fire: Callable[..., None], *args: Any) -> None:
        """Arm ``owner``'s one timer for ``due`` (never in the past) to call ``fire(*args)``, unless it is
        armed earlier already."""
        if due is None:
            return
        due = max(due, self.now)
        if due < self._timer_at.get(id(owner), float("inf")):
            self._timer_at[id(owner)] = due
            self._at(due, self._timer, owner, fire, args)

    def _timer(self, owner: object, fire: Callable[..., None], args: tuple[Any, ...]) -> None:
        if self._timer_at.get(id(owner)) != self.now:  # superseded by an earlier arming
            return
        del self._timer_at[id(owner)]
        fire(*args)

    def _schedule_endpoint(self, host: str, endpoint: Endpoint) -> None:
        self._schedule(endpoint, endpoint.next_deadline(), self._endpoint_due, host, endpoint)

    def _endpoint_due(self, host: str, endpoint: Endpoint) -> None:
        self.hosts_moved = True
        deadline = endpoint.next_deadline()
        if deadline is not None and deadline <= self.now:
            self._host_send(host, endpoint.on_timeout(self.now))
        self._schedule_endpoint(host, endpoint)

    def _schedule_switch(self, name: str, runtime: SwitchRuntime) -> None:
        self._schedule(runtime, runtime.next_timer(), self._switch_due, name, runtime)

    def _switch_due(self, name: str, runtime: SwitchRuntime) -> None:
        for port, frame in runtime.run_timers(self.now):
            self.transmit(name, port, frame)
        self._schedule_switch(name, runtime)

    def run(self, until: float = float("inf"), max_events: int = 50_000_000) -> float:
        """Start everything, run until every endpoint is done (or time/event limits)."""
        for name, runtime in self.switches.items():
            for port, frame in runtime.start(self.now):
                self.transmit(name, port, frame)
            self._schedule_switch(name, runtime)
        for host, endpoints in self.endpoints.items():
            for endpoint in endpoints:
                self._host_send(host, endpoint.start(self.now))
                self._schedule_endpoint(host, endpoint)
        self.hosts_moved = True
        finite = [e for es in self.endpoints.values() for e in es if not getattr(e, "daemon", False)]
        left = list(finite)  # endpoints not yet done, pruned now and then (a 1000-host run checks few per event)
        progress = Progress("local")
        stop = False
        ran = self.events_run
        while self._times and not stop:
            time = self._times[0]
            if time > until:
                break
            events, k = self._due[time], 0
            while k < len(events):  # events scheduled for ``time`` meanwhile join the end
                if ran >= max_events:
                    stop = True
                    break
                if self.hosts_moved:  # only an endpoint's event can end one (and so the run)
                    self.hosts_moved = False
                    if left and left[-1].done:
                        left = [e for e in left if not e.done]
                    if finite and not left:
                        stop = True
                        break
                fn, args = events[k]
                k += 1
                ran += 1
                self.now = time
                fn(*args)
                if not ran & 4095:
                    self.events_run = ran
                    progress.update(partial(self._status, finite, left))
            del events[:k]
            if not events:
                heapq.heappop(self._times)
                del self._due[time]
        self.events_run = ran
        ended = self.now
        if finite and not left:
            self._drain()
        return ended


    def _status(self, finite: list[Any], busy: list[Any]) -> str:
        """The progress line: virtual time, events, hosts done, and what the first busy ones wait for."""
        return (f"virtual time {self.now:.6f}s, {self.events_run} events, "
                f"{sum(e.done for e in finite)}/{len(finite)} hosts done{waits(busy)}")
    def _drain(self) -> None:
        """Every endpoint is done: deliver the frames still on their way (a ring rank's DONE to its
        successor), as the wires of a real network would, and fire no timer: the run is over."""
        wire = (self._deliver, self._link_free)
        for endpoints in self.endpoints.values():  # an elastic flow's acknowledgements would clock out more
            for endpoint in endpoints:
                if hasattr(endpoint, "stop_sending"):
                    endpoint.stop_sending()
        while self._times:
            time = self._times[0]
            events, k = self._due[time], 0
            while k < len(events):  # events scheduled for ``time`` meanwhile join the end
                fn, args = events[k]
                k += 1
                if fn in wire:
                    self.now = time
                    fn(*args)
            heapq.heappop(self._times)
            del self._due[time]

    def direction_bytes(self, background: bool = False) -> dict[tuple[str, str], int]:
        """Bytes put on each link direction, (from, to): the jobs' (background traffic's with ``background``)."""
        return {uv: link.background_bytes if background else link.bytes - link.background_bytes
                for uv, link in self.links.items()}

    def link_bytes(self, background: bool = False) -> dict[str, int]:
        """Bytes put on each link, both directions together, by link name: the jobs' (background traffic's
        with ``background``)."""
        return link_totals(self.direction_bytes(background))
