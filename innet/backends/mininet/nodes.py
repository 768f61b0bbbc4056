"""Starting a run's node processes: each one's configuration (innet.node.config) written to the run
directory, and ``python -m innet.node ROLE CONFIG`` started on its node.

Switches come up first, each listening on its control socket, and get their routes and jobs through
it; PBox shards, workers and an ensemble's input stream then start, say "ready" and wait for the
controller's "go". A node group (innet.planning.grouping) is one process serving several nodes.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, TypeVar

import networkx as nx

from innet.backends.mininet.control import Control
from innet.backends.mininet.network import NODE_ENV, Network, log
from innet.ebpf.holds import HostHold
from innet.errors import UserError
from innet.events import Progress
from innet.graph import is_switch, natural_key, ports
from innet.hosts.ensemble import InputPlan
from innet.node.config import (
    Faults,
    InputConfig,
    InputServerConfig,
    PBoxConfig,
    PortFaults,
    SwitchGroup,
    SwitchNodeConfig,
    WorkerConfig,
    WorkerGroup,
)
from innet.planning.grouping import group_label, start_timeout
from innet.planning.spec import RunSpec
from innet.results.files import make_output_folder
from innet.schemes.modes import RunPlan, pbox_servers
from innet.switch.program import SwitchProgram
from innet.switch.runtime import SwitchConfig
from innet.wire.faults import fault_seed

Procs = dict[str, subprocess.Popen[bytes]]
C = TypeVar("C", SwitchNodeConfig, WorkerConfig)
FaultsOf = Callable[[str], Faults]  # node -> its ports' faults


def port_faults(graph: nx.Graph, run: RunSpec, node: str, latency: bool = False, ebpf: bool = False,
                holds: Mapping[str, HostHold] | None = None) -> Faults:
    """Each port's faults for the link behind it, and their seed. With ``latency`` the link's latency is added
    to the port's delay, and the port holds each frame for its serialization at the link's rate too (a dilated
    run: there both are long enough to matter, ``tc netem`` is not available to add them on the link, and htb
    lets a frame that finds tokens through at once: a latency-bound run would skip every hop's serialization).
    With ``ebpf`` too (eBPF switches, which forward at once) a switch's ports hold nothing and a host's port holds
    what it receives instead (``hold_in``): the hop from a switch to a host ends at the host, and ``holds`` says
    what a host holds for the hops between switches before it (innet.ebpf.holds.path_holds)."""
    held_here = latency and not (ebpf and is_switch(graph, node))

    def spec(peer: str) -> PortFaults:
        faults, rate = run.faults_on(node, peer), 0.0
        if held_here:
            link = graph.edges[node, peer]
            faults, rate = dataclasses.replace(faults, delay=faults.delay + link["latency"]), link["bw"] * 1e6 / 8
        hold_in = held_here and ebpf
        mine = (holds or {}).get(node, HostHold()) if hold_in else HostHold()
        return PortFaults(faults, fault_seed(run.seed, node, peer), rate, hold_in=hold_in, hold_path=mine.into,
                          hold_from=mine.by_source, hold_out=mine.out)

    return {p: spec(peer) for p, peer in ports(graph, node).items()}


def _command(role: str, path: str) -> list[str]:
    return [sys.executable, "-m", "innet.node", role, path]


def _start_group(net: Network, group: list[str], confs: dict[str, C], roles: tuple[str, str],
                 grouped: Callable[[tuple[C, ...]], object], **popen: Any) -> tuple[str, subprocess.Popen[bytes]]:
    """Start the process serving ``group``: a lone node's role (``roles[0]``) with its config, or a group's
    (``roles[1]``) with each node's config naming its namespace. Its label and process."""
    label = group_label(group)
    if len(group) == 1:
        path, role = net.write(f"{label}.json", confs[label]), roles[0]
    else:
        path, role = net.write(f"{label}.json", grouped(tuple(replace(confs[n], netns=net.netns(n)) for n in group))), roles[1]
    return label, net.spawn(group[0], _command(role, path), NODE_ENV, **popen)


def start_switches(net: Network, run: RunSpec, program: type[SwitchProgram], configs: dict[str, SwitchConfig],
                   faults: FaultsOf, node_group: int | None, ebpf: str = "") -> tuple[dict[str, Control], Procs]:
    """Every switch's process, its control channel once up, and its configuration installed; the controls
    by switch and the processes by label. ``ebpf``: the built eBPF switch their ports run (innet.ebpf)."""
    graph = net.graph
    switches = [n for n in sorted(graph, key=natural_key) if is_switch(graph, n)]
    confs = {sw: SwitchNodeConfig(run.program, {p: f"{sw}-eth{p}" for p in configs[sw].ports}, faults(sw),
                                  os.path.join(net.run_dir, f"{sw}.sock"), run.pool_slots, run.packet_elements,
                                  getattr(program, "fan_in", 0), ebpf=ebpf) for sw in switches}
    procs: Procs = {}
    served_by: dict[str, tuple[subprocess.Popen[bytes], str]] = {}
    for group in net.groups(switches, node_group):
        log_path = os.path.join(net.run_dir, f"{group_label(group)}.log")
        with open(log_path, "wb") as log_file:
            label, proc = _start_group(net, group, confs, ("switch", "switches"), SwitchGroup,
                                       stdout=subprocess.DEVNULL, stderr=log_file)
        procs[label] = proc
        served_by.update({sw: (proc, log_path) for sw in group})
    controls: dict[str, Control] = {}
    progress = Progress("innet")
    deadline = time.monotonic() + start_timeout(len(procs))
    for sw in switches:
        proc, log_path = served_by[sw]
        controls[sw] = Control(confs[sw].control, max(0.0, deadline - time.monotonic()), proc, log_path)
        net.controls.append(controls[sw])
        progress.update(lambda: f"{len(controls)}/{len(switches)} switches up")
    python = [sw for sw, ctl in controls.items() if ctl.install(configs[sw]).data_plane != "ebpf"]
    if ebpf and python:  # it did not load there, or cannot hold the switch's plan: the switch's log says why
        log(f"--data-plane ebpf: {', '.join(python)} run(s) the Python switch ({controls[python[0]].last_words()})")
    grouped = f" in {len(procs)} processes" if len(procs) < len(switches) else ""
    log(f"{len(switches)} switches up{grouped} running {program.name}")
    return controls, procs


def start_pboxes(net: Network, run: RunSpec, rp: RunPlan, cores: int, faults: FaultsOf) -> Procs:
    """One process per PBox core (a shard of the keys), by ``host#core``."""
    host, servers = pbox_servers(net.graph, run, rp, cores)
    procs: Procs = {}
    for core, server in enumerate(servers):
        conf = PBoxConfig(server.node, cores, core, f"{host}-eth0", faults(str(host)), tuple(server.jobs.values()))
        path = net.write(f"pbox{core}.json", conf)
        procs[f"{host}#{core}"] = net.spawn(str(host), _command("pbox", path), NODE_ENV, stdout=subprocess.PIPE)
    return procs


def worker_configs(net: Network, run: RunSpec, rp: RunPlan, faults: FaultsOf) -> dict[str, WorkerConfig]:
    """Every worker host's configuration. A ring rank lingers after its last call until its predecessor's
    DONE (innet.hosts.ring.linger.Linger), the run's timeout at most."""
    confs = {}
    for plan in rp.plans:
        for w, spec in rp.specs[plan.job].items():
            confs[w] = WorkerConfig(
                spec=spec, seed=run.seed, sizes=tuple(run.call_sizes()), topk=run.topk, layers=run.layers(),
                ssp=run.parameter_server() if run.consistency else None,
                compute=tuple(run.compute_times(w, plan.job, spec.rank)),
                task=run.task(spec.nworkers) if run.train else None, training=rp.training,
                port=f"{w}-eth0", faults=faults(w), result=os.path.join(net.run_dir, f"{w}.npz"), mode=run.mode,
                ring=tuple(rp.ring(plan.job)), linger_limit=run.timeout if run.mode == "ring" else 0.0)
    return confs


def start_workers(net: Network, confs: dict[str, WorkerConfig], node_group: int | None) -> Procs:
    """The worker processes (a worker to crash is alone in its process: the crash kills its process)."""
    procs: Procs = {}
    for group in net.groups(sorted(confs, key=natural_key), node_group, hosts=True):
        label = group_label(group)
        _, procs[label] = _start_group(net, group, confs, ("worker", "workers"), WorkerGroup,
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    return procs


def start_input(net: Network, plan: InputPlan, faults: FaultsOf) -> Procs:
    """The ensemble's input stream: its server on the PBox host and a reader beside every worker, told "go"
    with the workers; the readers (``host:input``) are waited for like them."""
    confs: list[tuple[str, str, InputConfig | InputServerConfig]] = [(plan.server, "input-server", InputServerConfig(
        plan, f"{plan.server}-eth0", faults(plan.server), os.path.join(net.run_dir, "input-server.json")))]
    confs += [(r.host, "input", InputConfig(plan, f"{r.host}-eth0", faults(r.host), r,
                                            os.path.join(net.run_dir, f"{r.host}-input.json"))) for r in plan.receivers]
    procs: Procs = {}
    for host, role, conf in confs:
        path = net.write(f"{host}-{role}.json", conf)
        procs[f"{host}:{role}"] = net.spawn(host, _command(role, path), NODE_ENV, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    return procs


def start_pcaps(net: Network, pcap_dir: str, nodes: Sequence[str]) -> None:
    """tcpdump on every interface of ``nodes``, writing ``pcap_dir/<interface>.pcap``; back once all capture.
    tcpdump runs as root and follows links: ``pcap_dir`` is made new, or must be the caller's own that no one
    else can write (innet.results.files), so no one else can plant a name in it."""
    pcap_dir = make_output_folder(pcap_dir)
    net.pcaps = True
    files = []
    for name in nodes:
        for intf in net.net.get(name).intfNames():
            if intf != "lo":
                path = os.path.abspath(os.path.join(pcap_dir, f"{intf}.pcap"))
                net.spawn(name, ["tcpdump", "-i", intf, "-w", path, "-U", "--immediate-mode", "-s", "0", "-q"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                files.append(path)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not all(os.path.exists(f) for f in files):
        time.sleep(0.05)
    time.sleep(0.2)


def await_ready(procs: Procs) -> None:
    """Every process said "ready" (or stop with what it said instead)."""
    for name, proc in procs.items():
        assert proc.stdout is not None
        said = proc.stdout.readline().strip()
        if said != b"ready":
            raise UserError(f"{name} failed to start: {said.decode(errors='replace') or 'it said nothing'}")
