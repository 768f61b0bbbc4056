"""Training a real model on Mininet (``--train digits``): each worker's learner runs in its own host namespace,
its gradients all-reduced by the real switch processes, PBox or ring."""

import dataclasses
import os
import subprocess
import sys

import pytest

from innet.backends.mininet.emulation import run_mininet
from innet.hosts.learning.learner import exact_training
from innet.planning.spec import RunSpec
from innet.schemes.learn import scheme_spec
from tests.test_emulation import assert_nothing_left
from topologies import build

pytestmark = pytest.mark.mininet
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = RunSpec(train="digits", packet_elements=1024, compute_time=0.01, min_rto=0.02)


@pytest.mark.parametrize("scheme", ["innet", "pbox", "ring"])
def test_ten_epochs_on_mininet_end_within_half_a_point_of_the_exact_baseline(scheme):
    """The issue's bound: 4 workers, 10 epochs, every step's sum exact (``correct``), the final test accuracy
    within 0.5 points of the float baseline's and above 95%."""
    exact = exact_training(TRAIN.task(4))
    record = run_mininet(build("star", workers=4), scheme_spec(TRAIN, scheme))
    assert record.correct, record.errors
    assert len(record["epochs"]) == 10 and record["scheme"] == scheme
    assert abs(record["accuracy"] - exact[-1][0]) <= 0.005 and record["accuracy"] > 0.95
    assert record["time_to_target_s"] is not None and record["time_per_epoch_s"] > 0


@pytest.mark.parametrize("scheme", ["topk", "ssp"])
def test_topk_and_ssp_train_on_mininet_and_report_their_cost(scheme):
    run = dataclasses.replace(TRAIN, epochs=2)
    record = run_mininet(build("star", workers=4), scheme_spec(run, scheme, topk=0.01, staleness=3))
    assert record.correct, record.errors
    assert len(record["epochs"]) == 2 and 0.8 < record["accuracy"] <= 1
    if scheme == "ssp":
        assert record["max_staleness"] <= 3
    else:
        assert record["bytes_vs_dense"] < 0.1


def test_a_diverging_learning_rate_on_mininet_is_one_error_line_and_leaves_nothing(tmp_path):
    out = subprocess.run([sys.executable, os.path.join(ROOT, "run_topology.py"), "--backend", "mininet", "--topo", "star",
                          "--workers", "4", "--train", "digits", "--lr", "50", "--no-plots", "--out", str(tmp_path / "out"),
                          "--dilation", "100"],  # what its links ask: auto's latency bound would slow its many calls more
                         capture_output=True, text=True, timeout=120)
    errors = [line for line in out.stderr.splitlines() if not line.startswith("innet: ")]  # the progress log aside
    assert out.returncode == 2 and len(errors) == 1, out.stderr
    assert errors[0].startswith("error: training diverged at step") and "--lr 50 is too large" in errors[0]
    assert_nothing_left()


@pytest.mark.parametrize("flags, says", [
    (["--train", "mnist"], "error: unknown data set 'mnist'; choose from digits"),
    (["--train", "digits", "--model", "cnn"], "error: unknown model 'cnn'; choose from mlp"),
    (["--train", "digits", "--batch", "30"], "error: --batch 30 does not divide among the 4 workers"),
])
def test_bad_training_input_on_mininet_is_one_line_and_leaves_nothing(flags, says, tmp_path):
    out = subprocess.run([sys.executable, os.path.join(ROOT, "run_topology.py"), "--backend", "mininet", "--topo", "star",
                          "--workers", "4", *flags, "--no-plots", "--out", str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=120)
    errors = [line for line in out.stderr.splitlines() if not line.startswith("innet: ")]
    assert out.returncode == 2 and len(errors) == 1 and errors[0].startswith(says), out.stderr
    assert_nothing_left()
