"""``--backend local``: run an experiment on the in-process fabric."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import networkx as nx
import numpy as np

from innet.backends.local.fabric import Fabric
from innet.backends.local.sampler import LinkSampler
from innet.events import Progress
from innet.hosts.background import (
    BackgroundHost,
    BackgroundSpec,
    asked_flows,
    background_flows,
    background_hosts,
    background_summary,
    lead_s,
    stats_of,
    with_alone,
)
from innet.hosts.elastic import ALONE_S, WARM_S, ElasticHost, elastic_hosts, received_between
from innet.hosts.endpoint import Endpoint, Frames
from innet.hosts.ensemble import InputReceiver, InputServer, input_summary
from innet.hosts.ssp import SSPWorker
from innet.hosts.worker.call import AllreduceCall
from innet.hosts.worker.process import WorkerProcess
from innet.planning.spec import RunSpec, program_of
from innet.results.check import run_record, tally_drops, timeline_of, with_directions
from innet.results.fidelity import virtual_fidelity
from innet.results.outcome import outcome_of, training_outcome
from innet.results.record import RunRecord
from innet.schemes.modes import RunPlan, host_endpoint, installed_configs, plan_run
from innet.schemes.pboxes import pbox_endpoints
from innet.switch.program import SwitchProgram
from innet.switch.runtime import SwitchRuntime


class LocalRun:
    """One experiment on the fabric, in steps, so tests can add hosts of their own (a spoofer, a crash)."""

    def __init__(self, graph: nx.Graph, run: RunSpec, pbox_cores: int = 1, crash: dict[str, float] | None = None,
                 given: Mapping[int, Sequence[np.ndarray]] | None = None, planned: RunPlan | None = None,
                 program: type[SwitchProgram] | None = None) -> None:
        """``given``: job 1's tensors by rank, all-reduced instead of the run's seeded ones (DDP's buckets);
        ``planned`` and ``program``: the run's plan and program, as ``innet.prepare`` made them (else made here)."""
        self.graph, self.run = graph, run
        progress = Progress("local")
        self.rp: RunPlan = planned or plan_run(graph, run, program_of(run))
        self.program = program or program_of(run, self.rp.fan_in)
        self.fabric = Fabric(graph, faults=run.faults_on, seed=run.seed)
        configs = installed_configs(graph, run, self.rp)
        self.runtimes = {name: SwitchRuntime(cfg, self.program) for name, cfg in configs.items()}
        for name, rt in self.runtimes.items():
            self.fabric.add_switch(name, rt)
        boxes = pbox_endpoints(graph, run, self.rp, pbox_cores)
        self.servers = [server for _, server in boxes]
        for host, server in boxes:
            self.fabric.attach(host, server)
        self.inputs = []
        if self.rp.input is not None:
            self.input_server = InputServer(self.rp.input)
            self.fabric.attach(self.rp.input.server, self.input_server)
            self.inputs = [InputReceiver(self.rp.input, reader) for reader in self.rp.input.receivers]
            for receiver in self.inputs:
                self.fabric.attach(receiver.reader.host, receiver)
        self.procs: list[WorkerProcess | SSPWorker] = []
        # background runs alone first, as on Mininet: an elastic one is measured alone before the job starts, an
        # open-loop one reaches its steady flow (innet.hosts.background.lead_s)
        self.start_s = WARM_S + ALONE_S if run.background.elastic else \
            lead_s(background_flows(graph, run.background, run.seed)) if run.background.active else 0.0
        for plan in self.rp.plans:
            for w, spec in self.rp.specs[plan.job].items():
                proc = host_endpoint(run, self.rp, w, spec, given.get(spec.rank) if given and plan.job == 1 else None)
                endpoint: Endpoint = Crashing(proc, crash[w]) if crash and w in crash else proc
                self.fabric.attach(w, Later(endpoint, self.start_s) if self.start_s else endpoint)
                self.procs.append(proc)
                progress.update(lambda: f"building: {len(self.procs)} workers")
        self.background: dict[str, BackgroundHost | ElasticHost] = {}
        self.sampler: LinkSampler | None = None
        if run.background.active:
            self.fabric.background = True
            self.background = {**(elastic_hosts if run.background.elastic else background_hosts)(
                graph, run.background, run.seed)}
            for name, end in self.background.items():
                self.fabric.attach(name, end)
            self.sampler = LinkSampler(self.fabric)
            self.fabric.attach("~sampler", self.sampler)

    def attach(self, host: str, endpoint: Endpoint) -> None:
        self.fabric.attach(host, endpoint)

    def finish(self, **extra: object) -> RunRecord:
        ended = self.fabric.run()
        if self.sampler is not None:
            extra["utilisation"] = self.sampler.utilisation()
            summary = background_summary(self.run.background, [stats_of(e) for e in self.background.values()], ended,
                                         self.fabric.link_bytes(background=True),
                                         sum(f.bps for f in asked_flows(self.graph, self.run.background, self.run.seed)))
            if self.run.background.elastic:  # payload that arrived while the job ran (not what the wires drained),
                # and alone, after WARM_S, before the job started
                elastic = [e for e in self.background.values() if isinstance(e, ElasticHost)]
                during = sum(received_between(e.samples, self.start_s, ended) for e in elastic)
                alone = sum(received_between(e.samples, WARM_S, self.start_s) for e in elastic)
                summary = with_alone(replace(summary, delivered_mbps=round(during * 8 / (ended - self.start_s) / 1e6, 3)),
                                     alone * 8 / ALONE_S / 1e6)
            extra["background"] = summary
        for proc in self.procs:
            for call in getattr(proc, "calls", []):
                if isinstance(call, AllreduceCall):
                    call.release()
        counters = [rt.ctx.counters for rt in self.runtimes.values()]
        counters += [{"pbox:" + k: n for k, n in s.counters.items()} for s in self.servers]
        drops = tally_drops(counters, {"link:lost": sum(link.injector.lost for link in self.fabric.links.values())})
        outcomes = [training_outcome(p) if isinstance(p, SSPWorker) else outcome_of(p) for p in self.procs]
        if self.inputs and self.rp.input is not None:
            switch_bytes = sum(rt.ctx.counters.get("input_bytes", 0) for rt in self.runtimes.values())
            extra["input"] = input_summary(self.graph, self.rp.input, [r.outcome() for r in self.inputs],
                                           self.input_server.sent_bytes + switch_bytes)
        record = run_record(
            self.graph, self.run, self.rp, "local", outcomes, self.fabric.link_bytes(),
            drops, switch_memory_bytes={n: rt.memory_bytes for n, rt in self.runtimes.items()},
            **{"fidelity": virtual_fidelity(), **extra},
        )
        record = with_directions(record, self.graph, self.fabric.direction_bytes())
        if self.run.background.elastic:  # the job's slowdown: the same run without the background
            quiet = LocalRun(self.graph, replace(self.run, background=BackgroundSpec()), planned=self.rp,
                             program=self.program).finish()
            record = record.with_figures(background=with_alone(record.figures["background"],
                                                               record.figures["background"].alone_mbps,
                                                               record.completion_s, quiet.completion_s))
        if self.run.timeline:
            workers = {(s.job, s.rank): w for specs in self.rp.specs.values() for w, s in specs.items()}
            reports = {n: rt.report() for n, rt in self.runtimes.items()}
            record = replace(record, timeline=timeline_of(self.run, workers, outcomes, reports))
        return record


def run_local(graph: nx.Graph, run: RunSpec, pbox_cores: int = 1, crash: dict[str, float] | None = None) -> RunRecord:
    return LocalRun(graph, run, pbox_cores, crash).finish()


class Later:
    """A host's endpoint that starts at virtual time ``at`` (until then it neither hears nor says anything)."""

    def __init__(self, endpoint: Endpoint, at: float) -> None:
        self.endpoint, self.at = endpoint, at
        self.started = False

    @property
    def done(self) -> bool:
        return self.endpoint.done

    def start(self, now: float) -> Frames:
        return self.on_timeout(now)

    def receive(self, frame: bytes, now: float) -> Frames:
        return list(self.endpoint.receive(frame, now)) if self.started else []

    def next_deadline(self) -> float | None:
        return self.endpoint.next_deadline() if self.started else self.at

    def on_timeout(self, now: float) -> Frames:
        if self.started:
            return list(self.endpoint.on_timeout(now))
        if now < self.at:
            return []
        self.started = True
        return list(self.endpoint.start(now))


class Crashing:
    """A worker that dies at virtual time ``at``: from then on it neither hears nor says anything."""

    def __init__(self, proc: WorkerProcess | SSPWorker, at: float) -> None:
        self.proc, self.at = proc, at
        self.dead = False

    @property
    def done(self) -> bool:
        return self.dead or self.proc.done

    def _alive(self, now: float) -> bool:
        if now >= self.at and not self.dead:
            self.dead = True
            failed = self.proc.calls[-1] if isinstance(self.proc, WorkerProcess) else self.proc
            failed.error = RuntimeError(f"rank {self.proc.spec.rank} crashed (injected at {self.at:g}s)")
        return not self.dead

    def start(self, now: float) -> Frames:
        return self.proc.start(now) if self._alive(now) else []

    def receive(self, frame: bytes, now: float) -> Frames:
        return self.proc.receive(frame, now) if self._alive(now) else []

    def next_deadline(self) -> float | None:
        deadline = self.proc.next_deadline()
        return None if self.dead else self.at if deadline is None else min(deadline, self.at)

    def on_timeout(self, now: float) -> Frames:
        return self.proc.on_timeout(now) if self._alive(now) else []
