"""One switch's forwarding and aggregation rate, next to the Linux bridge, on this machine.

A star: sender hosts h1..hW and the switch s1 (plus a sink h(W+1) when
forwarding). One ``scripts.blast`` process drives every sender's interface in
lockstep with sendmmsg, for a fixed time; the middle node is either the Linux
bridge or the innet switch. Rates come from interface and switch counters.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

from innet.backends.mininet.control import Control
from innet.backends.mininet.dataplane import cache_dir
from innet.backends.mininet.emulation import network
from innet.ebpf.build import object_path
from innet.graph import node_indices
from innet.node.config import PortFaults, SwitchNodeConfig
from innet.planning.configs import switch_configs
from innet.planning.planner import plan_job
from innet.wire.packet import JUMBO_MTU
from topologies.star import star

SEARCH_FLOOR = 0.01  # the lossless search's lowest rate, of the sender's: a switch losing frames below it shows 0

PROGRAM = """from switch_programs.sum_allreduce import SumAllreduce


class Sized(SumAllreduce):
    name = "sum_allreduce_{elements}"
    elements = {elements}
"""


def _rx_tx(node: Any) -> dict[str, tuple[int, int]]:
    import json

    out = {}
    for d in json.loads(node.cmd("ip -s -j link show")):
        if "stats64" in d:
            out[d["ifname"]] = (int(d["stats64"]["rx"]["packets"]), int(d["stats64"]["tx"]["packets"]))
    return out


SENDER_CPU, SWITCH_CPU = 0, 1
GRACE = 0.02  # seconds after the sender's exit (its call's teardown, ~25 ms after its last frame, before it) that
# a run's completions are counted: a kernel queue (the hop's 2048 frames) drains in ~5 ms; a switch that takes
# longer is behind the rate it was sent (counted until 0.3 s later, the Python switch's lossless rate in a 0.5 s trial
# included its sockets' backlog: ~1.4 s of its core a second sent, 2026-11-29)
DRAIN = 0.3  # then the rest drains, before the next run
# The sum rows' pool: 512 slots (1024 keys with both versions). The sender is open loop, so every port's queue
# holds far more than a pool, and the Python switch reads up to 256 frames of a port at a time: a read carries
# a port up to 256 chunks past another port it has not read yet, and where that passes the pool's keys the next
# round overwrites a slot before the lagging port's contribution to it arrives (drop:stale; the chunk never
# completes). With 128 slots (256 keys, a read's worth) that lost 4-27% of what the sender sent flat out on
# the switch's own core (steered), and completed nothing offered twice its lossless rate; real workers never
# send past their window (a pool), so that was the benchmark's loss, not the switch's.
SLOTS = 512


def steer(node: Any, cpu: int) -> None:
    """Every frame arriving at ``node``'s interfaces received on ``cpu`` (RPS): veth delivers synchronously, in
    the sender's softirq, unless its receive queue names other CPUs. Written in a private mount namespace with
    sysfs mounted in the node's network namespace where its /sys shows the machine's interfaces."""
    mask, intf = format(1 << cpu, "x"), node.intfNames()[-1]
    out = node.cmd(f"unshare -m sh -c '[ -e /sys/class/net/{intf} ] || mount -t sysfs sysfs /sys; "
                   f"for q in /sys/class/net/*/queues/rx-*/rps_cpus; do echo {mask} > $q; done; "
                   f"cat /sys/class/net/{intf}/queues/rx-*/rps_cpus'")
    masks = out.replace(",", "").split()
    if not masks or any(not all(c in "0123456789abcdef" for c in m) or int(m, 16) != 1 << cpu for m in masks):
        raise RuntimeError(f"cannot steer {node.name}'s receive queues to CPU {cpu}: {out.strip()[:300]}")


def measure(kind: str, workers: int, elements: int, target: str, seconds: float = 1.0, search: int = 0,
            steered: bool = True, native: str = "", xdp: str = "", hop: bool = False) -> dict[str, Any]:
    """Packets/s through the middle node (``target``: bridge, innet, ebpf: the innet switch with
    ``--data-plane ebpf``'s tc program on its ports, or xdp: that with switch.c's XDP half before it), the
    sender on CPU 0 and the switch on CPU 1 (``hop``, the ``xdp`` sender's: its ports' receive too, scripts.blast's
    --hop: their veths' poll, an XDP program there, the skb made): with
    ``steered`` (RPS), all of it, the kernel's receive path on its ports included (the bridge's forwarding, the
    eBPF program, the Python switch's ring); without, that path runs in the sender's softirq on CPU 0.
    ``native``: the sender's loop in C (scripts.blast's ``--native``: blast.c built by ``native_sender``), else
    in Python.

    One unpaced run gives the sender's rate, what the node took in (``in_pps``)
    and what it completed (``done_pps``: frames forwarded to the sink, or
    contributions folded into finished aggregations). With ``search`` > 0 (innet
    only), that many paced runs bisect for ``lossless_pps`` (geometrically, from SEARCH_FLOOR of the sender's rate
    up to it): the highest offered
    rate at which at least 99% of what was sent was completed (RFC 2544's
    throughput, with a 1% allowance); ``overload2_pps``: what it completed offered twice that, open loop;
    and ``cpu_pps``: at the lossless rate, the packets the switch took in per second of its own CPU time
    (getrusage: its system calls and the kernel's delivery of what it sends included), i.e. its rate
    were it never idle.
    """
    hosts = workers + (1 if kind == "forward" else 0)
    graph = star(hosts, bw=100_000.0, pbox=False)  # above TCLink's range: left unshaped, veth speed
    idx = node_indices(graph)
    senders = [f"h{i + 1}" for i in range(workers)]
    ebpf = target in ("ebpf", "xdp")
    with network(graph, JUMBO_MTU) as emu, timed_programs(ebpf):  # room for 1024 elements a frame
        s1 = emu.net.get("s1")
        if steered:
            steer(s1, SWITCH_CPU)
        if xdp:  # the generator's frames need NAPI on the veths' far ends (GRO turns it on): every target alike
            for intf in s1.intfNames():
                if intf != "lo":
                    gro_on(s1, intf)
        if target == "xdp":  # and so do the XDP half's results on the hosts' ends: there alone, since a host's NAPI
            # costs its receive more (the bridge, flooding to 3 hosts, lost ~15% flat out with it: 185-198k against
            # 219-240k, 2026-11-29 13:24-13:41), and the Python switch and the bridge keep the veths' default
            for h in senders:
                gro_on(emu.net.get(h), f"{h}-eth0")
        control = None
        if target == "bridge":
            s1.cmd("ip link add br0 type bridge && ip link set br0 up")
            for intf in s1.intfNames():
                if intf != "lo":
                    s1.cmd(f"ip link set {intf} master br0")
        else:
            control = _start_switch(emu, graph, kind, senders, elements, ebpf, target == "xdp")
        where = ",".join(f"{emu.net.get(h).pid}:{h}-eth0" for h in senders)
        dst = idx["s1"] if kind == "sum" else idx[f"h{hosts}"]
        done_intf = "s1-eth0" if kind == "sum" else f"s1-eth{hosts - 1}"

        programs = _programs(s1) if ebpf else set()

        def cpu_s() -> float:
            if ebpf:  # the tc program's own run time (frames it ran on: the in-count below)
                return program_run_s(programs)
            return control.stats().cpu_s if control is not None else 0.0

        def run(rate: float, first_chunk: int) -> dict[str, float]:
            before, cpu_before = _rx_tx(s1), cpu_s()
            busy = busy_s(SWITCH_CPU)
            blast = emu.spawn(None, ["taskset", "-c", str(SENDER_CPU), sys.executable, "-m", "scripts.blast", where, "--kind", kind,
                                     "--dst", str(dst), "--src", ",".join(str(idx[h]) for h in senders),
                                     "--elements", str(elements), "--slots", str(SLOTS), "--seconds", str(seconds), "--rate", str(rate),
                                     "--first-chunk", str(first_chunk), *(["--native", native] if native else []),
                                     *(["--xdp", xdp] if xdp else []), *(["--hop", str(SWITCH_CPU)] if hop else [])],
                               stdout=subprocess.PIPE)
            out, _ = blast.communicate(timeout=seconds + 60)
            time.sleep(GRACE)
            busy = busy_s(SWITCH_CPU) - busy  # the switch's core over what the counters count
            after = _rx_tx(s1)
            time.sleep(DRAIN)  # what is still queued drains before the next run
            sent, elapsed, sender_cpu = int(out.split()[1]), float(out.split()[2]), float(out.split()[3])
            rx = sum(after[i][0] - before[i][0] for i in after if i in before and i != "lo")
            done = after[done_intf][1] - before[done_intf][1]
            r = {"rate": rate, "sent": sent, "elapsed": elapsed, "sender_cpu": sender_cpu, "in": rx,
                 "done": done * (workers if kind == "sum" else 1),
                 "cpu": cpu_s() - cpu_before, "core_busy": busy / elapsed, "core_s": busy}
            if control is not None and target == "innet":  # why a run fell short: its counters so far
                stats = control.stats()
                r.update(counters=dict(stats.counters), socket_drops=sum(stats.socket_drops.values()),
                         admission=dataclasses.asdict(stats.admission))
            runs.append(r)
            return r

        runs: list[dict[str, float]] = []  # every run's figures, in the order run

        first = run(0.0, 0)
        result: dict[str, Any] = {"sender_pps": first["sent"] / first["elapsed"], "in_pps": first["in"] / first["elapsed"],
                                  "done_pps": first["done"] / first["elapsed"], "core_busy": first["core_busy"], "runs": runs,
                                  "sender_cpu_pps": first["sent"] / first["sender_cpu"] if first["sender_cpu"] > 0 else 0.0}
        result["core_pps"] = per_core_s(first, "in" if target == "bridge" else "done")
        if control is not None:
            stats = control.stats()
            result["counters"] = stats.counters
            result["socket_drops"] = sum(stats.socket_drops.values())
            result["admission"] = dataclasses.asdict(stats.admission)
        if not search:
            return result
        lo, hi = 0.0, result["sender_pps"]
        result["sender_bound"] = first["done"] >= 0.99 * first["sent"]
        if result["sender_bound"]:  # it kept up with the sender flat out: the most this sender can show
            result["lossless_pps"] = result["overload2_pps"] = result["sender_pps"]
            result["cpu_pps"] = first["in"] / first["cpu"] if first["cpu"] > 0 else 0.0
            return result
        floor, found = hi * SEARCH_FLOOR, False
        for step in range(search):
            rate = math.sqrt(max(lo, floor) * hi)  # halving the ratio: the kernel sender's 4.6M frames/s from the
            # Python switch's ~0.1M is 46x, which halving the difference took 5 steps to reach and 4 missed
            r = run(rate, (step + 1) << 24)
            if r["done"] >= 0.99 * r["sent"]:
                lo, found = r["sent"] / r["elapsed"], True
                result["cpu_pps"] = r["in"] / r["cpu"] if r["cpu"] > 0 else 0.0
                result["core_pps"] = per_core_s(r, "done")
            else:
                hi = rate
        result["lossless_pps"] = lo if found else 0.0
        r = run(2 * lo, (search + 1) << 24)  # twice the lossless rate, open loop
        result["overload2_pps"] = r["done"] / r["elapsed"]
        return result


def per_core_s(run: dict[str, float], key: str) -> float:
    """A run's ``key`` frames (``in``, ``done``) per second of the switch's core busy while they were counted."""
    return run[key] / run["core_s"] if run["core_s"] > 0 else 0.0


def busy_s(cpu: int) -> float:
    """CPU ``cpu``'s busy seconds so far (/proc/stat: everything but idle and iowait; on a shared machine, other
    processes' work on that core too). Read around a run's counters, the setup's idle core adds nothing: the frames
    counted over these seconds are the node's per second of its core busy (read over the whole sender process and
    taken as a share of its wall time, the load and setup idle around a 0.5 s send read every kernel column ~0.82
    busy flat out; over the send alone, the Python switch's drain after it read 1.2)."""
    with open("/proc/stat", encoding="ascii") as f:
        ticks = next([int(x) for x in line.split()[1:]] for line in f if line.startswith(f"cpu{cpu} "))
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def gro_on(node: Any, intf: str) -> None:
    if "generic-receive-offload: on" not in node.cmd(f"ethtool -K {intf} gro on; ethtool -k {intf}"):
        raise RuntimeError(f"cannot turn GRO on at {intf} (ethtool): the kernel-made sender and XDP results need it")


@contextlib.contextmanager
def timed_programs(on: bool) -> Iterator[None]:
    """The kernel times every BPF program's runs while this is open (BPF_ENABLE_STATS: while its fd is held)."""
    if not on:
        yield
        return
    fd = ctypes.CDLL("libbpf.so.1").bpf_enable_stats(0)  # BPF_STATS_RUN_TIME
    try:
        yield
    finally:
        if fd >= 0:
            os.close(fd)


def _programs(node: Any) -> set[int]:
    """The ids of the BPF programs on ``node``'s tc ingress and XDP hooks (its eBPF switch's; another run's are not),
    and of the switch's innet_devmap (run on each result's copy as it leaves: in no hook, found by the maps it
    shares with them)."""
    out = json.loads(node.cmd("bpftool -j net show") or "[]")
    hooked = ({f["id"] for ns in out for f in ns.get("tc", []) if f.get("kind") == "clsact/ingress"}
              | {f["id"] for ns in out for f in ns.get("xdp", []) if "id" in f})
    progs = _bpf_programs()
    maps = {m for p in progs if p.get("id") in hooked for m in p.get("map_ids", [])}
    return hooked | {p["id"] for p in progs if p.get("name") == "innet_devmap" and maps & set(p.get("map_ids", []))}


def _bpf_programs() -> list[dict[str, Any]]:
    """Every BPF program loaded on this machine, as bpftool describes it (id, name, map_ids, run_time_ns...)."""
    return json.loads(subprocess.run(["bpftool", "-j", "prog", "show"], capture_output=True, text=True, check=True).stdout)


def program_run_s(ids: set[int]) -> float:
    """Seconds the programs ``ids`` have run (the kernel's run_time_ns, while ``timed_programs``)."""
    return sum(p.get("run_time_ns", 0) for p in _bpf_programs() if p.get("id") in ids) / 1e9


def _start_switch(emu: Any, graph: Any, kind: str, senders: list[str], elements: int, ebpf: bool = False,
                  xdp: bool = False) -> Control:
    """The innet switch on s1, pinned to CPU 1: forward, or sum_allreduce at ``elements`` per packet (with ``ebpf``,
    its ports run the eBPF switch; what it does runs in the kernel's softirq, on whichever CPU the frame came)."""
    program = os.path.join(emu.run_dir, f"sum_{elements}.py")
    with open(program, "w", encoding="utf-8") as fh:
        fh.write(PROGRAM.format(elements=elements))
    plans = [] if kind == "forward" else [plan_job(graph, senders, method="root", slots=SLOTS)]
    config = switch_configs(graph, plans, memory=64 << 20)["s1"]
    conf = SwitchNodeConfig("forward" if kind == "forward" else program, {p: f"s1-eth{p}" for p in config.ports},
                            {p: PortFaults() for p in config.ports}, os.path.join(emu.run_dir, "s1.sock"),
                            pool_slots=SLOTS if kind == "sum" else 0,
                            ebpf=object_path(elements, 2 * SLOTS, cache_dir()) if ebpf else "", xdp=xdp)
    path = emu.write("s1.json", conf)
    emu.spawn("s1", ["taskset", "-c", str(SWITCH_CPU), sys.executable, "-m", "innet.node", "switch", path])
    control = Control(conf.control)
    emu.controls.append(control)
    control.install(config)
    return control
