"""The PyTorch DDP communication hook (innet.integrations.torch.ddp): buckets all-reduced on the fabric, and the example
that trains a torch model on the digits with it, against plain DDP."""

import os
import re
import subprocess
import sys

import numpy as np
import torch

from innet.integrations.torch.ddp import fabric_allreduce, innet_hook
from innet.planning.spec import RunSpec
from innet.wire import fixedpoint
from tests.test_guide import readme_commands
from topologies import build

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_a_bucket_is_summed_on_the_fabric_within_the_fixed_point_bound():
    rng = np.random.default_rng(3)
    tensors = [(rng.standard_normal(5000) * 0.01).astype(np.float32) for _ in range(3)]
    results, took = fabric_allreduce(build("star", workers=3), RunSpec(), tensors)
    exact = np.sum([t.astype(np.float64) for t in tensors], axis=0)
    scale = fixedpoint.scale_for(max(fixedpoint.magnitude_exponent(t) for t in tensors), 3)
    assert took > 0 and all(np.array_equal(r, results[0]) for r in results)
    assert np.all(np.abs(results[0] - exact) <= fixedpoint.error_bound(exact, scale, 3))


def test_the_hook_hands_ddp_the_mean_in_the_bucket_itself():
    class Bucket:
        def __init__(self):
            self.data = torch.arange(6, dtype=torch.float32)

        def buffer(self):
            return self.data

    class Doubling:  # two ranks holding the same bucket
        world = 2

        def allreduce(self, array):
            return 2 * array

    bucket = Bucket()
    got = innet_hook(Doubling(), bucket).wait()
    assert got is bucket.data and got.tolist() == [0, 1, 2, 3, 4, 5]


def test_the_readme_example_trains_to_plain_ddps_accuracy():
    """README's command as written: 2 processes, 10 epochs, the hook's accuracy within 0.5 points of plain DDP's."""
    (command,) = [c for _, c in readme_commands() if "scripts/ddp_digits.py" in c]
    argv = command.split()
    assert argv[:2] == ["python", "scripts/ddp_digits.py"]
    out = subprocess.run([sys.executable, os.path.join(ROOT, argv[1]), *argv[2:]], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    hook = float(re.search(r"innet hook: test accuracy ([\d.]+) \(([\d.]+) virtual", out.stdout).group(1))
    plain = float(re.search(r"plain DDP:  test accuracy ([\d.]+)", out.stdout).group(1))
    virtual = float(re.search(r"\(([\d.]+) virtual seconds", out.stdout).group(1))
    assert abs(hook - plain) <= 0.005 and hook > 0.95 and virtual > 0, out.stdout
