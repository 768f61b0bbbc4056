"""PNG plots of a comparison: the topology with link load per mode, and bytes per tier."""

from __future__ import annotations

import os
import textwrap
from dataclasses import dataclass
from typing import Any

import networkx as nx

from innet.graph import TIER_ORDER, link_name, natural_key, role, uplink
from innet.results.files import save_figure
from innet.results.record import RunRecord

LABELLED = 200  # nodes up to which the topology plot names them

# An axis of a figure in words and units, not a field name: metric or flag -> (label, factor the values are
# multiplied by to be in the label's unit). Bytes are drawn in MB (1e6 bytes), so the axis has no "1e7" offset.
LABELS: dict[str, tuple[str, float]] = {
    "completion_s": ("completion time (s)", 1.0),
    "iteration_s": ("time per iteration (s)", 1.0),
    "prediction.iteration_s": ("time per iteration, timing model (s)", 1.0),
    "prediction.ps_iteration_s": ("time per iteration, parameter servers' model (s)", 1.0),
    "next_forward_wait_s": ("wait for the next forward pass (s)", 1.0),
    "input.completion_s": ("input delivery time (s)", 1.0),
    "time_s": ("emulated time (s)", 1.0),
    "cross_rack_bytes": ("cross-rack traffic (MB)", 1e-6),
    "total_bytes": ("traffic on all links (MB)", 1e-6),
    "max_link_bytes": ("traffic on the busiest link (MB)", 1e-6),
    "input.bytes": ("input traffic (MB)", 1e-6),
    "iterations_per_s": ("iterations per second, per worker", 1.0),
    "mean_staleness": ("mean staleness read (iterations)", 1.0),
    "max_staleness": ("largest staleness read (iterations)", 1.0),
    "accuracy": ("test accuracy (%)", 100.0),
    "bw": ("link rate (Mbit/s)", 1.0),
    "delay": ("latency per link (s)", 1.0),
    "elements": ("tensor length (elements)", 1.0),
    "workers": ("workers (hosts)", 1.0),
    "hosts_per_rack": ("workers per rack", 1.0),
    "jobs": ("jobs sharing the network", 1.0),
    "staleness": ("staleness bound (iterations)", 1.0),
    "topk": ("density (fraction of the gradient sent)", 1.0),
    "compute_scale": ("compute per iteration (× the workload's)", 1.0),
    "workload": ("model trained (workload)", 1.0),
    "background": ("background traffic (pattern: load)", 1.0),
}


def axis_label(name: str) -> tuple[str, float]:
    """``name``'s axis label in words and units, and the factor that puts its values in that unit. A ratio
    ``metric/series`` is the metric over that series' at the same point (no unit); a field not in ``LABELS``
    is named in words from its suffix (``_s``: seconds, ``_bytes``: MB)."""
    if "/" in name:
        metric, base = name.split("/", 1)
        words = axis_label(metric)[0].split(" (")[0]
        return f"{words}, ÷ {base}'s", 1.0
    if name in LABELS:
        return LABELS[name]
    words = name.replace(".", " ").replace("_", " ").replace("-", " ")
    if name.endswith("_bytes"):
        return f"{words.removesuffix(' bytes')} (MB)", 1e-6
    if name.endswith("per_s"):
        return f"{words.removesuffix(' per s')} per second", 1.0
    if name.endswith("_s"):
        return f"{words.removesuffix(' s')} (s)", 1.0
    return words, 1.0


def _layout(graph: nx.Graph) -> dict[str, tuple[float, float]]:
    """Tiers as rows (hosts at the bottom), nodes spread evenly in name order."""
    rows: dict[int, list[str]] = {}
    for n in sorted(graph, key=natural_key):
        rows.setdefault(TIER_ORDER[role(graph, n)], []).append(n)
    pos = {}
    for level, nodes in rows.items():
        for i, n in enumerate(nodes):
            pos[n] = ((i + 0.5) / len(nodes), float(level))
    return pos


def _directions(graph: nx.Graph, run: RunRecord) -> list[tuple[tuple[str, str], int]]:
    """Each link direction (from, to) and its bytes: both directions of each link where ``run`` measured them,
    else each link once with both directions' bytes."""
    out = []
    for u, v in sorted(graph.edges, key=lambda e: link_name(*e)):
        name = link_name(u, v)
        if name in run.link_bytes_up:
            a, b = uplink(graph, u, v)
            out += [((a, b), run.link_bytes_up[name]), ((b, a), run.link_bytes_down[name])]
        else:
            out.append(((u, v), run.link_bytes.get(name, 0)))
    return out


def plot_links(graph: nx.Graph, runs: list[RunRecord], path: str) -> None:
    """One panel per run: each link direction's width and colour by the bytes it carried (two arcs per link, an
    arrow each way, where the run measured directions and the graph is small enough to name its nodes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pos = _layout(graph)
    large = len(graph) > LABELLED  # a thousand names would be one black smear, and take seconds to draw
    each = [_directions(graph, r) if not large else [(e, r.link_bytes.get(link_name(*e), 0)) for e in graph.edges]
            for r in runs]
    peak = max((b for loads in each for _, b in loads), default=0) or 1
    fig, axes = plt.subplots(1, len(runs), figsize=(5 * len(runs), 4.5), squeeze=False)
    cmap = plt.get_cmap("viridis")
    for ax, run, loads in zip(axes[0], runs, each, strict=True):
        directed = not large and bool(run.link_bytes_up)
        load = [b / peak for _, b in loads]
        nx.draw_networkx_edges(nx.DiGraph(graph) if directed else graph, pos, edgelist=[e for e, _ in loads],
                               width=[0.5 + 7 * x for x in load], edge_color=[cmap(x) for x in load], ax=ax,
                               **({"arrows": True, "arrowsize": 8, "connectionstyle": "arc3,rad=0.12",
                                   "node_size": 260} if directed else {}))
        colours = ["#d62728" if role(graph, n) == "pbox" else "#1f77b4" if role(graph, n) == "host" else "#7f7f7f"
                   for n in graph]
        nx.draw_networkx_nodes(graph, pos, node_size=20 if large else 260, node_color=colours, ax=ax)
        if not large:
            nx.draw_networkx_labels(graph, pos, font_size=7, font_color="white", ax=ax)
        ax.set_title(f"{run.mode} ({run.placement}): cross-rack {run.cross_rack_bytes / 1e6:.2f} MB", fontsize=9)
        ax.axis("off")
    sm = plt.cm.ScalarMappable(cmap=cmap, norm=plt.Normalize(0, peak / 1e6))
    both = large or not all(r.link_bytes_up for r in runs)
    fig.colorbar(sm, ax=axes[0].tolist(), label="MB on link (both directions)" if both else "MB on link, each way",
                 shrink=0.8)
    save_figure(fig, path, dpi=110)
    plt.close(fig)


def plot_tiers(graph: nx.Graph, runs: list[RunRecord], path: str) -> None:
    """Grouped bars: bytes per tier, one bar per mode, up (host to ToR, ToR to spine...) and down stacked where
    the run measured directions."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from innet.results.metrics import tier_bytes

    tiers = sorted({t for r in runs for t in r.tier_bytes})
    fig, ax = plt.subplots(figsize=(1.5 + 1.6 * len(tiers), 4))
    width = 0.8 / max(len(runs), 1)
    for i, run in enumerate(runs):
        xs = [t + i * width for t in range(len(tiers))]
        label = f"{run.mode} ({run.placement})"
        if not run.link_bytes_up:
            ax.bar(xs, [run.tier_bytes.get(t, 0) / 1e6 for t in tiers], width, label=label)
            continue
        up, down = tier_bytes(graph, run.link_bytes_up), tier_bytes(graph, run.link_bytes_down)
        bars = ax.bar(xs, [up.get(t, 0) / 1e6 for t in tiers], width, label=f"{label}: up")
        ax.bar(xs, [down.get(t, 0) / 1e6 for t in tiers], width, bottom=[up.get(t, 0) / 1e6 for t in tiers],
               color=bars.patches[0].get_facecolor(), alpha=0.45, hatch="//", label=f"{label}: down")
    ax.set_xticks([t + width * (len(runs) - 1) / 2 for t in range(len(tiers))], tiers)
    ax.set_xlabel("tier (the roles of a link's two ends; up: towards the second)")
    ax.set_ylabel("traffic per tier, up + down (MB)")
    ax.set_title("bytes per tier and direction")
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)


def plot_accuracy(runs: list[RunRecord], exact: float | None, path: str) -> None:
    """Training runs: test accuracy after each epoch against emulated time, one line per scheme; the exact
    float baseline's final accuracy as a dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for run in runs:
        epochs = run.figures.get("epochs", [])
        ax.plot([e["time_s"] for e in epochs], [100 * e["accuracy"] for e in epochs], marker="o", markersize=3,
                label=f"{run.figures['scheme']} ({100 * run.figures['accuracy']:.1f}%)")
    if exact is not None:
        ax.axhline(100 * exact, color="black", linestyle="--", linewidth=1, label=f"exact float ({100 * exact:.1f}%)")
    ax.set_xlabel(f"emulated time (s, {runs[0].backend})")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(f"training {runs[0].figures.get('train', '')}: accuracy against emulated time")
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)


def write_plots(graph: nx.Graph, runs: list[RunRecord], out_dir: str, exact: float | None = None) -> list[str]:
    """links.png and tiers.png; accuracy.png too for training runs (``exact``: the float baseline's accuracy)."""
    links, tiers = os.path.join(out_dir, "links.png"), os.path.join(out_dir, "tiers.png")
    plot_links(graph, runs, links)
    plot_tiers(graph, runs, tiers)
    if not any(r.figures.get("train") for r in runs):
        return [links, tiers]
    accuracy = os.path.join(out_dir, "accuracy.png")
    plot_accuracy([r for r in runs if r.figures.get("train")], exact, accuracy)
    return [links, tiers, accuracy]


@dataclass(frozen=True)
class PaperPanel:
    """A figure's panel beside a paper: innet's values of the paper's measure, a line per series, and the paper's
    points (stars; a peak, "as much as", a dotted line across the panel)."""

    label: str
    lines: dict[str, list[tuple[Any, float]]]  # series -> (swept value, innet's value)
    points: list[tuple[str, Any, float, bool]]  # (series, swept value or None, the paper's value, a peak)


def plot_sweep(rows: list[dict], x: str, ys: list[str], path: str, title: str = "", log_x: bool = False,
               paper: PaperPanel | None = None) -> None:
    """A paper-style figure of a sweep: one panel per metric in ``ys`` against ``x``, one line per series
    (``row["series"]``); against names (a workload), grouped bars; with ``paper``, a last panel of innet's
    values beside the paper's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = list(dict.fromkeys(r[x] for r in rows))
    named = any(isinstance(v, str) for v in xs)
    panels = len(ys) + (paper is not None)
    fig, axes = plt.subplots(1, panels, figsize=(4.6 * panels, 3.6), squeeze=False)
    names = list(dict.fromkeys(r["series"] for r in rows))
    width = 0.8 / len(names)
    xlabel, xscale = axis_label(x)
    for ax, y in zip(axes[0][: len(ys)], ys, strict=True):
        ylabel, yscale = axis_label(y)
        for i, series in enumerate(names):
            points = [(xs.index(r[x]) if named else r[x] * xscale, r[y] * yscale) for r in rows
                      if r["series"] == series and r[y] is not None]
            if named:  # grouped bars, one group per name
                ax.bar([p[0] + (i - (len(names) - 1) / 2) * width for p in points], [p[1] for p in points], width, label=series)
            else:
                ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=4, label=series)
        if named:
            ax.set_xticks(range(len(xs)), [str(v).replace(":", "\n") for v in xs])  # "permutation:0.5" in two lines
        elif log_x:
            ax.set_xscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    if paper is not None:
        _paper_panel(axes[0][-1], paper, xs, named, axis_label(x), log_x)
    if title:  # wrapped to the figure's width (about 12 characters an inch at this size), not cut off
        fig.suptitle("\n".join(textwrap.wrap(title, int(12 * 4.6 * panels))), fontsize=10)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)


def _paper_panel(ax: Any, paper: PaperPanel, xs: list[Any], named: bool, xlabel: tuple[str, float], log_x: bool) -> None:
    """innet's line per series and the paper's points in the same colour: a star at its swept value, a dotted line
    for a peak."""
    def at(v: Any) -> float:
        return float(xs.index(v)) if named else float(v) * xlabel[1]

    for i, (series, values) in enumerate(paper.lines.items()):
        colour = f"C{i}"
        ax.plot([at(v) for v, _ in values], [y for _, y in values], marker="o", markersize=4, color=colour,
                label=f"{series}: innet")
        for j, (_, v, y, peak) in enumerate(p for p in paper.points if p[0] == series):
            if peak:
                ax.axhline(y, linestyle=":", color=colour, label=f"{series}: the paper's peak" if j == 0 else None)
            elif v is not None and (v in xs or not named):  # a named value not run (--quick): not drawn
                ax.plot([at(v)], [y], marker="*", markersize=12, linestyle="", color=colour,
                        label=f"{series}: the paper" if j == 0 else None)
    if named:
        ax.set_xticks(range(len(xs)), [str(v) for v in xs])
    elif log_x:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel[0])
    ax.set_ylabel(paper.label)
    ax.set_title("beside the paper", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
