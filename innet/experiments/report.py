"""An experiment's results: one row per point (series, swept value, metrics, the command that made it),
ratios to a baseline series, the summary (speed-ups, break-even), written as CSV, JSON and a figure."""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from innet.errors import UserError
from innet.events import emit
from innet.experiments.file import Experiment
from innet.experiments.paper import PEAK, Compared, as_json, compare, innet_values
from innet.results.files import make_output_folder, write_text_atomic
from innet.results.plots import PaperPanel, plot_sweep
from innet.results.record import RunRecord, json_value

Row = dict[str, Any]  # a point as points.csv and points.json hold it: the edge where results become a table
PAYS = 0.99  # a ratio to the baseline "breaks even" where it saves less than 1%


def metric(record: RunRecord, name: str) -> Any:
    """A run record's value by name, read from the typed record: one of its fields (``completion_s``) or figures
    (``iteration_s``: the scheme's or the backend's own), ``a.b`` the field or key b of a; ``total_bytes`` is every
    link's bytes. A name the record does not have is one line naming what it has, never an empty column."""
    if name == "total_bytes":
        return sum(record.link_bytes.values())
    first, *rest = name.split(".")
    has = [f.name for f in fields(record) if f.name != "figures"] + list(record.figures)
    if first not in has:
        raise UserError(f"metric {name!r} is not in the {record.mode} run's record; it has {', '.join(sorted(has))}")
    value: Any = record.figures[first] if first in record.figures else getattr(record, first)
    for i, part in enumerate(rest):
        value = json_value(value)
        if not isinstance(value, Mapping) or part not in value:
            where = ".".join([first, *rest[:i]])
            raise UserError(f"metric {name!r}: the {record.mode} run's {where} has no {part!r}")
        value = value[part]
    return json_value(value)


def rows_with_ratios(experiment: Experiment, rows: list[Row]) -> list[Row]:
    """The rows, each metric also as ``metric/baseline``: over the baseline series' at the same point (a series'
    own ``vs``, where it names one)."""
    if not experiment.baseline:
        return rows
    base = {(r["series"], r[experiment.option]): r for r in rows}
    out = []
    for row in rows:
        ref = base.get((experiment.baseline_of(row["series"]), row[experiment.option]), {})  # not run yet: no ratio
        ratios = {f"{m}/{experiment.baseline}": _ratio(row[m], ref.get(m)) for m in experiment.metrics}
        out.append({**row, **ratios})
    return out


def _ratio(a: Any, b: Any) -> float | None:
    return a / b if isinstance(a, int | float) and isinstance(b, int | float) and b else None


def crossing(points: list[tuple[float, float]], level: float = PAYS) -> float | None:
    """The x where a ratio rising with x first reaches ``level``, linear between measured points (None: never)."""
    for (d0, r0), (d1, r1) in zip(points, points[1:], strict=False):
        if r0 < level <= r1:
            return d0 + (level - r0) * (d1 - d0) / (r1 - r0)
    return None


def summary(experiment: Experiment, rows: list[Row]) -> Row:
    """Per series and swept value, the speed-up over the baseline by the first metric: the baseline's time
    over this series' for a time (a name ending in ``_s``, not ``per_s``), this series' rate over the baseline's
    otherwise;
    and where ``breakeven`` is set, the swept value where that ratio reaches 0.99, per series."""
    out: Row = {}
    if experiment.baseline:
        first = f"{experiment.metrics[0]}/{experiment.baseline}"
        time = experiment.metrics[0].endswith("_s") and not experiment.metrics[0].endswith("per_s")
        bases = {experiment.baseline_of(s) for s in experiment.series}  # a series others are over is not sped up
        out["speedup"] = {s: {str(r[experiment.option]): (1 / r[first] if time else r[first]) if r[first] else None
                              for r in rows if r["series"] == s} for s in experiment.series if s not in bases}
    if experiment.breakeven:
        out["breakeven"] = {s: crossing([(r[experiment.option], r[experiment.breakeven]) for r in rows
                                         if r["series"] == s and r[experiment.breakeven] is not None])
                            for s in experiment.series if s != experiment.baseline}
    return out


STEADY = ("iteration_s", "comm_wait_s", "next_forward_wait_s")  # a workload's figures: warm-up left out


def steady_state(experiment: Experiment) -> str:
    """What the table's per-iteration figures leave out (innet.hosts.training.warmup), as its caption says it;
    "" where it has none of them."""
    from innet.hosts.training import warmup
    from innet.planning.spec import RunSpec

    if not any(m.split(".")[-1] in STEADY for m in experiment.metrics):
        return ""
    runs = {int(experiment.options(s, v).get("iterations", RunSpec.iterations))
            for s in experiment.series for v in experiment.values}
    left = sorted({warmup(n) for n in runs})
    counts = " or ".join(map(str, left))
    return (f"steady state: {counts} warm-up iteration{'s' if left[-1] > 1 else ''} of "
            f"{' or '.join(map(str, sorted(runs)))} left out" if any(left) else "one iteration: no warm-up left out")


def beside_the_paper(experiment: Experiment, rows: list[Row]) -> tuple[list[Row], list[Compared]]:
    """The rows as points.json holds them: each row a paper point stands beside carries ``paper`` (its value, where
    in the paper) and ``innet`` (innet's of the same measure); and every point's comparison."""
    if experiment.paper is None:
        return rows, []
    compared = compare(experiment.paper, experiment.option, rows, summary(experiment, rows).get("speedup", {}),
                       experiment.baseline_of)
    out = [dict(r) for r in rows]
    for point, c in zip(experiment.paper.points, compared, strict=True):
        row = next((r for r in out if r["series"] == c.series and r[experiment.option] == c.x), None)
        if row is not None:
            row.setdefault("paper", []).append({"at": point.at, experiment.paper.measure: point.value,
                                                "source": point.source})
            row["innet"] = {experiment.paper.measure: c.innet}
    return out, compared


def write_outputs(experiment: Experiment, rows: list[Row], out: str, plot: bool = True) -> list[str]:
    """points.csv, points.json and (with ``plot``) NAME.png in ``out``; the paths written. A figure that cannot be
    drawn is said (a warning event) and left out; the table stays."""
    out = make_output_folder(out)
    files = [os.path.join(out, f) for f in ("points.csv", "points.json", f"{experiment.name}.png")]
    table = io.StringIO(newline="")
    writer = csv.DictWriter(table, list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    write_text_atomic(files[0], table.getvalue())
    note = steady_state(experiment)
    points, compared = beside_the_paper(experiment, rows)
    paper = {"paper": as_json(experiment.paper, compared)} if experiment.paper is not None else {}
    write_text_atomic(files[1], json.dumps({"experiment": experiment.name, "description": experiment.description,
                                            **({"steady_state": note} if note else {}), "sweep": experiment.option,
                                            "series": list(experiment.series),
                                            "metrics": list(experiment.metrics), "points": points,
                                            "summary": summary(experiment, rows), **paper}, indent=1))
    panels = list(experiment.plot or experiment.metrics)
    if experiment.baseline and not experiment.plot:
        panels.append(f"{experiment.metrics[0]}/{experiment.baseline}")
    if not plot:
        return files[:2]
    beside = None
    if experiment.paper is not None and experiment.paper.points:
        measure = experiment.paper.measure
        shown = list(dict.fromkeys(p.series for p in experiment.paper.points))
        beside = PaperPanel("speed-up over the baseline (×)" if measure == "speedup" else measure,
                            {s: innet_values(experiment.paper, experiment.option, rows,
                                             summary(experiment, rows).get("speedup", {}), s) for s in shown},
                            [(c.series, c.x if c.at == PEAK else c.at, c.paper, c.at == PEAK) for c in compared])
    try:
        plot_sweep(rows, experiment.option, panels, files[2], experiment.description + (f" ({note})" if note else ""),
                   experiment.log_x, beside)
    except Exception as exc:  # noqa: BLE001 -- a figure's failure must not cost the table already written
        emit("warning", f"{experiment.name}: the figure was not drawn ({type(exc).__name__}: {exc}); "
                        f"the table is in {files[0]}")
        return files[:2]
    return files
