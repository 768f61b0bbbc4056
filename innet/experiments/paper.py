"""An experiment's ``[paper]`` table: the cited paper's published points, and innet's figure beside each.

    [paper]
    citation = "Jayarajan et al., Priority-based Parameter Propagation for Distributed DNN Training, SysML 2019"
    figure = "abstract"                # where the points are from: a figure or table number, or the abstract
    setting = "MXNet, 4 machines ..."  # the paper's setting, in its words
    measure = "speedup"                # what a point's value is: "speedup" (the summary's, over the baseline
                                       # series), a column of the table, or "1/" and a column (its reciprocal)
    unmodelled = "GPU kernel time ..."  # what innet cannot model, and the scale that maps innet to the paper
    unsourced = "Figure 8's points"    # what of the paper's figure the file does not give, and why
    points = [{ series = "p3", at = "peak", value = 1.66, source = "abstract: as much as 66%" }]
    claims = ["Sockeye +38%: innet has no Sockeye workload"]  # the paper's numbers not compared, and why

A point's ``at`` is a swept value, or ``"peak"``: the highest of innet's values over the sweep (the paper's
"as much as"). Each point gets one line: whether the shape agrees (who is ahead; between two points of a series,
the trend) and how far the magnitudes are apart.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from innet.errors import UserError
from innet.results.record import JsonObject

PAPER_KEYS = {"citation", "figure", "setting", "measure", "unmodelled", "unsourced", "points", "claims"}
POINT_KEYS = {"series", "at", "value", "source", "note"}
PEAK = "peak"


@dataclass(frozen=True)
class PaperPoint:
    series: str  # the series of the experiment it stands beside
    at: str | int | float  # a swept value, or PEAK
    value: float
    source: str  # where in the paper, quoted
    note: str = ""  # what differs between the paper's setting and innet's at this point


@dataclass(frozen=True)
class Paper:
    citation: str
    figure: str
    setting: str
    measure: str
    unmodelled: str
    unsourced: str = ""
    points: tuple[PaperPoint, ...] = ()
    claims: tuple[str, ...] = ()


@dataclass(frozen=True)
class Compared:
    """One paper point beside innet's: where innet's value was read (a peak: where it is highest)."""

    series: str
    at: str | int | float
    x: str | int | float | None  # None: innet has no value there (yet)
    paper: float
    innet: float | None
    shape: str
    magnitude: str
    note: str = ""
    unit: str = ""  # "×" for a speed-up

    @property
    def line(self) -> str:
        where = f"{self.at}" + (f" (innet's at {self.x})" if self.at == PEAK and self.x is not None else "")
        innet = "not run" if self.innet is None else f"{self.innet:.3g}{self.unit}"
        return (f"{self.series} at {where}: paper {self.paper:.3g}{self.unit}, innet {innet}; shape {self.shape}; "
                f"magnitude {self.magnitude}" + (f". {self.note}" if self.note else ""))


def read(table: Any, series: JsonObject, values: tuple[Any, ...], columns: list[str], baseline: str,
         where: str) -> Paper:
    """The ``[paper]`` table, checked against the experiment's series, sweep and columns."""
    def want(ok: bool, what: str) -> None:
        if not ok:
            raise UserError(f"{where}: [paper] {what}")

    want(isinstance(table, dict), "must be a table")
    unknown = sorted(set(table) - PAPER_KEYS)
    want(not unknown, f"unknown key {unknown[0] if unknown else ''!r}; it takes {', '.join(sorted(PAPER_KEYS))}")
    for key in ("citation", "figure", "setting", "measure", "unmodelled"):
        want(isinstance(table.get(key), str) and bool(table[key].strip()), f"needs {key} (a string)")
    measure = table["measure"]
    column = measure.removeprefix("1/")
    want(measure == "speedup" and bool(baseline) or column in columns,
         f"measure {measure!r} is not speedup (with a baseline) or a column ({', '.join(columns)})")
    claims = table.get("claims", [])
    want(isinstance(claims, list) and all(isinstance(c, str) for c in claims), "claims must be a list of strings")
    points = []
    for raw in table.get("points", []):
        want(isinstance(raw, dict) and not set(raw) - POINT_KEYS and {"series", "at", "value", "source"} <= set(raw),
             f"a point is {{ series, at, value, source[, note] }}, got {raw!r}")
        want(raw["series"] in series, f"point series {raw['series']!r} is not a series")
        want(raw["at"] == PEAK or raw["at"] in values, f"point at {raw['at']!r} is neither {PEAK!r} nor a swept value")
        want(isinstance(raw["value"], int | float), f"point value {raw['value']!r} is not a number")
        points.append(PaperPoint(raw["series"], raw["at"], float(raw["value"]), raw["source"], raw.get("note", "")))
    return Paper(table["citation"], table["figure"], table["setting"], measure, table["unmodelled"],
                 table.get("unsourced", ""), tuple(points), tuple(claims))


def innet_values(paper: Paper, option: str, rows: list[JsonObject], speedups: dict[str, JsonObject],
                 series: str) -> list[tuple[Any, float]]:
    """Series ``series``' values of the paper's measure, by swept value, as far as run."""
    out = []
    for row in rows:
        if row["series"] != series:
            continue
        if paper.measure == "speedup":
            value = speedups.get(series, {}).get(str(row[option]))
        else:
            value = row.get(paper.measure.removeprefix("1/"))
            value = 1 / value if paper.measure.startswith("1/") and value else value
        if isinstance(value, int | float):
            out.append((row[option], float(value)))
    return out


def compare(paper: Paper, option: str, rows: list[JsonObject], speedups: dict[str, JsonObject],
            baseline_of: Any) -> list[Compared]:
    """Each paper point beside innet's value of it."""
    out: list[Compared] = []
    for k, point in enumerate(paper.points):
        values = innet_values(paper, option, rows, speedups, point.series)
        at = dict(values)
        x, got = (max(values, key=lambda v: v[1]) if values else (None, None)) if point.at == PEAK \
            else (point.at, at.get(point.at))
        shape = []
        if paper.measure == "speedup" or paper.measure.startswith("1/"):
            ahead = point.series if point.value > 1 else baseline_of(point.series)
            if got is not None:
                mine = "neither" if abs(got - 1) < 0.005 else point.series if got > 1 else baseline_of(point.series)
                shape.append(f"agrees: {ahead} ahead in both" if ahead == mine
                             else f"differs: the paper has {ahead} ahead, innet {mine}")
        before = next((p for p in reversed(paper.points[:k]) if p.series == point.series
                       and isinstance(p.at, int | float)), None)  # a trend is along a numeric axis only
        if before is not None and isinstance(point.at, int | float) and got is not None and at.get(before.at) is not None:
            theirs, mine_trend = _trend(before.value, point.value), _trend(at[before.at], got)
            shape.append(f"{theirs} from {before.at} in both" if theirs == mine_trend
                         else f"the paper {theirs} from {before.at}, innet {mine_trend}")
        out.append(Compared(point.series, point.at, x, point.value, got,
                            "; ".join(shape) or "one point: nothing but its size to compare",
                            _magnitude(paper.measure, point.value, got), point.note,
                            "×" if paper.measure == "speedup" or paper.measure.startswith("1/") else ""))
    return out


def _trend(a: float, b: float) -> str:
    return "rising" if b > a * 1.005 else "falling" if b < a * 0.995 else "flat"


def _magnitude(measure: str, paper: float, innet: float | None) -> str:
    """How far innet's value is from the paper's: for a speed-up, its gain (value − 1) against the paper's."""
    if innet is None:
        return "unknown (not run)"
    if measure == "speedup" or measure.startswith("1/"):
        gain, theirs = innet - 1, paper - 1
        relative = f", {abs(gain / theirs - 1):.0%} {'larger' if gain > theirs else 'smaller'}" if theirs else ""
        return f"gain {gain:+.0%} against the paper's {theirs:+.0%}{relative}"
    return f"innet {innet / paper:.2f}× the paper's" if paper else "the paper's is 0"


def as_json(paper: Paper, compared: list[Compared]) -> JsonObject:
    """points.json's ``paper``: the table as the file has it, and each point's comparison with its line."""
    return {**{k: v for k, v in asdict(paper).items() if k != "points"},
            "compared": [{**asdict(c), "line": c.line} for c in compared]}


def lines(points: JsonObject) -> list[str]:
    """What ``innet reproduce`` prints from points.json: the paper, its setting and innet's, and one line per
    point."""
    paper = points.get("paper")
    if not paper:
        return []
    out = [f"paper: {paper['citation']}; from its {paper['figure']}", f"  its setting: {paper['setting']}",
           f"  innet's: {points['description']}" + (f" ({points['steady_state']})" if points.get("steady_state") else ""),
           f"  not modelled: {paper['unmodelled']}"]
    out += [f"  not sourced: {paper['unsourced']}"] if paper["unsourced"] else []
    out += [f"  {c['line']}" for c in paper["compared"]]
    out += [f"  not compared: {claim}" for claim in paper["claims"]]
    return out
