"""One experiment, backend-independent parts: configs, gradients, checking, results.

``switch_configs`` turns a topology and job plans into what each switch's
control channel installs; ``make_tensors`` draws the seeded gradients every
backend uses; ``check`` compares what workers got with the exact integer sum.
"""

from __future__ import annotations

import hashlib
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import networkx as nx
import numpy as np

from innet import fixedpoint
from innet.faults import FaultSpec
from innet.graph import hosts, natural_key, node_indices, ports, role, routes, switches
from innet.metrics import cross_rack_bytes, tier_bytes
from innet.planner import JobPlan
from innet.program import SwitchProgram
from innet.runtime import DEFAULT_SWITCH_MEMORY, SwitchConfig
from innet.worker import AllreduceCall, JobSpec


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
    timeout: float = 10.0


def pick_workers(graph: nx.Graph, count: int | None) -> list[str]:
    from innet.errors import UserError

    available = hosts(graph)
    if count is None:
        return available
    if count < 1:
        raise UserError(f"--workers must be at least 1, got {count}")
    if count > len(available):
        raise UserError(f"--workers {count} is more than the {len(available)} hosts of this topology")
    return available[:count]


def switch_configs(graph: nx.Graph, plans: Sequence[JobPlan], memory: int = DEFAULT_SWITCH_MEMORY) -> dict[str, SwitchConfig]:
    index = node_indices(graph)
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
            jobs={plan.job: plan.switch_ports[sw] for plan in plans if sw in plan.switch_ports},
            memory_bytes=memory,
        )
    return configs


def worker_specs(graph: nx.Graph, plan: JobPlan, program: type[SwitchProgram], run: RunSpec) -> dict[str, JobSpec]:
    index = node_indices(graph)
    return {
        w: JobSpec(job=plan.job, rank=rank, nworkers=len(plan.workers), slots=plan.slots,
                   elements=program.elements, node=index[w], first_hop=index[plan.first_hop[w]],
                   min_rto=run.min_rto, timeout=run.timeout)
        for rank, w in enumerate(plan.workers)
    }


def make_tensors(seed: int, job: int, rank: int, iterations: int, elements: int) -> list[np.ndarray]:
    """Seeded gradients: per iteration, normal values with a per-worker magnitude."""
    rng = np.random.default_rng([seed, job, rank])
    return [(rng.standard_normal(elements) * 10.0 ** rng.uniform(-3, 1)).astype(np.float32)
            for _ in range(iterations)]


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


def completion(calls_by_rank: Sequence[Sequence[AllreduceCall]]) -> float:
    """Median over iterations of (last worker's result - first packet sent)."""
    times = []
    for it in range(min(len(c) for c in calls_by_rank)):
        ends = [c[it].finished_at for c in calls_by_rank]
        starts = [c[it].started_at for c in calls_by_rank]
        if all(t is not None for t in ends + starts):
            times.append(max(t for t in ends if t is not None) - min(t for t in starts if t is not None))
    return statistics.median(times) if times else float("nan")


def run_record(graph: nx.Graph, run: RunSpec, plan: JobPlan, per_packet: int, backend: str, correct: bool,
               max_err: float, completion_s: float, link_bytes: dict[str, int], retransmissions: int,
               drops: dict[str, int], **extra: Any) -> dict[str, Any]:
    """A results-JSON run entry (names are stable; later additions go in ``extra``)."""
    from innet.prediction import predicted_link_bytes

    busiest = max(sorted(link_bytes), key=lambda k: link_bytes[k], default="")
    return {
        "mode": run.mode, "backend": backend, "program": run.program,
        "placement": plan.method if run.mode == "innet" else run.mode,
        "workers": len(plan.workers), "elements": run.elements, "iterations": run.iterations, "seed": run.seed,
        "correct": bool(correct), "max_abs_error": max_err, "completion_s": completion_s,
        "link_bytes": dict(sorted(link_bytes.items(), key=lambda kv: natural_key(kv[0]))),
        "tier_bytes": tier_bytes(graph, link_bytes),
        "cross_rack_bytes": cross_rack_bytes(graph, link_bytes),
        "max_link_bytes": max(link_bytes.values(), default=0),
        "busiest_link": busiest,
        "predicted_link_bytes": predicted_link_bytes(graph, run.mode, plan, run.elements, per_packet, run.iterations),
        "retransmissions": retransmissions,
        "packets_dropped": sum(drops.values()),
        "drops": drops,
        **extra,
    }
