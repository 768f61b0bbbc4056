"""Run an experiment: every point is an ``innet run`` command line, its options run through ``innet.run``,
its results.json kept under ``runs/``; then the table, the summary and the figure (innet.experiments.report)."""

from __future__ import annotations

import os
import sys
import time

from tqdm import tqdm

from innet import cli
from innet.api import run
from innet.errors import UserError
from innet.experiments.file import Experiment, Value, argv_of
from innet.experiments.report import Row, metric, rows_with_ratios, write_outputs
from innet.results.files import NewFolder, make_output_folder
from innet.results.record import JsonObject, RunRecord


def run_point(argv: list[str], out: str) -> RunRecord:
    """One point's run record, run as ``innet run ARGV --out OUT`` would (its files written into ``out``)."""
    try:
        return run(**cli.parse_options([*argv, "--no-plots", "--out", out])).runs[0]
    except UserError as exc:
        raise UserError(f"innet run {' '.join(argv)}: {exc.render(cli.flag)}") from None


def command(argv: list[str]) -> str:
    return "innet run " + " ".join(argv)


def reproduce(experiment: Experiment, backend: str = "local", quick: bool = False, out: str | None = None) -> list[str]:
    """Run every point of ``experiment`` (its quick sweep with ``quick``) and write its files into ``out``;
    the files written."""
    out = make_output_folder(out or NewFolder(os.path.join("results", f"{experiment.name}-{time.strftime('%Y%m%d-%H%M%S')}")))
    values = experiment.quick if quick else experiment.values
    points = [(s, v) for v in values for s in experiment.series]
    done: dict[tuple[str, ...], RunRecord] = {}  # a series that does not sweep runs once
    rows = []
    bests = any("best" in own for own in experiment.series.values())
    with tqdm(points, unit="point", file=sys.stderr, dynamic_ncols=True) as bar:
        for series, value in bar:
            bar.set_postfix_str(f"{experiment.flag}={value} {series}")
            tried = []
            for label, flags in experiment.variants(series, value):
                argv = ["--backend", backend, *argv_of(flags)]
                key = tuple(argv)
                if key not in done:
                    slug = f"{series}-{_slug(value)}" + (f"-{_slug(label).replace(' ', '-')}" if label else "")
                    done[key] = run_point(argv, os.path.join(out, "runs", slug))
                tried.append(_row(experiment, series, value, done[key].to_json(), command(argv), label if bests else None))
            rows.append(best_of(experiment, tried))
    return write_outputs(experiment, rows_with_ratios(experiment, rows), out)


def best_of(experiment: Experiment, rows: list[Row]) -> Row:
    """Of one point's variants, the row with the least first metric (a failed run never wins: an inexact one
    counts as slowest)."""
    first = experiment.metrics[0]
    return min(rows, key=lambda r: (not r["correct"], r[first] if isinstance(r[first], int | float) else float("inf")))


def _row(experiment: Experiment, series: str, value: Value, record: JsonObject, cmd: str, best: str | None) -> Row:
    row: Row = {"series": series, experiment.flag: value}
    row.update({m: metric(record, m) for m in experiment.metrics})
    row.update(correct=record["correct"], command=cmd)
    if best is not None:
        row["best"] = best
    return row


def _slug(value: Value) -> str:
    return str(value).replace("/", "_")
