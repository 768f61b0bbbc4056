"""``--background`` on Mininet: a sender in every host's namespace (innet.node.background), started before
the job and stopped after it; their stats become the record's ``background`` figure."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import networkx as nx

from innet.backends.mininet.network import Network
from innet.backends.mininet.nodes import await_ready
from innet.hosts.background import BackgroundStats, BackgroundSummary, asked_flows, background_summary, host_flows
from innet.node.background import BackgroundConfig
from innet.node.codec import read
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
            self.procs[host] = net.spawn(host, [sys.executable, "-m", "innet.node.background", path],
                                         stdout=subprocess.PIPE)
            self.paths.append(stats)
        await_ready({f"{h}:background": p for h, p in self.procs.items()})

    def stop(self, requested: nx.Graph, dilation: float) -> BackgroundSummary:
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


def net_index(graph: nx.Graph, host: str) -> int:
    from innet.graph import node_indices

    return node_indices(graph)[host]
