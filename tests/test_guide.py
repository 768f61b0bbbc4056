"""Every command in README.md, run as written: those of the sections with tests of their own are run there; the
performance table's commands are the benchmarks the tests run; README is a guide (at most 600 lines, a link to
its long form at the end of every task's section) and no page of docs/ is orphaned."""

import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# sections whose commands their own tests run as written (or that CI runs itself)
TESTED_ELSEWHERE = {
    "Set-up: two commands": ".ci/run runs make test; make demo is the tour's first command",
    "Topologies": "tests/test_readme.py::test_the_topology_file_commands_run_as_written",
    "Past one machine: a cluster": "tests/test_readme.py::test_the_cluster_commands_run_as_written",
    "Writing a switch program": "tests/test_readme.py::test_each_command_runs_as_written",
    "Reproducing the papers": "tests/test_experiments.py runs each innet reproduce command (its quick sweep)",
    "Training a real model (`--train digits`)": "tests/test_learning.py runs its command",
    "PyTorch: `innet launch`": "tests/test_launch.py runs its launches (2 ranks, 2 epochs), tests/test_ddp.py the hook's",
    "Replaying Chakra traces": "tests/test_chakra.py::test_the_readme_command_replays_the_shipped_example",
    "Scaling up": "tests/test_scale.py::test_the_readme_scaling_commands_run_as_written (the bench at small sizes)",
    "Performance": "tests/test_bench.py runs every benchmark make bench runs, small",
}

# the sections of README that are a task, each ending with a link to its long form in docs/
TASKS = ["Running it", "Reproducing the papers", "Writing a switch program", "Comparing placements and traffic localization",
         "The schemes", "Training a real model (`--train digits`)", "Scaling up", "Faults", "Performance",
         "Troubleshooting", "Tests"]

# each benchmark script the Performance table names -> the test file that runs it (small), by name
BENCH_TESTS = {
    "bench_switch.py": "test_bench.py",
    "bench_allreduce.py": "test_bench.py",
    "bench_blocks.py": "test_bench.py",
    "bench_fabric.py": "test_bench.py",
    "bench_scale.py": "test_scale.py",
    "bench_dilation.py": "test_dilation_mininet.py",
    "ring_vs_gloo.py": "test_torchnet.py",
}


def readme() -> str:
    with open(os.path.join(ROOT, "README.md")) as f:
        return f.read()


def readme_commands() -> list[tuple[str, str]]:
    """(section title, command) for every line of every ``sh`` block, continuation lines joined, comments cut."""
    text = readme()
    found = []
    for part in re.split(r"^(?=#{2,3} )", text, flags=re.M):
        title = part.splitlines()[0].lstrip("#").strip() if part.startswith("#") else ""
        for block in re.findall(r"```sh\n(.*?)```", part, re.S):
            for line in block.replace("\\\n", " ").splitlines():
                command = " ".join(line.split("  #")[0].split())
                if command:
                    found.append((title, command))
    return found


ALL = readme_commands()
TO_RUN = [(t, c) for t, c in ALL if t not in TESTED_ELSEWHERE]


def test_every_readme_command_is_run_by_a_test():
    titles = {t for t, _ in ALL}
    assert set(TESTED_ELSEWHERE) <= titles, "a section named here is gone from README"
    assert len(TO_RUN) >= 15
    for _, command in TO_RUN:
        assert command.split()[:2] in (["python", "run_topology.py"], ["sudo", "python"]), command


def _argv(command: str, out: str) -> tuple[list[str], bool]:
    words = command.split()
    root = words[0] == "sudo"
    words = words[1:] if root else words
    assert words[:2] == ["python", "run_topology.py"], command
    argv = [sys.executable, os.path.join(ROOT, "run_topology.py"), *words[2:]]
    if not {"--plan-only", "--clean"} & set(words):
        argv += ["--out", out, "--no-plots"]
    return argv, root


@pytest.mark.parametrize("command", [pytest.param(c, marks=[pytest.mark.mininet] if c.startswith("sudo ") else [],
                                                  id=f"{t[:20]}:{c[:70]}") for t, c in TO_RUN])
def test_the_guides_command_runs_as_written(command, tmp_path):
    argv, root = _argv(command, str(tmp_path / "out"))
    if root and os.geteuid() != 0:
        pytest.skip("needs root (Mininet)")
    os.symlink(os.path.join(ROOT, "topologies"), tmp_path / "topologies")  # relative topology files, as from a checkout
    out = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    results = tmp_path / "out" / "results.json"
    if "--plan-only" in argv or "--clean" in argv:
        assert not results.exists()
        return
    runs = json.loads(results.read_text())["runs"]
    assert runs and all(r["correct"] for r in runs), [(r["mode"], r.get("errors")) for r in runs if not r["correct"]]


def sections() -> dict[str, str]:
    """README's ``## `` sections by title, each with its ``###`` subsections."""
    parts = re.split(r"^## ", readme(), flags=re.M)[1:]
    return {p.splitlines()[0].strip(): p for p in parts}


def test_readme_is_a_guide_of_at_most_600_lines_with_a_section_per_task():
    text = readme()
    assert text.count("\n") <= 600
    found = sections()
    assert list(found)[:2] == ["Set-up: two commands", "A ten-minute tour"]
    for title in TASKS:
        last = found[title].strip().rsplit("\n\n", 1)[-1]
        assert last.startswith("Long form:") and "(docs/" in last, (title, last)
    setup = re.findall(r"```sh\n(.*?)```", found["Set-up: two commands"], re.S)
    assert [line.split("#")[0].strip() for b in setup for line in b.strip().splitlines()] == ["make demo", "make test"]


def test_no_page_of_docs_is_orphaned():
    """Every page and picture in docs/ is linked from README or from a page that is (figures README shows count)."""
    docs = os.path.join(ROOT, "docs")
    pages = {os.path.relpath(os.path.join(d, f), ROOT) for d, _, fs in os.walk(docs) for f in fs
             if f.endswith((".md", ".png"))}
    reached, todo = set(), ["README.md"]
    while todo:
        page = todo.pop()
        with open(os.path.join(ROOT, page)) as f:
            text = f.read()
        for target in re.findall(r"\]\(([^)#\s]+)", text):
            path = os.path.normpath(os.path.join(os.path.dirname(page), target))
            if path in pages and path not in reached:
                reached.add(path)
                if path.endswith(".md"):
                    todo.append(path)
    assert pages - reached == set(), "orphaned: not linked from README nor from a page it reaches"


def performance_commands() -> list[str]:
    table = sections()["Performance"]
    return [cell for row in re.findall(r"^\|.*\|$", table, re.M)[2:] for cell in re.findall(r"`([^`]*)`", row.rsplit("|", 2)[1])]


def test_every_performance_figure_has_a_command_a_test_runs():
    """Each headline figure's command is a benchmark script with flags it takes, that make bench or a test runs
    (small): the figures come from these scripts; docs/performance.md has them machine by machine."""
    commands = performance_commands()
    assert len(commands) == len(re.findall(r"^\| (?!what |---)", sections()["Performance"], re.M)) >= 10
    with open(os.path.join(ROOT, "Makefile")) as f:
        make = f.read()
    for command in commands:
        words = command.split()
        words = words[1:] if words[0] == "sudo" else words
        assert words[0] == "python" and words[1].startswith("scripts/"), command
        script = os.path.basename(words[1])
        assert script in make or script == "ring_vs_gloo.py", command
        with open(os.path.join(ROOT, "tests", BENCH_TESTS[script])) as f:
            assert script in f.read(), (script, BENCH_TESTS[script])
        out = subprocess.run([sys.executable, os.path.join(ROOT, words[1]), "--help"], capture_output=True, text=True,
                             timeout=60, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
        assert out.returncode == 0, out.stderr
        for flag in (w for w in words[2:] if w.startswith("--")):
            assert flag in out.stdout, (command, flag)
