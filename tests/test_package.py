"""innet as a package: the wheel built from this checkout, installed into a fresh virtual environment, runs an
experiment and a switch program by name from a folder that is not the checkout, and installs nothing at the top
level but ``innet`` (the checkout's topologies/, switch_programs/ and experiments/ go inside it)."""

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib

import pytest

from innet import commands, shipped

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = ("pyproject.toml", "innet", "topologies", "switch_programs", "experiments")  # what the wheel is built from
MAPPED = {"innet.topologies": "topologies", "innet.switch_programs": "switch_programs",
          "innet.experiments.shipped": "experiments"}


def pyproject() -> dict:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["tool"]["setuptools"]


def test_the_wheel_lists_every_package_of_innet_and_maps_the_checkouts_folders_inside_it():
    """pyproject lists the packages (a mapped folder cannot be found by setuptools' find): a new one is listed."""
    found = {os.path.relpath(folder, ROOT).replace(os.sep, ".") for folder, _, files in os.walk(os.path.join(ROOT, "innet"))
             if "__init__.py" in files}
    config = pyproject()
    assert set(config["packages"]) == found | set(MAPPED) | {"innet.topologies.examples"}
    assert config["package-dir"] == MAPPED
    assert all(p.split(".")[0] == "innet" for p in config["packages"])


def test_a_checkout_keeps_what_ships_beside_innet():
    assert not shipped.INSTALLED
    assert (shipped.PROGRAMS, shipped.EXPERIMENTS, shipped.SCRIPTS) == tuple(
        os.path.join(ROOT, name) for name in ("switch_programs", "experiments", "scripts"))
    assert shipped.topologies().__file__ == os.path.join(ROOT, "topologies", "__init__.py")
    assert shipped.topologies("files").__name__ == "topologies.files"
    assert sorted(shipped.build("star", workers=3)) == ["h1", "h2", "h3", "p1", "s1"]  # and the PBox


def test_innet_bench_where_innet_is_installed_says_the_benchmarks_run_from_a_checkout(monkeypatch, capsys):
    monkeypatch.setattr(commands, "SCRIPTS", None)
    assert commands.bench_names() == []
    assert commands.main(["bench", "--list"]) == 2
    assert capsys.readouterr().err == ("error: the benchmarks (scripts/bench_*.py) run from a source checkout of innet, "
                                       "not from an installed package: run innet bench there\n")


def make_dry(*targets: str) -> str:
    """What ``make`` would run for ``targets`` as a non-root user (SUDO=sudo), everything out of date (-B)."""
    return subprocess.run(["make", "-n", "-B", *targets, "SUDO=sudo", "PYTHON=python3"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout


def test_lint_and_test_fast_need_no_root_and_make_test_installs_everything():
    fast = make_dry("lint", "test-fast")
    assert "apt-get" not in fast and "sudo" not in fast
    assert "python3 -m pip install -q -e '.[dev,torch]'" in fast  # only where a Python package is missing
    full = make_dry("test")  # CI (.ci/run) on a fresh machine
    assert "sudo env DEBIAN_FRONTEND=noninteractive apt-get install" in full
    assert "python3 -m pip install -q -e '.[dev,torch]'\ntouch .deps.stamp\n" in full and "sudo python3 -m pytest\n" in full


def test_the_packages_lint_and_test_fast_check_are_pyprojects():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["dev"], *project["optional-dependencies"]["torch"]]
    with open(os.path.join(ROOT, "Makefile")) as f:
        [line] = [line for line in f if line.startswith("PY_MODULES :=")]
    modules = line.split(":=")[1].split("#")[0].split()
    names = {re.split(r"[<>=!~\[ ]", w)[0] for w in wanted}
    assert {"sklearn" if n == "scikit-learn" else n for n in names} == set(modules)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(the venv's innet command, its python, a folder to run in): the wheel built offline from a copy of the
    checkout (the build writes build/ and innet.egg-info beside its sources) and installed with no downloads."""
    where = tmp_path_factory.mktemp("package")
    (where / "src").mkdir()
    for name in SOURCES:
        source, target = os.path.join(ROOT, name), where / "src" / name
        if os.path.isdir(source):
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy(source, target)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
                    "-w", str(where / "dist"), str(where / "src")], cwd=where, env=env, check=True, capture_output=True)
    [wheel] = os.listdir(where / "dist")
    # the system's packages (numpy, scapy, networkx, ...) and its pip, seen from the venv; innet is installed anew
    # even where an editable innet is among them
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(where / "venv")],
                   env=env, check=True, capture_output=True)
    python = str(where / "venv" / "bin" / "python")
    subprocess.run([python, "-m", "pip", "install", "--no-deps", "--no-index", "--ignore-installed", "-q",
                    str(where / "dist" / wheel)], cwd=where, env=env, check=True, capture_output=True)
    (where / "work").mkdir()
    return str(where / "venv" / "bin" / "innet"), python, where / "work"


def run(argv: list[str], cwd) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return subprocess.run(argv, cwd=cwd, env=dict(env, MPLBACKEND="Agg"), capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_the_installed_package_holds_only_innet_and_finds_what_ships_inside_it(installed):
    innet, python, work = installed
    out = run([python, "-c", "import json, sys, innet.shipped as s, innet.topologies.files\n"
                             "print(json.dumps([s.INSTALLED, s.PACKAGE, s.PROGRAMS, s.EXPERIMENTS, s.SCRIPTS,\n"
                             "  sorted(m for m in sys.modules if m.split('.')[0] in ('topologies', 'switch_programs'))]))"],
              work)
    assert out.returncode == 0, out.stderr
    site = os.path.join(os.path.dirname(os.path.dirname(python)), "lib", f"python{sys.version_info.major}."
                        f"{sys.version_info.minor}", "site-packages")
    package = os.path.join(site, "innet")
    assert json.loads(out.stdout) == [True, package, os.path.join(package, "switch_programs"),
                                      os.path.join(package, "experiments", "shipped"), None, []]
    assert sorted(os.listdir(site)) == ["innet", "innet-0.1.0.dist-info"]  # no top-level topologies, switch_programs
    with open(os.path.join(site, "innet-0.1.0.dist-info", "RECORD")) as f:
        paths = [line.split(",")[0] for line in f]
    assert {p.split("/")[0] for p in paths} == {"innet", "innet-0.1.0.dist-info", ".."}  # .. : bin/innet
    assert {"innet/switch_programs/max_allreduce.py", "innet/experiments/shipped/phub.toml",
            "innet/topologies/examples/two_racks.graphml", "innet/wire/innet.lua"} <= set(paths)


@pytest.mark.slow
def test_the_installed_innet_runs_a_program_by_name_and_by_path_from_another_folder(installed, tmp_path):
    innet, _, work = installed
    with open(os.path.join(ROOT, "switch_programs", "max_allreduce.py")) as f:
        (work / "my_max.py").write_text(f.read())
    for program in ("max_allreduce", "my_max.py"):
        out = run([innet, "run", "--backend", "local", "--topo", "star", "--workers", "4", "--elements", "1000",
                   "--mode", "innet", "--program", program, "--out", str(tmp_path / program)], work)
        assert out.returncode == 0, out.stderr
        [record] = json.loads((tmp_path / program / "results.json").read_text())["runs"]
        assert (record["program"], record["correct"], record["workers"]) == (program, True, 4)
    assert os.listdir(work) == ["my_max.py"]  # the runs wrote only where --out said
    out = run([innet, "bench", "--list"], work)
    assert (out.returncode, out.stderr) == (2, "error: the benchmarks (scripts/bench_*.py) run from a source checkout "
                                               "of innet, not from an installed package: run innet bench there\n")


@pytest.mark.slow
def test_the_installed_innet_reproduces_an_experiment_by_name_from_another_folder(installed, tmp_path):
    innet, _, work = installed
    out = run([innet, "reproduce", "phub", "--quick", "--out", str(tmp_path / "phub")], work)
    assert out.returncode == 0, out.stderr
    points = json.loads((tmp_path / "phub" / "points.json").read_text())["points"]
    assert [(p["series"], p["hosts_per_rack"]) for p in points] == [
        (s, n) for n in (2, 4) for s in ("stock", "pbox", "phub", "innet")]
    assert all(p["correct"] is True for p in points)
    assert (tmp_path / "phub" / "phub.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
