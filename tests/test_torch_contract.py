"""torch.distributed's process-group contract on the backend "innet", against gloo's: the same script
(tests/torch_contract.py) under ``innet launch --backend local`` and under torchrun on gloo prints the same lines;
small all-reduces fused on the fabric give bit for bit what each gives alone; the benchmark of many small calls
runs and agrees with gloo."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch.distributed as dist

from innet.integrations.torch.batch import compute, compute_batch
from innet.integrations.torch.fabric import FabricCollectives
from innet.integrations.torch.forms import op_of
from innet.planning.spec import RunSpec
from innet.shipped import build
from tests.torchrun import torchrun

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join("tests", "torch_contract.py")


def said(out: str) -> list[str]:
    """The ranks' lines (``R<rank> ...``), their launcher's prefix taken off, in order of rank then line."""
    lines = [re.sub(r"^\[rank\d+\]: ", "", line) for line in out.splitlines()]
    return sorted(line for line in lines if re.match(r"R\d ", line))


def test_the_contract_script_prints_on_innet_what_it_prints_on_gloo():
    """PRODUCT and BXOR (integers through the network, floats on gloo), sparse all_reduce, futures' values,
    ProcessGroup call forms (``pg.broadcast(xs)``, ``root=``, ``rootTensor``, ``pg.reduce(x, 0, MAX)``), the
    coalesced tensor calls, a list all-gather of two inputs a rank in inference mode, bad arguments refused in gloo's
    words, any-source receive, and an all-to-all of isend/irecv that must not wait for a timeout:
    every line the same on both backends but the backend's name."""
    gloo = torchrun(SCRIPT, ranks=3, finished=r"R0 backend gloo")
    assert gloo.returncode == 0, gloo.stderr[-2000:]
    innet = subprocess.run([sys.executable, "-m", "innet", "launch", "--backend", "local", "--topo", "star", "--workers",
                            "3", "--", sys.executable, SCRIPT], capture_output=True, text=True, cwd=ROOT,
                           env=dict(os.environ, PYTHONPATH=ROOT), timeout=600)
    assert innet.returncode == 0, innet.stderr[-2000:]
    theirs, ours = said(gloo.stdout), said(innet.stdout)
    timed = [line for line in ours if " seconds p2p " in line]
    assert len(timed) == 3 and all(float(line.split()[-1]) < 10 for line in timed), timed  # not the side plane's 50 s
    assert [ln for ln in ours if " backend " in ln] == [f"R{r} backend innet innet" for r in range(3)]
    keep = [ln for ln in theirs if " seconds p2p " not in ln and " backend " not in ln]
    assert [ln for ln in ours if " seconds p2p " not in ln and " backend " not in ln] == keep
    assert len(keep) == 3 * 26 + 4, keep  # 26 lines a rank, and four of one rank's (a reduce's root, rank 0's receive)
    assert {"R1 reduce product tensor([ 48, 162])", "R0 bxor tensor([      4,       2, 1048579])",
            "R2 product torch.int8 tensor([ 24,  -6,   6, -46], dtype=torch.int8)", "R1 refused [True, True, True]",
            } <= set(keep)  # int8 wraps as torch's
    calls = re.search(r"collectives through the network: (.*);", innet.stdout).group(1)
    assert "allreduce" in calls and "reduce 3" in calls  # the integer products went through the network
    side = re.search(r"over the TCP side plane \(not counted\): (.*)", innet.stdout).group(1)
    assert "allreduce ReduceOp.PRODUCT of float32" in side and "sparse" in side
    assert "send" not in side and "all_to_all" not in side and "gather" not in side  # messages through the links
    assert "ReduceOp.PRODUCT of int" not in side


def test_small_all_reduces_fused_give_bit_for_bit_what_each_gives_alone():
    """300 float all-reduces of 1-39 values, of magnitudes 10**-2..10**2, SUM, MIN, MAX and AVG, and 50 integer
    ones (SUM, BOR, BAND, PRODUCT, MAX): fused where operator, dtype and agreed exponent match, the same bits as
    one collective each; far fewer collectives than calls."""
    fabric = FabricCollectives(build("star", workers=4), RunSpec(topo="star"))
    rng = np.random.default_rng(1)
    calls = []
    for i in range(300):
        n, scale = int(rng.integers(1, 40)), 10.0 ** int(rng.integers(-2, 3))
        calls.append(("allreduce", ["sum", "min", "max", "avg"][i % 4], 0,
                      [(rng.standard_normal(n) * scale).astype(np.float32) for _ in range(4)]))
    for i in range(50):
        calls.append(("allreduce", ["sum", "bor", "band", "prod", "max"][i % 5], 0,
                      [rng.integers(-9, 9, 7).astype(np.int64) for _ in range(4)]))
    fused = compute_batch(fabric, calls, pytest.fail)
    assert fabric.tally.calls["allreduce"] == len(calls) and 0 < fabric.tally.fusions < len(calls) / 4
    alone = [compute(fabric, name, op, inputs, root, pytest.fail) for name, op, root, inputs in calls]
    for got, want in zip(fused, alone, strict=True):
        assert all(np.array_equal(g, w) and g.dtype == w.dtype for g, w in zip(got, want, strict=True))
    ufuncs = {"sum": np.add, "bor": np.bitwise_or, "band": np.bitwise_and, "prod": np.multiply, "max": np.maximum}
    for (_, op, _, inputs), got in zip(calls[300:], fused[300:], strict=True):
        assert np.array_equal(got[0], ufuncs[op].reduce(np.stack(inputs))), op  # integers: exact


def test_an_operator_innet_does_not_serve_is_named():
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist._make_nccl_premul_sum(2.0)
    with pytest.raises(ValueError, match=r"^innet: ReduceOp.PREMUL_SUM is not a reduce operator innet serves \(SUM, "):
        op_of(opts)
    assert op_of(None) == "sum" and op_of(dist.ReduceOp.PRODUCT) == "prod" and op_of(dist.ReduceOp.BXOR) == "bxor"


def test_the_benchmark_of_small_calls_prints_both_backends_times_and_their_ratio():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench_torch_calls.py"), "--calls", "300",
                          "--ranks", "2", "--repeats", "1"], capture_output=True, text=True, cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=ROOT), timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    runs = re.findall(r"run 1: (gloo|innet) +([\d.]+) s  results ([0-9a-f]+)", out.stdout)
    assert [b for b, _, _ in runs] == ["gloo", "innet"] and runs[0][2] == runs[1][2], out.stdout
    ratio = re.search(r"median of 1: gloo ([\d.]+) s, innet ([\d.]+) s, innet / gloo ([\d.]+)", out.stdout)
    assert float(ratio.group(3)) == pytest.approx(float(ratio.group(2)) / float(ratio.group(1)), abs=0.01)
