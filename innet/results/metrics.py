"""Where the bytes went: per link, per tier, across racks; the summary table."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import networkx as nx

from innet.graph import is_switch, link_name, link_totals, natural_key, port_to, role, tier, uplink
from innet.planning.prediction import link_rate
from innet.results.files import write_text_atomic
from innet.results.record import JsonObject, RunRecord
from innet.switch.runtime import PortStats


def tier_bytes(graph: nx.Graph, link_bytes: Mapping[str, int]) -> dict[str, int]:
    """Bytes per tier (``host-tor``, ``tor-spine``...), summed over its links."""
    out: dict[str, int] = {}
    for u, v in graph.edges:
        t = tier(graph, u, v)
        out[t] = out.get(t, 0) + link_bytes.get(link_name(u, v), 0)
    return dict(sorted(out.items()))


def up_and_down(graph: nx.Graph, directions: Mapping[tuple[str, str], int]) -> tuple[dict[str, int], dict[str, int]]:
    """Bytes per link direction (from, to) as two maps by link name, every link named: up (innet.graph.uplink:
    host to ToR, ToR to spine) and down."""
    up, down = {}, {}
    for u, v in sorted(graph.edges, key=lambda e: natural_key(link_name(*e))):
        a, b = uplink(graph, u, v)
        up[link_name(a, b)], down[link_name(a, b)] = directions.get((a, b), 0), directions.get((b, a), 0)
    return up, down


def message_link_bytes(graph: nx.Graph, ports: Mapping[str, Mapping[str, PortStats]]) -> dict[str, int]:
    """Bytes of point-to-point messages (job P2P_JOB) each link carried, both directions, from the switches' port
    counters (``ports``: switch -> interface ``{switch}-eth{port}`` -> its PortStats): a direction out of a switch as
    that switch sent it, a host's uplink as its switch received it. Exact where the side plane's TCP shares the
    links (Mininet), whose frames the switches never count as messages. Links that carried none are left out."""
    directions: dict[tuple[str, str], int] = {}
    for u, v in graph.edges:
        for a, b in ((u, v), (v, u)):
            if a in ports:
                directions[(a, b)] = ports[a][f"{a}-eth{port_to(graph, a, b)}"].message_tx_bytes
            elif b in ports:
                directions[(a, b)] = ports[b][f"{b}-eth{port_to(graph, b, a)}"].message_rx_bytes
    return {name: n for name, n in link_totals(directions).items() if n}


def cross_rack_bytes(graph: nx.Graph, link_bytes: dict[str, int]) -> int:
    """Bytes on links between switches: what leaves or enters a rack."""
    return sum(link_bytes.get(link_name(u, v), 0) for u, v in graph.edges
               if is_switch(graph, u) and is_switch(graph, v))


def link_seconds(graph: nx.Graph, link_bytes: dict[str, int]) -> dict[str, float]:
    """Per link, the seconds its bytes take at its rate (``bw``, Mbit/s): what makes a link the bottleneck."""
    rates = {link_name(u, v): link_rate(graph, u, v) for u, v in graph.edges}
    return {name: b / rates[name] for name, b in link_bytes.items() if name in rates}


def busiest_link(graph: nx.Graph, link_bytes: dict[str, int]) -> str:
    """The link whose bytes take longest at its rate (not the one with most bytes: on an oversubscribed
    uplink fewer bytes can take longer); ties to the most bytes, then the name."""
    seconds = link_seconds(graph, link_bytes)
    return max(sorted(link_bytes, key=natural_key), key=lambda k: (seconds.get(k, 0.0), link_bytes[k]), default="")


def topology_summary(graph: nx.Graph) -> JsonObject:
    """results.json's ``topology``: every node's role, every link's tier, rate and up direction ("h1->t1")."""
    return {
        "name": graph.graph.get("name", "topology"),
        "nodes": {n: role(graph, n) for n in sorted(graph, key=natural_key)},
        "links": [{"link": link_name(u, v), "tier": tier(graph, u, v), "bw_mbps": d["bw"], "up": "->".join(uplink(graph, u, v))}
                  for u, v, d in sorted(graph.edges(data=True), key=lambda e: link_name(e[0], e[1]))],
    }


def summary_table(runs: list[RunRecord]) -> str:
    """The terminal table; with a PBox run among them, each run's ratios to it. A training run is named by its
    scheme (top-k runs in-network, SSP and ASP at the PBox)."""
    tiers = sorted({t for r in runs for t in r.tier_bytes})
    base = next((r for r in runs if r.mode == "pbox"), None)
    head = ["mode", "placement", "backend", "correct", "completion_s", "retx", "dropped", "cross_rack_B",
            *[f"{t}_B" for t in tiers], "busiest_link", "busiest_B"]
    if base is not None:
        head += ["time/pbox", "xrack/pbox"]
    rows = [head]
    for r in runs:
        row = [r.figures.get("scheme", r.mode), r.placement, r.backend, str(r.correct), f"{r.completion_s:.6f}", str(r.retransmissions),
               str(r.packets_dropped), str(r.cross_rack_bytes), *[str(r.tier_bytes.get(t, 0)) for t in tiers],
               r.busiest_link, str(r.max_link_bytes)]
        if base is not None:
            row += [_ratio(r.completion_s, base.completion_s), _ratio(r.cross_rack_bytes, base.cross_rack_bytes)]
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=False)) for row in rows)


def training_lines(runs: list[RunRecord]) -> list[str]:
    """A line per consistency run: throughput, and the staleness read against the bound."""
    lines = []
    for r in runs:
        if r.figures.get("consistency"):
            bound = "none" if r["staleness_bound"] is None else r["staleness_bound"]
            lines.append(f"{r['mode']} {r['consistency']}: {r['iterations_per_s']:.2f} iterations/s per worker "
                         f"(slowest {r['slowest_worker_iterations_per_s']:.2f}); staleness read: max "
                         f"{r['max_staleness']}, mean {r['mean_staleness']:.3f} (bound {bound})")
    return lines


def job_lines(runs: list[RunRecord]) -> list[str]:
    """A line per job of every run with several: where it aggregated, its band, and its verdict."""
    return [f"{r.mode} job {j.job} (band {j.priority}, {j.outcome}): correct={j.correct}, "
            f"{j.completion_s:.6f} s, {j.retransmissions} retransmissions"
            for r in runs if len(r.jobs) > 1 for j in r.jobs]


def input_lines(runs: list[RunRecord]) -> list[str]:
    """A line per run that streamed input: exact or not, its bytes, and what sharing saved."""
    lines = []
    for r in runs:
        i = r.get("input")
        if i:
            lines.append(f"{r['mode']} input ({'shared, multicast' if i['shared'] else 'a unicast copy per job'}): "
                         f"exact={i['exact']} to {i['readers']} readers in {i['completion_s']:.4f} s; {i['bytes']} B on "
                         f"the links (predicted {i['predicted_bytes']}), {i['unicast_bytes']} B as unicast copies: "
                         f"saved {i['saved_bytes']} B ({100 * i['saved_fraction']:.1f}%); {i['nacks']} NACKs")
    return lines


def cluster_lines(runs: list[RunRecord]) -> list[str]:
    """A line per run spread over servers (--cluster): where the nodes ran, and the bytes that crossed servers."""
    lines = []
    for r in runs:
        c = r.get("cluster")
        if c:
            where = "; ".join(f"{s}: {' '.join(nodes)}" for s, nodes in c["servers"].items())
            tunnels = ", ".join(f"{link} {b}" for link, b in c["tunnel_bytes"].items()) or "none"
            lines.append(f"{r['mode']} cluster ({where}): {c['cross_server_bytes']} B crossed servers on "
                         f"{len(c['tunnel_bytes'])} tunnel link(s): {tunnels}")
    return lines


def write_results(path: str, graph: nx.Graph, runs: list[RunRecord], **top: Any) -> None:
    """results.json: the topology, every run, and ``top``-level figures (a training run's exact baseline)."""
    write_text_atomic(path, json.dumps({"topology": topology_summary(graph), **top,
                                        "runs": [r.to_json() for r in runs]}, indent=2))


def direction_table(graph: nx.Graph, runs: list[RunRecord]) -> str:
    """Bytes per tier and direction (up: host to ToR, ToR to spine...), measured and the planner's, a row per
    run and tier that carried any; "-" where a run measured no directions."""
    head = ["mode", "tier", "up_B", "down_B", "predicted_up_B", "predicted_down_B"]
    rows = [head]
    for r in runs:
        maps = [r.link_bytes_up, r.link_bytes_down, r.predicted_link_bytes_up, r.predicted_link_bytes_down]
        per_tier = [tier_bytes(graph, m) if m else {} for m in maps]
        for t in sorted({t for m in per_tier for t in m}):
            cells = [m.get(t) for m in per_tier]
            if any(cells):
                rows.append([r.figures.get("scheme", r.mode), t, *("-" if c is None else str(c) for c in cells)])
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in rows)


def write_link_csv(path: str, graph: nx.Graph, runs: list[RunRecord]) -> None:
    """links.csv: a row per run and link: its bytes (both directions, ``bytes``), its up direction (``up``,
    "h1->t1"), the bytes each way and the planner's prediction each way (empty where a run measured none)."""
    lines = ["mode,backend,link,tier,bytes,up,bytes_up,bytes_down,predicted_up,predicted_down"]
    for r in runs:
        for u, v in sorted(graph.edges, key=lambda e: link_name(*e)):
            name = link_name(u, v)
            each_way = [r.link_bytes_up.get(name, ""), r.link_bytes_down.get(name, ""),
                        r.predicted_link_bytes_up.get(name, 0), r.predicted_link_bytes_down.get(name, 0)]
            lines.append(f"{r.mode},{r.backend},{name},{tier(graph, u, v)},{r.link_bytes.get(name, 0)},"
                         f"{'->'.join(uplink(graph, u, v))}," + ",".join(str(x) for x in each_way))
    write_text_atomic(path, "\n".join(lines) + "\n")


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.3f}" if b else "-"
