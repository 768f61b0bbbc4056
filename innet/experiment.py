"""One experiment, backend-independent parts: configs, gradients, checking, results.

``switch_configs`` turns a topology and job plans into what each switch's
control channel installs; ``make_tensors`` draws the seeded gradients every
backend uses; ``check`` compares what workers got with the exact integer sum.
"""

from __future__ import annotations

import hashlib
import re
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import networkx as nx
import numpy as np

from innet import fixedpoint
from innet.errors import UserError
from innet.faults import FaultSpec
from innet.graph import hosts, link_name, natural_key, node_indices, ports, role, routes, switches
from innet.metrics import cross_rack_bytes, tier_bytes
from innet.planner import JobPlan
from innet.program import SwitchProgram
from innet.runtime import DEFAULT_SWITCH_MEMORY, SwitchConfig
from innet.sparse import topk_with_feedback
from innet.ssp import Consistency
from innet.training import Training, iteration_stats
from innet.worker import JobSpec
from innet.workloads import load_workload


@dataclass(frozen=True)
class RunSpec:
    """What to run; the same for every backend."""

    mode: str = "innet"
    program: str = "sum_allreduce"
    placement: str = "tor"
    workers: int | None = None
    elements: int = 65536
    iterations: int = 1
    seed: int = 0
    faults: FaultSpec = field(default_factory=FaultSpec)
    switch_memory: int = DEFAULT_SWITCH_MEMORY
    min_rto: float = 0.001
    initial_rto: float = 1.0  # RFC 6298's: the first window may queue behind a slow link
    timeout: float = 10.0
    jobs: int = 1
    pool_slots: int = 0  # slots in every switch's pool, per version (0: the program's own)
    packet_elements: int = 0  # gradient values per packet (0: the program's own)
    job_slots: int = 0  # slots each job asks of every switch (0: the pool divided by the jobs)
    job_priority: tuple[int, ...] = ()  # each job's priority band, job 1 first (empty: band 0 for all)
    link_faults: tuple[tuple[str, FaultSpec], ...] = ()  # per link ("a--b") or direction ("a->b")
    workload: str = ""  # a model (innet.workloads): iterations over its layers instead of one flat tensor
    workload_scale: float = 0.01  # the model's layers (and compute) shrunk to this fraction
    pipeline: int = 1  # with a workload: 1 = BSP, 2 = Pipe-SGD width-2 pipelining
    compute_scale: float = 1.0  # with a workload: multiplies every layer's compute time (a faster or slower GPU)
    topk: float = 0.0  # > 0: workers send only this fraction of each gradient, top-k with error feedback (innet.sparse)
    consistency: str = ""  # pbox training (innet.ssp): "bsp", "ssp" or "asp"; "": all-reduce calls
    staleness: int = 0  # ssp: the bound s
    compute_time: float = 0.0  # training without a workload: seconds of compute per iteration
    stragglers: tuple[tuple[str, float, float], ...] = ()  # (host, compute factor, probability per iteration)
    slice_elements: int = 0  # with a workload: cut layers into all-reduce calls of at most this many elements (0: whole)
    priority: str = "fifo"  # with a workload: "fifo" (backward order) or "p3" (the layer needed first goes first)
    input_elements: int = 0  # > 0: every worker reads this many input values per iteration from the PBox host
    shared_input: bool = False  # with input_elements: one multicast stream for all jobs instead of a copy each

    def _slices(self) -> list[tuple[int, int, bool]]:
        """One iteration's calls in FIFO order, layers backward: (forward index of the layer, elements,
        first slice of its layer), each layer cut into slices of at most ``slice_elements``."""
        layers = load_workload(self.workload, self.workload_scale).layers
        out = []
        for index in reversed(range(len(layers))):
            n = layers[index].elements
            size = self.slice_elements or n
            out += [(index, min(size, n - at), at == 0) for at in range(0, n, size)]
        return out

    def call_sizes(self) -> list[int]:
        """The elements of each all-reduce call of a worker, in FIFO order."""
        if not self.workload:
            return [self.elements] * self.iterations
        return [n for _, n, _ in self._slices()] * self.iterations

    def layers(self) -> int:
        """Calls per iteration: a workload's layers (or their slices), else 1."""
        return len(self._slices()) if self.workload else 1

    def tensors(self, job: int, rank: int) -> list[np.ndarray]:
        """What worker ``rank`` of ``job`` all-reduces, call by call."""
        return worker_tensors(self.seed, job, rank, self.call_sizes(), self.topk, self.layers())

    def training(self) -> Training | None:
        """The compute schedule the calls follow (None: back to back, no compute)."""
        if not self.workload:
            return None
        w = load_workload(self.workload, self.workload_scale)
        c, backward = self.compute_scale, w.backward_times()
        slices = self._slices()  # a layer's backward time passes before its first slice
        return Training(c * sum(w.forward_times()), tuple(c * backward[i] if first else 0.0 for i, _, first in slices),
                        self.pipeline, tuple(i for i, _, _ in slices))

    def parameter_server(self) -> Consistency:
        """How the PBox answers this run's training pushes (``consistency`` runs only)."""
        return Consistency(self.consistency, self.staleness, self.iterations, self.elements)

    def compute_times(self, host: str, job: int, rank: int) -> list[float]:
        """Seconds of compute of each iteration on ``host``: ``compute_time``, times a straggler's factor
        in the iterations it straggles (seeded)."""
        rng = np.random.default_rng([self.seed, job, rank, 7])
        factor, chance = next(((f, p) for h, f, p in self.stragglers if h == host), (1.0, 0.0))
        return [self.compute_time * (factor if rng.random() < chance else 1.0) for _ in range(self.iterations)]

    def band(self, job: int) -> int:
        """The priority band of job ``job``'s packets (jobs count from 1)."""
        return self.job_priority[job - 1] if self.job_priority else 0

    def faults_on(self, sender: str, receiver: str) -> FaultSpec:
        """The faults of frames ``sender`` puts on its link to ``receiver``: the direction's,
        else the link's, else the run's."""
        given = dict(self.link_faults)
        return given.get(f"{sender}->{receiver}", given.get(link_name(sender, receiver), self.faults))


def pick_workers(graph: nx.Graph, count: int | None) -> list[str]:
    available = hosts(graph)
    if count is None:
        return available
    if count < 1:
        raise UserError(f"--workers must be at least 1, got {count}")
    if count > len(available):
        raise UserError(f"--workers {count} is more than the {len(available)} hosts of this topology")
    return available[:count]


def switch_configs(graph: nx.Graph, plans: Sequence[JobPlan], memory: int = DEFAULT_SWITCH_MEMORY,
                   stall_timeout: float = 0.0, bands: dict[int, int] | None = None,
                   groups: dict[str, dict[int, tuple[int, ...]]] | None = None) -> dict[str, SwitchConfig]:
    """What each switch's control channel installs; jobs abort after ``stall_timeout`` s stuck (0: never),
    and their packets leave in band ``bands[job]`` (0 when not given); ``groups``: each switch's multicast
    group table."""
    index = node_indices(graph)
    bands = bands or {}
    configs = {}
    for sw in switches(graph):
        port_map = ports(graph, sw)
        by_neighbor = {n: p for p, n in port_map.items()}
        configs[sw] = SwitchConfig(
            name=sw,
            node=index[sw],
            tier=role(graph, sw),
            ports={p: f"{sw}-eth{p}" for p in port_map},
            neighbors={p: index[n] for p, n in port_map.items()},
            routes={index[dst]: by_neighbor[hop] for dst, hop in routes(graph, sw).items()},
            jobs={plan.job: replace(plan.switch_ports[sw], stall_timeout=stall_timeout, priority=bands.get(plan.job, 0))
                  for plan in plans if sw in plan.switch_ports},
            memory_bytes=memory,
            groups=(groups or {}).get(sw, {}),
        )
    return configs


def worker_specs(graph: nx.Graph, plan: JobPlan, program: type[SwitchProgram], run: RunSpec) -> dict[str, JobSpec]:
    index = node_indices(graph)
    return {
        w: JobSpec(job=plan.job, rank=rank, nworkers=len(plan.workers), slots=plan.slots,
                   elements=program.elements, node=index[w], first_hop=index[plan.first_hop[w]],
                   min_rto=run.min_rto, initial_rto=run.initial_rto, timeout=run.timeout, sparse=run.topk > 0,
                   band=run.band(plan.job))
        for rank, w in enumerate(plan.workers)
    }


def make_tensors(seed: int, job: int, rank: int, sizes: Sequence[int]) -> list[np.ndarray]:
    """Seeded gradients: per call, normal values with a per-worker magnitude."""
    rng = np.random.default_rng([seed, job, rank])
    return [(rng.standard_normal(n) * 10.0 ** rng.uniform(-3, 1)).astype(np.float32) for n in sizes]


def worker_tensors(seed: int, job: int, rank: int, sizes: Sequence[int], topk: float = 0.0,
                   layers: int = 1) -> list[np.ndarray]:
    """The seeded gradients, or with ``topk`` what top-k with error feedback per layer keeps of them."""
    tensors = make_tensors(seed, job, rank, sizes)
    return topk_with_feedback(tensors, topk, layers) if topk else tensors


def result_digest(results_int: Sequence[Sequence[np.ndarray]]) -> str:
    """sha256 of every worker's integer results: equal digests mean identical results."""
    digest = hashlib.sha256()
    for per_rank in results_int:
        for arr in per_rank:
            digest.update(np.asarray(arr, np.int64).tobytes())
    return digest.hexdigest()[:16]


def check(inputs: Sequence[Sequence[np.ndarray]], results_int: Sequence[Sequence[np.ndarray]],
          results: Sequence[Sequence[np.ndarray]]) -> tuple[bool, float]:
    """(every worker got the exact integer sum, max |float result - float64 sum|).

    ``inputs[rank][it]`` are the float gradients; ``results_int[rank][it]`` the
    integers each worker got back, ``results`` the floats.
    """
    nworkers = len(inputs)
    correct, max_err = True, 0.0
    for it in range(len(inputs[0])):
        q = max(fixedpoint.magnitude_exponent(inputs[r][it]) for r in range(nworkers))
        scale = fixedpoint.scale_for(q, nworkers)
        expected = np.sum([fixedpoint.quantize(inputs[r][it], scale).astype(np.int64) for r in range(nworkers)], axis=0)
        exact = np.sum([inputs[r][it].astype(np.float64) for r in range(nworkers)], axis=0)
        for r in range(nworkers):
            got = results_int[r][it] if it < len(results_int[r]) else None
            if got is None or got.shape != expected.shape or not np.array_equal(got, expected):
                correct = False
                continue
            if exact.size:
                max_err = max(max_err, float(np.max(np.abs(results[r][it].astype(np.float64) - exact))))
    return correct, max_err


def tally_drops(counters: Iterable[dict[str, int]], extra: dict[str, int]) -> dict[str, int]:
    """Every drop counter (``drop:``, ``bad:``, ``pbox:``) summed over nodes, plus the non-zero ``extra`` ones."""
    drops: dict[str, int] = {}
    for c in counters:
        for key, n in c.items():
            if key.startswith(("drop:", "bad:", "pbox:")):
                drops[key] = drops.get(key, 0) + n
    for key, n in extra.items():
        if n:
            drops[key] = drops.get(key, 0) + n
    return drops


@dataclass
class WorkerOutcome:
    """What one worker got, whichever backend ran it."""

    job: int
    rank: int
    ints: list[np.ndarray]
    floats: list[np.ndarray]
    started: list[float]
    finished: list[float]
    retransmissions: int
    error: str = ""
    compute_starts: list[float] = field(default_factory=list)  # with a workload: each iteration's
    staleness: list[int] = field(default_factory=list)  # consistency runs: the staleness of every read
    scale: int = 0  # consistency runs: the run's fixed-point scale


def training_outcome(worker: Any) -> WorkerOutcome:
    """A finished SSPWorker's outcome: its final parameters, iterations and the staleness it read."""
    final = [worker.final] if worker.done_at is not None else []
    floats = [fixedpoint.dequantize(worker.final, worker.scale)] if final and worker.scale is not None else []
    return WorkerOutcome(worker.spec.job, worker.spec.rank, final, floats, worker.started, worker.finished,
                         worker.retransmissions, str(worker.error) if worker.error else "", [], worker.staleness,
                         worker.scale or 0)


def outcome_of(proc: Any) -> WorkerOutcome:
    """A finished WorkerProcess's outcome (the fabric's, or a Mininet host's before it saves it)."""
    calls = proc.calls_in_order()  # by tensor: a P3 worker begins them in another order
    done = [c for c in calls if c.finished_at is not None]
    return WorkerOutcome(
        proc.spec.job, proc.spec.rank, [c.result_int for c in done], [c.result for c in done],
        [c.started_at if c.started_at is not None else float("nan") for c in calls],
        [c.finished_at if c.finished_at is not None else float("nan") for c in calls],
        sum(c.retransmissions for c in calls), str(proc.error) if proc.error else "", proc.compute_starts,
    )


def training_summary(run: RunSpec, workers: Sequence[WorkerOutcome]) -> dict[str, Any]:
    """A consistency run's verdict: every worker ends with the exact sum of every worker's gradients of every
    iteration (at the run's one scale); the staleness read, against the bound; iterations per second."""
    inputs = [run.tensors(w.job, w.rank) for w in workers]
    q = max(fixedpoint.magnitude_exponent(t) for per_rank in inputs for t in per_rank)
    scale = fixedpoint.scale_for(q, len(workers) * run.iterations)
    expected = np.sum([fixedpoint.quantize(t, scale).astype(np.int64) for per_rank in inputs for t in per_rank], axis=0)
    exact = np.sum([t.astype(np.float64) for per_rank in inputs for t in per_rank], axis=0)
    correct = all(w.scale == scale and len(w.ints) == 1 and np.array_equal(w.ints[0], expected) for w in workers)
    max_err = max((float(np.max(np.abs(w.floats[0].astype(np.float64) - exact))) for w in workers if w.floats), default=0.0)
    reads = [s for w in workers for s in w.staleness]
    spans = [w.finished[run.iterations - 1] - w.started[0] for w in workers if len(w.finished) > run.iterations - 1]
    ends = [w.finished[-1] for w in workers if w.finished]
    return {
        "correct": correct, "max_abs_error": max_err,
        "completion_s": max(ends) - min(w.started[0] for w in workers) if ends and len(ends) == len(workers) else float("nan"),
        "consistency": run.consistency, "staleness_bound": run.parameter_server().json_bound,
        "max_staleness": int(max(reads, default=0)), "mean_staleness": float(np.mean(reads)) if reads else 0.0,
        "iterations_per_s": float(np.mean([run.iterations / s for s in spans])) if spans else 0.0,
        "slowest_worker_iterations_per_s": min((run.iterations / s for s in spans), default=0.0),
    }


def job_summary(run: RunSpec, plan: JobPlan, outcome: str, workers: Sequence[WorkerOutcome]) -> dict[str, Any]:
    """One job's verdict: exact or not, its error, time, retransmissions, digest."""
    workers = sorted(workers, key=lambda w: w.rank)
    errors = sorted({w.error for w in workers if w.error})
    summary = training_summary(run, workers) if run.consistency else allreduce_summary(run, workers)
    return {
        **summary,
        "job": plan.job, "workers": list(plan.workers), "placement": plan.method, "outcome": outcome,
        "priority": run.band(plan.job),
        "correct": summary["correct"] and not errors and len(workers) == len(plan.workers),
        "retransmissions": sum(w.retransmissions for w in workers), "errors": errors,
        "result_digest": result_digest([w.ints for w in workers]),
    }


def allreduce_summary(run: RunSpec, workers: Sequence[WorkerOutcome]) -> dict[str, Any]:
    """All-reduce calls' verdict: every call's exact sum, the median call time and, with a workload,
    the training schedule's figures."""
    inputs = [run.tensors(w.job, w.rank) for w in workers]
    correct, max_err = check(inputs, [w.ints for w in workers], [w.floats for w in workers])
    times = []
    for it in range(len(inputs[0]) if inputs else 0):
        starts = [w.started[it] for w in workers if it < len(w.started)]
        ends = [w.finished[it] for w in workers if it < len(w.finished)]
        if len(ends) == len(workers) and not any(np.isnan(ends)) and starts:
            times.append(max(ends) - min(starts))
    training = run.training()
    stats: dict[str, float] = {}
    if training is not None and workers and all(not np.isnan(w.finished).any() for w in workers):
        per_worker = [iteration_stats(training, w.compute_starts, w.finished) for w in workers]
        stats = {k: max(p[k] for p in per_worker) for k in per_worker[0]} if per_worker[0] else {}
    return {**stats, "correct": correct, "max_abs_error": max_err,
            "completion_s": statistics.median(times) if times else float("nan")}


def run_record(graph: nx.Graph, run: RunSpec, rp: Any, backend: str, outcomes: Sequence[WorkerOutcome],
               link_bytes: dict[str, int], drops: dict[str, int], **extra: Any) -> dict[str, Any]:
    """A results-JSON run entry (names are stable; later additions go in ``extra``).

    With several jobs, ``jobs`` holds each one's verdict; the top-level fields
    are over all jobs (correct: all of them; completion: the slowest job's).
    """
    from innet.prediction import predicted_link_bytes

    jobs = [job_summary(run, plan, rp.outcomes[plan.job], [o for o in outcomes if o.job == plan.job])
            for plan in rp.plans]
    predicted: dict[str, int] = {}
    for plan in rp.plans:
        for size, calls in Counter(run.call_sizes()).items():
            for name, b in predicted_link_bytes(graph, run.mode, plan, size, rp.per_packet, calls).items():
                predicted[name] = predicted.get(name, 0) + b
    names = dict(enumerate(sorted(graph, key=natural_key)))
    for j in jobs:  # name the nodes an error mentions
        j["errors"] = [re.sub(r"node (\d+)", lambda m: names.get(int(m.group(1)), m.group(0)), e) for e in j["errors"]]
    busiest = max(sorted(link_bytes), key=lambda k: link_bytes[k], default="")
    methods = sorted({j["placement"] for j in jobs})
    return {
        "mode": run.mode, "backend": backend, "program": run.program,
        "placement": (methods[0] if len(methods) == 1 else "+".join(methods)) if run.mode == "innet" else run.mode,
        "workers": sum(len(p.workers) for p in rp.plans), "elements": run.elements, "packet_elements": rp.per_packet,
        "iterations": run.iterations, "seed": run.seed, "correct": all(j["correct"] for j in jobs),
        "max_abs_error": max(j["max_abs_error"] for j in jobs),
        "completion_s": max(j["completion_s"] for j in jobs),
        "link_bytes": dict(sorted(link_bytes.items(), key=lambda kv: natural_key(kv[0]))),
        "tier_bytes": tier_bytes(graph, link_bytes),
        "cross_rack_bytes": cross_rack_bytes(graph, link_bytes),
        "max_link_bytes": max(link_bytes.values(), default=0),
        "busiest_link": busiest,
        "predicted_link_bytes": predicted,
        "retransmissions": sum(j["retransmissions"] for j in jobs),
        "packets_dropped": sum(drops.values()),
        "drops": drops,
        "fallbacks": sum(1 for j in jobs if j["outcome"].startswith("fallback")),
        "errors": [e for j in jobs for e in j["errors"]],
        "result_digest": hashlib.sha256("".join(j["result_digest"] for j in jobs).encode()).hexdigest()[:16]
        if len(jobs) > 1 else jobs[0]["result_digest"],
        "jobs": jobs,
        **({"consistency": run.consistency, "staleness_bound": run.parameter_server().json_bound,
            **{k: max(j[k] for j in jobs) for k in ("max_staleness", "mean_staleness", "iterations_per_s")},
            "slowest_worker_iterations_per_s": min(j["slowest_worker_iterations_per_s"] for j in jobs)}
           if run.consistency else {}),
        **({"topk": run.topk, "bytes_vs_dense": round(sum(link_bytes.values()) / max(1, sum(predicted.values())), 4)}
           if run.topk else {}),
        **({"workload": run.workload, "workload_scale": run.workload_scale, "pipeline": run.pipeline,
            "slice_elements": run.slice_elements, "priority": run.priority,
            **{k: max(j[k] for j in jobs) for k in ("iteration_s", "compute_s", "comm_wait_s", "next_forward_wait_s")
               if k in jobs[0]}}
           if run.workload else {}),
        **extra,
    }
