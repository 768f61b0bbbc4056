"""An experiment file, read and checked: every point's command line is parsed and checked as ``innet run``
would before anything runs, so a bad file is one line and costs nothing.

    description = "one line"           # what ``innet reproduce --list`` shows
    [run]                              # flags of ``innet run`` every point shares (key = the flag's name)
    topo = "star"
    [series]                           # one line of the figure each: its own flags
    innet = { mode = "innet" }
    [sweep]
    flag = "bw"                        # the flag the x axis sweeps
    values = [10, 100, 1000]
    quick = [100]                      # ``--quick``: the short sweep tests run
    [report]
    metrics = ["completion_s"]         # columns: a run record's field; ``a.b`` a nested one; total_bytes
    baseline = "pbox"                  # optional: each metric over the baseline series' at the same point
    breakeven = "total_bytes/dense"    # optional: where a ratio first reaches 0.99
    log_x = true                       # optional
    plot = ["completion_s/pbox"]       # optional: the figure's panels, any of the columns

A series with ``sweep = false`` does not take the swept flag (it runs once and is drawn flat); a flag a
series sets itself wins over the sweep's. A series with ``vs = "other"`` takes its ratios over series
``other`` instead of the baseline (two topologies in one file, each against its own baseline). A series with
``best = [{ placement = "root" }, { placement = "tree", pool-slots = 64 }, ...]`` runs each variant (its own flags
and the variant's) at every point and keeps the one with the least first metric: the best configuration a user
could choose; its row's ``best`` column says which variant won.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from typing import Any

from innet import cli
from innet.errors import UserError
from innet.shipped import EXPERIMENTS as SHIPPED

TABLES = {"description": str, "run": dict, "series": dict, "sweep": dict, "report": dict}
SWEEP_KEYS = {"flag", "values", "quick"}
REPORT_KEYS = {"metrics", "baseline", "breakeven", "log_x", "plot"}
Value = str | int | float | bool | list[str]


@dataclass(frozen=True)
class Experiment:
    name: str
    path: str
    description: str
    run: dict[str, Value]
    series: dict[str, dict[str, Value]]
    flag: str
    values: tuple[Value, ...]
    quick: tuple[Value, ...]
    metrics: tuple[str, ...]
    baseline: str = ""
    breakeven: str = ""
    log_x: bool = False
    plot: tuple[str, ...] = ()  # the figure's panels (default: the metrics, and the first over the baseline)

    def flags(self, series: str, value: Value) -> dict[str, Value]:
        """The flags of one point: the shared ones, the swept one, the series' own."""
        own = dict(self.series[series])
        own.pop("vs", None)
        own.pop("best", None)
        swept = {self.flag: value} if own.pop("sweep", True) else {}
        return {**self.run, **swept, **own}

    def variants(self, series: str, value: Value) -> list[tuple[str, dict[str, Value]]]:
        """The points a series runs at swept value ``value``: (label, flags) of each of its ``best`` variants (the
        label its flags, e.g. ``placement=tree pool-slots=64``), or its one point (label "")."""
        flags = self.flags(series, value)
        best: Any = self.series[series].get("best")
        if not isinstance(best, list):
            return [("", flags)]
        return [(" ".join(f"{k}={v}" for k, v in variant.items()), {**flags, **variant}) for variant in best]

    def baseline_of(self, series: str) -> str:
        """The series ``series``' ratios are over: its ``vs``, else the baseline."""
        return str(self.series[series].get("vs", self.baseline))


def argv_of(flags: dict[str, Value]) -> list[str]:
    """The ``innet run`` command line of ``flags``: true is a bare flag, a list repeats the flag."""
    argv: list[str] = []
    for name, value in flags.items():
        if value is True:
            argv.append(f"--{name}")
        elif isinstance(value, list):
            for v in value:
                argv += [f"--{name}", str(v)]
        elif value is not False:
            argv += [f"--{name}", str(value)]
    return argv


def shipped() -> dict[str, str]:
    """The shipped experiments: name -> path."""
    return {f[:-5]: os.path.join(SHIPPED, f) for f in sorted(os.listdir(SHIPPED)) if f.endswith(".toml")}


def describe() -> str:
    return "\n".join(f"{name:<10} {load(name).description}" for name in shipped())


def load(name: str) -> Experiment:
    """The experiment ``name`` (shipped) or at path ``name``, checked point by point."""
    path = shipped().get(name, name)
    if not os.path.isfile(path):
        raise UserError(f"unknown experiment {name!r}; choose one of {', '.join(shipped())} or give a .toml file")
    where = os.path.relpath(path) if not path.startswith(SHIPPED) else f"experiments/{os.path.basename(path)}"
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{where}: not valid TOML: {exc}") from None
    experiment = _experiment(data, os.path.basename(path).removesuffix(".toml"), path, where)
    for series in experiment.series:
        for value in (*experiment.values, *experiment.quick):
            for label, flags in experiment.variants(series, value):
                check(argv_of(flags), f"{where}: series {series}{f' ({label})' if label else ''}, {experiment.flag}={value}")
    return experiment


def _want(ok: bool, where: str, what: str) -> None:
    if not ok:
        raise UserError(f"{where}: {what}")


def _experiment(data: dict[str, Any], name: str, path: str, where: str) -> Experiment:
    for key, value in data.items():
        _want(key in TABLES, where, f"unknown key {key!r}; an experiment has {', '.join(TABLES)}")
        _want(isinstance(value, TABLES[key]), where, f"{key} must be a {'table' if TABLES[key] is dict else 'string'}")
    for key in ("description", "series", "sweep", "report"):
        _want(key in data, where, f"missing {key}")
    flags = cli.flag_names()
    run = data.get("run", {})
    series = data["series"]
    _want(bool(series) and all(isinstance(s, dict) for s in series.values()), where,
          "series must be tables of flags, e.g. innet = { mode = \"innet\" }")
    for label, own in series.items():
        best = own.get("best", [{"": ""}])
        _want(isinstance(best, list) and bool(best) and all(isinstance(v, dict) and v for v in best), where,
              f"series {label}: best must be a non-empty list of tables of flags, e.g. [{{ placement = \"root\" }}]")
    variants = [(f"series.{s}.best", v) for s, f in series.items() for v in f.get("best", [])]
    for table, keys in [("run", run), *((f"series.{s}", {k: v for k, v in f.items() if k not in ("sweep", "vs", "best")})
                                        for s, f in series.items()), *variants]:
        for key in keys:
            _want(key in flags, where, f"unknown key {key!r} in [{table}]: not a flag of innet run")
    sweep, report = data["sweep"], data["report"]
    for table, allowed, got in (("sweep", SWEEP_KEYS, sweep), ("report", REPORT_KEYS, report)):
        unknown = set(got) - allowed
        if unknown:
            raise UserError(f"{where}: unknown key {sorted(unknown)[0]!r} in [{table}]; it takes {', '.join(sorted(allowed))}")
    _want(sweep.get("flag", "") in flags, where, f"[sweep] flag {sweep.get('flag')!r} is not a flag of innet run")
    values, quick = sweep.get("values"), sweep.get("quick", sweep.get("values"))
    for key, got in (("values", values), ("quick", quick)):
        _want(isinstance(got, list) and bool(got) and all(isinstance(v, str | int | float) for v in got), where,
              f"[sweep] {key} must be a non-empty list of numbers or names")
    metrics = report.get("metrics")
    _want(isinstance(metrics, list) and bool(metrics) and all(isinstance(m, str) for m in metrics), where,
          "[report] metrics must be a non-empty list of run record fields")
    baseline = report.get("baseline", "")
    _want(baseline in ("", *series), where, f"[report] baseline {baseline!r} is not a series")
    for label, own in series.items():
        _want(own.get("vs", baseline) in series or not baseline, where, f"series {label}: vs {own.get('vs')!r} is not a series")
    columns = [*metrics, *(f"{m}/{baseline}" for m in metrics if baseline)]
    for key in ("plot", "breakeven"):
        for column in report.get(key, []) if key == "plot" else [report.get(key, "")] if key in report else []:
            _want(column in columns, where, f"[report] {key}: {column!r} is not a column; the columns are {', '.join(columns)}")
    return Experiment(name, path, data["description"], run, series, sweep["flag"], tuple(values), tuple(quick),
                      tuple(metrics), baseline, report.get("breakeven", ""), bool(report.get("log_x", False)),
                      tuple(report.get("plot", ())))


def check(argv: list[str], where: str) -> None:
    """Refuse a point's command line as ``innet run`` would refuse it, in one line that says where."""
    from innet.api import spec_of

    try:
        spec_of(**cli.parse_options(["--backend", "local", *argv]))
    except UserError as exc:
        raise UserError(f"{where}: {exc.render(cli.flag)}") from None
