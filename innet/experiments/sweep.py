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
from innet.results.record import RunRecord


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
    bests = any("best" in own for own in experiment.series.values())
    with tqdm(points, unit="point", file=sys.stderr, dynamic_ncols=True) as bar:
        for series, value in bar:
            bar.set_postfix_str(f"{experiment.option}={value} {series}")
            tried = []
            for label, own in experiment.variants(series, value):
                options = {"backend": backend, **own}
                key = tuple(sorted((k, repr(v)) for k, v in options.items()))
                if key not in done:
                    slug = f"{series}-{_slug(value)}" + (f"-{_slug(label).replace(' ', '-')}" if label else "")
                    try:
                        done[key] = run_point(options, os.path.join(out, "runs", slug))
                    except UserError as exc:
                        if not rows:
                            raise
                        raise UserError(f"{exc}; the {len(rows)} point(s) before it are in "
                                        f"{os.path.join(out, 'points.csv')}") from None
                tried.append(_row(experiment, series, value, done[key], command_of(options),
                                  label if bests else None))
            rows.append(best_of(experiment, tried))
            write_outputs(experiment, rows_with_ratios(experiment, rows), out, plot=False)  # each point kept as it comes
    return write_outputs(experiment, rows_with_ratios(experiment, rows), out)


def best_of(experiment: Experiment, rows: list[Row]) -> Row:
    """Of one point's variants, the row with the least first metric (a failed run never wins: an inexact one
    counts as slowest)."""
    first = experiment.metrics[0]
    return min(rows, key=lambda r: (not r["correct"], r[first] if isinstance(r[first], int | float) else float("inf")))


def _row(experiment: Experiment, series: str, value: Value, record: RunRecord, cmd: str, best: str | None) -> Row:
    row: Row = {"series": series, experiment.option: value}
    row.update({m: metric(record, m) for m in experiment.metrics})
    row.update(correct=record.correct, command=cmd)
    if best is not None:
        row["best"] = best
    return row


def _slug(value: Value) -> str:
    return str(value).replace("/", "_")
