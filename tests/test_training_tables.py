"""scripts/training_tables.py: docs/training.md's tables from a --train --mode all run's results.json."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_tables_are_the_runs_figures(tmp_path):
    run = subprocess.run([sys.executable, os.path.join(ROOT, "run_topology.py"), "--backend", "local", "--topo", "star",
                          "--workers", "4", "--train", "digits", "--mode", "all", "--packet-elements", "1024", "--epochs", "2",
                          "--no-plots", "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "training_tables.py"), str(tmp_path / "results.json")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    result = json.loads((tmp_path / "results.json").read_text())
    lines = out.stdout.splitlines()
    assert lines[0] == f"exact float baseline: {100 * result['accuracy_exact']:.2f}%"
    epoch2 = next(line for line in lines if line.startswith("| 2 |")).strip("| ").split(" | ")
    assert epoch2 == ["2", f"{100 * result['exact_epochs'][1]['accuracy']:.2f}",
                      *[f"{100 * r['epochs'][1]['accuracy']:.2f}" for r in result["runs"]]]
    for r, name in zip(result["runs"], ("innet", "PBox", "ring", "top-k", "SSP", "ASP"), strict=True):
        row = next(line for line in lines if line.startswith(f"| {name} |")).strip("| ").split(" | ")
        assert row[1] == f"{100 * r['accuracy']:.2f}%" and row[4] == f"{r['time_per_epoch_s']:.3f} s"
        # the printed line says the same time per epoch
        assert f"{r['time_per_epoch_s']:.3f}s per epoch" in run.stdout


def test_a_result_without_training_is_one_line(tmp_path):
    (tmp_path / "results.json").write_text(json.dumps({"runs": []}))
    out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "training_tables.py"), str(tmp_path / "results.json")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "is not a --train run's results" in out.stderr
