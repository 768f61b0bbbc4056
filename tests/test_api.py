"""innet as a library: ``innet.run`` and ``innet.plan``, README's *From Python*, and rules checked before a run."""

import json
import os
import subprocess
import sys

import networkx as nx
import pytest

import innet
from innet.errors import UserError
from innet.planning.spec import RunSpec
from innet.wire.faults import FaultSpec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_issue_one_liner_works_exactly_as_written():
    code = ("import innet; r = innet.run('star', workers=4, elements=10000, backend='local'); "
            "assert r.runs[0].correct")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stderr == "", out.stderr


def test_a_run_gives_typed_records_equal_to_the_command_lines(tmp_path):
    report = innet.run("star", workers=4, elements=10000, backend="local", mode="all")
    assert isinstance(report, innet.Report) and isinstance(report.spec, RunSpec)
    assert [r.mode for r in report.runs] == ["innet", "pbox", "ring"] and report.correct
    r = report.run("innet")
    assert r.correct and r.completion_s > 0 and sum(r.link_bytes.values()) == sum(r.tier_bytes.values())
    assert r.link_bytes == r.predicted_link_bytes and r.fidelity.verdict == "faithful"
    out = subprocess.run([sys.executable, "run_topology.py", "--backend", "local", "--topo", "star", "--workers", "4",
                          "--elements", "10000", "--mode", "all", "--no-plots", "--out", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    cli = json.loads((tmp_path / "results.json").read_text())
    assert cli == json.loads(json.dumps(report.to_json()))  # the same bytes, results, digests and times


def test_plan_predicts_the_bytes_the_run_measures():
    plan = innet.plan("leaf-spine", mode="all", elements=50000)
    assert [m.mode for m in plan.modes] == ["innet", "pbox", "ring"]
    report = innet.run("leaf-spine", mode="all", elements=50000, backend="local")
    for m, r in zip(plan.modes, report.runs, strict=True):
        assert m.predicted_link_bytes == r.link_bytes and m.jobs[0].workers == r.jobs[0].workers
    assert plan.text().startswith("topology leaf-spine-2x2-s1: mode innet")


def test_a_graph_a_file_and_faults_given_one_by_one(tmp_path):
    from topologies import build
    from topologies.files import save_file

    graph = build("leaf-spine", racks=3)
    assert isinstance(graph, nx.Graph)
    by_graph = innet.run(graph, backend="local", elements=20000, loss=0.05, seed=3)
    assert by_graph.spec.faults == FaultSpec(loss=0.05) and by_graph.correct
    save_file(graph, str(tmp_path / "t.json"))
    by_file = innet.run(str(tmp_path / "t.json"), backend="local", elements=20000, faults=FaultSpec(loss=0.05), seed=3)
    assert by_file.runs[0].result_digest == by_graph.runs[0].result_digest
    assert by_file.runs[0].link_bytes == by_graph.runs[0].link_bytes and by_graph.runs[0].retransmissions > 0


@pytest.mark.parametrize("options,message", [
    ({"elemnts": 5}, "unknown option 'elemnts'; did you mean 'elements'?"),
    ({"topo": "star", "k": 4}, "k shapes fat-tree: it means nothing with topo star"),
    ({"loss": 2.0}, "bad fault option: loss must be a probability in [0, 1), got 2.0"),
    ({"out": "/proc/forbidden"}, "out /proc/forbidden: cannot make /proc/forbidden"),
    ({"json": "/proc/forbidden/r.json"}, "json /proc/forbidden/r.json: cannot make /proc/forbidden"),
    ({"mode": "gloo"}, "mode must be one of innet, pbox, ring, all, got 'gloo'"),
    ({"crash": ("h9@1",)}, "crash names 'h9', which is not a host of this topology"),
])
def test_a_broken_rule_is_one_user_error_before_anything_runs(options, message, monkeypatch):
    import innet.backends.local.run as local

    monkeypatch.setattr(local, "run_local", lambda *a, **k: pytest.fail("the run started"))
    with pytest.raises(UserError) as err:
        innet.run(backend="local", **options)
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("flag", ["--out", "--json"])
def test_an_unwritable_output_is_refused_in_one_line_before_the_run(flag, tmp_path):
    path = "/proc/forbidden" + ("/x.json" if flag == "--json" else "")
    out = subprocess.run([sys.executable, "run_topology.py", "--backend", "local", "--elements", "3000000", flag, path],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert (out.returncode, out.stdout) == (2, "")  # nothing ran: no table
    assert out.stderr == f"error: {flag} {path}: cannot make /proc/forbidden: No such file or directory\n"


def readme_block(title: str) -> str:
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    section = text.split(f"\n## {title}\n")[1].split("\n## ")[0]
    return section.split("```python\n")[1].split("```")[0]


def test_the_from_python_example_runs_as_written(tmp_path):
    code = readme_block("From Python")
    assert code.startswith("# file: placements.py\n") and len(code.strip().splitlines()) <= 15
    (tmp_path / "placements.py").write_text(code)
    env = dict(os.environ, PYTHONPATH=ROOT, MPLBACKEND="Agg")
    out = subprocess.run([sys.executable, "placements.py"], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                         env=env)
    assert out.returncode == 0, out.stderr
    root, tor = out.stdout.splitlines()
    assert root.startswith("root: correct=True ") and root.endswith(" 2417400 B across racks")  # what README says
    assert tor.startswith("tor: correct=True ") and tor.endswith(" 1611600 B across racks")
    assert (tmp_path / "placements.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
