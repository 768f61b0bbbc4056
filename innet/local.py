"""``--backend local``: run an experiment on the in-process fabric."""

from __future__ import annotations

from typing import Any

import networkx as nx

from innet.experiment import RunSpec, check, completion, make_tensors, pick_workers, result_digest, run_record, switch_configs
from innet.fabric import Fabric
from innet.graph import node_indices
from innet.modes import installed_plans, job_specs, make_plan, pbox_servers, worker_process
from innet.programs import load_program
from innet.runtime import SwitchRuntime


def run_local(graph: nx.Graph, run: RunSpec, pbox_cores: int = 1) -> dict[str, Any]:
    program = load_program(run.program)
    workers = pick_workers(graph, run.workers)
    plan = make_plan(graph, run, workers, program)
    fabric = Fabric(graph, faults=run.faults, seed=run.seed)
    configs = switch_configs(graph, installed_plans(run, plan), run.switch_memory)
    runtimes = {name: SwitchRuntime(cfg, program) for name, cfg in configs.items()}
    for name, rt in runtimes.items():
        fabric.add_switch(name, rt)
    specs = job_specs(graph, run, plan, program)
    servers = pbox_servers(graph, run, plan, specs, pbox_cores)
    for server in servers:
        fabric.attach(str(plan.pbox), server)
    index = node_indices(graph)
    ring = [index[w] for w in plan.workers]
    inputs, procs = [], []
    for w, spec in specs.items():
        tensors = make_tensors(run.seed, plan.job, spec.rank, run.iterations, run.elements)
        proc = worker_process(run.mode, spec, ring, tensors)
        fabric.attach(w, proc)
        inputs.append(tensors)
        procs.append(proc)
    fabric.run()
    errors = [p.error for p in procs if p.error is not None]
    ints = [[c.result_int for c in p.calls if c.finished_at is not None] for p in procs]
    floats = [[c.result for c in p.calls if c.finished_at is not None] for p in procs]
    correct, max_err = check(inputs, ints, floats)
    drops: dict[str, int] = {}
    for counters in [rt.ctx.counters for rt in runtimes.values()] + [s.counters for s in servers]:
        for key, n in counters.items():
            if key.startswith(("drop:", "bad:")) or not key.startswith(("fallback", "started")):
                key = key if ":" in key else "pbox:" + key
                drops[key] = drops.get(key, 0) + n
    lost = sum(link.injector.lost for link in fabric.links.values())
    if lost:
        drops["link:lost"] = lost
    return run_record(
        graph, run, plan, specs[plan.workers[0]].elements, "local", correct and not errors, max_err,
        completion([p.calls for p in procs]), fabric.link_bytes(),
        sum(c.retransmissions for p in procs for c in p.calls), drops,
        errors=[str(e) for e in errors], result_digest=result_digest(ints),
        switch_memory_bytes={n: rt.memory_bytes for n, rt in runtimes.items()},
    )
