"""Where the bytes went: per link, per tier, across racks; the summary table."""

from __future__ import annotations

import json
from typing import Any

import networkx as nx

from innet.graph import is_switch, link_name, natural_key, role, tier
from innet.planning.prediction import link_rate
from innet.results.files import write_text_atomic
from innet.results.record import JsonObject, RunRecord


def tier_bytes(graph: nx.Graph, link_bytes: dict[str, int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for u, v in graph.edges:
        t = tier(graph, u, v)
        out[t] = out.get(t, 0) + link_bytes.get(link_name(u, v), 0)
    return dict(sorted(out.items()))


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
    """results.json's ``topology``: every node's role, every link's tier and rate."""
    return {
        "name": graph.graph.get("name", "topology"),
        "nodes": {n: role(graph, n) for n in sorted(graph, key=natural_key)},
        "links": [{"link": link_name(u, v), "tier": tier(graph, u, v), "bw_mbps": d["bw"]}
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


def write_link_csv(path: str, graph: nx.Graph, runs: list[RunRecord]) -> None:
    lines = ["mode,backend,link,tier,bytes"]
    for r in runs:
        for u, v in sorted(graph.edges, key=lambda e: link_name(*e)):
            name = link_name(u, v)
            lines.append(f"{r.mode},{r.backend},{name},{tier(graph, u, v)},{r.link_bytes.get(name, 0)}")
    write_text_atomic(path, "\n".join(lines) + "\n")


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.3f}" if b else "-"
