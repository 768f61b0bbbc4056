"""``--backend local``: run an experiment on the in-process fabric."""

from __future__ import annotations

from typing import Any

import networkx as nx

from innet.experiment import RunSpec, check, completion, make_tensors, pick_workers, result_digest, run_record, switch_configs, worker_specs
from innet.fabric import Fabric
from innet.planner import plan_job
from innet.programs import load_program
from innet.runtime import SwitchRuntime
from innet.worker import WorkerProcess


def run_local(graph: nx.Graph, run: RunSpec) -> dict[str, Any]:
    program = load_program(run.program)
    workers = pick_workers(graph, run.workers)
    plan = plan_job(graph, workers, method=run.placement, slots=program.slots)
    fabric = Fabric(graph, faults=run.faults, seed=run.seed)
    runtimes = {name: SwitchRuntime(cfg, program) for name, cfg in switch_configs(graph, [plan], run.switch_memory).items()}
    for name, rt in runtimes.items():
        fabric.add_switch(name, rt)
    inputs, procs = [], []
    for w, spec in worker_specs(graph, plan, program, run).items():
        tensors = make_tensors(run.seed, plan.job, spec.rank, run.iterations, run.elements)
        proc = WorkerProcess(spec, tensors)
        fabric.attach(w, proc)
        inputs.append(tensors)
        procs.append(proc)
    fabric.run()
    errors = [p.error for p in procs if p.error is not None]
    ints = [[c.result_int for c in p.calls if c.finished_at is not None] for p in procs]
    correct, max_err = check(inputs, ints, [[c.result for c in p.calls if c.finished_at is not None] for p in procs])
    drops: dict[str, int] = {}
    for rt in runtimes.values():
        for key, n in rt.ctx.counters.items():
            if key.startswith(("drop:", "bad:")):
                drops[key] = drops.get(key, 0) + n
    lost = sum(link.injector.lost for link in fabric.links.values())
    if lost:
        drops["link:lost"] = lost
    return run_record(
        graph, run, "local", len(workers), correct and not errors, max_err,
        completion([p.calls for p in procs]), fabric.link_bytes(),
        sum(c.retransmissions for p in procs for c in p.calls), drops,
        errors=[str(e) for e in errors], result_digest=result_digest(ints),
        switch_memory_bytes={n: rt.memory_bytes for n, rt in runtimes.items()},
    )
