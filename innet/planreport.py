"""``run_topology.py --plan-only``: the plan as text, before anything starts."""

from __future__ import annotations

import networkx as nx

from innet.experiment import RunSpec
from innet.graph import natural_key
from innet.metrics import cross_rack_bytes, tier_bytes
from innet.modes import plan_run
from innet.planner import JobPlan
from innet.prediction import predicted_link_bytes, tier_lower_bounds
from innet.programs import program_of


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
    else:
        lines.append(f"  every worker sends to PBox {plan.pbox}")
    return lines


def plan_report(graph: nx.Graph, run: RunSpec) -> str:
    program = program_of(run)
    rp = plan_run(graph, run, program)
    lines = [f"topology {graph.graph.get('name', '?')}: mode {run.mode}, placement {run.placement}, {len(rp.plans)} job(s)"]
    links: dict[str, int] = {}
    bounds: dict[str, int] = {}
    for plan in rp.plans:
        lines += _job_lines(run, plan, rp.outcomes[plan.job])
        for name, b in predicted_link_bytes(graph, run.mode, plan, run.elements, rp.per_packet, run.iterations).items():
            links[name] = links.get(name, 0) + b
        for t, b in tier_lower_bounds(graph, plan.workers, run.elements, rp.per_packet).items():
            bounds[t] = bounds.get(t, 0) + b * run.iterations
    lines.append(f"predicted bytes for {run.iterations} x {run.elements} elements per worker:")
    for t, b in tier_bytes(graph, links).items():
        lines.append(f"  {t:>12}: {b:>12}  (lower bound {bounds.get(t, 0)})")
    lines.append(f"  {'cross-rack':>12}: {cross_rack_bytes(graph, links):>12}")
    busiest = max(sorted(links), key=lambda k: links[k])
    lines.append(f"  busiest link {busiest}: {links[busiest]}")
    return "\n".join(lines)
