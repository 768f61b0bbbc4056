"""``run_topology.py --plan-only``: the plan as text, before anything starts."""

from __future__ import annotations

from dataclasses import replace

import networkx as nx

from innet.graph import link_name, natural_key
from innet.planning.planner import JobPlan
from innet.planning.prediction import direction_bytes, predicted_link_bytes, tier_lower_bounds
from innet.planning.spec import RunSpec, program_of
from innet.planning.timing import MININET_HOP, busiest_direction, predict
from innet.results.metrics import cross_rack_bytes, tier_bytes
from innet.results.record import RunRecord
from innet.schemes.modes import RunPlan, plan_run


def _job_lines(run: RunSpec, plan: JobPlan, outcome: str) -> list[str]:
    lines = [f"job {plan.job}: {len(plan.workers)} workers ({', '.join(plan.workers)}); {outcome}"]
    if run.mode == "innet" and plan.method != "pbox":
        lines.append(f"  root {plan.root}; aggregating: {', '.join(plan.aggregators)}; slots per switch: {plan.slots}")
        for switch, jp in sorted(plan.switch_ports.items(), key=lambda kv: natural_key(kv[0])):
            role = "aggregates" if jp.aggregate else "relays"
            base = f", slots {jp.slot_base}..{jp.slot_base + jp.slots - 1}" if jp.aggregate else ""
            lines.append(f"  {switch} -> {plan.parents.get(switch, '(root)')}: {role} {', '.join(plan.children(switch))}{base}")
    elif run.mode == "ring":
        lines.append(f"  ring order: {' -> '.join(plan.workers)} -> {plan.workers[0]}")
    elif plan.layout == "rack":
        boxes = ", ".join(dict.fromkeys(plan.servers))
        lines.append(f"  every worker sends to its rack's PBox ({boxes}), which sends its rack's sums to PBox {plan.pbox}")
    elif plan.layout == "sharded":
        lines.append(f"  every worker sends key (slot) k to server k % {len(plan.servers)} of {', '.join(plan.servers)}")
    else:
        lines.append(f"  every worker sends to PBox {plan.pbox}")
    return lines


def plan_report(graph: nx.Graph, run: RunSpec, rp: RunPlan | None = None) -> str:
    """The plan ``--plan-only`` prints; ``rp``: ``plan_run``'s for this graph and run when the caller has it
    (planning a k=32 fat-tree twice took seconds). What a run would refuse (registers that do not fit), the plan
    refuses too: ``innet.plan`` prepares it first (innet.api.prepare)."""
    rp = rp or plan_run(graph, run, program_of(run))
    placement = run.placement
    if placement == "auto" and run.mode == "innet":
        placement += f" ({'+'.join(sorted({p.method for p in rp.plans}))}: the fastest the timing model predicts)"
    lines = [f"topology {graph.graph.get('name', '?')}: mode {run.mode}, placement {placement}, {len(rp.plans)} job(s)"]
    links: dict[str, int] = {}
    bounds: dict[str, int] = {}
    density = run.topk if run.topk and run.mode != "ring" else 1.0
    directions: dict[tuple[str, str], float] = {}
    size, c = (run.elements if run.collective_of.payload else 0), run.collective_of
    for plan in rp.plans:
        lines += _job_lines(run, plan, rp.outcomes[plan.job])
        for name, b in predicted_link_bytes(graph, run.mode, plan, size, rp.per_packet, run.iterations,
                                            density, c, run.root).items():
            links[name] = links.get(name, 0) + b
        for uv, sent in direction_bytes(graph, run.mode, plan, size, rp.per_packet, density, c, run.root).items():
            directions[uv] = directions.get(uv, 0.0) + sent
        for t, b in tier_lower_bounds(graph, plan.workers, run.elements, rp.per_packet).items():
            bounds[t] = bounds.get(t, 0) + b * run.iterations
    lines.append(f"predicted bytes for {run.iterations} x {size} elements per worker" +
                 ("" if c.name == "allreduce" else f", {c.name}") + ":")
    for t, b in tier_bytes(graph, links).items():  # the bound is all-reduce's
        lines.append(f"  {t:>12}: {b:>12}" + (f"  (lower bound {bounds.get(t, 0)})" if c.name == "allreduce" else ""))
    lines.append(f"  {'cross-rack':>12}: {cross_rack_bytes(graph, links):>12}")
    (u, v), seconds = busiest_direction(graph, directions)
    busiest = link_name(u, v)
    lines.append(f"  busiest link {busiest}: {links[busiest]} B, {u}->{v} busy {seconds * run.iterations:.6f} s "
                 f"at {graph.edges[u, v]['bw']:g} Mbit/s (most bytes: {max(sorted(links), key=lambda k: links[k])})")
    return "\n".join(lines)


def prediction_table(graph: nx.Graph, run: RunSpec, runs: list[RunRecord], plans: dict[str, RunPlan],
                     hop: float | None = None) -> tuple[str, list[RunRecord]]:
    """The model next to each measured run, with the error; and the runs with the model's figures added
    (``prediction``). ``plans``: each mode's plan, as the run placed it; ``hop``: per-hop processing time
    (default: 0 on local, MININET_HOP on mininet)."""
    keys = ["iteration_s", "comm_wait_s", "next_forward_wait_s"] if run.workload else ["completion_s"]
    rows = [["mode", "backend", *[f"{k} {w}" for k in keys for w in ("measured", "model", "error")]]]
    predicted = []
    for r in runs:
        spec = replace(run, mode=r.mode)
        rp = plans[r.mode]
        dilation = r.get("fidelity", {}).get("dilation", 1.0)  # a dilated switch's hop is that much shorter
        per_hop = hop if hop is not None else 0.0 if r.backend == "local" else MININET_HOP / dilation
        r = r.with_figures(prediction=predict(graph, spec, list(rp.plans), rp.per_packet, per_hop))
        predicted.append(r)
        row = [r.mode, r.backend]
        for k in keys:
            got, model = r.get(k, float("nan")), r["prediction"][k]
            err = f"{100 * (model / got - 1):+.1f}%" if got and got == got else "-"
            row += [f"{got:.4f}", f"{model:.4f}", err]
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in rows), predicted
