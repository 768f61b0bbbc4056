"""An experiment file, read and checked: every point's options are prepared as ``innet.run`` would prepare them
(innet.prepare) before anything runs, so a bad file is one line and costs nothing.

    description = "one line"           # what ``innet reproduce --list`` shows
    [run]                              # options every point shares (key = the RunSpec field: innet.run's keyword)
    topo = "star"
    [series]                           # one line of the figure each: its own options
    innet = { mode = "innet" }
    [sweep]
    option = "bw"                      # the option the x axis sweeps
    values = [10, 100, 1000]
    quick = [100]                      # ``--quick``: the short sweep tests run
    [report]
    metrics = ["completion_s"]         # columns: a run record's field; ``a.b`` a nested one; total_bytes
    baseline = "pbox"                  # optional: each metric over the baseline series' at the same point
    breakeven = "total_bytes/dense"    # optional: where a ratio first reaches 0.99
    log_x = true                       # optional
    plot = ["completion_s/pbox"]       # optional: the figure's panels, any of the columns
    [paper]                            # optional: the cited paper's points, innet's beside each (paper.py)

A series with ``sweep = false`` does not take the swept option (it runs once and is drawn flat); an option a
series sets itself wins over the sweep's. A series with ``vs = "other"`` takes its ratios over series
``other`` instead of the baseline (two topologies in one file, each against its own baseline). A series with
``best = [{ placement = "root" }, { placement = "tree", pool_slots = 64 }, ...]`` runs each variant (its own options
and the variant's) at every point and keeps the one with the least first metric: the best configuration a user
could choose; its row's ``best`` column says which variant won.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from typing import Any

from innet.cli import Options
from innet.errors import UserError
from innet.experiments import paper as papers
from innet.experiments.paper import Paper
from innet.shipped import EXPERIMENTS as SHIPPED

TABLES = {"description": str, "run": dict, "series": dict, "sweep": dict, "report": dict, "paper": dict}
SWEEP_KEYS = {"option", "values", "quick"}
REPORT_KEYS = {"metrics", "baseline", "breakeven", "log_x", "plot"}
Value = str | int | float | bool | list[str]


@dataclass(frozen=True)
class Experiment:
    name: str
    path: str
    description: str
    run: dict[str, Value]
    series: dict[str, dict[str, Value]]
    option: str  # the RunSpec field the x axis sweeps
    values: tuple[Value, ...]
    quick: tuple[Value, ...]
    metrics: tuple[str, ...]
    baseline: str = ""
    breakeven: str = ""
    log_x: bool = False
    plot: tuple[str, ...] = ()  # the figure's panels (default: the metrics, and the first over the baseline)
    paper: Paper | None = None  # the cited paper's published points (innet.experiments.paper)

    def options(self, series: str, value: Value) -> Options:
        """The options of one point, as ``innet.run`` takes them: the shared ones, the swept one, the series' own
        (a list is a repeated option's tuple)."""
        own = dict(self.series[series])
        own.pop("vs", None)
        own.pop("best", None)
        swept = {self.option: value} if own.pop("sweep", True) else {}
        return {k: tuple(v) if isinstance(v, list) else v for k, v in {**self.run, **swept, **own}.items()}

    def variants(self, series: str, value: Value) -> list[tuple[str, Options]]:
        """The points a series runs at swept value ``value``: (label, options) of each of its ``best`` variants
        (the label its options, e.g. ``placement=tree pool_slots=64``), or its one point (label "")."""
        options = self.options(series, value)
        best: Any = self.series[series].get("best")
        if not isinstance(best, list):
            return [("", options)]
        return [(" ".join(f"{k}={v}" for k, v in variant.items()), {**options, **variant}) for variant in best]

    def baseline_of(self, series: str) -> str:
        """The series ``series``' ratios are over: its ``vs``, else the baseline."""
        return str(self.series[series].get("vs", self.baseline))


def command_of(options: Options) -> str:
    """The ``innet run`` command line that runs ``options``: what a point's row records, to run it again by hand."""
    from innet.planning.options import default_of, flag_of, options_of
    from innet.planning.spec import RunSpec

    fields = {f.name: (f, opt) for f, opt in options_of(RunSpec)}
    argv = ["innet", "run"]
    for name, value in options.items():
        f, opt = fields.get(name, (None, None))
        flag = flag_of(f) if f is not None else f"--{name}"  # a fault of every link: --loss, --delay, ...
        if f is not None and opt is not None and opt.switch:
            argv += [flag] if value != default_of(f) else []
        elif isinstance(value, tuple):
            argv += [a for v in value for a in (flag, str(v))]
        else:
            argv += [flag, str(value)]
    return " ".join(argv)


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
            for label, options in experiment.variants(series, value):
                check(options, f"{where}: series {series}{f' ({label})' if label else ''}, {experiment.option}={value}")
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
    names = option_names()
    run = data.get("run", {})
    series = data["series"]
    _want(bool(series) and all(isinstance(s, dict) for s in series.values()), where,
          "series must be tables of options, e.g. innet = { mode = \"innet\" }")
    for label, own in series.items():
        best = own.get("best", [{"": ""}])
        _want(isinstance(best, list) and bool(best) and all(isinstance(v, dict) and v for v in best), where,
              f"series {label}: best must be a non-empty list of tables of options, e.g. [{{ placement = \"root\" }}]")
    variants = [(f"series.{s}.best", v) for s, f in series.items() for v in f.get("best", [])]
    for table, keys in [("run", run), *((f"series.{s}", {k: v for k, v in f.items() if k not in ("sweep", "vs", "best")})
                                        for s, f in series.items()), *variants]:
        for key in keys:
            _want(key in names, where, f"unknown key {key!r} in [{table}]: not an option of innet.run" + _hint(key))
    sweep, report = data["sweep"], data["report"]
    for table, allowed, got in (("sweep", SWEEP_KEYS, sweep), ("report", REPORT_KEYS, report)):
        unknown = set(got) - allowed
        if unknown:
            raise UserError(f"{where}: unknown key {sorted(unknown)[0]!r} in [{table}]; it takes {', '.join(sorted(allowed))}")
    _want(sweep.get("option", "") in names, where, f"[sweep] option {sweep.get('option')!r} is not an option of innet.run"
          + _hint(str(sweep.get("option", ""))))
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
    paper = papers.read(data["paper"], series, tuple(values), columns, baseline, where) if "paper" in data else None
    return Experiment(name, path, data["description"], run, series, sweep["option"], tuple(values), tuple(quick),
                      tuple(metrics), baseline, report.get("breakeven", ""), bool(report.get("log_x", False)),
                      tuple(report.get("plot", ())), paper)


def option_names() -> set[str]:
    """What an experiment's keys may be: ``innet.run``'s options (RunSpec's fields, and the faults of every link)."""
    from dataclasses import fields

    from innet.planning.spec import FAULT_HELP, RunSpec

    return {f.name for f in fields(RunSpec)} | set(FAULT_HELP)


def _hint(key: str) -> str:
    """A flag's name given for an option's: say the option's."""
    under = key.replace("-", "_")
    from innet.planning.options import flag_of, options_of
    from innet.planning.spec import RunSpec

    named = {flag_of(f)[2:]: f.name for f, _ in options_of(RunSpec)}
    near = named.get(key) or (under if under in option_names() else "")
    return f" (the option is {near!r})" if near and near != key else ""


def check(options: Options, where: str) -> None:
    """Refuse a point's options as ``innet.run`` would refuse them, in one line that says where: every rule,
    memory and the switches' registers, and the plan (``innet.prepare``), before the first point runs."""
    from innet.api import prepare

    try:
        prepare(calibrate=False, **{**options, "backend": "local"})
    except UserError as exc:
        raise UserError(f"{where}: {exc}") from None
