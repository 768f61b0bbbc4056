"""``--background`` on Mininet: a sender in every host's namespace (innet.node.background; with ``:tcp``, real
kernel TCP: innet.node.elastic over the IP network beside innet's frames), stopped after the job; their stats become
the record's ``background`` figure. The open-loop senders start ``lead_s`` before the job (released at an instant before the
workers' "go", as the fabric leads them), the elastic ones before it (measured alone first)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import networkx as nx

from innet.backends.mininet.network import NODE_ENV, Network
from innet.backends.mininet.nodes import await_ready
from innet.hosts.background import (
    BackgroundStats,
    BackgroundSummary,
    asked_flows,
    background_flows,
    background_summary,
    host_flows,
    lead_s,
    with_alone,
)
from innet.hosts.elastic import ALONE_S, FRAME_BYTES, SEGMENT, WARM_S, received_between
from innet.node.background import BackgroundConfig
from innet.node.codec import read
from innet.node.elastic import ElasticConfig, ElasticStats
from innet.planning.spec import RunSpec


class Background:
    """The run's background senders, one per host that sends or receives (on the wire graph: dilated rates)."""

    def __init__(self, net: Network, graph: nx.Graph, run: RunSpec) -> None:
        self.net, self.run = net, run
        self.paths: list[str] = []
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        for host, flows in host_flows(graph, run.background, run.seed).items():
            stats = os.path.join(net.run_dir, f"{host}-background-stats.json")
            conf = BackgroundConfig(net_index(graph, host), tuple(flows), f"{host}-eth0", stats, run.seed)
            path = net.write(f"{host}-background.json", conf)
            self.procs[host] = net.spawn(host, [sys.executable, "-m", "innet.node.background", path], NODE_ENV,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            self.paths.append(stats)
        await_ready({f"{h}:background": p for h, p in self.procs.items()})
        # sending from their "go", lead_s before the workers' (as the fabric leads them: the job meets them in flow)
        self.starters = {f"{h}:background": p for h, p in self.procs.items()}
        self.lead_s = lead_s(background_flows(graph, run.background, run.seed))  # the wire graph's: dilated

    def stop(self, requested: nx.Graph, dilation: float, window: tuple[float, float] = (0.0, 0.0)) -> BackgroundSummary:
        """Stop every sender and read what it did, in the requested run's timeline (rates times ``dilation``)."""
        for proc in self.procs.values():
            proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            proc.wait(timeout=30)
        ends = [read(BackgroundStats, p) for p in self.paths]
        seconds = max(e.seconds for e in ends) / dilation
        ends = [BackgroundStats(e.flows, e.offered_bps * dilation, e.sent_bytes, e.received_bytes) for e in ends]
        asked = sum(f.bps for f in asked_flows(requested, self.run.background, self.run.seed))
        return background_summary(self.run.background, ends, seconds, {}, asked)


RTO_MIN_S = 0.2  # Linux's least retransmission timeout, of the run's timeline (innet.hosts.elastic.STALL_S)
RTO_MAX_S = 120.0  # the most the kernel takes (TCP_RTO_MAX)


class ElasticBackground:
    """The run's elastic background: a TCP sink and senders in every host that sends or receives (innet.node.elastic),
    run alone for ``WARM_S`` then measured alone for ``ALONE_S`` (dilated), before the job starts."""

    def __init__(self, net: Network, graph: nx.Graph, run: RunSpec, dilation: float) -> None:
        from innet.backends.mininet.iplane import host_address, ip_commands

        self.net, self.run = net, run
        self.starters: dict[str, subprocess.Popen[bytes]] = {}  # none: they run before the job
        self.lead_s = 0.0
        net.add_ip_network()
        # the kernel's timers are not dilated: its least retransmission timeout (200 ms) would be 200 ms / dilation of
        # the run's timeline, shorter than the job's frames hold a queue, and time out windows that were only queued
        rto_min = min(RTO_MAX_S, RTO_MIN_S * dilation)
        for host, commands in ip_commands(graph).items():
            if graph.nodes[host].get("role") == "host":
                for command in commands:
                    if command.startswith("ip route add"):
                        net.net.get(host).cmd(command.replace(" add ", " change ", 1) + f" rto_min {rto_min * 1e3:.0f}ms")
        address = {h: host_address(graph, h) for h in graph if graph.nodes[h].get("role") == "host"}
        names = {net_index(graph, h): h for h in address}
        self.paths: list[str] = []
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        for host, flows in host_flows(graph, run.background, run.seed).items():
            stats = os.path.join(net.run_dir, f"{host}-elastic-stats.json")
            conf = ElasticConfig(address[host], tuple((address[names[dst]], bps * SEGMENT / FRAME_BYTES)
                                                      for dst, bps in flows), stats)
            path = net.write(f"{host}-elastic.json", conf)
            self.procs[host] = net.spawn(host, [sys.executable, "-m", "innet.node.elastic", path], NODE_ENV, stdout=subprocess.PIPE)
            self.paths.append(stats)
        await_ready({f"{h}:elastic": p for h, p in self.procs.items()})
        time.sleep(max(0.2, WARM_S * dilation))
        start = time.monotonic()
        time.sleep(max(0.5, ALONE_S * dilation))
        self.alone = (start, time.monotonic())

    def stop(self, requested: nx.Graph, dilation: float, window: tuple[float, float]) -> BackgroundSummary:
        """Stop every endpoint and read what it did: goodput over the job's ``window`` (monotonic seconds) and
        alone, in the requested run's timeline (rates times ``dilation``)."""
        for proc in self.procs.values():
            proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            proc.wait(timeout=30)
        ends = [read(ElasticStats, p) for p in self.paths]
        self.retransmissions = sum(e.retransmissions for e in ends)
        (a0, a1), (j0, j1) = self.alone, window
        alone = sum(received_between(list(e.samples), a0, a1) for e in ends)
        stats = [BackgroundStats(e.flows, e.offered_bps * FRAME_BYTES / SEGMENT * dilation, e.sent_bytes,
                                 received_between(list(e.samples), j0, j1)) for e in ends]
        asked = sum(f.bps for f in asked_flows(requested, self.run.background, self.run.seed))
        summary = background_summary(self.run.background, stats, (j1 - j0) / dilation, {}, asked)
        return with_alone(summary, alone * 8 * dilation / (a1 - a0) / 1e6)


def net_index(graph: nx.Graph, host: str) -> int:
    from innet.graph import node_indices

    return node_indices(graph)[host]
