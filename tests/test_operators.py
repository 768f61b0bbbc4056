"""Reduce operators as values: every shipped program, in every mode, checked against its numpy reduction."""

import os

import numpy as np
import pytest

from innet import Operator, Reduction
from innet.backends.local.run import LocalRun, run_local
from innet.errors import UserError
from innet.planning.spec import RunSpec
from innet.switch.loader import load_program
from innet.wire.operators import OPERATORS
from topologies import build


@pytest.mark.parametrize("op", OPERATORS.values(), ids=lambda o: o.name)
def test_each_operator_has_its_identity(op):
    x = np.array([-(2**31), -5, 0, 3, 2**31 - 1], np.int64).astype(np.int32)
    assert np.array_equal(op.fn(np.int32(op.identity), x), x)


@pytest.mark.parametrize("kwargs,message", [
    (dict(name="x", ufunc="add"), "has no identity"),
    (dict(name="x", ufunc="maximum", identity=0), "is not the identity of maximum"),
    (dict(name="x", ufunc="sqrt", identity=0), "is not a binary numpy ufunc"),
    (dict(name="x", ufunc="add", identity=0, rule="avg"), "unknown fixed-point rule"),
])
def test_a_bad_operator_is_one_clear_error(kwargs, message):
    with pytest.raises(UserError, match=message):
        Operator(**kwargs)


@pytest.mark.parametrize("mode", ["innet", "pbox", "ring"])
@pytest.mark.parametrize("program", ["sum_allreduce", "max_allreduce", "min_allreduce", "or_allreduce", "and_allreduce",
                                     "topk_sparse"])
def test_every_program_is_exact_in_every_mode(program, mode):
    graph = build("leaf-spine", racks=2, hosts_per_rack=3)
    run = RunSpec(mode=mode, program=program, elements=3001, iterations=2, topk=0.05 if program == "topk_sparse" else 0)
    record = run_local(graph, run)
    assert record["correct"], record["errors"]
    lr = LocalRun(graph, run)
    lr.finish()
    worker = lr.procs[0].calls[-1]
    inputs = [run.tensors(1, r)[-1] for r in range(6)]
    op = run.operator
    expected = op.reduce([op.quantize(x, worker.scale) for x in inputs])
    assert np.array_equal(worker.result_int, expected)  # the worker's own integers, against numpy
    if op.rule != "bits":
        assert np.abs(worker.result - op.reduce(inputs)).max() <= op.tolerance(op.reduce(inputs), worker.scale, 6).max()


def test_a_max_program_gives_the_max_and_not_the_sum():
    graph = build("star", workers=3)
    lr = LocalRun(graph, RunSpec(program="max_allreduce", elements=500))
    lr.finish()
    call = lr.procs[0].calls[0]
    inputs = [RunSpec(program="max_allreduce", elements=500).tensors(1, r)[0] for r in range(3)]
    assert np.allclose(call.result, np.maximum.reduce(inputs), atol=2.0 ** -call.scale)
    assert not np.allclose(call.result, np.sum(inputs, axis=0), atol=2.0 ** -call.scale)


def test_a_program_whose_result_is_wrong_reports_the_first_differing_element(tmp_path):
    """A program that says max but keeps the min: the run is not correct, and says where."""
    path = tmp_path / "liar.py"
    path.write_text("from innet import MAX, MIN, Engine, Reduction\n\n"
                    "class Liar(Reduction):\n    name = 'liar'\n    operator = MAX\n\n"
                    "    def _engine(self, ctx):\n        return Engine(ctx.regs, MIN)\n")
    record = run_local(build("star", workers=3), RunSpec(program=str(path), elements=300))
    assert not record["correct"]
    assert "result differs from max of the inputs: rank 0 call 0: element " in record["errors"][0]


def test_a_user_operator_in_a_program_file_runs_in_every_mode(tmp_path):
    path = tmp_path / "xor.py"
    path.write_text("from innet import Operator, Reduction\n\nXOR = Operator('xor', 'bitwise_xor', identity=0, rule='bits')\n\n"
                    "class XorAllreduce(Reduction):\n    name = 'xor_allreduce'\n    operator = XOR\n")
    for mode in ("innet", "pbox", "ring"):
        record = run_local(build("star", workers=4), RunSpec(mode=mode, program=str(path), elements=700))
        assert record["correct"], (mode, record["errors"])
    assert load_program(str(path)).operator.name == "xor"


def test_an_operator_without_identity_in_a_program_file_names_the_file_and_the_fix(tmp_path):
    path = tmp_path / "bad.py"
    path.write_text("from innet import Operator, Reduction\n\nBAD = Operator('prod', 'multiply')\n\n"
                    "class Bad(Reduction):\n    operator = BAD\n")
    with pytest.raises(UserError, match=f"program file {path} failed to load: .*has no identity in int32: give identity="):
        load_program(str(path))


def test_reduction_programs_are_short():
    """The programming model's promise: a reduction is a few lines on Reduction."""
    here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "switch_programs")
    for name in ("sum_allreduce", "max_allreduce", "min_allreduce", "or_allreduce", "and_allreduce", "topk_sparse"):
        with open(os.path.join(here, name + ".py")) as f:
            text = f.read()
        code = [line for line in text.split('"""')[2].splitlines() if line.strip() and not line.strip().startswith("#")]
        assert len(code) <= 30, name
        assert issubclass(load_program(name), Reduction)


def test_a_handler_that_returns_no_action_is_one_line_naming_the_file(tmp_path, capsys):
    from innet.cli import main

    path = tmp_path / "wrong.py"
    path.write_text("from innet import SwitchProgram, on_packet\n\nclass Wrong(SwitchProgram):\n    name = 'wrong'\n\n"
                    "    @on_packet('routed')\n    def forward(self, ctx, pkt):\n        return 42\n")
    assert main(["--backend", "local", "--topo", "star", "--workers", "3", "--mode", "ring", "--program", str(path),
                 "--elements", "100", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: program file {path}: a handler of Wrong returned 42, which is not an action; return Emit, "
                   "Multicast, Drop, ToPBox, EmitMany, a list of them, or None"]
