"""``--cluster``: the Mininet network spread over servers, the way Mininet Cluster Edition spreads it.

As in Mininet's ``examples/cluster.py`` (whose Python 3 version ships with Debian's mininet 2.3.0): a server is
reached over ssh; a node placed on it is a shell started there by ``mnexec`` in a namespace of its own, and
everything innet starts in that node goes through ssh the same way (``RemoteHost``); switches are dealt evenly
over the servers and every host goes with its switch (Mininet's SwitchBinPlacer, ``place``). A link between two
nodes on one server is a veth pair made there; a link between servers is a VXLAN tunnel (``VxlanLink``, where
Mininet has GRE and ssh tunnels): one VXLAN device on each server, over the servers' own network, moved into its
node's namespace under the link's interface name (those node and link classes: innet.backends.cluster.remote). The emulated
network is the one a single machine builds — the same names, ports and TCLink shaping — so the same all-reduce
moves the same bytes on every link.

Unlike upstream, a remote command keeps ssh's terminal and is not detached from it (no ``mnexec -d``): when innet
ends the local ssh, the server hangs up on everything it started, so nothing is left behind there. The run
directory (control sockets, results) is read at the same path on every server: the servers must share it (they do
when they are namespaces of one machine, as ``scripts/cluster_servers.py`` makes them; on separate machines, a
shared mount).
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import networkx as nx

from innet.errors import UserError
from innet.graph import is_switch, link_name, natural_key

_SERVER = re.compile(r"^(?:[A-Za-z0-9_][A-Za-z0-9_.-]*@)?[A-Za-z0-9][A-Za-z0-9.:-]*$")


def parse_servers(text: str) -> tuple[str, ...]:
    """``HOST1,HOST2,...`` (each a name or address, optionally ``user@``), each once."""
    servers = tuple(s.strip() for s in text.split(","))
    bad = [s for s in servers if not _SERVER.match(s)]
    if bad or not servers:
        raise UserError(f"{{cluster}} wants servers as HOST1,HOST2,... (names or addresses), got {text!r}")
    repeated = sorted({s for s in servers if servers.count(s) > 1})
    if repeated:
        raise UserError(f"{{cluster}} names {', '.join(repeated)} more than once")
    return servers


@dataclass(frozen=True)
class Cluster:
    """The servers and how to log in to them (ssh as ``user``, with ``key`` and ``known_hosts`` when given)."""

    servers: tuple[str, ...]
    key: str = ""
    known_hosts: str = ""
    user: str = "root"
    control_dir: str = ""  # once a run's masters are up (``master``): every ssh goes through its server's

    def ssh(self, server: str, tty: bool = False) -> list[str]:
        """The ssh command that runs a command on ``server``; ``tty``: a terminal there, hung up when ssh ends."""
        argv = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "-o", "LogLevel=ERROR", "-e", "none",
                "-tt" if tty else "-T"]
        if self.key:
            argv += ["-i", self.key, "-o", "IdentitiesOnly=yes"]
        if self.known_hosts:
            argv += ["-o", f"UserKnownHostsFile={self.known_hosts}", "-o", "StrictHostKeyChecking=yes"]
        if self.control_dir:
            argv += ["-o", "ControlMaster=no", "-o", f"ControlPath={self.control_dir}/ssh-%C"]
        return argv + [server if "@" in server else f"{self.user}@{server}"]

    def master(self, server: str) -> list[str]:
        """The ssh command that holds one login to ``server`` for the whole run (with ``control_dir`` set): the
        nodes' shells and processes are sessions inside it, so a run makes one login per server, not one per
        process (sshd drops logins that arrive together: MaxStartups), and ending it hangs up all of them."""
        argv = self.ssh(server)
        return argv[:-5] + ["-M", "-N", "-o", "ControlPersist=no", "-o", f"ControlPath={self.control_dir}/ssh-%C", argv[-1]]

    def wait_masters(self, timeout: float = 15) -> None:
        """Until every server's master answers (``ssh -O check``)."""
        for server in self.servers:
            deadline = time.monotonic() + timeout
            while subprocess.run(self.ssh(server)[:-1] + ["-O", "check", self.ssh(server)[-1]], capture_output=True,
                                 check=False).returncode:
                if time.monotonic() > deadline:
                    raise UserError(f"the ssh connection to server {server} did not come up in {timeout:g}s")
                time.sleep(0.05)

    def run(self, server: str, command: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """``command`` (a shell line) on ``server``, outside any node."""
        return subprocess.run(self.ssh(server) + [command], capture_output=True, text=True, timeout=timeout,
                              check=False, start_new_session=True)

    def address(self, server: str) -> str:
        """The address other servers reach ``server`` at (for the tunnels)."""
        host = server.rpartition("@")[2]
        out = subprocess.run(["getent", "ahostsv4", host], capture_output=True, text=True, check=False)
        return out.stdout.split()[0] if out.stdout.split() else host

    def check(self) -> None:
        """Log in to every server (all at once) and find mnexec there, or stop with one line saying which failed."""
        if self.key and not os.path.isfile(self.key):
            raise UserError(f"{{cluster_key}} {self.key}: no such file (the private key for the servers' ssh logins)")
        if self.known_hosts and not os.path.isfile(self.known_hosts):
            raise UserError(f"{{cluster_known_hosts}} {self.known_hosts}: no such file")
        with ThreadPoolExecutor(len(self.servers)) as pool:
            answers = list(pool.map(lambda s: (s, self.run(s, "command -v mnexec >/dev/null && echo ok")), self.servers))
        for server, out in answers:
            said = (out.stderr.strip().splitlines() or ["no message"])[-1]
            if out.returncode == 255 and "Permission denied" in said:
                key = f"key {self.key}" if self.key else "ssh's default keys"
                raise UserError(f"server {server} refused the ssh login as {self.user} with {key} ({said}): add the "
                                f"public key to that server's authorized_keys, or name the right one with {{cluster_key}}")
            if out.returncode == 255:
                raise UserError(f"cannot reach server {server} over ssh: {said}")
            if out.stdout.strip() != "ok":
                raise UserError(f"server {server} has no mnexec: install Mininet there (apt-get install mininet)")


def place(graph: nx.Graph, servers: tuple[str, ...]) -> dict[str, str]:
    """Node -> server: switches in name order dealt into even bins (the first servers take one more when they do
    not divide), every other node on the server of the last switch it links to (Mininet's SwitchBinPlacer)."""
    switches = sorted((n for n in graph if is_switch(graph, n)), key=natural_key)
    size, extra = divmod(len(switches), len(servers))
    tickets = [s for i, s in enumerate(servers) for _ in range(size + (i < extra))]
    placement = dict(zip(switches, tickets, strict=True))
    for node in sorted(graph, key=natural_key):
        if node not in placement:
            near = [n for n in sorted(graph[node], key=natural_key) if n in placement]
            if not near:
                raise UserError(f"cannot place {node} on a server: it links to no switch")
            placement[node] = placement[near[-1]]
    return placement


def tunnels(graph: nx.Graph, placement: dict[str, str]) -> list[str]:
    """The links between servers, by name."""
    return sorted((link_name(u, v) for u, v in graph.edges if placement[u] != placement[v]), key=natural_key)


@dataclass(frozen=True)
class ClusterFigures:
    """The run record's ``cluster``: where each node ran, and the bytes that crossed servers, per tunnel and in all."""

    servers: dict[str, list[str]]
    tunnel_bytes: dict[str, int]
    cross_server_bytes: int


def cluster_figures(graph: nx.Graph, placement: dict[str, str], servers: tuple[str, ...],
                    link_bytes: dict[str, int]) -> ClusterFigures:
    crossed = {name: link_bytes[name] for name in tunnels(graph, placement)}
    return ClusterFigures({s: sorted((n for n, p in placement.items() if p == s), key=natural_key) for s in servers},
                          crossed, sum(crossed.values()))
