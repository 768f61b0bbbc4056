"""The Mininet network of a graph, the processes started in it, and removing all of it.

Every graph node becomes a Mininet node in its own network namespace; links are TCLinks (htb shaping)
named so that port ``i`` of node ``n`` is interface ``n-eth<i>``. Everything created is recorded
(innet.backends.mininet.cleanup) before it exists and removed on success, error, Ctrl-C and SIGTERM. A
run's files sit in a private run directory (``tempfile.mkdtemp``: 0700, a name no one can take first).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

import networkx as nx

from innet.backends.cluster.servers import Cluster, place
from innet.backends.mininet.cleanup import RunState, delete_intfs, kill_recorded
from innet.backends.mininet.control import Control
from innet.backends.mininet.shaper import burst_command, hold, release
from innet.errors import UserError
from innet.events import emit
from innet.graph import link_name, link_totals, natural_key, port_to
from innet.node.codec import write
from innet.node.usage import interface_drops, queue_drops
from innet.planning.grouping import group_size, node_groups
from innet.planning.timing.dilation import TCLINK_MAX_MBPS
from innet.shipped import CHECKOUT as ROOT  # on the node processes' PYTHONPATH
from innet.wire.packet import ETH_MTU

ETH_HEADER = 14  # bytes a VXLAN device's counters leave out of every frame (they count from the inner IP header)
Counters = dict[str, dict[str, int]]  # node -> interface -> bytes sent
N = TypeVar("N", bound="Network")


# innet's node processes run one thread: numpy's OpenBLAS would start one per core (its start alone cost ~0.1 s of
# CPU a process here), which none uses, and whose times leave with it (innet.node.usage.process_times)
NODE_ENV = {"OPENBLAS_NUM_THREADS": "1"}
QUEUE_FRAMES = 1000  # a veth's default txqueuelen: the frames its queue holds, unless a run needs more


def log(msg: str, kind: str = "phase") -> None:
    """Say what the emulation is doing (innet.events): a phase by default."""
    emit(kind, msg)


def interface_bytes(links: str) -> dict[str, int]:
    """tx bytes of every interface of a Mininet node, from its ``ip -d -s -j link show`` read inside its namespace:
    whole Ethernet frames, as a veth counts them, on a cluster's VXLAN tunnels too."""
    try:
        shown = json.loads(links)
    except ValueError:
        return {}
    return {d["ifname"]: int(d["stats64"]["tx"]["bytes"])
            + (ETH_HEADER * int(d["stats64"]["tx"]["packets"]) if d.get("linkinfo", {}).get("info_kind") == "vxlan" else 0)
            for d in shown if "stats64" in d}


def direction_bytes_between(graph: nx.Graph, before: Counters, after: Counters) -> dict[tuple[str, str], int]:
    """Bytes each link direction (from, to) carried between two readings of every node's interface counters: what
    the sending end's interface transmitted."""
    out = {}
    for u, v in graph.edges:
        for a, b in ((u, v), (v, u)):
            intf = f"{a}-eth{port_to(graph, a, b)}"
            out[(a, b)] = after[a].get(intf, 0) - before[a].get(intf, 0)
    return out


def link_bytes_between(graph: nx.Graph, before: Counters, after: Counters) -> dict[str, int]:
    """Bytes each link carried between two readings of every node's interface counters (both directions)."""
    return link_totals(direction_bytes_between(graph, before, after))


@contextmanager
def signals_as_interrupts() -> Iterator[None]:
    old = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


@contextmanager
def signals_deferred() -> Iterator[None]:
    """SIGINT and SIGTERM that arrive during the block interrupt right after it: what the block creates is
    recorded before an interrupt lands. Python-level handlers, not a signal mask: the kernel may hand a
    signal to any thread that does not block it (numpy's BLAS thread, for one), and Python then runs the
    handler in the main thread whatever the main thread's mask is."""
    caught: list[int] = []
    old: dict[signal.Signals, Any] = {}
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            old[sig] = signal.signal(sig, lambda signum, _frame: caught.append(signum))
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        if caught:
            raise KeyboardInterrupt


@contextmanager
def built(graph: nx.Graph, mtu: int, make: type[N], cluster: Cluster | None = None, tag: str = "") -> Iterator[N]:
    """The network of ``graph`` built (as ``make``: a Network, or what runs on one), every link's MTU ``mtu``, with its
    run directory and state file; all of it removed on exit, SIGINT and SIGTERM included. The state file and
    run directory are made with those signals deferred, so an interrupt cannot land between creating them
    and recording that they exist."""
    state: RunState | None = None
    net: N | None = None
    run_dir = ""
    with signals_as_interrupts():
        try:
            with signals_deferred():
                run_dir = tempfile.mkdtemp(prefix=f"innet-{tag}-" if tag else "innet-")
                state = RunState(os.path.basename(run_dir), run_dir)
            net = make(graph, state, run_dir, mtu, cluster)
            net.build()
            yield net
        finally:
            with signals_deferred():
                if net is not None:
                    net.teardown()
                if state is not None:
                    state.remove()
                elif run_dir and os.path.isdir(run_dir):
                    os.rmdir(run_dir)


class Network:
    """A built Mininet network and what runs in it, all recorded in ``state``; files in ``run_dir``."""

    def __init__(self, graph: nx.Graph, state: RunState, run_dir: str, mtu: int, cluster: Cluster | None = None) -> None:
        self.graph = graph
        self.cluster = cluster
        self.placement = place(graph, cluster.servers) if cluster is not None else {}
        self.mtu = mtu
        self.state = state
        self.run_dir = run_dir
        self.net: Any = None
        self.procs: list[subprocess.Popen[bytes]] = []
        self.controls: list[Control] = []  # closed at teardown
        self.pcaps = False
        self.bursts = False  # shaped links send in bursts of BURST_S (innet.backends.mininet.shaper)

    def build(self) -> None:
        from mininet.net import Mininet
        from mininet.node import Host

        from innet.backends.cluster.remote import RemoteHost, VxlanLink

        graph = self.graph
        log(f"building {graph.graph.get('name', 'topology')}: {graph.number_of_nodes()} nodes, "
            f"{graph.number_of_edges()} links")
        link, host = (VxlanLink, RemoteHost) if self.cluster is not None else (_made_link(), Host)
        if self.cluster is not None:
            self._connect()
        remote = {"cluster": self.cluster} if self.cluster is not None else {}
        self.net = net = Mininet(topo=None, build=False, controller=None, link=link, autoSetMacs=False,
                                 autoStaticArp=False, waitConnected=False)
        names = sorted(graph, key=natural_key)
        self.state.add_intfs([f"{n}-eth{p}" for n in names for p in range(graph.degree(n))])
        for name in names:
            with signals_deferred():  # a node's shell is recorded before an interrupt can land
                node = net.addHost(name, cls=host, ip=None, inNamespace=True,
                                   **({"server": self.placement[name], **remote} if remote else {}))
                self.state.add_pid(f"mininet:{name}", node.shell.pid)  # here: a remote node's is its ssh
        unshaped = 0
        shaped: list[tuple[str, str, float]] = []
        edges = sorted(graph.edges(data=True), key=lambda e: link_name(e[0], e[1]))
        if self.cluster is None:
            self._make_pairs([(u, v) for u, v, _ in edges])
        for u, v, data in edges:
            params: dict[str, float] = {}
            if data["bw"] <= TCLINK_MAX_MBPS:
                params = {"bw": data["bw"]} if self.cluster is not None else {}  # here: shaped below, node by node
                shaped += [(u, f"{u}-eth{port_to(graph, u, v)}", data["bw"]), (v, f"{v}-eth{port_to(graph, v, u)}", data["bw"])]
            else:
                unshaped += 1
            net.addLink(u, v, port1=port_to(graph, u, v), port2=port_to(graph, v, u),
                        intfName1=f"{u}-eth{port_to(graph, u, v)}", intfName2=f"{v}-eth{port_to(graph, v, u)}", **params)
        if unshaped:
            log(f"{unshaped} link(s) above {TCLINK_MAX_MBPS:g} Mbit/s are left unshaped (TCLink cannot shape them)")
        net.build()
        self.bursts = bool(shaped) and self.cluster is None and hold(self.state)
        self._configure(shaped)
        loss = float(graph.graph.get("kernel_loss", 0.0))  # another program's traffic (gloo's TCP): the kernel drops
        if loss:
            self._kernel_loss(shaped, loss)

    def _make_pairs(self, links: list[tuple[str, str]]) -> None:
        """Every link's veth pair, each end made in its node's namespace, by one ``ip -batch`` (Mininet's links made
        and brought up each end one shell command at a time: 1,920 round trips, 12 s of k=8's bring-up at load 9)."""
        graph = self.graph
        lines = [f"link add name {u}-eth{port_to(graph, u, v)} netns {self.net.get(u).pid} type veth "
                 f"peer name {v}-eth{port_to(graph, v, u)} netns {self.net.get(v).pid}" for u, v in links]
        made = subprocess.run(["ip", "-batch", "-"], input="\n".join(lines), capture_output=True, text=True, check=False)
        if made.returncode:
            raise UserError(f"cannot make the links' veth pairs: {made.stderr.strip()}")

    def _configure(self, shaped: list[tuple[str, str, float]]) -> None:
        """Each node's interfaces set up as the run needs them: no offloads, jumbo MTU where the frames need it, the
        ``shaped`` interfaces' queues and shapers, IPv6 off; one shell round trip a node."""
        net = self.net
        ip: dict[str, list[str]] = {n.name: [] for n in net.hosts}  # each node's `ip -batch` and `tc -batch` lines
        tc: dict[str, list[str]] = {n.name: [] for n in net.hosts}
        offload: dict[str, list[str]] = {n.name: [] for n in net.hosts}
        for node in net.hosts:
            for intf in node.intfNames():
                if intf != "lo":
                    offload[node.name].append(f"ethtool -K {intf} tx off rx off sg off tso off gso off gro off >/dev/null 2>&1")
                    ip[node.name].append(f"link set {intf} up")
                    if self.mtu != ETH_MTU:  # frames longer than Ethernet's (--packet-elements): jumbo links
                        ip[node.name].append(f"link set {intf} mtu {self.mtu}")
        for name, intf, bw in shaped:
            ip[name] += self._queue_length(intf)
            tc[name] += self._shaper(intf, bw)
        commands = {}  # one shell round trip and one ip and tc process a node, all nodes' at once: k=8's 768
        for node in net.hosts:  # interfaces' commands one by one (Mininet's TCLink's and these) took its bring-up 1.5-2 minutes
            lines = ["sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1", *offload[node.name]]
            lines += [_batch(tool, cmds) for tool, cmds in (("ip", ip[node.name]), ("tc", tc[node.name])) if cmds]
            commands[node.name] = "{ " + " ; ".join(lines) + " ; } 2>&1 | grep -v '^Warning'"
        for name, error in self.each_node(commands).items():
            if error.strip():
                raise UserError(f"cannot set up {name}'s interfaces: {error.strip()}")

    def _queue_length(self, intf: str) -> list[str]:
        """``ip`` lines giving ``intf`` a queue that holds the frames the run can have in flight (pfifo_fast's limit:
        the interface's txqueuelen)."""
        queue = max(QUEUE_FRAMES, int(self.graph.graph.get("queue_frames", 0)))
        return [f"link set {intf} txqueuelen {queue}"] if queue > QUEUE_FRAMES else []

    def _shaper(self, intf: str, bw: float) -> list[str]:
        """``tc`` lines shaping ``intf`` at ``bw`` Mbit/s: TCLink's htb class (root 5:, class 5:1, burst 15 KB; a
        cluster's links have it from VxlanLink already), strict-priority queues under it
        (innet.rawport.SOCKET_PRIORITY), and the shaper's bursts."""
        out = [] if self.cluster is not None else [f"qdisc add dev {intf} root handle 5:0 htb default 1",
                                                   f"class add dev {intf} parent 5:0 classid 5:1 htb rate {bw:f}Mbit burst 15k"]
        out.append(f"qdisc add dev {intf} parent 5:1 handle 10: pfifo_fast")
        if self.bursts:  # the shaper's bursts (innet.backends.mininet.shaper)
            out.append(burst_command(intf, bw, self.mtu + ETH_HEADER).removeprefix("tc "))
        return out

    def _delete_links(self) -> None:
        """Every link's veth pair deleted, one ``ip -batch`` a node (Mininet's ``stop`` deleted them one command each:
        22 s of k=8's teardown)."""
        ends: dict[Any, list[str]] = {}
        for link in self.net.links:
            ends.setdefault(link.intf1.node, []).append(f"link del {link.intf1.name}")
        self.each_node({node.name: _batch("ip", lines) + " >/dev/null 2>&1" for node, lines in ends.items()
                        if node.shell and not node.waiting})  # a shell an interrupt left mid-command: Mininet's stop, or the record
        self.net.links = []

    def _kernel_loss(self, shaped: list[tuple[str, str, float]], loss: float) -> None:
        """Drop ``loss`` of every shaped interface's frames in the kernel, for traffic innet's ports do not send (gloo's
        TCP): a classic-BPF filter draws a random number per frame (``ld rand``) and sends that share to a class whose
        queue holds nothing. (netem would do it, but this kernel has no sch_netem, nor tc's gact action.)"""
        threshold = min(int(loss * 2**32), 2**32 - 1)
        program = f"4,32 0 0 {2**32 - 4040},53 1 0 {threshold},6 0 0 {2**32 - 1},6 0 0 0"  # ld rand; jge T; drop; pass
        for name, intf, bw in shaped:
            node = self.net.get(name)
            for command in (f"tc class add dev {intf} parent 5: classid 5:2 htb rate {bw:f}Mbit",
                            f"tc qdisc add dev {intf} parent 5:2 handle 20: pfifo limit 0",
                            f'tc filter add dev {intf} parent 5: protocol all prio 1 bpf bytecode "{program}" classid 5:2'):
                error = node.cmd(command + " 2>&1 | grep -v '^Warning'")
                if error.strip():
                    raise UserError(f"cannot make {intf} lossy: {error.strip()}")

    def _connect(self) -> None:
        """One ssh login per server for the run (innet.backends.cluster.servers.Cluster.master), recorded like every process;
        teardown ends them last, after Mininet has stopped the nodes through them."""
        assert self.cluster is not None
        self.cluster = dataclasses.replace(self.cluster, control_dir=self.run_dir)
        for server in self.cluster.servers:
            with signals_deferred():
                proc = subprocess.Popen(self.cluster.master(server), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL, start_new_session=True)
                self.state.add_pid(f"ssh:{server}", proc.pid)
        self.cluster.wait_masters()

    def add_ip_network(self) -> None:
        """Addresses and routes for IP beside innet's frames (innet.backends.mininet.iplane): for torch.distributed."""
        from innet.backends.mininet.iplane import ip_commands

        for name, commands in ip_commands(self.graph).items():
            for command in commands:
                error = self.net.get(name).cmd(command + " 2>&1")
                if error.strip():
                    raise UserError(f"cannot set up IP on {name} ({command}): {error.strip()}")


    def spawn(self, name: str | None, args: list[str], extra_env: Mapping[str, str] | None = None,
              **kw: Any) -> subprocess.Popen[bytes]:
        """Start ``args`` inside node ``name`` (or, with None, here), recorded for teardown; ``extra_env`` added
        to its environment (innet's own node processes: ``NODE_ENV``)."""
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), **(extra_env or {}))
        proc: subprocess.Popen[bytes]
        with signals_deferred():  # a process is recorded before an interrupt can land
            if name is None:
                proc = subprocess.Popen(args, env=env, **kw)
            else:
                proc = self.net.get(name).popen(args, env=env, **kw)
            self.procs.append(proc)
            self.state.add_pid(f"innet:{name or 'root'}", proc.pid)
        return proc

    def groups(self, names: list[str], wanted: int | None, hosts: bool = False) -> list[list[str]]:
        """``names`` in the node groups their processes serve (innet.planning.grouping): on small runs one each, or
        with ``hosts`` (workers) one a core."""
        return node_groups(names, group_size(len(names), os.cpu_count() or 1, wanted, hosts), self.placement)

    def netns(self, name: str) -> str:
        return f"/proc/{self.net.get(name).pid}/ns/net"


    def write(self, name: str, conf: object) -> str:
        """Write a node's configuration (innet.node.config) to the run directory; its path."""
        path = os.path.join(self.run_dir, name)
        write(path, conf)
        return path

    def each_node(self, commands: dict[str, str]) -> dict[str, str]:
        """What each named node's command of ``commands`` printed in its shell: all sent before any is read, so their
        round trips overlap (one node after the other, reading k=8's 208 nodes' counters took 5-9 s, load 9-11)."""
        nodes = [self.net.get(name) for name in commands]
        for node in nodes:
            node.sendCmd(commands[node.name])
        return {node.name: node.waitOutput() for node in nodes}

    def counters(self) -> tuple[Counters, tuple[dict[str, int], dict[str, int]]]:
        """Every interface's tx bytes (``interface_bytes``) and the frames it dropped so far: at its queue, and
        itself; one shell round trip a node."""
        shown = self.each_node({n.name: f"ip -d -s -j link show; echo '{_QDISCS}'; tc -s -j qdisc show"
                                for n in self.net.hosts})
        sent: Counters = {}
        queue: dict[str, int] = {}
        interface: dict[str, int] = {}
        for name, out in shown.items():
            links, _, qdiscs = out.partition(_QDISCS)
            sent[name] = interface_bytes(links)
            queue.update(queue_drops(qdiscs))
            interface.update(interface_drops(links))
        return sent, (queue, interface)

    def interface_bytes(self) -> Counters:
        return {name: interface_bytes(out)
                for name, out in self.each_node({n.name: "ip -d -s -j link show" for n in self.net.hosts}).items()}

    def teardown(self) -> None:
        if self.pcaps:
            time.sleep(0.5)  # let tcpdump drain what the kernel already captured
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + 2
        for proc in self.procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            for pipe in (proc.stdin, proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
        for ctl in self.controls:
            ctl.close()
        if self.net is not None:
            try:
                self._delete_links()
                self.net.stop()
            except Exception as exc:  # noqa: BLE001 - an interrupt inside a node's cmd() leaves Mininet unable to stop
                log(f"Mininet could not stop the network ({type(exc).__name__}); removing what the run recorded instead")
        kill_recorded(self.state.data.pids, grace=0.5)
        delete_intfs(self.state.data.intfs)
        if self.state.data.htb_hysteresis:
            release(own=self.state.path)


def _made_link() -> type:
    """Mininet's link between two nodes whose veth pair ``Network._make_pairs`` made: it makes none, and its
    interfaces run no command (``Network._configure`` sets them up, one batch a node)."""
    from mininet.link import Intf, Link

    class MadeIntf(Intf):
        def config(self, **_params: Any) -> dict[str, Any]:
            return {}

    class MadeLink(Link):
        def __init__(self, node1: Any, node2: Any, **params: Any) -> None:
            super().__init__(node1, node2, **{**params, "intf": MadeIntf})

        def makeIntfPair(self, *_args: Any, **_kwargs: Any) -> None:  # noqa: N802 - Mininet's name
            return None

    return MadeLink


_QDISCS = "--- qdiscs ---"  # between a node's links and its queues in ``Network.counters``' output


def _batch(tool: str, lines: list[str]) -> str:
    """A shell command running ``lines`` through one ``tool -batch`` process (``ip`` or ``tc``)."""
    return f"printf '%s\\n' {' '.join(shlex.quote(line) for line in lines)} | {tool} -batch -"
