"""README's "Reproducing the papers" and docs/experiments.md, run as written: each ``innet reproduce``
command (``innet`` is ``python -m innet``), and the example experiment file."""

import os
import re
import subprocess
import sys

from innet.experiments.file import shipped
from tests.test_readme import blocks, section

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPRODUCE = section("Reproducing the papers")
COMMANDS = [line for b in blocks(REPRODUCE, "sh") for line in b.strip().splitlines()]
with open(os.path.join(ROOT, "docs", "experiments.md")) as f:
    DOC = f.read()


def innet(command: str, cwd) -> subprocess.CompletedProcess:
    argv = command.split()
    assert argv[0] == "innet"
    return subprocess.run([sys.executable, "-m", "innet", *argv[1:]], cwd=cwd, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=ROOT), timeout=900)


def test_every_shipped_experiment_has_its_command_and_its_figure():
    """Each command is ``innet reproduce NAME`` for a shipped NAME: tests/test_experiments.py runs every one of
    them (with ``--quick``: the full sweeps take minutes each; their figures are the ones committed)."""
    assert COMMANDS == [f"innet reproduce {name}" for name in ("phub", "topk", "ensemble", "pipesgd", "p3", "ssp")]
    assert sorted(c.split()[-1] for c in COMMANDS) == sorted(shipped())
    figures = re.findall(r"!\[[^]]*\]\((docs/figures/(\w+)\.png)\)", REPRODUCE)
    assert [name for _, name in figures] == [c.split()[-1] for c in COMMANDS]
    for path, _ in figures:
        with open(os.path.join(ROOT, path), "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_the_documented_experiment_file_runs_as_written(tmp_path):
    [example] = blocks(DOC, "toml")
    (tmp_path / "star.toml").write_text(example)
    [command] = [line for b in blocks(DOC, "sh") for line in b.strip().splitlines()]
    out = innet(command, tmp_path)
    assert out.returncode == 0, out.stderr
    with open(tmp_path / "star" / "points.csv") as f:
        rows = f.read().splitlines()
    assert rows[0] == "series,bw,completion_s,cross_rack_bytes,correct,command,completion_s/pbox,cross_rack_bytes/pbox"
    assert [r.split(",")[:2] for r in rows[1:]] == [[s, bw] for bw in ("10", "100", "1000") for s in ("innet", "pbox")]
