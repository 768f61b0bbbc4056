"""``--backend mininet``: the experiment on real namespaces and veth links.

The only module that imports Mininet. Every graph node becomes a Mininet node
in its own network namespace; links are TCLinks (htb shaping) named so that
port ``i`` of node ``n`` is interface ``n-eth<i>``. Each switch runs
``innet.node switch``; the controller installs routes and jobs over the
switch's control socket, then releases the workers together and measures the
bytes at every interface. Everything created is recorded (innet.backends.mininet.cleanup) and
removed on success, error, Ctrl-C and SIGTERM.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import networkx as nx
import numpy as np

from innet.backends.mininet.cleanup import RunState, delete_intfs, kill_recorded
from innet.backends.mininet.cluster import Cluster, cluster_figures, place
from innet.backends.mininet.shaper import BURST_S, FLAG, burst_command, hold, release
from innet.errors import UserError
from innet.graph import is_switch, link_name, natural_key, port_to, ports
from innet.hosts.ensemble import InputPlan, input_summary
from innet.node.codec import config_to_json, spec_to_json
from innet.node.usage import Samples, drops_between, has_exited, interface_drops, process_times, queue_drops
from innet.planning.dilation import TCLINK_MAX_MBPS, dilate_graph, dilate_spec, dilate_times, virtual
from innet.planning.grouping import group_label, group_size, node_groups, start_timeout
from innet.planning.spec import RunSpec, program_of
from innet.results.check import WorkerOutcome, run_record, tally_drops
from innet.results.fidelity import CPU_BOUND, fidelity, with_model, with_retransmissions
from innet.results.progress import Progress
from innet.results.record import RunRecord
from innet.schemes.modes import RunPlan, installed_configs, pbox_servers, plan_run
from innet.wire.faults import fault_seed
from innet.wire.packet import ETH_MTU, link_mtu

SAMPLE_S = 0.05  # how often a run's CPU is read while it goes on (longer with over 50 processes to read)
GO_LEAD, GO_LEAD_PER_HOST = 0.03, 0.002  # seconds from "go" to the common start: time to wake every host
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _faults(graph: nx.Graph, run: RunSpec, node: str, latency: bool = False) -> dict[str, dict[str, Any]]:
    """Each port's faults for the link behind it, and their seed (JSON keys are strings). With ``latency``
    the link's latency is added to the port's delay (a dilated run: there it is long enough to matter, and
    ``tc netem`` is not available to add it on the link)."""
    def spec(peer: str) -> dict[str, Any]:
        faults = run.faults_on(node, peer)
        if latency:
            faults = dataclasses.replace(faults, delay=faults.delay + graph.edges[node, peer]["latency"])
        return dataclasses.asdict(faults)

    return {str(p): {"spec": spec(peer), "seed": fault_seed(run.seed, node, peer)} for p, peer in ports(graph, node).items()}


def log(msg: str) -> None:
    print(f"innet: {msg}", file=sys.stderr, flush=True)


def saturated(cores_busy: float) -> bool:
    """Whether ``cores_busy`` cores on average is enough to call the whole machine CPU-bound."""
    return cores_busy >= CPU_BOUND * (os.cpu_count() or 1)


def _faulty(run: RunSpec) -> bool:
    """Whether ``run`` injects faults that make a worker retransmit (loss, duplicates, reordering)."""
    return any(f.loss or f.dup or f.reorder for f in (run.faults, *(f for _, f in run.link_faults)))


def _modelled(run: RunSpec) -> bool:
    """Whether the timing model (innet.planning.timing) predicts ``run``'s time: one job of all-reduce calls,
    dense, on links without faults that make workers retransmit."""
    return not (run.consistency or run.train or run.topk or run.input_elements or run.jobs > 1 or _faulty(run))


class Control:
    """The controller's end of one switch's control channel (JSON lines on a Unix socket). ``proc``, the
    process serving the switch, is watched while the socket comes up: if it dies, that is said at once,
    with the last line of its ``log``."""

    def __init__(self, path: str, timeout: float = 20.0, proc: subprocess.Popen[bytes] | None = None,
                 log: str | None = None) -> None:
        self.path = path
        self.name = os.path.basename(path).removesuffix(".sock")
        self.log = log or path.removesuffix(".sock") + ".log"
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self.sock.connect(path)
                break
            except (FileNotFoundError, ConnectionRefusedError):
                self.sock.close()
                if proc is not None and proc.poll() is not None:
                    raise UserError(f"switch process {self.name} exited before its control socket came up: "
                                    f"{self._last_words()}") from None
                if time.monotonic() > deadline:
                    raise UserError(f"switch control socket {path} did not come up in {timeout:.0f}s") from None
                time.sleep(0.05)
        self.file = self.sock.makefile("rb")

    def close(self) -> None:
        self.file.close()
        self.sock.close()

    def call(self, op: str, **kw: Any) -> dict[str, Any]:
        try:
            self.sock.sendall(json.dumps({"op": op, **kw}).encode() + b"\n")
            line = self.file.readline()
        except OSError:
            line = b""
        if not line:
            raise UserError(f"switch process {self.name} exited unexpectedly: {self._last_words()}")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def _last_words(self) -> str:
        """The last line the switch process wrote to its log (its error, when it crashed)."""
        try:
            with open(self.log, encoding="utf-8", errors="replace") as fh:
                lines = [ln.strip() for ln in fh if ln.strip()]
        except OSError:
            lines = []
        return lines[-1] if lines else "no message"


ETH_HEADER = 14  # bytes a VXLAN device's counters leave out of every frame (they count from the inner IP header)


def interface_bytes(node: Any) -> dict[str, int]:
    """tx bytes of every interface of a Mininet node, read inside its namespace: whole Ethernet frames, as a veth
    counts them, on a cluster's VXLAN tunnels too."""
    out = node.cmd("ip -d -s -j link show")
    try:
        links = json.loads(out)
    except ValueError:
        return {}
    return {d["ifname"]: int(d["stats64"]["tx"]["bytes"])
            + (ETH_HEADER * int(d["stats64"]["tx"]["packets"]) if d.get("linkinfo", {}).get("info_kind") == "vxlan" else 0)
            for d in links if "stats64" in d}


@contextmanager
def _signals_as_interrupts() -> Iterator[None]:
    def raise_interrupt(*_: Any) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


@contextmanager
def _signals_deferred() -> Iterator[None]:
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


def run_mininet(graph: nx.Graph, run: RunSpec, pcap_dir: str | None = None, cli: bool = False,
                pbox_cores: int = 1, crash: dict[str, float] | None = None,
                intruders: list[tuple[str, list[str]]] | None = None, cluster: Cluster | None = None,
                dilation: float = 1.0, node_group: int | None = None) -> RunRecord:
    """Run ``run`` on a Mininet network built from ``graph``; remove everything afterwards.

    ``crash`` kills the named worker hosts' processes (SIGKILL) that many seconds
    after the start; ``intruders`` are extra commands started on hosts with the
    workers (the tests' spoofers and fuzzers); ``cluster`` spreads the network over
    servers (innet.backends.mininet.cluster), every one of them checked before anything starts.
    ``dilation``: the time dilation factor
    (innet.planning.dilation): the network is built and the run given its times ``dilation``
    times slower, and the record's times are the requested (virtual) ones. ``node_group``: switches
    (and workers) per process, None for innet.planning.grouping's choice.
    """
    from mininet.log import setLogLevel

    setLogLevel("critical")
    wire_graph, wire_run = dilate_graph(graph, dilation), dilate_spec(run, dilation)
    rp = plan_run(wire_graph, wire_run, program_of(wire_run))
    program = program_of(wire_run, rp.fan_in)
    configs = installed_configs(wire_graph, wire_run, rp)
    run_id = f"{os.getpid()}-{time.strftime('%H%M%S')}"
    answer = program.elements + (1 if run.consistency else 0)  # a parameter server's answer leads with its clock
    if cluster is not None:
        cluster.check()
    with _emulation(wire_graph, run_id, link_mtu(answer), cluster) as emu:
        emu.dilate(dilation, graph, run)
        emu.node_group = node_group
        emu.start_switches(wire_run, program, configs, pcap_dir)
        return emu.execute(wire_run, rp, pbox_cores, dilate_times(crash or {}, dilation), intruders or [], cli)


@contextmanager
def network(graph: nx.Graph, mtu: int = ETH_MTU, tag: str = "bench") -> Iterator[Emulation]:
    """A bare Mininet network of ``graph`` (nothing started on it), removed on exit: for benchmarks, and for
    other programs' processes (innet.integrations.torch.ranks)."""
    from mininet.log import setLogLevel

    setLogLevel("critical")
    with _emulation(graph, f"{os.getpid()}-{time.strftime('%H%M%S')}-{tag}", mtu) as emu:
        yield emu


@contextmanager
def _emulation(graph: nx.Graph, run_id: str, mtu: int, cluster: Cluster | None = None) -> Iterator[Emulation]:
    """The network of ``graph`` built, every link's MTU ``mtu``, with its run directory and state file; all of
    it removed on exit, SIGINT and SIGTERM included. The state file and run directory are made with those
    signals deferred, so an interrupt cannot land between creating them and recording that they exist."""
    run_dir = f"/tmp/innet-{run_id}"
    state: RunState | None = None
    emu: Emulation | None = None
    with _signals_as_interrupts():
        try:
            with _signals_deferred():
                os.makedirs(run_dir)
                state = RunState(run_id, run_dir)
            emu = Emulation(graph, state, run_dir, mtu, cluster)
            emu.build()
            yield emu
        finally:
            with _signals_deferred():
                if emu is not None:
                    emu.teardown()
                if state is not None:
                    state.remove()
                elif os.path.isdir(run_dir):
                    os.rmdir(run_dir)


def link_bytes_between(graph: nx.Graph, before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]) -> dict[str, int]:
    """Bytes each link carried between two readings of every node's interface counters (both directions)."""
    out = {}
    for u, v in graph.edges:
        out[link_name(u, v)] = sum(after[a].get(f"{a}-eth{port_to(graph, a, b)}", 0)
                                   - before[a].get(f"{a}-eth{port_to(graph, a, b)}", 0) for a, b in ((u, v), (v, u)))
    return out


class Emulation:
    def __init__(self, graph: nx.Graph, state: RunState, run_dir: str, mtu: int, cluster: Cluster | None = None) -> None:
        self.graph = graph
        self.cluster = cluster
        self.placement = place(graph, cluster.servers) if cluster is not None else {}
        self.mtu = mtu
        self.state = state
        self.run_dir = run_dir
        self.net: Any = None
        self.procs: list[subprocess.Popen[bytes]] = []
        self.controls: list[Control] = []
        self.pcaps = False
        self.switch_controls: dict[str, Control] = {}
        self.switch_procs: dict[str, subprocess.Popen[bytes]] = {}
        self.times_at_exit: dict[int, tuple[float, float] | None] = {}
        self.dilation = 1.0
        self.requested: tuple[nx.Graph, RunSpec] | None = None
        self.node_group: int | None = None  # nodes per process (innet.planning.grouping); None: its choice
        self.bursts = False  # shaped links send in bursts of BURST_S (innet.backends.mininet.shaper)

    def dilate(self, factor: float, graph: nx.Graph, run: RunSpec) -> None:
        """This network is ``graph`` dilated by ``factor``, running ``run`` dilated: ports add each link's
        latency, and the record is written for ``graph`` and ``run`` with times divided by ``factor``."""
        self.dilation, self.requested = factor, (graph, run)

    def _port_faults(self, run: RunSpec, node: str) -> dict[str, dict[str, Any]]:
        return _faults(self.graph, run, node, latency=self.dilation > 1)

    def build(self) -> None:
        from mininet.link import TCLink
        from mininet.net import Mininet
        from mininet.node import Host

        from innet.backends.mininet.remote import RemoteHost, VxlanLink

        graph = self.graph
        log(f"building {graph.graph.get('name', 'topology')}: {graph.number_of_nodes()} nodes, "
            f"{graph.number_of_edges()} links")
        link, host = (VxlanLink, RemoteHost) if self.cluster is not None else (TCLink, Host)
        if self.cluster is not None:
            self._connect()
        remote = {"cluster": self.cluster} if self.cluster is not None else {}
        self.net = net = Mininet(topo=None, build=False, controller=None, link=link, autoSetMacs=False,
                                 autoStaticArp=False, waitConnected=False)
        names = sorted(graph, key=natural_key)
        self.state.add_intfs([f"{n}-eth{p}" for n in names for p in range(graph.degree(n))])
        for name in names:
            with _signals_deferred():  # a node's shell is recorded before an interrupt can land
                node = net.addHost(name, cls=host, ip=None, inNamespace=True,
                                   **({"server": self.placement[name], **remote} if remote else {}))
                self.state.add_pid(f"mininet:{name}", node.shell.pid)  # here: a remote node's is its ssh
        unshaped = 0
        shaped: list[tuple[str, str, float]] = []
        for u, v, data in sorted(graph.edges(data=True), key=lambda e: link_name(e[0], e[1])):
            params: dict[str, Any] = {}
            if data["bw"] <= TCLINK_MAX_MBPS:
                params = {"bw": data["bw"]}
                shaped += [(u, f"{u}-eth{port_to(graph, u, v)}", data["bw"]), (v, f"{v}-eth{port_to(graph, v, u)}", data["bw"])]
            else:
                unshaped += 1
            net.addLink(u, v, port1=port_to(graph, u, v), port2=port_to(graph, v, u),
                        intfName1=f"{u}-eth{port_to(graph, u, v)}", intfName2=f"{v}-eth{port_to(graph, v, u)}", **params)
        if unshaped:
            log(f"{unshaped} link(s) above {TCLINK_MAX_MBPS:g} Mbit/s are left unshaped (TCLink cannot shape them)")
        net.build()
        for node in net.hosts:
            node.cmd("sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1")
            for intf in node.intfNames():
                if intf != "lo":
                    node.cmd(f"ethtool -K {intf} tx off rx off sg off tso off gso off gro off >/dev/null 2>&1")
                    if self.mtu != ETH_MTU:  # frames longer than Ethernet's (--packet-elements): jumbo links
                        node.cmd(f"ip link set {intf} mtu {self.mtu}")
        self.bursts = bool(shaped) and self.cluster is None and hold(self.state)
        for name, intf, bw in shaped:  # strict-priority queues under the shaper (innet.rawport.SOCKET_PRIORITY)
            error = net.get(name).cmd(f"tc qdisc add dev {intf} parent 5:1 handle 10: pfifo_fast")
            if self.bursts and not error.strip():  # the shaper's bursts (innet.backends.mininet.shaper)
                error = net.get(name).cmd(burst_command(intf, bw, self.mtu + ETH_HEADER))
            if error.strip():
                raise UserError(f"cannot set up the shaper of {intf}: {error.strip()}")

    def _connect(self) -> None:
        """One ssh login per server for the run (innet.backends.mininet.cluster.Cluster.master), recorded like every process;
        teardown ends them last, after Mininet has stopped the nodes through them."""
        assert self.cluster is not None
        self.cluster = dataclasses.replace(self.cluster, control_dir=self.run_dir)
        for server in self.cluster.servers:
            with _signals_deferred():
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

    def _popen(self, name: str | None, args: list[str], **kw: Any) -> subprocess.Popen[bytes]:
        """Start ``args`` inside node ``name`` (or, with None, here), recorded for teardown."""
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        proc: subprocess.Popen[bytes]
        with _signals_deferred():  # a process is recorded before an interrupt can land
            if name is None:
                proc = subprocess.Popen(args, env=env, **kw)
            else:
                proc = self.net.get(name).popen(args, env=env, **kw)
            self.procs.append(proc)
            self.state.add_pid(f"innet:{name or 'root'}", proc.pid)
        return proc

    spawn = _popen

    def _groups(self, names: list[str], wanted: int | None) -> list[list[str]]:
        """``names`` in the node groups their processes serve (innet.planning.grouping): one each on small runs."""
        return node_groups(names, group_size(len(names), os.cpu_count() or 1, wanted), self.placement)

    def _netns(self, name: str) -> str:
        return f"/proc/{self.net.get(name).pid}/ns/net"

    def start_switches(self, run: RunSpec, program: Any, configs: dict[str, Any], pcap_dir: str | None) -> None:
        graph = self.graph
        switches = [n for n in sorted(graph, key=natural_key) if is_switch(graph, n)]
        if pcap_dir:
            self._start_pcaps(pcap_dir, switches)
        confs = {sw: {"program": run.program, "pool_slots": run.pool_slots, "packet_elements": run.packet_elements,
                      "fan_in": getattr(program, "fan_in", 0),
                      "ports": {p: f"{sw}-eth{p}" for p in configs[sw].ports}, "faults": self._port_faults(run, sw),
                      "control": os.path.join(self.run_dir, f"{sw}.sock")} for sw in switches}
        served_by: dict[str, tuple[subprocess.Popen[bytes], str]] = {}
        for group in self._groups(switches, self.node_group):
            label, role = self._write_group(group, confs, "switch", "switches")
            log_path = os.path.join(self.run_dir, f"{label}.log")
            with open(log_path, "wb") as log_file:
                proc = self.switch_procs[label] = self._popen(
                    group[0], [sys.executable, "-m", "innet.node", role, os.path.join(self.run_dir, f"{label}.json")],
                    stdout=subprocess.DEVNULL, stderr=log_file)
            served_by.update({sw: (proc, log_path) for sw in group})
        progress = Progress("innet")
        deadline = time.monotonic() + start_timeout(len(self.switch_procs))
        for sw in switches:
            proc, log_path = served_by[sw]
            self.switch_controls[sw] = Control(os.path.join(self.run_dir, f"{sw}.sock"),
                                               max(0.0, deadline - time.monotonic()), proc, log_path)
            progress.update(lambda: f"{len(self.switch_controls)}/{len(switches)} switches up")
        progress.close()
        self.controls.extend(self.switch_controls.values())
        for sw, ctl in self.switch_controls.items():
            reply = ctl.call("install", config=config_to_json(configs[sw]))
            if not reply.get("ok"):
                raise UserError(reply.get("error", f"switch {sw} refused its configuration"))
        grouped = f" in {len(self.switch_procs)} processes" if len(self.switch_procs) < len(switches) else ""
        log(f"{len(switches)} switches up{grouped} running {program.name}")

    def execute(self, run: RunSpec, rp: RunPlan, pbox_cores: int, crash: dict[str, float],
                intruders: list[tuple[str, list[str]]], cli: bool) -> RunRecord:
        graph, net = self.graph, self.net
        for job, outcome in rp.outcomes.items():
            log(f"job {job}: mode {run.mode}, {outcome}")
        procs: dict[str, subprocess.Popen[bytes]] = {}
        host, servers = pbox_servers(graph, run, rp, pbox_cores)
        for core, server in enumerate(servers):
            conf = {"node": server.node, "cores": pbox_cores, "core": core, "port": f"{host}-eth0",
                    "faults": self._port_faults(run, str(host)),
                    "jobs": [dataclasses.asdict(j) for j in server.jobs.values()]}
            self._write(f"pbox{core}.json", conf)
            procs[f"{host}#{core}"] = self._popen(str(host), [sys.executable, "-m", "innet.node", "pbox",
                                                              os.path.join(self.run_dir, f"pbox{core}.json")],
                                                  stdout=subprocess.PIPE)
        workers, confs = {}, {}
        # a ring neighbour may have missed this rank's last ACKs: answer its probes until it has been quiet
        # for 4 of the longest RTOs (timeout / 32), at most the timeout, before leaving; on lossy links for
        # 16 of them (at 20% loss 4 tries in a row across 4 lossy links all fail 12% of the time, 16 0.02%)
        lossy = run.faults.loss > 0 or any(f.loss > 0 for _, f in run.link_faults)
        linger = (run.timeout / 2 if lossy else max(1.0, run.timeout / 8)) if run.mode == "ring" else 0.0
        for plan in rp.plans:
            for w, spec in rp.specs[plan.job].items():
                conf = {"spec": spec_to_json(spec), "seed": run.seed, "sizes": run.call_sizes(),
                        "topk": run.topk, "layers": run.layers(),
                        "ssp": dataclasses.asdict(run.parameter_server()) if run.consistency else None,
                        "compute": run.compute_times(w, plan.job, spec.rank),
                        "task": dataclasses.asdict(run.task(spec.nworkers)) if run.train else None,
                        "training": dataclasses.asdict(rp.training) if rp.training else None,
                        "port": f"{w}-eth0", "faults": self._port_faults(run, w), "result": os.path.join(self.run_dir, f"{w}.npz"),
                        "mode": run.mode, "ring": rp.ring(plan.job), "linger": linger,
                        "linger_limit": run.timeout if run.mode == "ring" else 0.0}
                confs[w] = conf
        # a worker to crash is alone in its process: the crash kills its process
        for group in self._groups(sorted(confs, key=natural_key), 1 if crash else self.node_group):
            label, role = self._write_group(group, confs, "worker", "workers")
            workers[label] = procs[label] = self._popen(
                group[0], [sys.executable, "-m", "innet.node", role, os.path.join(self.run_dir, f"{label}.json")],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        starters = dict(workers)
        if rp.input is not None:
            starters.update(self._start_input(run, rp.input, procs))
        readers = {name: p for name, p in starters.items() if name.endswith(":input")}
        for name, proc in procs.items():
            assert proc.stdout is not None
            said = proc.stdout.readline().strip()
            if said != b"ready":
                raise UserError(f"{name} failed to start: {said.decode(errors='replace') or 'it said nothing'}")
        cpu_before = {sw: ctl.call("stats")["cpu_s"] for sw, ctl in self.switch_controls.items()}
        tracked = {**self.switch_procs, **procs}
        samples = Samples(lambda: {name: self._times(p) for name, p in tracked.items()}, SAMPLE_S * max(1, len(tracked) / 50))
        before = {n.name: interface_bytes(n) for n in net.hosts}
        drops_before = self._drop_counts()
        log(f"all-reduce: {len(confs)} workers x {run.elements} elements x {run.iterations} iteration(s)")
        started = time.monotonic()
        # one start instant for all hosts, on the clock they share (servers of a cluster do not share it)
        go = b"go\n" if self.cluster else f"go {started + GO_LEAD + GO_LEAD_PER_HOST * len(starters):.6f}\n".encode()
        for proc in starters.values():
            assert proc.stdin is not None
            proc.stdin.write(go)
            proc.stdin.flush()
        others = {f"{name}!{i}": self._popen(name, argv, stdout=subprocess.DEVNULL) for i, (name, argv) in enumerate(intruders)}
        results = [os.path.join(self.run_dir, f"{w}.npz") for w in confs] if linger > 0 else []
        self._wait_workers({**workers, **readers}, run, started, crash, (results, list(workers.values())), samples)
        self._wait_workers(others, run, started, {}, samples=samples)
        samples.take()
        wall = time.monotonic() - started
        after = {n.name: interface_bytes(n) for n in net.hosts}
        drops_after = self._drop_counts()
        start, end = self._calls_window(confs) or (started, started + wall)
        seconds, cpu, waits, machine_busy = samples.shares(start, end, os.cpu_count() or 1)
        stats = {sw: ctl.call("stats") for sw, ctl in self.switch_controls.items()}
        for sw, st in stats.items():  # a switch works only while the calls go on: its CPU since "go" is theirs
            st["cpu_share"] = (st["cpu_s"] - cpu_before[sw]) / seconds if seconds > 0 else 0.0
        for ctl in self.switch_controls.values():
            ctl.call("stop")
        if cli:
            from mininet.cli import CLI

            CLI(net)
        fid = fidelity(self.dilation, cpu, drops_between(drops_before[0], drops_after[0]),
                       drops_between(drops_before[1], drops_after[1]),
                       {sw: sum(st.get("socket_drops", {}).values()) for sw, st in stats.items()}, os.cpu_count() or 1, waits)
        fid["shaper_burst_s"] = BURST_S if self.bursts else None  # None: TCLink's per-frame shaping
        fid["cpu_over_s"] = round(seconds, 3)  # the shares' span: the calls' window, to the readings around it
        return self._record(run, rp, before, after, stats, sum(cpu.values()), machine_busy, fid,
                            modelled=not crash and not intruders)

    def _drop_counts(self) -> tuple[dict[str, int], dict[str, int]]:
        """Every interface's frames dropped so far: at its queue, and by the interface itself."""
        queue: dict[str, int] = {}
        interface: dict[str, int] = {}
        for node in self.net.hosts:
            queue.update(queue_drops(node))
            interface.update(interface_drops(node))
        return queue, interface

    def _times(self, proc: subprocess.Popen[bytes]) -> tuple[float, float] | None:
        """``proc``'s (CPU s, run-queue wait s) so far; a process that has exited, until it exited."""
        return self.times_at_exit.get(proc.pid) if proc.returncode is not None else process_times(proc.pid)

    def _calls_window(self, confs: dict[str, dict[str, Any]]) -> tuple[float, float] | None:
        """From the workers' result files: the first call's start and the last one's end, on this machine's
        monotonic clock (None on a cluster, whose servers' clocks are not this one, or where a result lacks them)."""
        if self.cluster is not None:
            return None
        starts: list[float] = []
        ends: list[float] = []
        for w in confs:
            path = os.path.join(self.run_dir, f"{w}.npz")
            if not os.path.exists(path):
                return None
            data = np.load(path)
            starts.extend(t for t in data["started"].tolist() if np.isfinite(t))  # a call never started: NaN
            ends.extend(t for t in data["finished"].tolist() if np.isfinite(t))
        return (min(starts), max(ends)) if starts and ends else None

    def _start_input(self, run: RunSpec, plan: InputPlan,
                     procs: dict[str, subprocess.Popen[bytes]]) -> dict[str, subprocess.Popen[bytes]]:
        """The ensemble's input stream: its server on the PBox host and a reader beside every worker; all are
        told "go" with the workers (returned), the readers (":input") also waited for like them."""
        roles: list[tuple[str, str, dict[str, Any]]] = [
            (plan.server, "input-server", {"stats": os.path.join(self.run_dir, "input-server.json")})]
        roles += [(r.host, "input", {"reader": dataclasses.asdict(r), "result": os.path.join(self.run_dir, f"{r.host}-input.json")})
                  for r in plan.receivers]
        started: dict[str, subprocess.Popen[bytes]] = {}
        for host, role, extra in roles:
            conf = {"plan": dataclasses.asdict(plan), "port": f"{host}-eth0", "faults": self._port_faults(run, host),
                    **extra}
            self._write(f"{host}-{role}.json", conf)
            proc = self._popen(host, [sys.executable, "-m", "innet.node", role, os.path.join(self.run_dir, f"{host}-{role}.json")],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            procs[f"{host}:{role}"] = started[f"{host}:{role}"] = proc
        return started

    def _input_record(self, plan: InputPlan, stats: dict[str, dict[str, Any]]) -> dict[str, Any]:
        readers = []
        for r in plan.receivers:
            path = os.path.join(self.run_dir, f"{r.host}-input.json")
            if os.path.exists(path):
                with open(path, encoding="utf-8") as fh:
                    reader = json.load(fh)
                reader["completion_s"] /= self.dilation  # back on the requested timeline
                readers.append(reader)
        with open(os.path.join(self.run_dir, "input-server.json"), encoding="utf-8") as fh:
            sent = json.load(fh)["sent_bytes"]
        switch_bytes = sum(st.get("counters", {}).get("input_bytes", 0) for st in stats.values())
        return input_summary(self.graph, plan, readers, sent + switch_bytes)

    def _write_group(self, group: list[str], confs: dict[str, dict[str, Any]], one: str, many: str) -> tuple[str, str]:
        """Write the config of a lone node (role ``one``) or of a group (role ``many``: each node's config with its
        namespace); its label and role."""
        label = group_label(group)
        if len(group) == 1:
            self._write(f"{label}.json", confs[label])
            return label, one
        self._write(f"{label}.json", {many: [{**confs[n], "netns": self._netns(n)} for n in group]})
        return label, many

    def _write(self, name: str, conf: dict[str, Any]) -> None:
        with open(os.path.join(self.run_dir, name), "w", encoding="utf-8") as fh:
            json.dump(conf, fh)

    def _start_pcaps(self, pcap_dir: str, switches: list[str]) -> None:
        os.makedirs(pcap_dir, exist_ok=True)
        self.pcaps = True
        files = []
        for sw in switches:
            for intf in self.net.get(sw).intfNames():
                if intf != "lo":
                    path = os.path.abspath(os.path.join(pcap_dir, f"{intf}.pcap"))
                    self._popen(sw, ["tcpdump", "-i", intf, "-w", path, "-U", "--immediate-mode", "-s", "0", "-q"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    files.append(path)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not all(os.path.exists(f) for f in files):
            time.sleep(0.05)
        time.sleep(0.2)

    def _wait_workers(self, procs: dict[str, subprocess.Popen[bytes]], run: RunSpec, started: float,
                      crash: dict[str, float],
                      lingering: tuple[list[str], list[subprocess.Popen[bytes]]] = ([], []),
                      samples: Samples | None = None) -> None:
        """Wait for ``procs`` to end, crashing the workers ``crash`` names on time, reading ``samples`` as
        they fall due. ``lingering``: result files, and the worker processes that linger after writing theirs
        (the ring's): once every file is there, no rank needs a neighbour's answers any more, and they are
        stopped rather than left to linger out."""
        limit = started + 30 + run.timeout * (len(run.call_sizes()) + 1)
        progress = Progress("innet")
        crash = dict(crash)
        results, lingerers = lingering
        while not all(self._ended(p) for p in procs.values()):
            if results and all(os.path.exists(r) for r in results):
                for proc in lingerers:
                    if proc.poll() is None:
                        proc.terminate()
                results = []
            now = time.monotonic()
            for host, at in list(crash.items()):
                if now - started >= at:
                    log(f"crashing worker {host} (SIGKILL) {at:g}s into the run")
                    procs[host].kill()
                    del crash[host]
            if now > limit:
                raise UserError(f"workers did not finish within {limit - started:.0f}s; see {{timeout}}")
            progress.update(lambda: f"{sum(p.poll() is not None for p in procs.values())}/{len(procs)} worker processes finished")
            if samples is not None:
                samples.due()
            time.sleep(0.01)
        progress.close()

    def _ended(self, proc: subprocess.Popen[bytes]) -> bool:
        """Whether ``proc`` has ended, its CPU times read (into ``times_at_exit``) before it is reaped."""
        if proc.returncode is None and has_exited(proc.pid):
            self.times_at_exit[proc.pid] = process_times(proc.pid)
        return proc.poll() is not None

    def _record(self, run: RunSpec, rp: RunPlan, before: dict[str, dict[str, int]], after: dict[str, dict[str, int]],
                stats: dict[str, dict[str, Any]], busy: float, machine_busy: float, fid: dict[str, Any],
                modelled: bool = True) -> RunRecord:
        graph = self.graph
        link_bytes = link_bytes_between(graph, before, after)
        outcomes = [self._outcome(w, spec) for plan in rp.plans for w, spec in rp.specs[plan.job].items()]
        drops = tally_drops((st.get("counters", {}) for st in stats.values()), {
            "link:lost": sum(st.get("lost", 0) for st in stats.values()),
            "socket": sum(sum(st.get("socket_drops", {}).values()) for st in stats.values()),
        })
        graph, run = self.requested or (graph, run)  # the record is the requested run's, in its timeline
        record = run_record(
            graph, run, rp, "mininet", outcomes, link_bytes, drops,
            switch_memory_bytes={sw: st.get("memory_bytes", 0) for sw, st in stats.items()},
            switch_cpu_share={sw: round(st["cpu_share"], 3) for sw, st in stats.items()},
            busy_cores=round(busy, 2), machine_busy_cores=round(machine_busy, 2),
            switch_counters={sw: st.get("counters", {}) for sw, st in stats.items()},
            **({"input": self._input_record(rp.input, stats)} if rp.input is not None else {}),
            **({"cluster": cluster_figures(graph, self.placement, self.cluster.servers, link_bytes)}
               if self.cluster is not None else {}),
        )
        fid = with_retransmissions(fid, record.retransmissions, _faulty(run))
        if modelled and _modelled(run):  # the timing model gives what the links allow: the local backend's time
            from innet.planning.timing import MININET_HOP, predict

            key = "iteration_s" if run.workload else "completion_s"
            model = predict(graph, run, list(rp.plans), rp.per_packet, MININET_HOP / self.dilation)[key]
            fid = with_model(fid, float(record.get(key, float("nan"))), model)
        return record.with_figures(fidelity=fid)

    def _outcome(self, host: str, spec: Any) -> WorkerOutcome:
        """What a worker host saved."""
        path = os.path.join(self.run_dir, f"{host}.npz")
        if not os.path.exists(path):
            return WorkerOutcome(spec.job, spec.rank, [], [], [], [], 0, f"worker {host} (rank {spec.rank}) wrote no result")
        data = np.load(path)
        cuts = np.cumsum(data["sizes"])[:-1]
        ints = np.split(data["ints"], cuts) if len(data["sizes"]) else []
        floats = np.split(data["floats"], cuts) if len(data["sizes"]) else []
        if str(data["user_error"]):  # the worker's input was bad (a diverging learning rate): one line, as locally
            raise UserError(str(data["user_error"]))
        f = self.dilation  # the worker's clock ran f times slow: its instants back on the requested timeline
        outcome = WorkerOutcome(spec.job, spec.rank, ints, floats, virtual(list(data["started"]), f),
                                virtual(list(data["finished"]), f), int(data["retransmissions"]), str(data["error"]),
                                virtual(list(data["compute_starts"]), f),
                                [int(s) for s in data["staleness"]], int(data["scale"]), list(data["inputs"]),
                                [(float(a), float(loss)) for a, loss in data["history"]])
        return outcome

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
                self.net.stop()
            except Exception as exc:  # noqa: BLE001 - an interrupt inside a node's cmd() leaves Mininet unable to stop
                log(f"Mininet could not stop the network ({type(exc).__name__}); removing what the run recorded instead")
        kill_recorded(self.state.data["pids"], grace=0.5)
        delete_intfs(self.state.data["intfs"])
        if self.state.data.get(FLAG):
            release(own=self.state.path)
