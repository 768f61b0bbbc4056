"""Run an experiment: every point is an ``innet run`` command line, run as written (``innet.cli.main``), its
results.json kept under ``runs/``; then the table, the summary and the figure (innet.experiments.report)."""

from __future__ import annotations

import io
import json
import os
import sys
import time
from contextlib import redirect_stderr, redirect_stdout
from typing import Any, TextIO

from innet import cli
from innet.errors import UserError
from innet.experiments.file import Experiment, Value, argv_of
from innet.experiments.report import metric, rows_with_ratios, write_outputs


class Progress:
    """One line on ``stream``, redrawn in place: ``[####------] 4/10 bw=100 pbox``."""

    def __init__(self, total: int, stream: TextIO | None = None, width: int = 20) -> None:
        self.total, self.stream, self.width, self.done = total, stream or sys.stderr, width, 0

    def show(self, label: str) -> None:
        filled = self.width * self.done // self.total
        self.stream.write(f"\r[{'#' * filled}{'-' * (self.width - filled)}] {self.done}/{self.total} {label}\033[K")
        self.stream.flush()

    def step(self, label: str) -> None:
        self.done += 1
        self.show(label)
        if self.done == self.total:
            self.stream.write("\n")


def run_point(argv: list[str], out: str) -> dict[str, Any]:
    """One point's run record (results.json's first run), run as ``innet run ARGV --out OUT`` would."""
    said, err = io.StringIO(), io.StringIO()
    with redirect_stdout(said), redirect_stderr(err):
        rc = cli.main([*argv, "--no-plots", "--out", out])
    if rc == 2:
        lines = err.getvalue().strip().splitlines() or ["failed"]
        raise UserError(f"innet run {' '.join(argv)}: {lines[-1].removeprefix('error: ')}")
    with open(os.path.join(out, "results.json")) as f:
        return dict(json.load(f)["runs"][0])


def command(argv: list[str]) -> str:
    return "innet run " + " ".join(argv)


def reproduce(experiment: Experiment, backend: str = "local", quick: bool = False, out: str | None = None) -> list[str]:
    """Run every point of ``experiment`` (its quick sweep with ``quick``) and write its files into ``out``;
    the files written."""
    out = out or os.path.join("results", f"{experiment.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    values = experiment.quick if quick else experiment.values
    points = [(s, v) for v in values for s in experiment.series]
    progress = Progress(len(points))
    done: dict[tuple[str, ...], dict[str, Any]] = {}  # a series that does not sweep runs once
    rows = []
    for series, value in points:
        argv = ["--backend", backend, *argv_of(experiment.flags(series, value))]
        progress.show(f"{experiment.flag}={value} {series}")
        key = tuple(argv)
        if key not in done:
            done[key] = run_point(argv, os.path.join(out, "runs", f"{series}-{_slug(value)}"))
        progress.step(f"{experiment.flag}={value} {series}")
        rows.append(_row(experiment, series, value, done[key], command(argv)))
    return write_outputs(experiment, rows_with_ratios(experiment, rows), out)


def _row(experiment: Experiment, series: str, value: Value, record: dict[str, Any], cmd: str) -> dict[str, Any]:
    row: dict[str, Any] = {"series": series, experiment.flag: value}
    row.update({m: metric(record, m) for m in experiment.metrics})
    row.update(correct=record["correct"], command=cmd)
    return row


def _slug(value: Value) -> str:
    return str(value).replace("/", "_")
