"""The switch process: one switch, or a node group of them (innet.planning.grouping), served by one poll loop.

``python -m innet.node switch CONFIG`` serves one switch in the namespace it was started in;
``python -m innet.node switches CONFIG`` serves every switch its config lists, each switch's raw
ports opened inside that switch's namespace (innet.io.netns). Either way each switch has its own
control socket (a Unix socket in the run directory) answering ``install``, ``stats`` and ``stop``, runs
the switch runtime on every frame, and injects its links' faults on the frames it sends; the process
blocks in poll() while every switch is idle.
"""

from __future__ import annotations

import dataclasses
import json
import select
import socket
import sys
import time

from innet.ebpf.loader import EbpfPlane
from innet.io.netns import opened_in
from innet.io.rawport import ETH_P_ALL, ETH_P_IP, RawPort
from innet.node.admission import Admission
from innet.node.codec import from_json, to_json
from innet.node.config import Install, Installed, SwitchGroup, SwitchNodeConfig, SwitchStats
from innet.node.egress import Egress, wait_ms
from innet.node.usage import own_cpu_s
from innet.switch.loader import load_program
from innet.switch.runtime import SwitchConfig, SwitchReport, SwitchRuntime


class SwitchNode:
    """One switch of a process: its raw ports, its control socket, its runtime once installed."""

    def __init__(self, conf: SwitchNodeConfig, alone: bool = True) -> None:
        self.program = load_program(conf.program, conf.pool_slots, conf.packet_elements, conf.fan_in)
        self.plane = _plane(conf)
        protocol = ETH_P_ALL if self.plane is None else ETH_P_IP  # after the tc program: what it passes on
        self.ports = {p: RawPort(name, protocol=protocol) for p, name in conf.ports.items()}
        self.netns = conf.netns
        self.egress = Egress(self.ports, conf.faults)
        self.admission = Admission(list(self.ports.values()))
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(conf.control)
        self.listener.listen(1)
        self.by_fd = {port.fileno(): p for p, port in self.ports.items()}
        self.runtime: SwitchRuntime | None = None
        self.control: socket.socket | None = None
        self.buffer = b""
        self.alone = alone  # its CPU is the process's; in a group, the seconds the process spent on it
        self.cpu_s = 0.0

    def fds(self) -> list[int]:
        return [*self.by_fd, self.listener.fileno()]

    def next_wake(self) -> float | None:
        due = [t for t in (self.runtime.next_timer() if self.runtime else None, self.egress.next_due(),
                           self.admission.next_wake()) if t is not None]
        return min(due) if due else None

    def on_ready(self, fd: int) -> tuple[bool, int | None]:
        """Serve what woke ``fd``: (whether the switch is to stop, a newly accepted control socket's fd)."""
        if fd == self.listener.fileno():
            self.control, _ = self.listener.accept()
            return False, self.control.fileno()
        if self.control is not None and fd == self.control.fileno():
            data = self.control.recv(1 << 20)
            if not data:  # the controller went away
                return True, None
            self.buffer += data
            while b"\n" in self.buffer:
                line, self.buffer = self.buffer.split(b"\n", 1)
                reply, stop = self._control(json.loads(line))
                self.control.sendall(json.dumps(to_json(reply)).encode() + b"\n")
                if stop:
                    return True, None
            return False, None
        port = self.by_fd[fd]
        frames, lengths = self.ports[port].recv_rows()
        if self.runtime is not None and len(lengths):
            now = time.monotonic()
            self.admission.note(now, int(lengths[-1]))
            for out_port, out in self.runtime.receive_rows(port, frames, lengths, now):
                self.egress.send_all(out_port, [out], now)
        return False, None

    def tick(self, now: float) -> None:
        """Fire the runtime's due timers and send the frames whose delay is over."""
        if self.runtime is not None and (self.runtime.next_timer() or float("inf")) <= now:
            for out_port, out in self.runtime.run_timers(now):
                self.egress.send(out_port, out, now)
        self.egress.flush(now)
        self.admission.tick(now)

    def _control(self, msg: object) -> tuple[Installed | SwitchStats, bool]:
        """One control message (innet.backends.mininet.control): its answer, and whether to stop."""
        op = msg.get("op") if isinstance(msg, dict) else None
        if op == "install":
            try:
                config = from_json(Install, msg).config
                self.runtime = SwitchRuntime(config, self.program)
                self._install_plane(config)
            except Exception as exc:  # noqa: BLE001 - reported to the controller as one line
                return Installed(error=str(exc) or type(exc).__name__), False
            pools = [job.slots for job in config.jobs.values() if job.aggregate]
            self.admission.slots = max(pools, default=0)
            for port, frame in self.runtime.start(time.monotonic()):
                self.egress.send(port, frame, time.monotonic())
            return Installed(memory_bytes=self.runtime.memory_bytes, data_plane="python" if self.plane is None else "ebpf"), False
        if op == "stats":
            return SwitchStats(
                cpu_s=own_cpu_s() if self.alone else self.cpu_s, lost=self.egress.lost(),
                socket_drops={port.name: port.drops() for port in self.ports.values()},
                qdisc_waits={port.name: port.qdisc_waits for port in self.ports.values()},
                admission=self.admission.report(), runtime=self._report(),
            ), False
        if op == "stop":
            return Installed(), True
        return Installed(error=f"unknown op {op!r}"), False

    def _install_plane(self, config: SwitchConfig) -> None:
        """The plan into the eBPF switch's maps; a plan it cannot hold leaves this switch to the Python one."""
        if self.plane is None:
            return
        try:
            self.plane.install(config, self.program.slots)
        except OSError as exc:
            print(f"{config.name}: the eBPF switch cannot hold this plan ({exc}); the Python switch runs it",
                  file=sys.stderr)
            self._close_plane()

    def _report(self) -> SwitchReport | None:
        """The runtime's report, with the eBPF switch's frames, bytes and drops added (what it took in never
        reached the runtime)."""
        if self.runtime is None:
            return None
        report = self.runtime.report()
        if self.plane is None:
            return report
        ports, counters = dict(report.ports), dict(report.counters)
        for port, extra in self.plane.port_stats().items():
            name = self.runtime.config.ports[port]
            ports[name] = dataclasses.replace(ports[name], **{f.name: getattr(ports[name], f.name) + getattr(extra, f.name)
                                                             for f in dataclasses.fields(extra)})
        for name, n in self.plane.counters().items():
            counters[name] = counters.get(name, 0) + n
        return dataclasses.replace(report, ports=ports, counters=counters, data_plane="ebpf")

    def _close_plane(self) -> None:
        if self.plane is not None:
            plane, self.plane = self.plane, None
            opened_in([self], lambda _: plane.close())  # its hooks are in the switch's namespace

    def close(self) -> None:
        self._close_plane()
        for sock in (self.control, self.listener, *(port.sock for port in self.ports.values())):
            if sock is not None:
                sock.close()


def _plane(conf: SwitchNodeConfig) -> EbpfPlane | None:
    """The eBPF switch on ``conf``'s ports when it asks for one (else, or when it fails to load, None: the
    Python switch runs alone, as its log says)."""
    if not conf.ebpf:
        return None
    try:
        return EbpfPlane(conf.ebpf, conf.ports, conf.xdp)
    except OSError as exc:
        print(f"the eBPF switch did not load ({exc}); the Python switch runs alone", file=sys.stderr)
        return None


def serve_switch(conf: SwitchNodeConfig) -> int:
    """One switch, in this process's namespace."""
    return serve_switches(SwitchGroup((conf,)))


def serve_switches(conf: SwitchGroup) -> int:
    """Every switch of ``conf.switches`` in this process, until each has been told to stop (or lost its
    controller). In a group, a switch's ``cpu_s`` is the thread CPU time spent serving it."""
    confs = conf.switches
    alone = len(confs) == 1
    nodes = opened_in(confs, lambda c: SwitchNode(c, alone))
    poller = select.poll()
    owner: dict[int, SwitchNode] = {}
    for node in nodes:
        for fd in node.fds():
            poller.register(fd, select.POLLIN)
            owner[fd] = node
    live = set(nodes)
    clock = time.thread_time
    while live:
        for fd, _ in poller.poll(wait_ms(*(node.next_wake() for node in live))):
            node = owner[fd]
            began = 0.0 if alone else clock()
            stop, accepted = node.on_ready(fd)
            if not alone:
                node.cpu_s += clock() - began
            if accepted is not None:
                poller.register(accepted, select.POLLIN)
                owner[accepted] = node
            if stop:
                live.discard(node)
                for gone in [f for f, n in owner.items() if n is node]:
                    poller.unregister(gone)
                    del owner[gone]
                node.close()
        now = time.monotonic()
        for node in live:
            due = node.next_wake()
            if due is not None and due <= now:
                began = 0.0 if alone else clock()
                node.tick(now)
                if not alone:
                    node.cpu_s += clock() - began
    return 0
