"""``innet.prepare``: the one place a run is made ready. Every option's type, range and choice is refused in one
``UserError`` line before anything is built; a hand-built graph is completed and checked as a file is; the
program file runs once and every job is placed once per run; a backend takes what preparing made."""

import math

import networkx as nx
import numpy as np
import pytest

import innet
from innet import api
from innet.errors import UserError
from innet.schemes import modes

# (options, words the one line must hold): wrong types, unknown choices, numbers that are not finite or out of range
BAD = [
    ({"elements": "100"}, "elements must be a whole number"),
    ({"elements": 10.5}, "elements must be a whole number"),
    ({"elements": True}, "elements must be a whole number"),
    ({"elements": 0}, "elements must be between 1"),
    ({"iterations": 10**20}, "iterations must be between 1 and 1e+06"),
    ({"workers": "4"}, "workers must be a whole number"),
    ({"seed": -1}, "seed must be a non-negative integer"),
    ({"seed": 1.5}, "seed must be a whole number"),
    ({"placement": "bogus"}, "placement must be one of auto, root, tor, tree, pbox, dynamic"),
    ({"collective": "bogus"}, "collective must be one of allreduce"),
    ({"consistency": "bogus"}, "consistency must be one of bsp, ssp, asp"),
    ({"mode": "bogus"}, "mode must be one of innet, pbox, ring, all"),
    ({"overlap": "bogus"}, "overlap must be one of layers, none"),
    ({"priority": "bogus"}, "priority must be one of fifo, p3"),
    ({"workload": "bogus"}, "workload must be one of"),
    ({"pipeline": 3}, "pipeline must be one of 1, 2"),
    ({"backend": "bogus"}, "backend must be one of mininet, local, gloo"),
    ({"loss": "0.1"}, "loss must be a finite number"),
    ({"loss": 1.5}, "loss must be a probability in [0, 1)"),
    ({"delay": math.nan}, "delay must be a finite number"),
    ({"delay": math.inf}, "delay must be a finite number"),
    ({"reorder": -0.1}, "reorder must be a probability"),
    ({"faults": "loss"}, "faults must be FaultSpec"),
    ({"out": 123}, "out must be text"),
    ({"json": ["x"]}, "json must be text"),
    ({"plots": "no"}, "plots must be True or False"),
    ({"timeout": math.nan}, "timeout must be a finite number"),
    ({"timeout": math.inf}, "timeout must be a finite number"),
    ({"timeout": 0}, "timeout must be between"),
    ({"min_rto": -1}, "min_rto must be between 0"),
    ({"initial_rto": math.nan}, "initial_rto must be a finite number"),
    ({"compute_scale": 1e308}, "compute_scale must be between 0 and 1e+09"),
    ({"compute_time": math.inf}, "compute_time must be a finite number"),
    ({"switch_memory": -1}, "switch_memory must be between 0"),
    ({"pbox_cores": 10**20}, "pbox_cores must be between 1 and 256"),
    ({"input_elements": 10**20}, "input_elements must be between 0"),
    ({"topk": 2.0}, "topk must be a fraction in [0, 1]"),
    ({"dilation": "fast"}, "dilation wants auto, off or a factor of at least 1"),
    ({"crash": "h1@2"}, "crash takes a list of values"),
    ({"stragglers": "h1:2"}, "stragglers takes a list of values"),
    ({"hop_latency": -1.0, "predict": True}, "hop_latency must be between 0"),
    ({"bw": math.inf}, "bw must be a finite number"),
    ({"bw": 0}, "bw must be between"),
    ({"topo": "fat-tree", "k": 200}, "k must be between 2 and 64"),
    ({"bogus": 1}, "unknown option 'bogus'"),
    ({"program": "no_such_program"}, "unknown program 'no_such_program'"),
]


@pytest.mark.parametrize("options, words", BAD, ids=[next(iter(o)) + "=" + repr(next(iter(o.values())))[:20] for o, _ in BAD])
def test_a_bad_option_to_innet_run_is_one_line_naming_it(options, words):
    options = {"topo": "star", "backend": "local", "plots": False, **options}
    with pytest.raises(UserError) as caught:
        innet.run(**options)
    line = str(caught.value)
    assert words in line and "\n" not in line, line


def test_a_hand_built_graph_with_roles_and_bw_only_runs():
    g = nx.Graph(name="mine")
    g.add_nodes_from(["h1", "h2", "h3"], role="host")
    g.add_node("s1", role="tor")
    g.add_edges_from((h, "s1") for h in ["h1", "h2", "h3"])
    nx.set_edge_attributes(g, 100.0, "bw")
    report = innet.run(g, backend="local", elements=5000, plots=False)
    assert report.runs[0].correct and report.runs[0].workers == 3
    assert set(report.runs[0].link_bytes) == {"h1--s1", "h2--s1", "h3--s1"}


def test_a_graph_without_roles_gets_them_as_a_file_would():
    g = nx.Graph()
    g.add_edges_from([("h1", "s1"), ("h2", "s1"), ("s1", "s2"), ("s2", "h3"), ("s2", "h4")], bw=50, delay="1ms")
    prepared = innet.prepare(g, backend="local", elements=5000)
    roles = dict(prepared.graph.nodes(data="role"))
    assert roles == {"h1": "host", "h2": "host", "h3": "host", "h4": "host", "s1": "tor", "s2": "tor"}
    assert prepared.graph.edges["s1", "s2"]["latency"] == pytest.approx(0.001)
    assert "role" not in g.nodes["h1"]  # the user's graph is left as it was
    assert innet.run(prepared).runs[0].correct


@pytest.mark.parametrize("attrs, words", [
    ({"bw": True}, "non-numeric bw or latency"),
    ({"bw": math.inf}, "finite bw > 0"),
    ({"bw": 0}, "finite bw > 0"),
    ({"bw": "fast"}, "non-numeric bw or latency"),
    ({"bw": 10, "latency": math.nan}, "finite latency >= 0"),
])
def test_a_graph_with_bad_link_attributes_is_refused_in_one_line(attrs, words):
    g = nx.Graph()
    g.add_edges_from([("h1", "s1"), ("h2", "s1")], **attrs)
    with pytest.raises(UserError, match=words):
        innet.prepare(g, backend="local")


def test_bw_with_a_given_graph_is_refused_rather_than_ignored():
    g = nx.Graph()
    g.add_edges_from([("h1", "s1"), ("h2", "s1")], bw=100)
    with pytest.raises(UserError, match="bw sizes a topology innet builds"):
        innet.run(g, backend="local", bw=10)


def test_the_program_file_runs_once_and_every_job_is_placed_once_per_run(tmp_path, monkeypatch):
    counter = tmp_path / "count"
    program = tmp_path / "counted_sum.py"
    program.write_text(
        "import pathlib\n"
        f"p = pathlib.Path({str(counter)!r}); p.write_text(str(int(p.read_text() or 0) + 1) if p.exists() else '1')\n"
        "from innet import SUM, Reduction\n\n\nclass CountedSum(Reduction):\n    operator = SUM\n")
    placed = []
    real = modes.place_jobs
    monkeypatch.setattr(modes, "place_jobs", lambda *a, **k: placed.append(a[1].mode) or real(*a, **k))
    report = innet.run("star", workers=4, backend="local", program=str(program), mode="all", elements=3000,
                       predict=True, plots=False)
    assert [r.correct for r in report.runs] == [True, True, True]
    assert counter.read_text() == "1"
    assert placed == ["innet", "pbox", "ring"]


def test_a_prepared_run_is_what_runs_and_takes_no_options():
    prepared = innet.prepare("star", workers=4, backend="local", elements=4096, seed=3)
    assert [m.spec.mode for m in prepared.runs] == ["innet"] and prepared.runs[0].spec.backend == "local"
    first, again = innet.run(prepared), innet.run(prepared)
    assert first.runs[0].result_digest == again.runs[0].result_digest
    with pytest.raises(UserError, match="a prepared run takes no options"):
        innet.run(prepared, elements=10)


def test_backends_are_a_registry_and_events_reach_on_event(monkeypatch):
    heard, ran = [], []

    def local(prepared, m):
        ran.append(m.spec.mode)
        api.emit("phase", f"running {m.spec.mode}")
        return api._local(prepared, m)

    monkeypatch.setitem(api.BACKENDS, "local", local)
    report = innet.run("star", workers=4, backend="local", elements=2048, mode="all", plots=False, on_event=heard.append)
    assert ran == ["innet", "pbox", "ring"] and all(r.correct for r in report.runs)
    assert [(e.kind, e.message) for e in heard] == [("phase", f"running {m}") for m in ran]
    assert np.all([r.backend == "local" for r in report.runs])


def test_readmes_own_graph_example_runs_as_written(tmp_path):
    """README's *From Python*: the second example, a hand-built graph prepared then run, events printed."""
    import os
    import re
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "README.md")) as f:
        section = f.read().split("\n## From Python\n")[1].split("\n## ")[0]
    code = re.findall(r"```python\n(.*?)```", section, re.S)[1]
    assert code.startswith("# file: mygraph.py\n")
    (tmp_path / "mygraph.py").write_text(code)
    out = subprocess.run([sys.executable, "mygraph.py"], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, PYTHONPATH=root))
    assert out.returncode == 0, out.stderr
    *said, last = out.stdout.splitlines()
    assert last.startswith("True {'h1--s1': ") and set(re.findall(r"'(h\d--s1)'", last)) == {"h1--s1", "h2--s1", "h3--s1"}
    assert all(line.split()[0] in ("phase", "progress", "warning", "fidelity") for line in said)


@pytest.mark.parametrize("options", [{}, {"placement": "tor"}, {"placement": "root"}, {"mode": "all"}])
def test_a_program_that_cannot_aggregate_is_refused_for_an_in_network_run(options):
    """Not reported as an in-network run the PBox summed: refused in one line before anything is built."""
    with pytest.raises(UserError, match="program forward keeps no slot pool, so it cannot aggregate"):
        innet.prepare("star", backend="local", program="forward", **options)
    for fine in ({"placement": "pbox"}, {"mode": "pbox"}, {"mode": "ring"}):  # said outright: runs as said
        assert innet.prepare("star", backend="local", program="forward", **fine).runs


def test_a_job_that_falls_back_to_the_pbox_is_said_and_recorded_as_asked_and_as_ran():
    heard = []
    r = innet.run("star", backend="local", workers=4, elements=20000, jobs=2, job_slots=128, plots=False,
                  on_event=heard.append).runs[0]
    assert r.correct and r.fallbacks == 1 and r.placement == "pbox+tor"
    assert r.figures["requested_placement"] == "auto" and r.to_json()["requested_placement"] == "auto"
    assert [(e.kind, e.message) for e in heard] == [("warning", "innet: 1 of 2 job(s) fell back to the PBox (switch memory "
                                                                "full, aggregated by p1): placement auto was asked, pbox+tor ran")]


def test_a_job_that_does_not_fit_in_switch_memory_is_refused_while_preparing(monkeypatch):
    from innet.backends.local import run as local

    monkeypatch.setattr(local, "LocalRun", None)  # nothing may be built
    with pytest.raises(UserError, match="switch s1 has 20000"):
        innet.run("star", backend="local", elements=100000, switch_memory=20000)


def test_mode_all_keeps_the_runs_that_finished_when_a_later_one_fails(tmp_path):
    """The PBox's and the ring's packets are routed through the switches: a routed handler that raises fails them,
    after the in-network run finished. That run is kept (results.json) and the one line says where."""
    program = tmp_path / "routed_raises.py"
    program.write_text("from innet import SUM, Reduction, on_packet\n\n\nclass RoutedRaises(Reduction):\n"
                       "    operator = SUM\n\n    @on_packet('routed')\n    def route(self, ctx, pkt):\n"
                       "        raise RuntimeError('not today')\n")
    out = tmp_path / "out"
    with pytest.raises(UserError) as caught:
        innet.run("star", backend="local", workers=4, elements=4096, mode="all", program=str(program), out=str(out),
                  plots=False)
    line = str(caught.value)
    assert "not today" in line and f"the finished run(s) innet were kept in {out}" in line and "\n" not in line
    import json

    kept = json.loads((out / "results.json").read_text())
    assert [r["mode"] for r in kept["runs"]] == ["innet"] and kept["runs"][0]["correct"] is True


def test_mode_all_on_a_topology_without_a_pbox_is_refused_before_any_run():
    g = nx.Graph()
    g.add_nodes_from(["h1", "h2", "h3"], role="host")
    g.add_node("s1", role="tor")
    g.add_edges_from(((h, "s1") for h in ["h1", "h2", "h3"]), bw=100)
    with pytest.raises(UserError, match="pbox|PBox"):
        innet.prepare(g, backend="local", mode="all")


def test_a_full_disk_after_the_run_is_one_line_not_a_traceback(tmp_path, monkeypatch):
    import errno

    from innet.results import report

    def full(path, text):
        raise OSError(errno.ENOSPC, "No space left on device", path)

    monkeypatch.setattr(report, "write_text_atomic", full)
    with pytest.raises(UserError) as caught:
        innet.run("star", backend="local", elements=1000, out=str(tmp_path / "o"), plots=False)
    assert str(caught.value).startswith(f"cannot write the results: No space left on device ({tmp_path / 'o'}")
