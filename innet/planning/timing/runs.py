"""A run's figures from the model: each call's time, a workload's schedule (see innet.planning.timing)."""

from __future__ import annotations

from dataclasses import replace

import networkx as nx

from innet.hosts.training import Training, iteration_stats, p3_order, run_schedule
from innet.planning.planner import JobPlan
from innet.planning.prediction import frame_bytes, link_rate, one_way, path_links
from innet.planning.spec import LOCAL_MIN_RTO, RunSpec
from innet.planning.timing.calls import call_time
from innet.planning.timing.consistency import consistency_time
from innet.planning.timing.kvstore import BIGARRAY_BOUND, period
from innet.planning.timing.loss import lossy_time
from innet.wire.collectives import Collective


def call_times(graph: nx.Graph, run: RunSpec, plans: list[JobPlan], per_packet: int, hop: float) -> list[float]:
    """The model's time of each call of a worker (FIFO order), for the slowest job; under loss (``--loss``, a
    link's ``loss=``), an all-reduce's expected time (``lossy_time``)."""
    calls = run.calls()
    def delay(u: str, v: str) -> float:
        return run.faults_on(u, v).delay

    def loss(u: str, v: str) -> float:
        return run.faults_on(u, v).loss

    lossy = any(loss(u, v) or loss(v, u) for u, v in graph.edges)
    known: dict[tuple[int, int, Collective], float] = {}

    def time(plan: JobPlan, n: int, collective: Collective) -> float:
        if (id(plan), n, collective) not in known:
            t = call_time(graph, run.mode, plan, n, per_packet, hop, delay, run.topk or 1.0, plans, collective, run.root)
            if lossy and run.mode in ("innet", "pbox", "ring") and collective.name == "allreduce":
                t = lossy_time(graph, run.mode, plan, n, per_packet, t, loss, LOCAL_MIN_RTO if hop else run.min_rto)
            known[id(plan), n, collective] = t
        return known[id(plan), n, collective]

    slowest = max(plans, key=lambda p: time(p, *max(calls, key=lambda c: c[0])))
    return [time(slowest, n, c) for n, c in calls]



def planned_training(graph: nx.Graph, run: RunSpec, plans: list[JobPlan], per_packet: int) -> Training | None:
    """The run's training schedule; with ``--priority p3``, with P3's send order planned from the model's
    call times (every worker must send the same call at once, so they follow one plan, not their clocks)."""
    training = run.training()
    if training is None or run.priority != "p3":
        return training
    return replace(training, order=p3_order(training, call_times(graph, run, plans, per_packet, 0.0)[: training.layers]))



def predict(graph: nx.Graph, run: RunSpec, plans: list[JobPlan], per_packet: int, hop: float) -> dict[str, float]:
    """The model's figures for a run: per-call time (``completion_s``) and, with a workload,
    ``iteration_s``, ``compute_s``, ``comm_wait_s`` and ``next_forward_wait_s``. Jobs call at once, sharing links."""
    if run.consistency:  # a training loop against the PBox, not all-reduce calls
        def delay(u: str, v: str) -> float:
            return run.faults_on(u, v).delay

        return {"completion_s": max(consistency_time(graph, run, p, per_packet, hop, delay) for p in plans)}
    durations = call_times(graph, run, plans, per_packet, hop)
    out: dict[str, float] = {"completion_s": sorted(durations)[len(durations) // 2]}
    training = planned_training(graph, run, plans, per_packet)
    if training is not None:
        starts, ends = run_schedule(training, durations)
        out.update(iteration_stats(training, starts, ends))
    if run.ps and training is not None:
        out["ps_iteration_s"] = ps_period(graph, run, plans, per_packet, hop, training)
    return out


def ps_period(graph: nx.Graph, run: RunSpec, plans: list[JobPlan], per_packet: int, hop: float, training: Training) -> float:
    """``--ps``: the steady-state iteration of the run's workload on parameter servers beside its workers
    (innet.planning.timing.kvstore, model only), each at its slowest host link's rate, each request costing
    the longest round trip of a header-only frame between two of them."""
    workers = sorted({w for plan in plans for w in plan.workers})
    rate = min(link_rate(graph, w, next(iter(graph[w]))) for w in workers)
    bound = max(1, round(BIGARRAY_BOUND * run.workload_scale))

    def delay(u: str, v: str) -> float:
        return run.faults_on(u, v).delay

    request = max((one_way(graph, path_links(graph, a, b), frame_bytes(0), hop, delay)
                   + one_way(graph, path_links(graph, b, a), frame_bytes(0), hop, delay)
                   for a in workers for b in workers if a != b), default=0.0)
    return period(training, run.call_sizes()[: training.layers], len(workers), rate, per_packet, run.ps, bound, request)
