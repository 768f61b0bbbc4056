"""Run an experiment: every point's options run through ``innet.run`` (its results.json kept under ``runs/``, the
``innet run`` command line that would run it recorded); then the table, the summary and the figure
(innet.experiments.report)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

from tqdm import tqdm

from innet.api import run
from innet.cli import Options
from innet.errors import UserError
from innet.events import Event, emit, listening
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


def reproduce(experiment: Experiment, backend: str = "local", quick: bool = False, out: str | None = None,
              jobs: int = 1) -> list[str]:
    """Run every point of ``experiment`` (its quick sweep with ``quick``) and write its files into ``out``;
    the files written. ``jobs`` > 1 (the local backend only: its runs share nothing) runs that many points at
    once, each in its own process; the points are taken, shown and written in their order all the same."""
    out = make_output_folder(out or NewFolder(os.path.join("results", f"{experiment.name}-{time.strftime('%Y%m%d-%H%M%S')}")))
    values = experiment.quick if quick else experiment.values
    points = [(s, v) for v in values for s in experiment.series]
    runs: dict[Key, tuple[Options, str]] = {}  # a series that does not sweep runs once
    variants = {point: _variants(experiment, backend, out, *point, runs) for point in points}
    rows: list[Row] = []
    bests = any("best" in own for own in experiment.series.values())
    # made before the runs start: each run's check that its folder can be made makes and removes the folders missing
    # on its way, and two at once raced over this one
    os.makedirs(os.path.join(out, "runs"), exist_ok=True)
    with _Runs(runs, jobs if backend == "local" else 1) as record, \
            tqdm(points, unit="point", file=sys.stderr, dynamic_ncols=True) as bar:
        for series, value in bar:
            bar.set_postfix_str(f"{experiment.option}={value} {series}")
            tried = []
            for label, options, key in variants[series, value]:
                try:
                    done = record(key)
                except UserError as exc:
                    if not rows:
                        raise
                    raise UserError(f"{exc}; the {len(rows)} point(s) before it are in "
                                    f"{os.path.join(out, 'points.csv')}") from None
                tried.append(_row(experiment, series, value, done, command_of(options), label if bests else None))
            rows.append(best_of(experiment, tried))
            write_outputs(experiment, rows_with_ratios(experiment, rows), out, plot=False)  # each point kept as it comes
    return write_outputs(experiment, rows_with_ratios(experiment, rows), out)


Key = tuple[tuple[str, str], ...]


def _variants(experiment: Experiment, backend: str, out: str, series: str, value: Value,
              runs: dict[Key, tuple[Options, str]]) -> list[tuple[str, Options, Key]]:
    """One point's variants (label, options, key), each variant's run added to ``runs`` unless another point's
    has the same options."""
    found = []
    for label, own in experiment.variants(series, value):
        options = {"backend": backend, **own}
        key = tuple(sorted((k, repr(v)) for k, v in options.items()))
        slug = f"{series}-{_slug(value)}" + (f"-{_slug(label).replace(' ', '-')}" if label else "")
        runs.setdefault(key, (options, os.path.join(out, "runs", slug)))
        found.append((label, options, key))
    return found


class _Runs:
    """The sweep's runs by key: with one job each runs when it is first asked for; with more, all are handed to
    a pool of processes at the start and asked for in order. Leaving cancels what has not started and waits
    for what has (nothing is left running)."""

    def __init__(self, runs: dict[Key, tuple[Options, str]], jobs: int) -> None:
        self.runs, self.done = runs, dict[Key, RunRecord]()
        self.pool = ProcessPoolExecutor(min(jobs, len(runs)), mp_context=get_context("spawn")) if jobs > 1 else None
        self.futures = {key: self.pool.submit(_run_telling, *args) for key, args in runs.items()} if self.pool else {}

    def __enter__(self) -> Callable[[Key], RunRecord]:
        return self.record

    def record(self, key: Key) -> RunRecord:
        if key not in self.done and not self.pool:
            self.done[key] = run_point(*self.runs[key])
        elif key not in self.done:
            self.done[key], said = self.futures[key].result()
            for event in said:  # what its run said, as one run in this process would have, in the points' order
                emit(event.kind, event.message)
        return self.done[key]

    def __exit__(self, *_: object) -> None:
        if self.pool:
            self.pool.shutdown(wait=True, cancel_futures=True)


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


def _run_telling(options: Options, out: str) -> tuple[RunRecord, list[Event]]:
    """``run_point`` in a pool's process: its record and what it said (its progress left out: it is over)."""
    said: list[Event] = []
    with listening(lambda event: said.append(event) if event.kind != "progress" else None):
        record = run_point(options, out)
    return record, said


def _slug(value: Value) -> str:
    return str(value).replace("/", "_")
