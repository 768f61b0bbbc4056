"""Run an experiment: every point's options run through ``innet.run`` (its results.json kept under ``runs/``, the
``innet run`` command line that would run it recorded); then the table, the summary and the figure
(innet.experiments.report)."""

from __future__ import annotations

import os
import sys
import time

from tqdm import tqdm

from innet.api import run
from innet.cli import Options
from innet.errors import UserError
from innet.experiments.file import Experiment, Value, command_of
from innet.experiments.report import Row, metric, rows_with_ratios, write_outputs
from innet.results.files import NewFolder, make_output_folder
from innet.results.record import JsonObject, RunRecord


def run_point(options: Options, out: str) -> RunRecord:
    """One point's run record, its files written into ``out``."""
    try:
        return run(**options, plots=False, out=out).runs[0]
    except UserError as exc:
        raise UserError(f"{command_of(options)}: {exc}") from None


def reproduce(experiment: Experiment, backend: str = "local", quick: bool = False, out: str | None = None) -> list[str]:
    """Run every point of ``experiment`` (its quick sweep with ``quick``) and write its files into ``out``;
    the files written."""
    out = make_output_folder(out or NewFolder(os.path.join("results", f"{experiment.name}-{time.strftime('%Y%m%d-%H%M%S')}")))
    values = experiment.quick if quick else experiment.values
    points = [(s, v) for v in values for s in experiment.series]
    done: dict[tuple[tuple[str, str], ...], RunRecord] = {}  # a series that does not sweep runs once
    rows: list[Row] = []
    with tqdm(points, unit="point", file=sys.stderr, dynamic_ncols=True) as bar:
        for series, value in bar:
            options = {"backend": backend, **experiment.options(series, value)}
            bar.set_postfix_str(f"{experiment.option}={value} {series}")
            key = tuple(sorted((k, repr(v)) for k, v in options.items()))
            if key not in done:
                try:
                    done[key] = run_point(options, os.path.join(out, "runs", f"{series}-{_slug(value)}"))
                except UserError as exc:
                    if not rows:
                        raise
                    raise UserError(f"{exc}; the {len(rows)} point(s) before it are in {os.path.join(out, 'points.csv')}") from None
            rows.append(_row(experiment, series, value, done[key].to_json(), command_of(options)))
            write_outputs(experiment, rows_with_ratios(experiment, rows), out, plot=False)  # each point kept as it comes
    return write_outputs(experiment, rows_with_ratios(experiment, rows), out)


def _row(experiment: Experiment, series: str, value: Value, record: JsonObject, cmd: str) -> Row:
    row: Row = {"series": series, experiment.option: value}
    row.update({m: metric(record, m) for m in experiment.metrics})
    row.update(correct=record["correct"], command=cmd)
    return row


def _slug(value: Value) -> str:
    return str(value).replace("/", "_")
