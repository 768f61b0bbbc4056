"""Every command in README.md, run as written: those of the sections with tests of their own are run there."""

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
    "Reading captures in Wireshark": "tests/test_readme.py::test_the_wireshark_commands_run_as_written",
    "Past one machine: a cluster": "tests/test_readme.py::test_the_cluster_commands_run_as_written",
    "Writing a switch program": "tests/test_readme.py::test_each_command_runs_as_written",
    "Reproducing the papers": "tests/test_experiments.py runs each innet reproduce command (its quick sweep)",
    "Training a real model (`--train digits`)": "tests/test_learning.py runs its command",
    "PyTorch: a DDP communication hook": "tests/test_ddp.py runs its command",
    "Scaling up": "tests/test_scale.py::test_the_readme_scaling_commands_run_as_written (the bench at small sizes)",
    "Performance": "tests/test_bench.py runs every benchmark make bench runs, small",
}


def readme_commands() -> list[tuple[str, str]]:
    """(section title, command) for every line of every ``sh`` block, continuation lines joined, comments cut."""
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
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
