"""Reduce operators as values: every shipped program, in every mode, checked against its numpy reduction."""

import os

import numpy as np
import pytest

import innet
from innet import Operator, Reduction
from innet.backends.local.run import LocalRun, run_local
from innet.errors import UserError
from innet.planning.spec import RunSpec
from innet.results.check import result_digest
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


# -- an operator's arithmetic on the wire's int32 ------------------------------------------------------------------

PROD = """\"\"\"The element-wise product of the workers' int32 values, modulo 2**32.\"\"\"
from innet import Operator, Reduction

PROD = Operator("prod", "multiply", identity=1, rule="bits", arithmetic="wrap")


class MyProd(Reduction):
    name = "my_prod"
    operator = PROD
"""
COUNT = PROD.replace("product", "saturating sum").replace("modulo 2**32", "as unsigned counts, clipped at 2**32-1") \
    .replace('"prod", "multiply", identity=1, rule="bits", arithmetic="wrap"',
             '"count", "add", identity=0, rule="bits", arithmetic="saturate"').replace("my_prod", "my_count") \
    .replace("MyProd", "MyCount")


def wrapped_product(inputs):
    """numpy's int32 product, wrapping (an int32 accumulator: multiply.reduce would widen to int64)."""
    return np.multiply.reduce(np.stack(inputs), axis=0, dtype=np.int32)


def clipped_sum(inputs):
    """The exact sum of the values read as unsigned 32-bit counts, clipped at 2**32-1, as int32 bit patterns."""
    total = np.stack([x.view(np.uint32) for x in inputs]).astype(np.int64).sum(axis=0)
    return np.clip(total, 0, 2**32 - 1).astype(np.uint32).view(np.int32)


@pytest.mark.parametrize("mode", ["innet", "pbox", "ring"])
@pytest.mark.parametrize("text,reference", [(PROD, wrapped_product), (COUNT, clipped_sum)], ids=["product", "count"])
def test_a_wrapping_or_saturating_operator_of_a_program_file_is_exact_in_every_mode(tmp_path, text, reference, mode):
    path = tmp_path / "program.py"
    path.write_text(text)
    graph = build("leaf-spine", racks=2, hosts_per_rack=3)  # in-network: ToRs, then a spine, combine partials
    report = innet.run(graph, backend="local", program=str(path), mode=mode, elements=3001, iterations=2)
    [record] = report.runs
    assert record.correct and not record.errors, record.errors
    run = RunSpec(program=str(path), elements=3001, iterations=2)
    inputs = [run.tensors(1, r) for r in range(6)]
    expected = [reference([inputs[r][it] for r in range(6)]) for it in range(2)]
    assert record.result_digest == result_digest([expected] * 6)  # every rank holds numpy's values, call by call
    wide = [np.stack([inputs[r][it] for r in range(6)]).astype(np.int64) for it in range(2)]
    beyond = sum(int(np.count_nonzero(expected[it] != (np.prod(wide[it], axis=0) if text is PROD else wide[it].sum(0))))
                 for it in range(2))
    assert beyond > 1000  # most products and many sums left int32: the arithmetic was what made them exact


def test_the_wire_arithmetic_is_what_the_engine_and_the_reference_compute():
    prod = Operator("prod", "multiply", identity=1, rule="bits", arithmetic="wrap")
    count = Operator("count", "add", identity=0, rule="bits", arithmetic="saturate")
    a = np.array([65536, -3, 2**31 - 1, 7], np.int32)
    b = np.array([65536, 5, 2, -1], np.int32)
    assert prod.combine(a, b).tolist() == [0, -15, -2, -7]
    assert count.combine(a, b).tolist() == [131072, -1, -2147483647, -1]  # unsigned: -3 is 2**32-3, -1 is 2**32-1
    assert prod.reduce([a, b, b]).tolist() == [0, -75, -4, 7]
    assert prod.reduce([a, b]).dtype == np.int32


@pytest.mark.parametrize("kwargs,message", [
    (dict(name="x", ufunc="bitwise_xor", identity=0, rule="sum"),
     "operator x: rule 'sum' is addition with headroom, but bitwise_xor(1, 1) = 0, not 2; rule 'bits' combines int32 "
     "patterns as they are"),
    (dict(name="prod", ufunc="multiply", identity=1, rule="bits"),
     "operator prod: multiply(2, 2147483646) = 4294967292 leaves int32, the wire's type: declare arithmetic='wrap' "
     "(modulo 2**32) or 'saturate' (unsigned, clipped)"),
    (dict(name="m", ufunc="add", identity=0, rule="select"),
     "operator m: rule 'select' needs a result that is one of its inputs, but add(1, 1) = 2"),
    (dict(name="s", ufunc="add", identity=0, rule="sum", arithmetic="saturate"),
     "operator s: arithmetic 'saturate' is for rule 'bits' (int32 patterns as they are); rule 'sum' works on fixed "
     "point and its arithmetic is exact"),
    (dict(name="d", ufunc="true_divide", identity=1, rule="bits", arithmetic="wrap"),
     "operator d: true_divide does not give integers on int32 values (it gives float64)"),
    (dict(name="p", ufunc="power", identity=1, rule="bits", arithmetic="wrap"),
     "operator p: power fails on int32 values (Integers to negative integer powers are not allowed.)"),
    (dict(name="x", ufunc="add", identity=0, rule="bits", arithmetic="modular"), "operator x: unknown arithmetic 'modular'"),
])
def test_a_declaration_the_ufunc_breaks_is_refused_in_one_line(kwargs, message):
    with pytest.raises(UserError) as err:
        Operator(**kwargs)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_an_order_dependent_combine_is_refused():
    from innet.wire import operators

    signed = Operator("count", "add", identity=0, rule="bits", arithmetic="saturate")
    object.__setattr__(signed, "combine", lambda a, b: np.clip(np.add(a, b, dtype=np.int64), -(2**31), 2**31 - 1))
    assert operators._order_refusal(signed) == (  # a signed clip: the order contributions come in decides
        "add does not associate (saturate): add(add(1, -1), -2147483648) = -2147483648 but "
        "add(1, add(-1, -2147483648)) = -2147483647; switches combine contributions as they arrive")


def test_a_program_whose_rule_the_combine_breaks_is_refused_at_load_naming_file_and_operator(tmp_path, capsys):
    from innet.cli import main

    path = tmp_path / "xor_sum.py"
    path.write_text("from innet import Operator, Reduction\n\nX = Operator('x', 'bitwise_xor', identity=0, rule='sum')\n\n"
                    "class Xor(Reduction):\n    name = 'x'\n    operator = X\n")
    with pytest.raises(UserError, match=f"^program file {path} failed to load: line 3: operator x: rule 'sum' is "):
        innet.run("star", backend="local", workers=3, program=str(path), mode="ring")
    assert main(["--backend", "local", "--topo", "star", "--workers", "3", "--program", str(path),
                 "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: program file {path} failed to load: line 3: operator x: ")
    assert not (tmp_path / "out").exists()
