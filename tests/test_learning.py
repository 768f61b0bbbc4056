"""Training a real model through the network (innet.hosts.learning.model, innet.hosts.learning.learner, ``--train``): the model's
gradient, the exact baseline, every scheme on the fabric against it, and bad input as one line."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from innet.backends.local.run import run_local
from innet.cli import main
from innet.errors import UserError
from innet.hosts.learning.learner import Learner, exact_training
from innet.hosts.learning.model import Task
from innet.planning.spec import RunSpec
from topologies import build

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def readme_commands() -> list[str]:
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    start = text.index("## Training a real model (`--train digits`)\n")
    section = text[start : text.find("\n## ", start + 1)]
    return [" ".join(b.replace("\\\n", " ").split()) for b in re.findall(r"```sh\n(.*?)```", section, re.S)]


def test_the_mlp_gradient_is_the_loss_derivative():
    task = Task(hidden=8)
    mlp, (x, y) = task.mlp, task.data.shard(0)
    w = mlp.init(0).astype(np.float64)
    loss, grad = mlp.loss_and_gradient(w, x[:16], y[:16])
    rng = np.random.default_rng(1)
    for i in rng.choice(mlp.size, 12, replace=False):
        step = np.zeros_like(w)
        step[i] = 1e-5
        numeric = (mlp.loss_and_gradient(w + step, x[:16], y[:16])[0] - mlp.loss_and_gradient(w - step, x[:16], y[:16])[0]) / 2e-5
        assert abs(numeric - grad[i]) < 1e-4 * max(1.0, abs(numeric)), i
    assert loss == pytest.approx(np.log(10), abs=1.0)


def test_the_exact_baseline_trains_above_95_percent_the_same_every_time():
    first = exact_training(Task())
    assert len(first) == 10 and first[-1][0] > 0.95
    assert first[-1][1] < first[0][1]  # the test loss fell
    assert exact_training(Task()) == first


def test_shards_are_disjoint_and_a_learner_goes_step_by_step():
    task = Task()
    shards = [task.data.shard(r)[0] for r in range(4)]
    rows = {row.tobytes() for s in shards for row in s}
    assert len(rows) == sum(len(s) for s in shards) == 4 * task.data.shard_size
    learner = Learner(task, 0)
    learner.bind(lambda k: learner.sent[k] * 4)
    learner[0]
    with pytest.raises(IndexError):
        learner[2]


def test_one_epoch_through_the_fabric_sums_every_step_exactly_and_tracks_the_baseline():
    """Every gradient of every step all-reduced in-network: the integer sums equal numpy's of the gradients the
    workers sent (``correct``), so after one epoch the model is the float baseline's up to fixed-point rounding."""
    graph = build("star", workers=4)
    exact = exact_training(Task(epochs=1))[0]
    record = run_local(graph, RunSpec(train="digits", epochs=1, packet_elements=1024))
    assert record.correct and record["scheme"] == "innet" and record.iterations == Task(epochs=1).steps
    assert abs(record["accuracy"] - exact[0]) <= 0.005 and abs(record["loss"] - exact[1]) < 1e-3


def test_the_readme_command_trains_every_scheme_within_the_issue_bounds(tmp_path):
    """README's command as written: 4 workers, 10 epochs, every scheme from the same weights and shards."""
    (command,) = [c for c in readme_commands() if "run_topology.py" in c]
    argv = command.split()
    assert argv[:2] == ["python", "run_topology.py"]
    out = subprocess.run([sys.executable, os.path.join(ROOT, "run_topology.py"), *argv[2:], "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    result = json.loads((tmp_path / "results.json").read_text())
    exact = result["accuracy_exact"]
    runs = {r["scheme"]: r for r in result["runs"]}
    assert list(runs) == ["innet", "pbox", "ring", "topk", "ssp", "asp"]
    assert all(r["correct"] and len(r["epochs"]) == 10 for r in runs.values())  # every step's sum exact
    assert exact > 0.95
    for scheme in ("innet", "pbox", "ring"):
        assert abs(runs[scheme]["accuracy"] - exact) <= 0.005 and runs[scheme]["accuracy"] > 0.95
    assert runs["topk"]["bytes_vs_dense"] < 0.1 and runs["ssp"]["max_staleness"] <= 3
    for r in runs.values():
        times = [e["time_s"] for e in r["epochs"]]
        assert times == sorted(times) and 0 < r["accuracy"] <= 1
        reached = [e["time_s"] for e in r["epochs"] if e["accuracy"] >= 0.95]
        assert r["time_to_target_s"] == (reached[0] if reached else None)
    assert (tmp_path / "accuracy.png").stat().st_size > 0
    assert f"exact float baseline: test accuracy {exact:.4f}" in out.stdout


@pytest.mark.parametrize("flags, says", [
    (["--train", "mnist"], "unknown data set 'mnist'; choose from digits"),
    (["--train", "digits", "--model", "cnn"], "unknown model 'cnn'; choose from mlp"),
    (["--train", "digits", "--batch", "30"], "--batch 30 does not divide among the 4 workers"),
    (["--train", "digits", "--lr", "1e30", "--mode", "ring"], "training diverged at step 1"),
    (["--train", "digits", "--lr", "50", "--mode", "pbox", "--consistency", "ssp"], "--lr 50 is too large"),
    (["--train", "digits", "--workload", "resnet50"], "--train all-reduces its own model's gradients"),
    (["--train", "digits", "--program", "max_allreduce"], "nor a --program that reduces with another operator"),
    (["--train", "digits", "--epochs", "0"], "--epochs and the hidden width must be at least 1"),
])
def test_bad_training_input_is_one_line(flags, says, capsys, tmp_path):
    code = main(["--backend", "local", "--topo", "star", "--workers", "4", "--out", str(tmp_path), "--no-plots", *flags])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: ") and says in err, err


def test_the_library_names_the_parameter_not_the_flag():
    with pytest.raises(UserError) as info:
        RunSpec(train="digits", batch=6).task(4)
    assert str(info.value).startswith("batch 6 does not divide")
