"""``innet reproduce``: every shipped experiment runs (its quick sweep), its CSV and JSON hold one row per
point with the values a direct ``innet run`` of the same command line gives, and its figure is drawn; a bad
experiment file is one line."""

import csv
import json
import os
import re
import subprocess
import sys

import pytest

from innet.errors import UserError
from innet.experiments.file import load, shipped

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEEDS = ["phub", "topk", "ensemble", "pipesgd", "p3", "ssp", "canary", "fsdp"]


def innet(*args, cwd=None):
    """``innet ARGS``; its output decoded as it is (text mode would turn the progress bar's \\r into \\n)."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, "-m", "innet", *args], capture_output=True, cwd=cwd or ROOT, env=env, timeout=900)
    return subprocess.CompletedProcess(out.args, out.returncode, out.stdout.decode(), out.stderr.decode())


def test_one_experiment_per_seed_result_is_shipped_and_listed():
    assert sorted(shipped()) == sorted(SEEDS)
    out = innet("reproduce", "--list")
    assert out.returncode == 0
    assert [line.split()[0] for line in out.stdout.splitlines()] == sorted(SEEDS)
    assert all(len(line.split()) > 3 for line in out.stdout.splitlines())


@pytest.mark.slow
@pytest.mark.parametrize("name", SEEDS)
def test_each_experiment_runs_and_matches_a_direct_run(name, tmp_path, reproduced):
    """The full sweep (run once, shared with tests/test_readme_reproduce.py, which checks README's figures)."""
    experiment = load(name)
    out, folder = reproduced(name)
    assert out.returncode == 0, out.stderr
    points = len(experiment.values) * len(experiment.series)
    # the progress bar (tqdm): one line redrawn in place, ending at points/points with the last point's label
    # a point slow enough on a loaded machine also logs its own status lines ("local: virtual time ..."): aside
    bar = re.sub(r"(local|innet): [^\r\n]*\n", "", out.stderr)  # and the run's events (an ensemble's one-job note)
    last = bar.rstrip("\n").split("\r")[-1]
    assert "\n" not in bar.rstrip("\n") and bar.endswith("\n")
    assert f" {points}/{points} " in last and last.endswith(f"{experiment.option}={experiment.values[-1]} "
                                                              f"{list(experiment.series)[-1]}]")
    files = [folder / f for f in ("points.csv", "points.json", f"{name}.png")]
    assert out.stdout.endswith(f"results: {', '.join(map(str, files))}\n")
    assert files[2].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with open(files[0]) as f:
        rows = list(csv.DictReader(f))
    data = json.loads(files[1].read_text())
    ratios = [f"{m}/{experiment.baseline}" for m in experiment.metrics if experiment.baseline]
    best = ["best"] if any("best" in own for own in experiment.series.values()) else []  # which variant won
    assert list(rows[0]) == ["series", experiment.option, *experiment.metrics, "correct", "command", *best, *ratios]
    assert [(r["series"], r[experiment.option]) for r in rows] == [
        (s, str(v)) for v in experiment.values for s in experiment.series]
    assert [{k: "" if v is None else str(v) for k, v in p.items() if k not in ("paper", "innet")}
            for p in data["points"]] == rows
    # the paper beside innet: printed first, one line per point, and in points.json beside the row it stands by
    from innet.experiments.paper import lines

    assert out.stdout.splitlines()[:-1] == lines(data) and data["paper"]["citation"] == experiment.paper.citation
    compared = data["paper"]["compared"]
    assert [c["series"] for c in compared] == [p.series for p in experiment.paper.points]
    for c in compared:
        assert f"  {c['line']}" in out.stdout.splitlines()
        beside = [p for p in data["points"] if p["series"] == c["series"] and p[experiment.option] == c["x"]]
        assert c["innet"] is None and not beside or beside[0]["innet"] == {experiment.paper.measure: c["innet"]}
    from innet.experiments.report import steady_state

    assert data.get("steady_state", "") == steady_state(experiment)
    assert all(p["correct"] is True for p in data["points"])
    for p in data["points"]:
        base = next(b for b in data["points"] if b["series"] == experiment.baseline_of(p["series"])
                    and b[experiment.option] == p[experiment.option]) if experiment.baseline else None
        for m in experiment.metrics:
            assert isinstance(p[m], int | float), (m, p)
            if base and base[m]:
                assert p[f"{m}/{experiment.baseline}"] == pytest.approx(p[m] / base[m])
    # the last point, run directly as its command line says
    last = data["points"][-1]
    argv = last["command"].split()
    assert argv[:4] == ["innet", "run", "--backend", "local"]
    direct = innet(*argv[1:], "--no-plots", "--out", str(tmp_path / "direct"))
    assert direct.returncode == 0, direct.stderr
    [record] = json.loads((tmp_path / "direct" / "results.json").read_text())["runs"]

    def read(name):  # results.json by name: what the point's typed record said must be what the file says
        if name == "total_bytes":
            return sum(record["link_bytes"].values())
        value = record
        for part in name.split("."):
            value = value[part]
        return value

    assert {m: read(m) for m in experiment.metrics} == {m: last[m] for m in experiment.metrics}


@pytest.mark.parametrize("name", SEEDS)
def test_every_experiment_names_its_paper(name):
    """Every shipped experiment (the seed papers' first) carries [paper]: its citation, where its points are from,
    the paper's setting, what innet cannot model; its points only where a source gives them (unsourced says what
    is missing)."""
    paper = load(name).paper
    assert paper is not None and all([paper.citation, paper.figure, paper.setting, paper.measure, paper.unmodelled])
    assert paper.points or paper.claims or paper.unsourced
    assert all(p.source for p in paper.points)
    assert bool(paper.points) == (name in ("p3", "pipesgd", "canary", "phub"))  # the ones with a series to stand beside


def test_a_paper_point_is_compared_in_shape_and_magnitude():
    from innet.experiments.paper import Paper, PaperPoint, compare

    paper = Paper("c", "Figure 1", "s", "speedup", "u", points=(
        PaperPoint("fast", 10, 1.5, "Fig. 1"), PaperPoint("fast", 100, 1.2, "Fig. 1"), PaperPoint("fast", "peak", 1.66, "abstract")))
    rows = [{"series": "fast", "bw": bw} for bw in (10, 100, 1000)]
    speedups = {"fast": {"10": 1.25, "100": 1.3, "1000": 0.9}}
    one, two, peak = compare(paper, "bw", rows, speedups, lambda s: "slow")
    assert one.line == ("fast at 10: paper 1.5×, innet 1.25×; shape agrees: fast ahead in both; "
                        "magnitude gain +25% against the paper's +50%, 50% smaller")
    assert two.line == ("fast at 100: paper 1.2×, innet 1.3×; shape agrees: fast ahead in both; the paper falling "
                        "from 10, innet rising; magnitude gain +30% against the paper's +20%, 50% larger")
    assert (peak.x, peak.innet) == (100, 1.3) and peak.line.startswith("fast at peak (innet's at 100): paper 1.66×")
    [behind] = compare(Paper("c", "f", "s", "speedup", "u", points=(PaperPoint("fast", 1000, 1.1, "x"),)), "bw", rows,
                       speedups, lambda s: "slow")
    assert "shape differs: the paper has fast ahead, innet slow" in behind.line


def test_the_table_says_how_many_warmup_iterations_its_figures_leave_out():
    """A workload's per-iteration figures are the steady state (innet.hosts.training.warmup): the caption and
    points.json say how many iterations were left out."""
    from innet.experiments.report import steady_state

    assert steady_state(load("p3")) == "steady state: 1 warm-up iteration of 2 left out"
    assert steady_state(load("fsdp")) == "steady state: 1 warm-up iteration of 2 left out"
    assert steady_state(load("phub")) == ""  # no per-iteration figure


def test_the_summary_has_speedups_and_the_topk_break_even(tmp_path):
    from innet.experiments.report import crossing, summary

    experiment = load("topk")
    rows = [{"series": "dense", "topk": d, "completion_s/dense": 1.0, "total_bytes/dense": 1.0} for d in (0.1, 0.3)]
    rows += [{"series": "sparse", "topk": 0.1, "completion_s/dense": 0.5, "total_bytes/dense": 0.49},
             {"series": "sparse", "topk": 0.3, "completion_s/dense": 1.0, "total_bytes/dense": 1.0}]
    assert summary(experiment, rows) == {"speedup": {"sparse": {"0.1": 2.0, "0.3": 1.0}},
                                         "breakeven": {"sparse": pytest.approx(0.1 + 0.5 / 0.51 * 0.2)}}
    assert crossing([(0.1, 0.5), (0.2, 0.6)]) is None
    ssp = load("ssp")  # a rate: the gain is this series' over the baseline's
    rows = [{"series": s, "staleness": 1, "iterations_per_s/bsp": g} for s, g in (("bsp", 1.0), ("ssp", 1.3), ("asp", 2.0))]
    assert summary(ssp, rows) == {"speedup": {"ssp": {"1": 1.3}, "asp": {"1": 2.0}}}


GOOD = '''description = "a test"
[run]
topo = "star"
elements = 2000
[series]
innet = { mode = "innet" }
pbox = { mode = "pbox" }
[sweep]
option = "bw"
values = [10, 100]
[report]
metrics = ["completion_s"]
'''


@pytest.mark.parametrize("change,message", [
    (("[run]", "[run"), "not valid TOML: "),
    (("[run]", "colour = 1\n[run]"), "unknown key 'colour'; an experiment has description, run, series, sweep, report, paper"),
    (('metrics = ["completion_s"]', 'metrics = ["completion_s"]\n[paper]\ncitation = "x"'), "[paper] needs figure (a string)"),
    (('metrics = ["completion_s"]', 'metrics = ["completion_s"]\n[paper]\ncitation = "x"\nfigure = "1"\nsetting = "s"\n'
      'measure = "completion_s"\nunmodelled = "u"\npoints = [{ series = "ring", at = 10, value = 1, source = "s" }]'),
     "[paper] point series 'ring' is not a series"),
    (('metrics = ["completion_s"]', 'metrics = ["completion_s"]\n[paper]\ncitation = "x"\nfigure = "1"\nsetting = "s"\n'
      'measure = "speedup"\nunmodelled = "u"'), "[paper] measure 'speedup' is not speedup (with a baseline) or a column"),
    (("elements = 2000", "elements = 2000\nspeed = 3"), "unknown key 'speed' in [run]: not an option of innet.run"),
    (('{ mode = "pbox" }', '{ mode = "pbox", turbo = true }'), "unknown key 'turbo' in [series.pbox]: not an option of innet.run"),
    (("values = [10, 100]", "values = [10, -5]"), "series innet, bw=-5: bw must be between 0.001 and 1e+07, got -5"),
    (("values = [10, 100]", "values = [10, 'fast']"), "series innet, bw=fast: bw must be a finite number, got 'fast'"),
    (("values = [10, 100]", "values = []"), "[sweep] values must be a non-empty list of numbers or names"),
    (("values = [10, 100]", "values = [{a = 1}]"), "[sweep] values must be a non-empty list of numbers or names"),
    (('option = "bw"', 'option = "speed"'), "[sweep] option 'speed' is not an option of innet.run"),
    (('option = "bw"', 'option = "k"'), "series innet, k=10: k shapes fat-tree: it means nothing with topo star"),
    (('{ mode = "pbox" }', '{ mode = "bus" }'), "series pbox, bw=10: mode must be one of innet, pbox, ring, all, got 'bus'"),
    (("elements = 2000", "pool-slots = 16"), "unknown key 'pool-slots' in [run]: not an option of innet.run (the option is 'pool_slots')"),
    (('metrics = ["completion_s"]', 'metrics = ["completion_s"]\nbaseline = "ring"'), "[report] baseline 'ring' is not a series"),
    (('metrics = ["completion_s"]', 'metrics = []'), "[report] metrics must be a non-empty list of run record fields"),
    (('metrics = ["completion_s"]', 'metrics = ["completion_s"]\nplot = ["bytes"]'),
     "[report] plot: 'bytes' is not a column; the columns are completion_s"),
    (('metrics = ["completion_s"]', 'metrics = ["completion_s"]\ncolour = 1'),
     "unknown key 'colour' in [report]; it takes baseline, breakeven, log_x, metrics, plot"),
    (('description = "a test"\n', ''), "missing description"),
    (('{ mode = "pbox" }', '{ mode = "pbox", best = [] }'), "series pbox: best must be a non-empty list of tables of options"),
    (('{ mode = "pbox" }', '{ mode = "pbox", best = [{ turbo = 1 }] }'),
     "unknown key 'turbo' in [series.pbox.best]: not an option of innet.run"),
    (('{ mode = "pbox" }', '{ best = [{ mode = "pbox" }, { mode = "bus" }] }'),
     "series pbox (mode=bus), bw=10: mode must be one of innet, pbox, ring, all, got 'bus'"),
])
def test_a_bad_experiment_file_is_one_user_error_naming_it(change, message, tmp_path):
    """Every point is prepared as the file loads: a bad one is refused before any runs."""
    path = tmp_path / "bad.toml"
    path.write_text(GOOD.replace(*change))
    with pytest.raises(UserError) as err:
        load(str(path))
    line = str(err.value)
    assert "\n" not in line and line.split(": ", 1)[0].endswith("bad.toml") and message in line, line


def test_a_bad_experiment_file_is_one_line_on_the_command_line_and_nothing_is_made(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(GOOD.replace("values = [10, 100]", "values = [10, -5]"))
    out = innet("reproduce", str(path), "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.splitlines() == ["error: bad.toml: series innet, bw=-5: bw must be between 0.001 and 1e+07, got -5"]
    assert not (tmp_path / "out").exists()


def test_an_unknown_experiment_name_is_one_line():
    out = innet("reproduce", "phubb")
    assert (out.returncode, out.stderr) == (2, "error: unknown experiment 'phubb'; choose one of "
                                               f"{', '.join(sorted(SEEDS))} or give a .toml file\n")
    out = innet("reproduce")
    assert out.returncode == 2 and out.stderr.startswith("error: name an experiment")


def test_a_good_file_of_ones_own_runs(tmp_path):
    (tmp_path / "mine.toml").write_text(GOOD)
    out = innet("reproduce", "mine.toml", "--out", "o", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    with open(tmp_path / "o" / "points.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["series"], r["bw"]) for r in rows] == [("innet", "10"), ("pbox", "10"), ("innet", "100"), ("pbox", "100")]
    times = {(r["series"], r["bw"]): float(r["completion_s"]) for r in rows}
    assert times["innet", "10"] > 5 * times["innet", "100"]  # ten times the bandwidth, far less time
    assert sorted(os.listdir(tmp_path / "o" / "runs")) == ["innet-10", "innet-100", "pbox-10", "pbox-100"]
    # the default runs a point per core at once, each in its own process: one at a time gives the same table
    assert innet("reproduce", "mine.toml", "--out", "one", "--jobs", "1", cwd=tmp_path).returncode == 0
    assert (tmp_path / "one" / "points.csv").read_text() == (tmp_path / "o" / "points.csv").read_text().replace(
        str(tmp_path / "o"), str(tmp_path / "one"))
    out = innet("reproduce", "mine.toml", "--jobs", "0", cwd=tmp_path)
    assert (out.returncode, out.stderr) == (2, "error: argument --jobs: jobs must be a whole number of at least 1, "
                                               "got '0' (see --help)\n")


def test_a_point_that_fails_in_a_pool_keeps_the_points_before_it_and_leaves_no_process(tmp_path):
    """Points run two at a time: the third point's failure (a ring through a program whose handler raises, as a
    run that fails once traffic flows would) is the same line as one at a time, and the pool's processes have
    ended."""
    import multiprocessing

    from innet.errors import UserError
    from innet.experiments.sweep import reproduce
    from tests.test_program_errors import ROUTED

    (tmp_path / "bad.py").write_text(ROUTED.format("ctx.rout(pkt)"))
    (tmp_path / "mine.toml").write_text(GOOD.replace('pbox = { mode = "pbox" }', 'pbox = { mode = "pbox" }\n'
                                                     f'bad = {{ mode = "ring", program = "{tmp_path / "bad.py"}" }}'))
    with pytest.raises(UserError) as caught:
        reproduce(load(str(tmp_path / "mine.toml")), out=str(tmp_path / "o"), jobs=2)
    assert str(caught.value).startswith(f"innet run --backend local --topo star --elements 2000 --bw 10 --mode ring "
                                        f"--program {tmp_path / 'bad.py'}: program bad ({tmp_path / 'bad.py'}): handler "
                                        "Bad.forward raised AttributeError at line 9")
    assert str(caught.value).endswith(f"; the 2 point(s) before it are in {tmp_path / 'o' / 'points.csv'}")
    assert multiprocessing.active_children() == []


def test_a_point_that_fails_keeps_the_points_before_it(tmp_path, monkeypatch):
    """Each point is written as it comes: a later point's failure (here the third run's, as a run that fails once
    traffic flows would) costs only itself, and its line says where the earlier ones are."""
    from innet.errors import UserError
    from innet.experiments import sweep

    real, calls = sweep.run_point, []

    def third_fails(argv, out):
        calls.append(argv)
        if len(calls) == 3:
            raise UserError("program raises.py: handler add raised RuntimeError at line 9")
        return real(argv, out)

    monkeypatch.setattr(sweep, "run_point", third_fails)
    (tmp_path / "mine.toml").write_text(GOOD)
    with pytest.raises(UserError) as caught:
        sweep.reproduce(load(str(tmp_path / "mine.toml")), out=str(tmp_path / "o"))
    assert str(caught.value) == ("program raises.py: handler add raised RuntimeError at line 9; the 2 point(s) before it "
                                 f"are in {tmp_path / 'o' / 'points.csv'}")
    with open(tmp_path / "o" / "points.csv") as f:
        assert [(r["series"], r["bw"]) for r in csv.DictReader(f)] == [("innet", "10"), ("pbox", "10")]


def test_a_figure_that_cannot_be_drawn_leaves_the_table_and_says_so(tmp_path, monkeypatch, said):
    from innet.experiments import report
    from innet.experiments.sweep import reproduce

    def broken(*_, **__):
        raise ValueError("cannot plot this")

    monkeypatch.setattr(report, "plot_sweep", broken)
    (tmp_path / "mine.toml").write_text(GOOD)
    files = reproduce(load(str(tmp_path / "mine.toml")), quick=True, out=str(tmp_path / "o"))
    assert [os.path.basename(f) for f in files] == ["points.csv", "points.json"]
    assert [e.message for e in said if e.kind == "warning"] == [
        f"mine: the figure was not drawn (ValueError: cannot plot this); the table is in {tmp_path / 'o' / 'points.csv'}"]


def test_a_best_of_series_keeps_the_fastest_variant_and_says_which(tmp_path):
    """``best = [...]``: each variant runs at every point; the row is the fastest one's, its ``best`` column the
    variant's flags; every variant's run is kept."""
    (tmp_path / "best.toml").write_text(GOOD.replace('pbox = { mode = "pbox" }',
                                                     'best = { best = [{ mode = "pbox" }, { mode = "innet" }] }'))
    out = innet("reproduce", "best.toml", "--out", "o", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    with open(tmp_path / "o" / "points.csv") as f:
        rows = {(r["series"], r["bw"]): r for r in csv.DictReader(f)}
    for bw in ("10", "100"):
        assert rows["best", bw]["best"] == "mode=innet" and rows["innet", bw]["best"] == ""
        assert rows["best", bw]["completion_s"] == rows["innet", bw]["completion_s"]
        assert "--mode innet" in rows["best", bw]["command"]
    assert sorted(os.listdir(tmp_path / "o" / "runs")) == [
        "best-10-mode=pbox", "best-100-mode=pbox", "innet-10", "innet-100"]  # a variant that is another series' point runs once
