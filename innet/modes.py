"""The three ways to all-reduce, as plans and host endpoints both backends run.

- ``innet``: switches aggregate, where the placement method says;
- ``pbox``: every worker sends to the PBox host, which aggregates (PHub);
- ``ring``: reduce-scatter then all-gather between the workers (Horovod).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import networkx as nx

from innet.errors import UserError
from innet.experiment import RunSpec, worker_specs
from innet.graph import node_indices
from innet.pbox import PBoxJob, PBoxServer
from innet.planner import JobPlan, plan_job
from innet.program import SwitchProgram
from innet.ring import RingCall
from innet.worker import AllreduceCall, JobSpec, WorkerProcess

MODES = ("innet", "pbox", "ring")


def make_plan(graph: nx.Graph, run: RunSpec, workers: list[str], program: type[SwitchProgram]) -> JobPlan:
    if run.mode not in MODES:
        raise UserError(f"unknown mode {run.mode!r}; expected one of {', '.join(MODES)}")
    if run.mode == "pbox" or (run.mode == "innet" and run.placement == "pbox"):
        return plan_job(graph, workers, method="pbox", slots=program.slots or 128)
    # ring: the plan only fixes ranks and first hops; switches just route
    method = "tor" if run.mode == "ring" else run.placement
    return plan_job(graph, workers, method=method, slots=program.slots or 128)


def installed_plans(run: RunSpec, plan: JobPlan) -> list[JobPlan]:
    """The plans switches are told about: none when switches only route."""
    return [plan] if run.mode == "innet" and plan.method != "pbox" else []


def job_specs(graph: nx.Graph, run: RunSpec, plan: JobPlan, program: type[SwitchProgram]) -> dict[str, JobSpec]:
    specs = worker_specs(graph, plan, program, run)
    if plan.method == "pbox" and run.mode != "ring":
        pbox = node_indices(graph)[plan.pbox] if plan.pbox is not None else None
        specs = {w: _with(s, pbox=pbox) for w, s in specs.items()}
    return specs


def _with(spec: JobSpec, **kw: Any) -> JobSpec:
    from dataclasses import replace

    return replace(spec, **kw)


def worker_process(mode: str, spec: JobSpec, ring: list[int], tensors: list[Any]) -> WorkerProcess:
    """The endpoint a worker host runs for ``mode``."""
    if mode == "ring":
        return WorkerProcess(spec, tensors, partial(_ring_call, ring))
    return WorkerProcess(spec, tensors, AllreduceCall)


def _ring_call(ring: list[int], spec: JobSpec, tensor: Any, first: int) -> RingCall:
    return RingCall(spec, ring, tensor, first)


def pbox_servers(graph: nx.Graph, run: RunSpec, plan: JobPlan, specs: dict[str, JobSpec], cores: int) -> list[PBoxServer]:
    """The PBox shards (one per core) when the plan sends the job to the PBox."""
    if plan.method != "pbox" or run.mode == "ring" or plan.pbox is None:
        return []
    index = node_indices(graph)
    first = next(iter(specs.values()))
    job = PBoxJob(plan.job, {s.rank: s.node for s in specs.values()}, first.slots, first.elements)
    return [PBoxServer(index[plan.pbox], [job], cores, core) for core in range(cores)]
