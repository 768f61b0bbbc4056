"""The figures README shows (``innet reproduce``'s and a run's plots) label their axes in words and units --
seconds, MB, Mbit/s -- not with field names, and draw bytes in MB (no ``1e7`` offset on the axis)."""

import matplotlib
import pytest

matplotlib.use("Agg")

from matplotlib.figure import Figure  # noqa: E402

from innet.experiments.file import load, shipped  # noqa: E402
from innet.experiments.report import write_outputs  # noqa: E402
from innet.results import plots  # noqa: E402
from innet.results.plots import axis_label  # noqa: E402


def in_words(label: str, fields: set[str]) -> bool:
    """Not a field name (``completion_s``, ``cross_rack_bytes``, ``hosts_per_rack``, ``input.bytes``) nor built of one."""
    return bool(label) and label not in fields and "_" not in label and not any(f in label for f in fields if "-" in f or "." in f)


@pytest.fixture()
def drawn(monkeypatch):
    """Every figure saved while the test runs, as [(xlabel, ylabel, y values drawn)] per axes, in order."""
    saved: list[list[tuple[str, str, list[float]]]] = []
    original = Figure.savefig

    def savefig(fig, *args, **kwargs):
        panels = []
        for ax in fig.axes:
            if ax.get_label() == "<colorbar>":
                panels.append(("", ax.get_ylabel(), []))
                continue
            ys = [float(y) for line in ax.get_lines() for y in line.get_ydata()]
            ys += [float(p.get_height()) for p in ax.patches if hasattr(p, "get_height")]  # bars, not a graph's arrows
            panels.append((ax.get_xlabel(), ax.get_ylabel(), ys))
        saved.append(panels)
        return original(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", savefig)
    return saved


def fake_rows(name: str) -> list[dict]:
    """Rows as ``innet reproduce NAME`` writes them, figures of a plausible size (bytes in the millions)."""
    exp = load(name)
    rows = []
    for k, value in enumerate(exp.values):
        for i, series in enumerate(exp.series):
            row = {"series": series, exp.option: value}
            for m in exp.metrics:
                big = m.endswith("bytes")
                row[m] = (4.4e6 if big else 0.5) * (1 + k) * (1 + i)
            rows.append(row)
    from innet.experiments.report import rows_with_ratios

    return rows_with_ratios(exp, rows)


@pytest.mark.parametrize("name", sorted(shipped()))
def test_each_experiments_figure_labels_its_axes_in_words_and_units(name, drawn, tmp_path):
    exp = load(name)
    rows = fake_rows(name)
    write_outputs(exp, rows, str(tmp_path))
    [panels] = drawn
    fields = set(rows[0])
    for xlabel, ylabel, ys in panels:
        for label in (xlabel, ylabel):
            assert in_words(label, fields), label
        if ylabel.endswith("(MB)"):
            assert ys and max(ys) < 1e3, (ylabel, ys)  # drawn in MB: no 1e7 offset on the axis
        if ylabel.endswith("(s)") or "÷" in ylabel or "per second" in ylabel:
            assert ys and max(ys) < 1e3
    assert any(x for x, _, _ in panels)


def test_phubs_figure_reads_seconds_mb_and_workers_per_rack(drawn, tmp_path):
    write_outputs(load("phub"), fake_rows("phub"), str(tmp_path))
    [panels] = drawn
    assert [(x, y) for x, y, _ in panels] == [("workers per rack", "completion time (s)"),
                                               ("workers per rack", "cross-rack traffic (MB)"),
                                               ("workers per rack", "completion time, ÷ stock's"),
                                               ("workers per rack", "speed-up over the baseline (×)")]
    assert max(panels[1][2]) == pytest.approx(4.4 * 5 * 4)  # 4.4e6 bytes × point 5 × series 4, in MB


def test_a_field_without_an_entry_is_still_named_in_words_and_units():
    assert axis_label("bw") == ("link rate (Mbit/s)", 1.0)
    assert axis_label("tor_spine_bytes") == ("tor spine (MB)", 1e-6)
    assert axis_label("setup_s") == ("setup (s)", 1.0)
    assert axis_label("frames_per_s") == ("frames per second", 1.0)
    assert axis_label("total_bytes/dense") == ("traffic on all links, ÷ dense's", 1.0)


def test_a_runs_plots_label_their_axes(drawn, tmp_path):
    from innet.backends.local.run import run_local
    from innet.planning.spec import RunSpec
    from topologies import build

    graph = build("star", workers=3)
    runs = [run_local(graph, RunSpec(elements=4096, mode=m)) for m in ("innet", "pbox")]
    plots.write_plots(graph, runs, str(tmp_path))
    links, tiers = drawn
    assert [y for _, y, _ in links if y] == ["MB on link, each way"]
    [(x, y, ys)] = tiers
    assert x == "tier (the roles of a link's two ends; up: towards the second)" and y == "traffic per tier, up + down (MB)"
    assert 0 < max(ys) < 1e3 and len(ys) == 2 * 2 * 2  # per run and tier, a bar up and one down
