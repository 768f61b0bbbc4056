"""``run_topology.py --plan-only``: the plan as text, before anything starts."""

from __future__ import annotations

import networkx as nx

from innet.experiment import RunSpec, pick_workers
from innet.graph import natural_key
from innet.metrics import cross_rack_bytes, tier_bytes
from innet.modes import make_plan
from innet.prediction import predicted_link_bytes, tier_lower_bounds
from innet.programs import load_program


def plan_report(graph: nx.Graph, run: RunSpec) -> str:
    program = load_program(run.program)
    workers = pick_workers(graph, run.workers)
    plan = make_plan(graph, run, workers, program)
    per_packet = program.elements
    lines = [f"topology {graph.graph.get('name', '?')}: {len(workers)} workers, mode {run.mode}, placement {plan.method}"]
    if run.mode == "innet" and plan.method != "pbox":
        lines.append(f"root {plan.root}; aggregating: {', '.join(plan.aggregators)}; slots per switch: {plan.slots}")
        lines.append("tree (child -> parent):")
        for switch, jp in sorted(plan.switch_ports.items(), key=lambda kv: natural_key(kv[0])):
            role = "aggregates" if jp.aggregate else "relays"
            kids = ", ".join(plan.children(switch))
            lines.append(f"  {switch} -> {plan.parents.get(switch, '(root)')}: {role} {kids}")
    elif plan.pbox is not None and run.mode == "pbox":
        lines.append(f"every worker sends to PBox {plan.pbox}")
    else:
        lines.append(f"ring order: {' -> '.join(plan.workers)} -> {plan.workers[0]}")
    links = predicted_link_bytes(graph, run.mode, plan, run.elements, per_packet, run.iterations)
    bounds = tier_lower_bounds(graph, workers, run.elements, per_packet)
    lines.append(f"predicted bytes for {run.iterations} x {run.elements} elements:")
    for t, b in tier_bytes(graph, links).items():
        lines.append(f"  {t:>12}: {b:>12}  (lower bound {bounds.get(t, 0) * run.iterations})")
    lines.append(f"  {'cross-rack':>12}: {cross_rack_bytes(graph, links):>12}")
    busiest = max(sorted(links), key=lambda k: links[k])
    lines.append(f"  busiest link {busiest}: {links[busiest]}")
    return "\n".join(lines)
