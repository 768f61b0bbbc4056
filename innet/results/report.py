"""A run's report (what ``innet.run`` returns): its typed run records and the files and text made of them."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import networkx as nx

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
from innet.results.record import JsonObject, RunRecord


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
        out += [f"{r.mode}: background {b.pattern}: {b.flows} flows, offered {b.offered_mbps:g} Mbit/s, delivered "
                f"{b.delivered_mbps:g} Mbit/s while the job ran" for r in runs if (b := r.figures.get("background"))]
        return out + ([self.prediction] if self.prediction else [])

    def to_json(self) -> JsonObject:
        """results.json's content."""
        return {"topology": topology_summary(self.graph), **(self.exact.to_json() if self.exact else {}),
                "runs": [r.to_json() for r in self.runs]}

    def write(self, out: str, plots: bool = True, json_path: str = "") -> list[str]:
        """results.json, links.csv and (with ``plots``) the plots into folder ``out`` (none without one), and
        results.json's content to ``json_path`` too; the files written into ``out``."""
        if json_path:
            self.write_json(json_path)
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
