"""The three ways to all-reduce, and a whole run's plan: jobs, their plans, what each host runs.

- ``innet``: switches aggregate, where the placement method says; jobs share
  the switches' slot pools and fall back to the PBox when they are full;
- ``pbox``: every worker sends to the PBox host, which aggregates (PHub);
- ``ring``: reduce-scatter then all-gather between the workers (Horovod).

With ``--jobs N`` the hosts are dealt round-robin to N jobs (so jobs share
racks and switches), each with its own seed-derived gradients.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import networkx as nx
import numpy as np

from innet.errors import UserError
from innet.graph import node_indices
from innet.hosts.background import BackgroundSpec, carried_mbps
from innet.hosts.endpoints import endpoint_of
from innet.hosts.ensemble import InputPlan, group_tables, plan_input
from innet.hosts.job import JobSpec
from innet.hosts.pbox import PBoxJob, PBoxServer
from innet.hosts.ssp import SSPWorker
from innet.hosts.training import Training
from innet.hosts.worker.process import WorkerProcess
from innet.planning.configs import pick_workers, switch_configs, worker_specs
from innet.planning.dynamic import partial_window, plan_dynamic
from innet.planning.planner import METHODS, JobPlan, JobRequest, Placement, plan_job, plan_jobs
from innet.planning.prediction import direction_bytes
from innet.planning.spec import MODES, RunSpec
from innet.planning.timing import planned_training, predict
from innet.planning.timing.dilation import (
    BANDWIDTH,
    auto_bound,
    auto_bounds,
    carried_rate,
    hop_cost,
    host_link_rate,
    latency_factor,
    process_links_rate,
    woken_graph,
)
from innet.schemes.layouts import laid_out, server_of, sharded_reorder
from innet.switch.program import SwitchProgram
from innet.switch.runtime import SwitchConfig
from innet.wire.packet import BANDS

DEFAULT_WINDOW = 128


@dataclass(frozen=True)
class RunPlan:
    """Every job of a run: its plan, what placing it together with the others gave, its workers' specs."""

    plans: tuple[JobPlan, ...]
    outcomes: dict[int, str]
    specs: dict[int, dict[str, JobSpec]]
    per_packet: int
    training: Training | None = None  # the schedule every worker's calls follow (P3's order planned in)
    input: InputPlan | None = None  # the ensemble's input stream (innet.hosts.ensemble), if the run reads one
    fan_in: int = 1  # the most contributors any switch aggregates for one job

    def ring(self, job: int) -> list[int]:
        return [s.node for s in sorted(self.specs[job].values(), key=lambda s: s.rank)]


def fastest_placement(graph: nx.Graph, run: RunSpec, requests: list[JobRequest], program: type[SwitchProgram]) -> Placement:
    """``--placement auto``: the switch placement (METHODS) whose plans the timing model says finish
    first: a run's iteration with a workload, else its calls. Ties go to tor, then tree, then root, so
    where they are alike the plan is the familiar rack-then-root one."""
    key = "iteration_s" if run.workload else "completion_s"
    order = ("tor", "tree", "root")
    assert set(order) == set(METHODS)
    asked = repr((sorted(graph.nodes(data=True)), sorted(graph.edges(data=True)), graph.graph,
                  replace(run, background=BackgroundSpec()), requests, program.slots, program.elements))
    if asked in _FASTEST:  # an experiment checks, then runs, the same plan at every background load
        return plan_jobs(graph, requests, method=_FASTEST[asked], pool_slots=program.slots)
    placed = {m: plan_jobs(graph, requests, method=m, pool_slots=program.slots) for m in order}

    def predicted(method: str) -> float:
        plans = list(placed[method].plans)
        return round(predict(graph, replace(run, placement=method), plans, program.elements, 0.0)[key], 12)

    if len(_FASTEST) > 256:
        _FASTEST.clear()
    _FASTEST[asked] = min(order, key=lambda m: (predicted(m), order.index(m)))
    return placed[_FASTEST[asked]]


_FASTEST: dict[str, str] = {}  # fastest_placement's choice by what it was asked (the timing model is deterministic)


def auto_dilation(graph: nx.Graph, run: RunSpec, rp: RunPlan, faithful_mbps: float, hop_s: float = 0.0) -> float:
    """``--dilation auto``'s factor for ``run`` (innet.planning.timing.dilation.auto_factor): ``auto_choice``'s."""
    return auto_choice(graph, run, rp, faithful_mbps, hop_s)[0]


def auto_choice(graph: nx.Graph, run: RunSpec, rp: RunPlan, faithful_mbps: float,
                hop_s: float = 0.0, plane: str = "python", python_mbps: float = 0.0) -> tuple[float, str]:
    """``--dilation auto``'s factor for ``run`` and the bound that chose it (innet.planning.timing.dilation.auto_bounds):
    from its host links' rate, from the traffic its plan ``rp`` puts on every link at once (all jobs together) and
    the background's beside it (``carried_mbps``: at ``run.background``'s rates while the job runs; left out, a
    leaf-spine 2x2's job beside a 50% TCP permutation took 1.10x its time alone on Mininet at auto's 18.75, 1.02-1.05x
    at 37.5, where the local backend says 1.024x), and
    from the process hops on its critical path, each ``hop_s`` of wall time (the calibration's, more for more workers:
    ``hop_cost``): the timing model's time with hops of ``hop_s`` less its time without, over ``hop_s``, counts them.
    ``plane``: the data plane calibrated (``faithful_mbps``, ``hop_s``); on "ebpf" a hop is counted only where a frame
    wakes a process (a host, a PBox: ``woken_graph``), and the links into and out of a PBox, a Python process on
    either plane, are kept within ``python_mbps`` (the Python switch's faithful rate; its bandwidth bound)."""
    loads: dict[tuple[str, str], float] = {}
    for plan in rp.plans:
        size, collective = max(run.calls(), key=lambda call: call[0])
        for uv, b in direction_bytes(graph, run.mode, plan, size, rp.per_packet, run.topk or 1.0, collective,
                                     run.root).items():
            loads[uv] = loads.get(uv, 0.0) + b
    latency = 0.0
    if hop_s > 0:
        key = "iteration_s" if run.workload else "completion_s"
        woken = woken_graph(graph) if plane == "ebpf" else graph
        base = predict(graph, run, list(rp.plans), rp.per_packet, 0.0)[key]
        hops = (predict(woken, run, list(rp.plans), rp.per_packet, hop_s)[key] - base) / hop_s
        latency = latency_factor(hops, hop_cost(hop_s, sum(len(p.workers) for p in rp.plans), plane), base,
                                 run.iterations)
    carried = carried_rate(graph, loads) + carried_mbps(graph, run.background, run.seed)
    bounds = auto_bounds(host_link_rate(graph), faithful_mbps, carried, latency)
    servers = {s for p in rp.plans for s in (p.pbox, *p.servers) if s is not None} if run.mode == "pbox" else set()
    if plane == "ebpf" and python_mbps > 0 and servers:
        bounds[BANDWIDTH] = max(bounds[BANDWIDTH], process_links_rate(graph, loads, servers) / python_mbps)
    return max(1.0, *bounds.values()), auto_bound(bounds)


def plan_run(graph: nx.Graph, run: RunSpec, program: type[SwitchProgram]) -> RunPlan:
    if run.mode not in MODES:
        raise UserError(f"unknown mode {run.mode!r}; expected one of {', '.join(MODES)}")
    if run.consistency and (run.mode != "pbox" or run.workload or run.topk):
        raise UserError("{consistency} trains against the PBox: it needs {mode} pbox, and neither {workload} nor {topk}")
    if run.topk and run.mode == "innet" and not getattr(program, "sparse", False):
        raise UserError(f"program {program.name} cannot aggregate sparse chunks; {{topk}} needs {{program}} topk_sparse")
    workers = pick_workers(graph, run.workers)
    if run.jobs < 1 or run.jobs > len(workers):
        raise UserError(f"{{jobs}} must be between 1 and the {len(workers)} workers, got {run.jobs}")
    if run.input_elements < 0 or (run.shared_input and not run.input_elements):
        raise UserError("{input_elements} must not be negative, and {shared_input} needs {input_elements}")
    if run.job_priority and (len(run.job_priority) != run.jobs or not all(0 <= b < BANDS for b in run.job_priority)):
        raise UserError(f"{{job_priority}} wants one band in 0..{BANDS - 1} per job ({run.jobs}), got "
                        f"{','.join(map(str, run.job_priority))}")
    groups = [tuple(workers[i::run.jobs]) for i in range(run.jobs)]
    if run.train and (run.workload or run.input_elements or run.operator.ufunc != "add"):
        raise UserError("{train} all-reduces its own model's gradients with a sum: it takes neither {workload}, "
                        "{input_elements} nor a {program} that reduces with another operator")
    if run.train:
        run.task(len(groups[0]))  # a batch that does not divide among the workers stops here, before anything starts
    plans, outcomes = place_jobs(graph, run, program, groups)
    return realise(graph, run, program, plans, outcomes)


def place_jobs(graph: nx.Graph, run: RunSpec, program: type[SwitchProgram],
               groups: list[tuple[str, ...]]) -> tuple[list[JobPlan], dict[int, str]]:
    """Where each job of ``run`` aggregates (the planner's work, done once a run): its plan, and what placing it
    together with the others gave."""
    window = program.slots or DEFAULT_WINDOW
    wanted = run.job_slots or max(1, window // run.jobs)
    if run.mode == "pbox" or (run.mode == "innet" and run.placement == "pbox"):
        plans = [plan_job(graph, g, method="pbox", job=j + 1, slots=wanted) for j, g in enumerate(groups)]
        if run.mode == "pbox":
            plans = [laid_out(graph, p, run.pbox_layout) for p in plans]
        outcomes = {p.job: f"pbox: {p.pbox}" if p.layout == "central" else f"pbox {p.layout}: {', '.join(dict.fromkeys(p.servers))}"
                    for p in plans}
    elif run.mode == "ring":  # the plan only fixes ranks and first hops; switches just route
        plans = [plan_job(graph, g, method="tor", job=j + 1, slots=wanted) for j, g in enumerate(groups)]
        outcomes = {p.job: "ring" for p in plans}
    else:
        requests = [JobRequest(j + 1, g, wanted) for j, g in enumerate(groups)]
        placed = (fastest_placement(graph, run, requests, program) if run.placement == "auto"
                  else plan_jobs(graph, requests, method=run.placement, pool_slots=program.slots,
                                 place=plan_dynamic if run.placement == "dynamic" else None))
        plans, outcomes = list(placed.plans), placed.outcomes
    return plans, outcomes


def realise(graph: nx.Graph, run: RunSpec, program: type[SwitchProgram], plans: list[JobPlan],
            outcomes: dict[int, str]) -> RunPlan:
    """The run's plan from its placed jobs: every worker's spec, the compute schedule and the input stream, on
    ``graph`` and ``run`` (a dilated run realises the same placement on its dilated links and clock)."""
    index = node_indices(graph)
    specs = {}
    frame = program.frame_bytes()
    plans = [replace(p, switch_ports={s: replace(jp, window=partial_window(graph, p, frame))
                                      for s, jp in p.switch_ports.items()}) if p.method == "dynamic" else p for p in plans]
    for plan in plans:
        job_specs = worker_specs(graph, plan, program, run)
        if plan.method == "pbox" and run.mode != "ring":
            assert plan.pbox is not None
            servers = tuple(index[s] for s in plan.servers) if plan.layout == "sharded" else ()
            job_specs = {w: replace(s, pbox=index[server_of(plan, w)], servers=servers,
                                    reorder=s.reorder + sharded_reorder(graph, plan, program.elements))
                         for w, s in job_specs.items()}
        specs[plan.job] = job_specs
    stream = plan_input(graph, specs, run.input_elements, run.shared_input, program.elements, run.iterations, run.seed,
                        max(0.05, 10 * run.min_rto), run.timeout) if run.input_elements else None
    fan_in = max((len(jp.contributors) for p in plans for jp in p.switch_ports.values() if jp.aggregate), default=1)
    return RunPlan(tuple(plans), outcomes, specs, program.elements, planned_training(graph, run, plans, program.elements),
                   stream, fan_in)


def installed_plans(run: RunSpec, rp: RunPlan) -> list[JobPlan]:
    """The plans switches are told about: the in-network jobs that did not fall back."""
    return [p for p in rp.plans if run.mode == "innet" and p.method != "pbox"]


def installed_configs(graph: nx.Graph, run: RunSpec, rp: RunPlan, routed: bool = True) -> dict[str, SwitchConfig]:
    """What every switch is told before traffic starts: its installed jobs (stalled ones abort after half
    the run's timeout), their priority bands, and its register memory (``routed=False``: no route tables)."""
    plans = installed_plans(run, rp)
    groups = group_tables(graph, rp.input) if rp.input and rp.input.shared else {}
    pboxed = [p for p in rp.plans if run.mode != "ring" and p.method == "pbox"]
    configs = switch_configs(graph, plans, run.switch_memory, run.timeout / 2, {p.job: run.band(p.job) for p in plans},
                             groups, routed, pboxed)
    return {n: replace(c, timeline=True) for n, c in configs.items()} if run.timeline else configs


def host_endpoint(run: RunSpec, rp: RunPlan, host: str, spec: JobSpec,
                  given: Sequence[np.ndarray] | None = None) -> WorkerProcess | SSPWorker:
    """What worker ``host`` runs: its all-reduce calls, or with ``consistency`` its training loop against the PBox;
    with ``train``, on the gradients its learner computes step by step; ``given``: on these tensors instead."""
    learner = run.learner(spec.nworkers, spec.rank) if run.train and given is None else None
    tensors = learner if learner is not None else given if given is not None else run.tensors(spec.job, spec.rank)
    ssp = (run.parameter_server(), run.compute_times(host, spec.job, spec.rank)) if run.consistency else None
    return endpoint_of(spec, tensors, run.mode, rp.ring(spec.job), rp.training, ssp)


def pbox_servers(graph: nx.Graph, run: RunSpec, rp: RunPlan, cores: int) -> tuple[str | None, list[PBoxServer]]:
    """The PBox host and its shards (one per core), serving every job that aggregates there."""
    if run.mode == "ring":
        return None, []
    jobs = [p for p in rp.plans if p.method == "pbox" and p.pbox is not None]
    if not jobs:
        return None, []
    host = jobs[0].pbox
    index = node_indices(graph)
    boxed = []
    for plan in jobs:
        specs = rp.specs[plan.job]
        first = next(iter(specs.values()))
        job = PBoxJob(plan.job, {s.rank: s.node for s in specs.values()}, first.slots, first.elements,
                      run.timeout / 2, sparse=run.topk > 0, operator=first.operator)
        boxed.append(replace(job, consistency=run.consistency, staleness=run.staleness, iterations=run.iterations,
                             length=run.elements) if run.consistency else job)
    assert host is not None
    return host, [PBoxServer(index[host], boxed, cores, core) for core in range(cores)]
