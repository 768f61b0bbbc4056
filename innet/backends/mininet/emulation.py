"""``--backend mininet``: the experiment on real namespaces and veth links.

A run reads top to bottom in three steps, each in its own module: the network is built
(innet.backends.mininet.network: Mininet, TCLinks, the private run directory, the record of everything
created), the node processes started (innet.backends.mininet.nodes: switches installed over their
control sockets, PBox shards, workers, the input stream), and, once the workers are released together
and have ended, what they left collected (innet.backends.mininet.collect) into the run record, with the
bytes measured at every interface and the fidelity verdict. Only the modules of this folder import Mininet.
"""

from __future__ import annotations

import math
import os
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace

import networkx as nx

from innet.backends.cluster.servers import Cluster, cluster_figures
from innet.backends.mininet.background import Background, ElasticBackground
from innet.backends.mininet.cleanup import RunState
from innet.backends.mininet.collect import Procs, Watch, calls_window, input_record, outcome, switch_drops
from innet.backends.mininet.control import Control, stop_all
from innet.backends.mininet.dataplane import ebpf_object
from innet.backends.mininet.network import Counters, Network, built, direction_bytes_between, log
from innet.backends.mininet.nodes import (
    FaultsOf,
    await_ready,
    port_faults,
    start_input,
    start_pboxes,
    start_pcaps,
    start_switches,
    start_workers,
    worker_configs,
)
from innet.backends.mininet.shaper import BURST_S
from innet.ebpf.holds import Holds
from innet.graph import host_link_rate, is_switch, link_totals, natural_key
from innet.io.sched import asked, granted
from innet.node.config import SwitchStats
from innet.node.usage import Samples, drops_between
from innet.planning.planner import JobPlan
from innet.planning.spec import RunSpec, program_of
from innet.planning.timing.dilation import dilate_graph, dilate_spec, dilate_times
from innet.results.check import run_record, timeline_of, with_directions
from innet.results.fidelity import CPU_BOUND, Fidelity, fidelity, sched_line, with_model, with_retransmissions
from innet.results.record import RunRecord
from innet.schemes.modes import RunPlan, installed_configs, plan_run, realise
from innet.switch.program import SwitchProgram
from innet.switch.runtime import SwitchConfig
from innet.wire.packet import ETH_MTU, link_mtu

SAMPLE_S = 0.05  # how often a run's CPU is read while it goes on (longer with over 50 processes to read)
GO_LEAD, GO_LEAD_PER_HOST = 0.03, 0.002  # seconds from "go" to the common start: time to wake every host


def saturated(cores_busy: float) -> bool:
    """Whether ``cores_busy`` cores on average is enough to call the whole machine CPU-bound."""
    return cores_busy >= CPU_BOUND * (os.cpu_count() or 1)


def _faulty(run: RunSpec) -> bool:
    """Whether ``run`` injects faults that make a worker retransmit (loss, duplicates, reordering)."""
    return any(f.loss or f.dup or f.reorder for f in (run.faults, *(f for _, f in run.link_faults)))


def _modelled(run: RunSpec) -> bool:
    """Whether the timing model (innet.planning.timing) predicts ``run``'s time: all-reduce calls, dense or top-k, of
    one job or of several sharing the links, on links without faults that make workers retransmit (docs/validation.md:
    the Mininet grid's two jobs and top-k points within 2% of it)."""
    return not (run.consistency or run.train or run.input_elements or _faulty(run))


def model_time(graph: nx.Graph, run: RunSpec, rp: RunPlan, dilation: float) -> float:
    """What the timing model gives ``run`` on ``graph`` (virtual seconds: its iteration's with a workload, else its
    completion's): the time its links allow, which the fidelity verdict holds the measured time against."""
    from innet.planning.timing import MININET_HOP, predict

    return predict(graph, run, list(rp.plans), rp.per_packet, MININET_HOP / dilation)["iteration_s" if run.workload else
                                                                                      "completion_s"]


def announce(graph: nx.Graph, run: RunSpec, rp: RunPlan, dilation: float, bound: str = "") -> None:
    """Say, before the build, what a dilated run's calls will take in real time (the timing model's time times
    ``dilation``): a run whose factor makes it long says so before it starts."""
    if dilation <= 1:
        return
    what = f"links at {host_link_rate(graph) / dilation:.3g} Mbit/s real"
    if _modelled(run):
        model = model_time(graph, run, rp, dilation) * run.iterations
        what += f"; its calls' {model:.3g} s (the timing model) take about {model * dilation:.0f} s of real time"
    log(f"dilation {dilation:g}{f' (auto: the {bound} bound)' if bound else ''}: {what}")


def run_mininet(graph: nx.Graph, run: RunSpec, pcap_dir: str | None = None, cli: bool = False,
                pbox_cores: int = 1, crash: dict[str, float] | None = None,
                intruders: list[tuple[str, list[str]]] | None = None, cluster: Cluster | None = None,
                dilation: float = 1.0, node_group: int | None = None, placed: RunPlan | None = None,
                dilation_bound: str = "", calls: bool = False) -> RunRecord:
    """Run ``run`` on a Mininet network built from ``graph``; remove everything afterwards.

    ``crash`` kills the named worker hosts' processes (SIGKILL) that many seconds
    after the start; ``intruders`` are extra commands started on hosts with the
    workers (the tests' spoofers and fuzzers); ``cluster`` spreads the network over
    servers (innet.backends.cluster.servers), every one of them checked before anything starts.
    ``dilation``: the time dilation factor
    (innet.planning.timing.dilation): the network is built and the run given its times ``dilation``
    times slower, and the record's times are the requested (virtual) ones; ``dilation_bound``: what chose it, for
    the fidelity record (innet.planning.timing.dilation.auto_bounds). ``node_group``: switches
    (and workers) per process, None for innet.planning.grouping's choice. ``placed``: the run's plan as
    ``innet.prepare`` placed it, realised here on the dilated links and clock (else planned here). ``calls``: the
    record's timeline holds every rank's calls even without ``run.timeline`` (which also tracks switches' slots,
    the Python switch's only: the eBPF calibration's hop, innet.backends.mininet.calibration.from_last_start).
    """
    from mininet.log import setLogLevel

    setLogLevel("critical")
    if crash and not run.crash:  # the crash given here is the run's, so the choice of data plane sees it (stall aborts)
        run = replace(run, crash=tuple(crash.items()))
    wire_graph, wire_run = dilate_graph(graph, dilation), dilate_spec(run, dilation)
    rp = (realise(wire_graph, wire_run, program_of(wire_run), list(placed.plans), placed.outcomes) if placed
          else plan_run(wire_graph, wire_run, program_of(wire_run)))
    program = program_of(wire_run, rp.fan_in)
    rp = replace(rp, specs={j: {w: replace(s, reorder=s.reorder * dilation) for w, s in specs.items()}  # a program's
                            for j, specs in rp.specs.items()})  # times are on the run's timeline: switches' and workers'
    configs = {n: replace(c, clock=dilation) for n, c in installed_configs(wire_graph, wire_run, rp).items()}
    # the fabric's queues hold whatever converges on a link: here every interface's holds every frame the jobs can
    # have in flight at once (a PBox's incast of 127 workers' windows overflowed the kernel's default 1000)
    chunks = -(-max(run.call_sizes(), default=0) // max(rp.per_packet, 1))
    wire_graph.graph["queue_frames"] = sum(len(p.workers) * min(max(p.slots, 1), chunks) for p in rp.plans)
    answer = program.elements + (1 if run.consistency else 0)  # a parameter server's answer leads with its clock
    answer += program.extra_values  # values a program's own frames carry beyond a chunk (a bitmap)
    if cluster is not None:
        cluster.check()
    announce(graph, run, rp, dilation, dilation_bound)  # the plans are the requested graph's: dilation changes rates, not routes
    with built(wire_graph, link_mtu(answer), Emulation, cluster) as emu:
        emu.dilate(dilation, graph, run, dilation_bound)
        emu.node_group, emu.calls = node_group, calls
        emu.start_switches(wire_run, program, configs, pcap_dir, rp.plans)
        return emu.execute(wire_run, rp, pbox_cores, dilate_times(crash or {}, dilation), intruders or [], cli)


@contextmanager
def network(graph: nx.Graph, mtu: int = ETH_MTU, tag: str = "bench") -> Iterator[Emulation]:
    """A bare Mininet network of ``graph`` (nothing started on it), removed on exit: for benchmarks, and for
    other programs' processes (innet.integrations.ranks.mininet)."""
    from mininet.log import setLogLevel

    setLogLevel("critical")
    with built(graph, mtu, Emulation, tag=tag) as emu:
        yield emu


@dataclass(frozen=True)
class Readings:
    """What the controller reads of the network when the workers are released, to read again when they end."""

    started: float  # the monotonic instant "go" was said
    switch_cpu_s: dict[str, float]
    interface_bytes: Counters
    drops: tuple[dict[str, int], dict[str, int]]  # frames dropped at each interface's queue, and by it


@dataclass(frozen=True)
class Measured:
    """What the controller measured of the run when its workers had ended."""

    directions: dict[tuple[str, str], int]  # bytes each link direction (from, to) carried from "go" to the workers' end
    stats: dict[str, SwitchStats]  # each switch's
    cpu_share: dict[str, float]  # each switch's share of a core over the calls' window
    busy: float  # cores the run's processes kept busy, on average over the window
    machine_busy: float  # cores the whole machine kept busy
    fidelity: Fidelity


class Emulation(Network):
    """A run on a built network: its switches, then ``execute``: the hosts' processes started, released
    together, waited for, and what they left made into the run record."""

    def __init__(self, graph: nx.Graph, state: RunState, run_dir: str, mtu: int, cluster: Cluster | None = None) -> None:
        super().__init__(graph, state, run_dir, mtu, cluster)
        self.switch_controls: dict[str, Control] = {}
        self.switch_procs: Procs = {}
        self.watch = Watch()
        self.dilation = 1.0
        self.dilation_bound = ""
        self.requested: tuple[nx.Graph, RunSpec] | None = None
        self.node_group: int | None = None  # nodes per process (innet.planning.grouping); None: its choice
        self.calls = False  # the record's timeline holds the ranks' calls (run_mininet)
        self.ebpf = False  # the switches run the eBPF switch (start_switches): hosts end the hops from them
        self.holds: Holds = {}  # and what each holds for the hops between switches

    def dilate(self, factor: float, graph: nx.Graph, run: RunSpec, bound: str = "") -> None:
        """This network is ``graph`` dilated by ``factor`` (chosen by ``bound``, with auto), running ``run``
        dilated: ports add each link's latency, and the record is written for ``graph`` and ``run`` with times
        divided by ``factor``."""
        self.dilation, self.dilation_bound, self.requested = factor, bound, (graph, run)

    def port_faults(self, run: RunSpec) -> FaultsOf:
        return lambda node: port_faults(self.graph, run, node, latency=self.dilation > 1, ebpf=self.ebpf, holds=self.holds)

    def start_switches(self, run: RunSpec, program: type[SwitchProgram], configs: dict[str, SwitchConfig],
                       pcap_dir: str | None, plans: Sequence[JobPlan] | None = None) -> None:
        """``plans``: the run's jobs' (their trees say what the hosts hold for the hops between eBPF switches)."""
        switches = [n for n in sorted(self.graph, key=natural_key) if is_switch(self.graph, n)]
        if pcap_dir:
            start_pcaps(self, pcap_dir, switches)
        faults = self.port_faults(run)  # each node's, read when asked: after this, as the eBPF choice leaves them
        ebpf, self.holds = ebpf_object(run, program, self.graph, switches, faults, self.dilation, plans)
        self.ebpf = bool(ebpf)
        self.switch_controls, self.switch_procs = start_switches(self, run, program, configs, faults,
                                                                 self.node_group, ebpf)

    def execute(self, run: RunSpec, rp: RunPlan, pbox_cores: int, crash: dict[str, float],
                intruders: list[tuple[str, list[str]]], cli: bool) -> RunRecord:
        """The run's hosts started, released together and waited for; then its record."""
        for job, plan_outcome in rp.outcomes.items():
            log(f"job {job}: mode {run.mode}, {plan_outcome}")
        hosts, starters, waited = self._start_hosts(run, rp, pbox_cores, crash)
        await_ready(hosts)
        tracked = {**self.switch_procs, **hosts}
        # what each serves under (a node process takes the ordinary policy back once its part is over: innet.io.sched)
        policies = {name: got for name, p in tracked.items() if (got := granted(p.pid)) is not None}
        samples = Samples(lambda: {name: self.watch.times(p) for name, p in tracked.items()},
                          SAMPLE_S * max(1, len(tracked) / 50))
        name = "all-reduce" if run.collective == "allreduce" else run.collective
        log(f"{name}: {sum(len(s) for s in rp.specs.values())} workers x {run.elements} elements x "
            f"{run.iterations} iteration(s)")
        background = (None if not run.background.active else ElasticBackground(self, self.graph, run, self.dilation)
                      if run.background.elastic else Background(self, self.graph, run))
        readings = self._go(starters, background.starters if background else {}, background.lead_s if background else 0.0)
        others = {f"{name}!{i}": self.spawn(name, argv, stdout=subprocess.DEVNULL) for i, (name, argv) in enumerate(intruders)}
        self.watch.wait(waited, run, readings.started, crash, samples, self.run_dir)
        self.watch.wait(others, run, readings.started, {}, samples)
        bg = None
        if background:
            workers = [w for specs in rp.specs.values() for w in specs]
            window = calls_window(self.run_dir, workers) or (readings.started, time.monotonic())
            bg = background.stop((self.requested or (self.graph, run))[0], self.dilation, window)
        samples.take()
        measured = self._measure(rp, readings, samples, policies)
        if cli:
            from mininet.cli import CLI

            CLI(self.net)
        record = self._record(run, rp, measured, modelled=not crash and not intruders and not bg)
        return record.with_figures(background=bg) if bg else record

    def _start_hosts(self, run: RunSpec, rp: RunPlan, pbox_cores: int, crash: dict[str, float]) -> tuple[Procs, Procs, Procs]:
        """The PBox shards, the workers and the input stream, started: every process (to say "ready"), those
        to tell "go" (workers and input stream), and those to wait for (workers and input readers)."""
        faults = self.port_faults(run)
        procs = start_pboxes(self, run, rp, pbox_cores, faults)
        workers = start_workers(self, worker_configs(self, run, rp, faults), 1 if crash else self.node_group)
        inputs = start_input(self, rp.input, faults) if rp.input is not None else {}
        readers = {name: p for name, p in inputs.items() if name.endswith(":input")}
        return {**procs, **workers, **inputs}, {**workers, **inputs}, {**workers, **readers}

    def _go(self, starters: Procs, early: Procs | None = None, lead: float = 0.0) -> Readings:
        """Read the counters, then release ``starters`` at one start instant on the clock all hosts share
        (servers of a cluster do not share it: there, each starts when told), and ``early`` (the background's
        senders) ``lead`` seconds before it."""
        cpu = {sw: ctl.stats().cpu_s for sw, ctl in self.switch_controls.items()}
        counters, drops = self.counters()
        started = time.monotonic()
        at = started + GO_LEAD + GO_LEAD_PER_HOST * (len(starters) + len(early or {})) + lead
        for procs, instant in ((early or {}, at - lead), (starters, at)):
            go = b"go\n" if self.cluster else f"go {instant:.6f}\n".encode()
            for proc in procs.values():
                assert proc.stdin is not None
                proc.stdin.write(go)
                proc.stdin.flush()
        return Readings(started, cpu, counters, drops)

    def _measure(self, rp: RunPlan, readings: Readings, samples: Samples, sched: dict[str, str]) -> Measured:
        """The switches' stats (then stopped), and the fidelity verdict on the calls' window: every process's
        share of a core and the frames dropped at every interface, queue and switch socket; ``sched``: the
        scheduler policy each process served under, recorded (a line where some did not get the one asked)."""
        wall = time.monotonic() - readings.started
        after, drops_after = self.counters()
        directions = direction_bytes_between(self.graph, readings.interface_bytes, after)
        hosts = [w for specs in rp.specs.values() for w in specs]
        window = calls_window(self.run_dir, hosts) if self.cluster is None else None  # servers' clocks differ
        start, end = window or (readings.started, readings.started + wall)
        seconds, cpu, waits, machine_busy = samples.shares(start, end, os.cpu_count() or 1)
        stats = {sw: ctl.stats() for sw, ctl in self.switch_controls.items()}
        # a switch works only while the calls go on: its CPU since "go" is theirs
        cpu_share = {sw: (st.cpu_s - readings.switch_cpu_s[sw]) / seconds if seconds > 0 else 0.0
                     for sw, st in stats.items()}
        stop_all(list(self.switch_controls.values()))
        fid = fidelity(self.dilation, cpu, drops_between(readings.drops[0], drops_after[0]),
                       drops_between(readings.drops[1], drops_after[1]),
                       {sw: sum(st.socket_drops.values()) for sw, st in stats.items()}, os.cpu_count() or 1, waits)
        # None: TCLink's per-frame shaping; cpu_over_s: the shares' span, the calls' window to the readings around it
        fid = replace(fid, shaper_burst_s=BURST_S if self.bursts else None, cpu_over_s=round(seconds, 3),
                      dilation_bound=self.dilation_bound, sched=sched)
        said = sched_line(sched, asked())
        if said:
            log(said)
        return Measured(directions, stats, cpu_share, sum(cpu.values()), machine_busy, fid)

    def _record(self, run: RunSpec, rp: RunPlan, measured: Measured, modelled: bool = True) -> RunRecord:
        """The run record (of the requested run, on its timeline), with the fidelity verdict and, where the
        timing model predicts the run, the verdict against it too."""
        stats, link_bytes = measured.stats, link_totals(measured.directions)
        outcomes = [outcome(self.run_dir, w, spec, self.dilation) for plan in rp.plans for w, spec in rp.specs[plan.job].items()]
        inputs = input_record(self.graph, self.run_dir, rp.input, stats, self.dilation) if rp.input is not None else None
        graph, run = self.requested or (self.graph, run)  # the record is the requested run's, in its timeline
        record = run_record(
            graph, run, rp, "mininet", outcomes, link_bytes, switch_drops(stats),
            switch_memory_bytes={sw: st.memory_bytes for sw, st in stats.items()},
            switch_cpu_share={sw: round(share, 3) for sw, share in measured.cpu_share.items()},
            busy_cores=round(measured.busy, 2), machine_busy_cores=round(measured.machine_busy, 2),
            switch_counters={sw: st.counters for sw, st in stats.items()},
            switch_data_plane={sw: st.runtime.data_plane for sw, st in stats.items() if st.runtime is not None},
            **({"input": inputs} if inputs is not None else {}),
            **({"cluster": cluster_figures(graph, self.placement, self.cluster.servers, link_bytes)}
               if self.cluster is not None else {}),
        )
        record = with_directions(record, graph, measured.directions)
        if run.timeline or self.calls:  # the hosts' monotonic clock, from the first call's start
            starts = [t for o in outcomes for t in o.started if math.isfinite(t)]
            workers = {(s.job, s.rank): w for specs in rp.specs.values() for w, s in specs.items()}
            reports = {sw: st.runtime for sw, st in stats.items() if st.runtime is not None}
            record = replace(record, timeline=timeline_of(run, workers, outcomes, reports, min(starts, default=0.0),
                                                          self.dilation))
        fid = with_retransmissions(measured.fidelity, record.retransmissions, _faulty(run))
        if modelled and _modelled(run):  # the timing model gives what the links allow: the local backend's time
            key = "iteration_s" if run.workload else "completion_s"
            fid = with_model(fid, float(record.get(key, float("nan"))), model_time(graph, run, rp, self.dilation))
        return record.with_figures(fidelity=fid)
