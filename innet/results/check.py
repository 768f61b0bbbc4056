"""What a run achieved: each worker's outcome checked against the exact reduction, and the run record."""

from __future__ import annotations

import hashlib
import math
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Protocol

import networkx as nx
import numpy as np

from innet.graph import natural_key
from innet.hosts.training import iteration_stats, warmup
from innet.planning.planner import JobPlan
from innet.planning.spec import RunSpec, program_of
from innet.results.learning import training_figures
from innet.results.metrics import busiest_link, cross_rack_bytes, tier_bytes, up_and_down
from innet.results.outcome import WorkerOutcome
from innet.results.record import CallSpan, JobRecord, RunRecord, SlotTrack, Timeline
from innet.switch.runtime import SwitchReport
from innet.wire import fixedpoint
from innet.wire.collectives import ALLREDUCE, Collective
from innet.wire.operators import SUM, Operator


def result_digest(results_int: Sequence[Sequence[np.ndarray]]) -> str:
    """sha256 of every worker's integer results: equal digests mean identical results."""
    digest = hashlib.sha256()
    for per_rank in results_int:
        for arr in per_rank:
            digest.update(np.asarray(arr, np.int64).tobytes())
    return digest.hexdigest()[:16]


def check(inputs: Sequence[Sequence[np.ndarray]], results_int: Sequence[Sequence[np.ndarray]],
          results: Sequence[Sequence[np.ndarray]], operator: Operator = SUM,
          collective: Collective | Sequence[Collective] = ALLREDUCE, root: int = 0, unit: int = 1) -> tuple[bool, float, str]:
    """(every worker got the exact reduction, max |result - exact float reduction|, the first difference).

    ``inputs[rank][it]`` are the float gradients (int32 bit sets for a bit operator); ``results_int[rank][it]``
    the integers each worker got back, ``results`` the floats. The reference is the operator's numpy
    reduction of the values the workers put on the wire, at the scale they agreed on; of it, each rank
    must hold what ``collective`` leaves it (its shard, the whole, or nothing; shards of ``unit`` packets), or
    with one collective per call (a sharded schedule), what call ``it``'s leaves it.
    """
    nworkers, calls = len(inputs), len(inputs[0]) if inputs else 0
    of = [collective] * calls if isinstance(collective, Collective) else list(collective)
    inputs = [[of[it].streams([t], r, nworkers, root, unit, operator)[0] for it, t in enumerate(inputs[r])]
              for r in range(nworkers)]
    correct, max_err, first = True, 0.0, ""
    for it in range(calls):
        q = max(operator.exponent(inputs[r][it]) for r in range(nworkers))
        scale = operator.scale(q, nworkers)
        expected = operator.reduce(operator.quantize(inputs[r][it], scale) for r in range(nworkers))
        exact = operator.reduce(inputs[r][it] for r in range(nworkers))
        for r in range(nworkers):
            got = results_int[r][it] if it < len(results_int[r]) else None
            expected_r, exact_r = (of[it].kept(a, r, nworkers, root, unit) for a in (expected, exact))
            if got is None or got.shape != expected_r.shape or not np.array_equal(got, expected_r):
                if correct:
                    first = _difference(r, it, got, expected_r)
                correct = False
                continue
            if exact_r.size and operator.rule != "bits":
                max_err = max(max_err, float(np.max(np.abs(results[r][it].astype(np.float64) - exact_r))))
    return correct, max_err, first


def _difference(rank: int, call: int, got: np.ndarray | None, expected: np.ndarray) -> str:
    where = f"rank {rank} call {call}"
    if got is None:
        return f"{where}: no result"
    if got.shape != expected.shape:
        return f"{where}: {got.size} values, expected {expected.size}"
    k = int(np.flatnonzero(got != expected)[0])
    return f"{where}: element {k} is {int(got[k])}, expected {int(expected[k])}"


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


Figure = str | int | float | None  # one of a job's own figures in results.json


@dataclass(frozen=True)
class JobSummary:
    """A job's verdict before it is a record: exact or not, its error and time, and its own figures."""

    correct: bool
    max_abs_error: float
    completion_s: float
    figures: dict[str, Figure]


def training_summary(run: RunSpec, workers: Sequence[WorkerOutcome]) -> JobSummary:
    """A consistency run's verdict: every worker ends with the exact sum of every worker's gradients of every
    iteration (at the run's one scale); the staleness read, against the bound; iterations per second."""
    inputs = [w.inputs or run.tensors(w.job, w.rank) for w in workers]
    if run.train:  # the workers agreed on a bound their learners clipped to, not on their gradients' peak
        scale = workers[0].scale
    else:
        q = max(fixedpoint.magnitude_exponent(t) for per_rank in inputs for t in per_rank)
        scale = fixedpoint.scale_for(q, len(workers) * run.iterations)
    expected = np.sum([fixedpoint.quantize(t, scale).astype(np.int64) for per_rank in inputs for t in per_rank], axis=0)
    exact = np.sum([t.astype(np.float64) for per_rank in inputs for t in per_rank], axis=0)
    correct = all(w.scale == scale and len(w.ints) == 1 and np.array_equal(w.ints[0], expected) for w in workers)
    max_err = max((float(np.max(np.abs(w.floats[0].astype(np.float64) - exact))) for w in workers if w.floats), default=0.0)
    reads = [s for w in workers for s in w.staleness]
    spans = [w.finished[run.iterations - 1] - w.started[0] for w in workers if len(w.finished) > run.iterations - 1]
    ends = [w.finished[-1] for w in workers if w.finished]
    return JobSummary(correct, max_err, max(ends) - min(w.started[0] for w in workers)
                      if ends and len(ends) == len(workers) else float("nan"), {
        "consistency": run.consistency, "staleness_bound": run.parameter_server().json_bound,
        "max_staleness": int(max(reads, default=0)), "mean_staleness": float(np.mean(reads)) if reads else 0.0,
        "iterations_per_s": float(np.mean([run.iterations / s for s in spans])) if spans else 0.0,
        "slowest_worker_iterations_per_s": min((run.iterations / s for s in spans), default=0.0),
    })


def job_summary(run: RunSpec, plan: JobPlan, outcome: str, workers: Sequence[WorkerOutcome]) -> JobRecord:
    """One job's verdict: exact or not, its error, time, retransmissions, digest."""
    workers = sorted(workers, key=lambda w: w.rank)
    errors = sorted({w.error for w in workers if w.error})
    summary = training_summary(run, workers) if run.consistency else allreduce_summary(run, workers)
    if summary.figures.get("first_difference") and not errors:  # wrong without any error: say where
        errors = [f"job {plan.job}: result differs from {run.operator.name} of the inputs: {summary.figures['first_difference']}"]
    return JobRecord(
        job=plan.job, workers=tuple(plan.workers), placement=plan.method, outcome=outcome, priority=run.band(plan.job),
        correct=summary.correct and not errors and len(workers) == len(plan.workers),
        max_abs_error=summary.max_abs_error, completion_s=summary.completion_s,
        retransmissions=sum(w.retransmissions for w in workers), errors=tuple(errors),
        result_digest=result_digest([w.ints for w in workers]), figures=summary.figures,
        spurious_retransmissions=sum(w.spurious for w in workers), host_queued=sum(w.host_queued for w in workers),
    )


def allreduce_summary(run: RunSpec, workers: Sequence[WorkerOutcome]) -> JobSummary:
    """All-reduce calls' verdict: every call's exact sum, the median call time and, with a workload,
    the training schedule's figures."""
    inputs = [w.inputs or run.tensors(w.job, w.rank) for w in workers]
    correct, max_err, first = check(inputs, [w.ints for w in workers], [w.floats for w in workers], run.operator,
                                    run.call_collectives(), run.root, program_of(run).elements)
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
    return JobSummary(correct, max_err, statistics.median(times) if times else float("nan"),
                      {**stats, "first_difference": first})


class Planned(Protocol):
    """What a run record needs of the run's plan (innet.schemes.modes.RunPlan, a layer above)."""

    @property
    def plans(self) -> Sequence[JobPlan]: ...
    @property
    def outcomes(self) -> Mapping[int, str]: ...
    @property
    def per_packet(self) -> int: ...


def background_model(graph: nx.Graph, run: RunSpec, rp: Planned) -> dict[str, float]:
    """``background_model_s``: the timing model's completion beside the run's background traffic (none: at link
    rate or the window's pace) for a plain switch all-reduce, every job's frames through the same queues, the
    slowest job's (innet.planning.dynamic). None beside an elastic background: the model's background is open-loop,
    in the job's FIFO."""
    from innet.hosts.background import BACKGROUND_BAND, FRAME_BYTES, background_flows, first_frames, lead_s
    from innet.planning.dynamic import background_model_s
    from innet.planning.prediction import frame_bytes as wire_bytes
    from innet.planning.timing.trees import Choices

    if run.mode != "innet" or run.collective != "allreduce" or run.workload or run.train or run.consistency or run.topk \
            or run.background.elastic or any(p.method == "pbox" for p in rp.plans):
        return {}
    got = background_flows(graph, run.background, run.seed)
    flows = [(f.src, f.dst, f.bps) for f in got]
    program = program_of(run)
    frame, choices = program.frame_bytes(rp.per_packet), Choices.of(program)
    if choices is None and any(p.method == "dynamic" for p in rp.plans):
        return {}
    chunks, short = -(-run.elements // rp.per_packet), run.elements % rp.per_packet  # a call's: all alike here
    figure = background_model_s(graph, rp.plans, flows, chunks, frame, [run.band(p.job) for p in rp.plans],
                                BACKGROUND_BAND, lead_s(got), FRAME_BYTES, wire_bytes(0),
                                first_frames(graph, got, run.seed), choices, program.frame_bytes(short) if short else 0,
                                len(run.call_sizes()))
    return {"background_model_s": round(figure, 6)}


def run_record(graph: nx.Graph, run: RunSpec, rp: Planned, backend: str, outcomes: Sequence[WorkerOutcome],
               link_bytes: dict[str, int], drops: dict[str, int], **extra: object) -> RunRecord:
    """A run's record (``extra``: the backend's own figures); a backend that counts each link direction adds
    them with ``with_directions``.

    With several jobs, ``jobs`` holds each one's verdict; the top-level fields
    are over all jobs (correct: all of them; completion: the slowest job's).
    """
    from innet.planning.prediction import run_direction_bytes, run_link_bytes

    names = dict(enumerate(sorted(graph, key=natural_key)))
    jobs = []
    for plan in rp.plans:
        job = job_summary(run, plan, rp.outcomes[plan.job], [o for o in outcomes if o.job == plan.job])
        jobs.append(replace(job, errors=tuple(re.sub(r"node (\d+)", lambda m: names.get(int(m.group(1)), m.group(0)), e)
                                              for e in job.errors)))  # name the nodes an error mentions
    def predict(density: float) -> dict[str, int]:
        return run_link_bytes(graph, run.mode, rp.plans, rp.per_packet, run.calls(), density, run.root)

    density = run.topk if run.topk and run.mode != "ring" else 1.0  # top-k: expected bytes
    predicted = predict(density)
    predicted_up, predicted_down = up_and_down(graph, run_direction_bytes(
        graph, run.mode, rp.plans, rp.per_packet, run.calls(), density, run.root))
    dense = predict(1.0) if run.topk else predicted
    busiest = busiest_link(graph, link_bytes)
    methods = sorted({j.placement for j in jobs})
    return RunRecord(
        mode=run.mode, backend=backend, program=run.program,
        placement=(methods[0] if len(methods) == 1 else "+".join(methods)) if run.mode == "innet" else run.mode,
        workers=sum(len(p.workers) for p in rp.plans), elements=run.elements, packet_elements=rp.per_packet,
        iterations=run.iterations, seed=run.seed, correct=all(j.correct for j in jobs),
        max_abs_error=max(j.max_abs_error for j in jobs), completion_s=max(j.completion_s for j in jobs),
        link_bytes=dict(sorted(link_bytes.items(), key=lambda kv: natural_key(kv[0]))),
        tier_bytes=tier_bytes(graph, link_bytes), cross_rack_bytes=cross_rack_bytes(graph, link_bytes),
        max_link_bytes=link_bytes.get(busiest, 0), busiest_link=busiest, predicted_link_bytes=predicted,
        predicted_link_bytes_up=predicted_up, predicted_link_bytes_down=predicted_down,
        retransmissions=sum(j.retransmissions for j in jobs),
        spurious_retransmissions=sum(j.spurious_retransmissions for j in jobs), host_queued=sum(j.host_queued for j in jobs),
        packets_dropped=sum(drops.values()), drops=drops,
        fallbacks=sum(1 for j in jobs if j.outcome.startswith("fallback")),
        errors=tuple(e for j in jobs for e in j.errors),
        result_digest=hashlib.sha256("".join(j.result_digest for j in jobs).encode()).hexdigest()[:16]
        if len(jobs) > 1 else jobs[0].result_digest,
        jobs=tuple(jobs),
        figures=run_figures(graph, run, rp, jobs, outcomes, link_bytes, dense, extra),
    )


def run_figures(graph: nx.Graph, run: RunSpec, rp: Planned, jobs: Sequence[JobRecord],
                outcomes: Sequence[WorkerOutcome], link_bytes: Mapping[str, int], dense: Mapping[str, int],
                extra: Mapping[str, object]) -> dict[str, object]:
    """A run record's ``figures``: what its options add (consistency, top-k, workload, training, background),
    each over its jobs, then the backend's own (``extra``)."""
    figures = lambda k: [j.figures[k] for j in jobs]  # noqa: E731
    return {
        **({"consistency": run.consistency, "staleness_bound": run.parameter_server().json_bound,
            **{k: max(figures(k)) for k in ("max_staleness", "mean_staleness", "iterations_per_s")},
            "slowest_worker_iterations_per_s": min(figures("slowest_worker_iterations_per_s"))}
           if run.consistency else {}),
        **({"topk": run.topk, "bytes_vs_dense": round(sum(link_bytes.values()) / max(1, sum(dense.values())), 4)}
           if run.topk else {}),
        **({"workload": run.workload, "workload_scale": run.workload_scale, "pipeline": run.pipeline,
            "slice_elements": run.slice_elements, "priority": run.priority, "sharded": run.sharded,
            "warmup_iterations": warmup(run.iterations),  # left out of iteration_s and its kin (steady state)
            **{k: max(figures(k)) for k in ("iteration_s", "compute_s", "comm_wait_s", "next_forward_wait_s")
               if k in jobs[0].figures}}
           if run.workload else {}),
        **(asdict(training_figures(run, outcomes)) if run.train else {}),
        **background_model(graph, run, rp),
        **extra,
    }


def with_directions(record: RunRecord, graph: nx.Graph, directions: Mapping[tuple[str, str], int]) -> RunRecord:
    """``record`` with the bytes measured on each link direction (from, to): ``link_bytes_up`` and ``_down``."""
    up, down = up_and_down(graph, directions)
    return replace(record, link_bytes_up=up, link_bytes_down=down)


def timeline_of(run: RunSpec, workers: Mapping[tuple[int, int], str], outcomes: Sequence[WorkerOutcome],
                reports: Mapping[str, SwitchReport], origin: float = 0.0, clock: float = 1.0) -> Timeline:
    """``run``'s timeline from its workers' outcomes (``workers``: (job, rank) -> host; times on the run's
    timeline) and its switches' reports (times on their clocks, ``clock`` seconds per second of the run's),
    both from ``origin`` on."""
    names, sizes = [c.name for c in run.call_collectives()], run.call_sizes()
    if run.consistency:  # a parameter server's iterations (push, then pull), not collectives
        names = []
    calls = []
    for o in sorted(outcomes, key=lambda o: (o.job, o.rank)):
        for k, (start, end) in enumerate(zip(o.started, o.finished, strict=False)):
            if math.isfinite(start) and math.isfinite(end):  # a call never finished has no slice
                calls.append(CallSpan(o.job, o.rank, workers.get((o.job, o.rank), ""), k,
                                      names[k] if k < len(names) else "iteration", sizes[k] if k < len(sizes) else 0,
                                      start - origin, end - origin))
    switches = [SlotTrack(name, r.slots, tuple((t / clock - origin, n) for t, n in r.slots_held))
                for name, r in reports.items() if r.slots]
    return Timeline(tuple(calls), tuple(switches))
