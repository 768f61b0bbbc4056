"""``--backend mininet``: the experiment on real namespaces and veth links.

The only module that imports Mininet. Every graph node becomes a Mininet node
in its own network namespace; links are TCLinks (htb shaping) named so that
port ``i`` of node ``n`` is interface ``n-eth<i>``. Each switch runs
``innet.node switch``; the controller installs routes and jobs over the
switch's control socket, then releases the workers together and measures the
bytes at every interface. Everything created is recorded (innet.cleanup) and
removed on success, error, Ctrl-C and SIGTERM.
"""

from __future__ import annotations

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

from innet.cleanup import RunState, kill_recorded
from innet.errors import UserError
from innet.experiment import RunSpec, check, make_tensors, pick_workers, result_digest, run_record, switch_configs
from innet.fixedpoint import dequantize
from innet.graph import is_switch, link_name, natural_key, node_indices, port_to
from innet.modes import installed_plans, job_specs, make_plan, pbox_servers
from innet.programs import load_program
from innet.serialize import config_to_json, spec_to_json

TCLINK_MAX_MBPS = 1000.0
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def log(msg: str) -> None:
    print(f"innet: {msg}", file=sys.stderr, flush=True)


class Control:
    """The controller's end of one switch's control channel (JSON lines on a Unix socket)."""

    def __init__(self, path: str, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self.sock.connect(path)
                break
            except (FileNotFoundError, ConnectionRefusedError):
                self.sock.close()
                if time.monotonic() > deadline:
                    raise UserError(f"switch control socket {path} did not come up in {timeout:g}s") from None
                time.sleep(0.05)
        self.file = self.sock.makefile("rb")

    def close(self) -> None:
        self.file.close()
        self.sock.close()

    def call(self, op: str, **kw: Any) -> dict[str, Any]:
        self.sock.sendall(json.dumps({"op": op, **kw}).encode() + b"\n")
        line = self.file.readline()
        if not line:
            raise UserError("a switch process exited unexpectedly")
        reply: dict[str, Any] = json.loads(line)
        return reply


def interface_bytes(node: Any) -> dict[str, int]:
    """tx bytes of every interface of a Mininet node, read inside its namespace."""
    out = node.cmd("ip -s -j link show")
    try:
        links = json.loads(out)
    except ValueError:
        return {}
    return {d["ifname"]: int(d["stats64"]["tx"]["bytes"]) for d in links if "stats64" in d}


@contextmanager
def _signals_as_interrupts() -> Iterator[None]:
    def raise_interrupt(*_: Any) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def run_mininet(graph: nx.Graph, run: RunSpec, pcap_dir: str | None = None, cli: bool = False,
                pbox_cores: int = 1) -> dict[str, Any]:
    from mininet.log import setLogLevel

    setLogLevel("critical")
    program = load_program(run.program)
    workers = pick_workers(graph, run.workers)
    plan = make_plan(graph, run, workers, program)
    configs = switch_configs(graph, installed_plans(run, plan), run.switch_memory)
    run_id = f"{os.getpid()}-{time.strftime('%H%M%S')}"
    run_dir = f"/tmp/innet-{run_id}"
    os.makedirs(run_dir)
    state = RunState(run_id, run_dir)
    emu = Emulation(graph, state, run_dir)
    with _signals_as_interrupts():
        try:
            emu.build()
            return emu.execute(run, program, plan, configs, workers, pcap_dir, cli, pbox_cores)
        finally:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
            try:
                emu.teardown()
                state.remove()
            finally:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})


class Emulation:
    def __init__(self, graph: nx.Graph, state: RunState, run_dir: str) -> None:
        self.graph = graph
        self.state = state
        self.run_dir = run_dir
        self.net: Any = None
        self.procs: list[subprocess.Popen[bytes]] = []
        self.controls: list[Control] = []
        self.pcaps = False

    def build(self) -> None:
        from mininet.link import TCLink
        from mininet.net import Mininet
        from mininet.node import Host

        graph = self.graph
        log(f"building {graph.graph.get('name', 'topology')}: {graph.number_of_nodes()} nodes, "
            f"{graph.number_of_edges()} links")
        self.net = net = Mininet(topo=None, build=False, controller=None, link=TCLink, autoSetMacs=False,
                                 autoStaticArp=False, waitConnected=False)
        names = sorted(graph, key=natural_key)
        self.state.add_intfs([f"{n}-eth{p}" for n in names for p in range(graph.degree(n))])
        for name in names:
            node = net.addHost(name, cls=Host, ip=None, inNamespace=True)
            self.state.add_pid(f"mininet:{name}", node.pid)
        unshaped = 0
        for u, v, data in sorted(graph.edges(data=True), key=lambda e: link_name(e[0], e[1])):
            params: dict[str, Any] = {}
            if data["bw"] <= TCLINK_MAX_MBPS:
                params = {"bw": data["bw"]}
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

    def _popen(self, name: str, args: list[str], **kw: Any) -> subprocess.Popen[bytes]:
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        proc: subprocess.Popen[bytes] = self.net.get(name).popen(args, env=env, **kw)
        self.procs.append(proc)
        self.state.add_pid(f"innet:{name}", proc.pid)
        return proc

    def execute(self, run: RunSpec, program: Any, plan: Any, configs: dict[str, Any], workers: list[str],
                pcap_dir: str | None, cli: bool, pbox_cores: int) -> dict[str, Any]:
        graph, net = self.graph, self.net
        faults = {"loss": run.faults.loss, "dup": run.faults.dup, "reorder": run.faults.reorder,
                  "reorder_delay": run.faults.reorder_delay, "delay": run.faults.delay}
        switches = [n for n in sorted(graph, key=natural_key) if is_switch(graph, n)]
        if pcap_dir:
            self._start_pcaps(pcap_dir, switches)
        for i, sw in enumerate(switches):
            conf = {"program": run.program, "ports": {p: f"{sw}-eth{p}" for p in configs[sw].ports},
                    "faults": faults, "seed": run.seed * 1000 + i, "control": os.path.join(self.run_dir, f"{sw}.sock")}
            self._write(f"{sw}.json", conf)
            self._popen(sw, [sys.executable, "-m", "innet.node", "switch", os.path.join(self.run_dir, f"{sw}.json")])
        controls = {sw: Control(os.path.join(self.run_dir, f"{sw}.sock")) for sw in switches}
        self.controls.extend(controls.values())
        for sw, ctl in controls.items():
            reply = ctl.call("install", config=config_to_json(configs[sw]))
            if not reply.get("ok"):
                raise UserError(reply.get("error", f"switch {sw} refused its configuration"))
        log(f"{len(switches)} switches up running {program.name}; mode {run.mode}, placement {plan.method}, root {plan.root}")
        specs = job_specs(graph, run, plan, program)
        procs = {}
        index = node_indices(graph)
        ring = [index[w] for w in plan.workers]
        for core, server in enumerate(pbox_servers(graph, run, plan, specs, pbox_cores)):
            conf = {"node": server.node, "cores": pbox_cores, "core": core, "port": f"{plan.pbox}-eth0", "faults": faults,
                    "seed": run.seed * 977 + core, "jobs": [vars(j) for j in server.jobs.values()]}
            self._write(f"pbox{core}.json", conf)
            procs[f"{plan.pbox}#{core}"] = self._popen(str(plan.pbox), [sys.executable, "-m", "innet.node", "pbox",
                                                                        os.path.join(self.run_dir, f"pbox{core}.json")],
                                                       stdout=subprocess.PIPE)
        for w, spec in specs.items():
            conf = {"spec": spec_to_json(spec), "seed": run.seed, "iterations": run.iterations, "elements": run.elements,
                    "port": f"{w}-eth0", "faults": faults, "result": os.path.join(self.run_dir, f"{w}.npz"),
                    "mode": run.mode, "ring": ring, "linger": 1.0 if run.mode == "ring" else 0.0}
            self._write(f"{w}.json", conf)
            procs[w] = self._popen(w, [sys.executable, "-m", "innet.node", "worker", os.path.join(self.run_dir, f"{w}.json")],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        for w, proc in procs.items():
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != b"ready":
                raise UserError(f"worker {w} failed to start")
        before = {n.name: interface_bytes(n) for n in net.hosts}
        log(f"all-reduce: {len(workers)} workers x {run.elements} elements x {run.iterations} iteration(s)")
        workers_procs = {w: p for w, p in procs.items() if w in specs}
        for proc in workers_procs.values():
            assert proc.stdin is not None
            proc.stdin.write(b"go\n")
            proc.stdin.flush()
        self._wait_workers(workers_procs, run)
        after = {n.name: interface_bytes(n) for n in net.hosts}
        stats = {sw: ctl.call("stats") for sw, ctl in controls.items()}
        for ctl in controls.values():
            ctl.call("stop")
        if cli:
            from mininet.cli import CLI

            CLI(net)
        return self._record(run, plan, workers, specs, before, after, stats)

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

    def _wait_workers(self, procs: dict[str, subprocess.Popen[bytes]], run: RunSpec) -> None:
        limit = time.monotonic() + 30 + run.timeout * (run.iterations + 1)
        last_report = time.monotonic()
        while any(p.poll() is None for p in procs.values()):
            if time.monotonic() > limit:
                raise UserError(f"workers did not finish within {limit:g}s; see --timeout")
            if time.monotonic() - last_report > 5:
                done = sum(p.poll() is not None for p in procs.values())
                log(f"  ... {done}/{len(procs)} workers finished")
                last_report = time.monotonic()
            time.sleep(0.01)

    def _record(self, run: RunSpec, plan: Any, workers: list[str], specs: dict[str, Any], before: dict[str, dict[str, int]],
                after: dict[str, dict[str, int]], stats: dict[str, dict[str, Any]]) -> dict[str, Any]:
        graph = self.graph
        link_bytes = {}
        for u, v in graph.edges:
            total = 0
            for a, b in ((u, v), (v, u)):
                intf = f"{a}-eth{port_to(graph, a, b)}"
                total += after[a].get(intf, 0) - before[a].get(intf, 0)
            link_bytes[link_name(u, v)] = total
        inputs: list[list[np.ndarray]] = []
        ints: list[list[np.ndarray]] = []
        floats: list[list[np.ndarray]] = []
        starts: list[np.ndarray] = []
        ends: list[np.ndarray] = []
        errors: list[str] = []
        retx = 0
        for w in workers:
            spec = specs[w]
            tensors = make_tensors(run.seed, spec.job, spec.rank, run.iterations, run.elements)
            inputs.append(tensors)
            path = os.path.join(self.run_dir, f"{w}.npz")
            if not os.path.exists(path):
                errors.append(f"worker {w} wrote no result")
                ints.append([])
                floats.append([])
                continue
            data = np.load(path)
            got = list(data["ints"])
            ints.append(got)
            floats.append([dequantize(g, int(s)) for g, s in zip(got, data["scales"], strict=False)])
            starts.append(data["started"])
            ends.append(data["finished"])
            retx += int(data["retransmissions"].sum())
            if str(data["error"]):
                errors.append(str(data["error"]))
        correct, max_err = check(inputs, ints, floats)
        times = []
        if starts and len(starts) == len(workers):
            s, e = np.array(starts), np.array(ends)
            times = list(e.max(axis=0) - s.min(axis=0))
        drops: dict[str, int] = {}
        for st in stats.values():
            for key, n in st.get("counters", {}).items():
                if key.startswith(("drop:", "bad:")):
                    drops[key] = drops.get(key, 0) + n
            lost = st.get("lost", 0)
            if lost:
                drops["link:lost"] = drops.get("link:lost", 0) + lost
            sock = sum(st.get("socket_drops", {}).values())
            if sock:
                drops["socket"] = drops.get("socket", 0) + sock
        return run_record(
            graph, run, plan, next(iter(specs.values())).elements, "mininet", correct and not errors, max_err,
            float(np.median(times)) if times else float("nan"), link_bytes, retx, drops,
            errors=errors, result_digest=result_digest(ints),
            switch_memory_bytes={sw: st.get("memory_bytes", 0) for sw, st in stats.items()},
            switch_cpu_s={sw: round(st.get("cpu_s", 0.0), 3) for sw, st in stats.items()},
        )

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
            self.net.stop()
        kill_recorded(self.state.data["pids"], grace=0.5)
