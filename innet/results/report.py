"""A run's report (what ``innet.run`` returns): its typed run records and the files and text made of them."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

import networkx as nx

from innet.hosts.background import BackgroundSummary
from innet.planning.spec import RunSpec
from innet.results.fidelity import fidelity_line
from innet.results.files import make_output_folder, write_text_atomic
from innet.results.learning import learning_lines
from innet.results.metrics import (
    cluster_lines,
    direction_table,
    input_lines,
    job_lines,
    summary_table,
    topology_summary,
    training_lines,
    write_link_csv,
)
from innet.results.record import JsonObject, RunRecord, Timeline


@dataclass(frozen=True)
class ExactTraining:
    """A training run's exact float baseline: test accuracy and loss after each epoch."""

    epochs: tuple[tuple[float, float], ...]

    @property
    def accuracy(self) -> float:
        return self.epochs[-1][0]

    def to_json(self) -> JsonObject:
        return {"accuracy_exact": self.accuracy,
                "exact_epochs": [{"epoch": e + 1, "accuracy": a, "loss": loss} for e, (a, loss) in enumerate(self.epochs)]}


@dataclass(frozen=True)
class Report:
    """What ``innet.run`` gave: one ``RunRecord`` per mode run (``runs``), on ``graph``, as ``spec`` asked."""

    spec: RunSpec
    graph: nx.Graph = field(repr=False)
    runs: tuple[RunRecord, ...]
    exact: ExactTraining | None = None  # a training run's exact float baseline
    prediction: str = ""  # with ``predict``: the model next to every measured run, as a table
    files: tuple[str, ...] = ()  # what ``innet.run`` wrote (with ``out``)

    @property
    def correct(self) -> bool:
        """Every run's result is right."""
        return all(r.correct for r in self.runs)

    def run(self, mode: str) -> RunRecord:
        """The run of ``mode``."""
        found = [r for r in self.runs if r.mode == mode]
        if not found:
            raise KeyError(f"no {mode} run in this report (runs: {', '.join(r.mode for r in self.runs)})")
        return found[0]

    def table(self) -> str:
        """The runs side by side: time, bytes per tier, cross-rack bytes, the busiest link, ratios to PBox."""
        return summary_table(list(self.runs))

    def lines(self) -> list[str]:
        """Everything the command line prints of a run, line by line."""
        runs = list(self.runs)
        out = [self.table(), direction_table(self.graph, runs), *(fidelity_line(r) for r in runs)]
        out += job_lines(runs) + training_lines(runs) + input_lines(runs)
        out += learning_lines(runs, self.exact.accuracy if self.exact else None) + cluster_lines(runs)
        out += [background_line(r.mode, b) for r in runs if (b := r.figures.get("background"))]
        return out + ([self.prediction] if self.prediction else [])

    def to_json(self) -> JsonObject:
        """results.json's content."""
        return {"topology": topology_summary(self.graph), **(self.exact.to_json() if self.exact else {}),
                "runs": [r.to_json() for r in self.runs]}

    def write(self, out: str, plots: bool = True, json_path: str = "", timeline: str = "") -> list[str]:
        """results.json, links.csv and (with ``plots``) the plots into folder ``out`` (none without one),
        results.json's content to ``json_path`` too, and the runs' trace to ``timeline``
        (innet.results.timeline); the files written into ``out``."""
        if json_path:
            self.write_json(json_path)
        if timeline:
            write_text_atomic(timeline, json.dumps(trace_events([(f"{r.figures.get('scheme', r.mode)} ({r.placement}, "
                                                                  f"{r.backend})", r.timeline)
                                                                 for r in self.runs if r.timeline is not None])))
        if not out:
            return []
        out = make_output_folder(out)
        runs = list(self.runs)
        files = [os.path.join(out, "results.json"), os.path.join(out, "links.csv")]
        self.write_json(files[0])
        write_link_csv(files[1], self.graph, runs)
        files += _write_utilisation(out, runs, plots)
        if plots:
            from innet.results.plots import write_plots

            files += write_plots(self.graph, runs, out, self.exact.accuracy if self.exact else None)
        return files

    def write_json(self, path: str) -> None:
        """``to_json`` into file ``path``."""
        write_text_atomic(path, json.dumps(self.to_json(), indent=2))


def _write_utilisation(out: str, runs: list[RunRecord], plots: bool) -> list[str]:
    """utilisation.csv (and utilisation.png, the first run's) for runs that sampled their links (background
    traffic ran)."""
    from innet.results.utilisation import Utilisation, plot_utilisation, write_utilisation_csv

    sampled = [(r.mode, r.figures["utilisation"]) for r in runs if isinstance(r.figures.get("utilisation"), Utilisation)]
    if not sampled:
        return []
    path = os.path.join(out, "utilisation.csv")
    write_utilisation_csv(path, sampled)
    if not plots:
        return [path]
    plot_utilisation(sampled[0][1], os.path.join(out, "utilisation.png"))
    return [path, os.path.join(out, "utilisation.png")]


US = 1e6  # the trace-event format's timestamps are microseconds


def trace_events(runs: Sequence[tuple[str, Timeline]]) -> dict[str, object]:
    """``--timeline``'s Chrome/Perfetto trace (the trace-event JSON format: open it in Perfetto's UI or
    chrome://tracing) of ``runs``, each a label ("innet (tor, local)") and its timeline (innet.results.record.Timeline).

    Per mode run and job, a process whose threads are the ranks (thread id: rank + 1), each call a complete ("X")
    slice named for its collective; per switch with a slot pool, a process with one counter ("C") track, ``slots
    held``, stepping at each change. Times are the run's: virtual seconds from the fabric's start on the local
    backend; on Mininet, the hosts' shared monotonic clock from the first call's start, put back on the requested
    timeline when dilated."""
    events: list[dict[str, object]] = []
    pid = 0

    def process(name: str) -> int:
        nonlocal pid
        pid += 1
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
        return pid

    for label, t in runs:
        for job in sorted({c.job for c in t.calls}):
            p = process(f"{label}: job {job}, calls per rank")
            mine = [c for c in t.calls if c.job == job]
            for rank, host in sorted({(c.rank, c.host) for c in mine}):
                events.append({"ph": "M", "name": "thread_name", "pid": p, "tid": rank + 1,  # tid 0: Perfetto's idle thread
                               "args": {"name": f"rank {rank} ({host})" if host else f"rank {rank}"}})
            events += [{"ph": "X", "cat": "call", "name": c.collective, "pid": p, "tid": c.rank + 1, "ts": c.start_s * US,
                        "dur": (c.end_s - c.start_s) * US, "args": {"call": c.call, "elements": c.elements}}
                       for c in mine]
        for sw in t.switches:
            p = process(f"{label}: switch {sw.switch} ({sw.slots} slots)")
            end = max([t.end_s, *(s for s, _ in sw.held)])
            steps = [(0.0, 0), *sw.held, (end, sw.held[-1][1] if sw.held else 0)]  # the track spans the run
            events += [{"ph": "C", "name": "slots", "pid": p, "tid": 0, "ts": s * US, "args": {"held": n}}
                       for s, n in steps]
    return {"traceEvents": events, "displayTimeUnit": "ns"}


def background_line(mode: str, b: BackgroundSummary) -> str:
    """What the background delivered (an elastic one: beside what it delivers alone, and the job's slowdown)."""
    line = (f"{mode}: background {b.pattern}: {b.flows} flows, offered {b.offered_mbps:g} Mbit/s, delivered "
            f"{b.delivered_mbps:g} Mbit/s while the job ran")
    if b.alone_mbps:
        line += f", {b.alone_mbps:g} Mbit/s alone (the job took {100 * b.goodput_loss:.1f}% of it)"
    if b.slowdown:
        line += f"; the job took {b.slowdown:.3f}x its time without it ({1e3 * b.job_alone_s:.3f} ms)"
    return line
