import os
import sys
import warnings
from collections import Counter

import pytest

TIME_BY_FILE = 25  # the slowest files the summary lists
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def pytest_collection_modifyitems(config, items):
    if "torchsuite" not in (config.option.markexpr or ""):  # PyTorch's whole suite twice: make torch-suite runs it
        config.hook.pytest_deselected(items=[item for item in items if item.get_closest_marker("torchsuite")])
        items[:] = [item for item in items if not item.get_closest_marker("torchsuite")]
    if os.geteuid() == 0:
        return
    skip = pytest.mark.skip(reason="needs root (Mininet): run as root, or deselect knowingly with -m 'not mininet'")
    for item in items:
        if "mininet" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _records_left_by_dead_runs(request):
    """Name the test during which a run died and left its state record (what ``--clean`` then finds): the
    suite's checks see only records of runs it started directly, not of those a script it ran started."""
    if os.geteuid() != 0:
        yield
        return
    from tests.test_emulation import orphan_records

    before = set(orphan_records())
    yield
    left = sorted(set(orphan_records()) - before)
    if left:
        warnings.warn(f"{request.node.nodeid} left the record(s) of dead run(s): {left}", stacklevel=1)


def pytest_terminal_summary(terminalreporter):
    """Say how often plain torchrun's known teardown abort was recognised and retried (tests/torchrun.py), and where
    the suite's time went: the Mininet tests' and the others' totals, and the slowest files (make test's 30 minutes)."""
    from tests.torchrun import ABORTS

    if ABORTS:
        terminalreporter.section("gloo teardown aborts retried")
        for line in ABORTS:
            terminalreporter.write_line(line)
    by_file, by_kind = Counter(), Counter()
    for reports in terminalreporter.stats.values():
        for report in reports:
            if isinstance(report, pytest.TestReport):
                by_file[report.nodeid.split("::")[0]] += report.duration
                by_kind["mininet" if "mininet" in report.keywords else "the others"] += report.duration
    if by_file:
        terminalreporter.section("time by file")
        terminalreporter.write_line(", ".join(f"{kind} {seconds:.0f} s" for kind, seconds in by_kind.most_common()))
        for path, seconds in by_file.most_common(TIME_BY_FILE):
            terminalreporter.write_line(f"{seconds:8.1f} s  {path}")


@pytest.fixture
def said():
    """What the library says during the test (innet.events), as a list of events."""
    from innet.events import listening

    heard = []
    with listening(heard.append):
        yield heard


@pytest.fixture(scope="session")
def reproduced(tmp_path_factory):
    """``innet reproduce NAME`` (the full sweep, on the fabric in virtual time), run once a session per experiment
    and read by every test that checks it (tests/test_experiments.py: its files and progress line;
    tests/test_readme_reproduce.py: README's figures): the command's output, decoded as it is (text mode would turn
    the progress bar's \\r into \\n), and its folder."""
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = {}

    def run(name):
        if name not in done:
            out = tmp_path_factory.mktemp(f"reproduce-{name}") / "out"
            proc = subprocess.run([sys.executable, "-m", "innet", "reproduce", name, "--out", str(out)],
                                  capture_output=True, cwd=root, env=dict(os.environ, PYTHONPATH=root), timeout=900)
            done[name] = (subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout.decode(),
                                                      proc.stderr.decode()), out)
        return done[name]

    return run
