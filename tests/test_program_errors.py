"""A program that fails — at import, at load, or in a handler at run time — ends a run with one line naming the
program, its file and the line, never a traceback, a silent exit or a run that only times out."""

import numpy as np
import pytest

import innet
from innet.cli import main
from innet.errors import UserError
from innet.planning.configs import switch_configs
from innet.switch.loader import load_program
from innet.switch.runtime import SwitchRuntime
from innet.wire.packet import ROUTE, make_packet
from topologies import build

ROUTED = "from innet import Emit, SwitchProgram, on_batch, on_packet, on_timer\n\n\nclass Bad(SwitchProgram):\n" \
         "    name = 'bad'\n\n    @on_packet('routed')\n    def forward(self, ctx, pkt):\n        return {}\n"


def program(tmp_path, text, name="bad.py"):
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("text,message", [
    ("import sys\nsys.exit(3)\n", "failed to load: SystemExit at line 2: a program must not exit (its code: 3)"),
    ("x = 1\nraise SystemExit\n", "failed to load: SystemExit at line 2: a program must not exit (its code: None)"),
    ("\n\nraise KeyboardInterrupt\n", "failed to load: KeyboardInterrupt at line 3"),
    ("import os\n\nos.path.join(1 / 0)\n", "failed to load: ZeroDivisionError at line 3: division by zero"),
    ("def f(:\n", "has a syntax error at line 1: invalid syntax"),
    ("import no_such_module_anywhere\n", "failed to load: ModuleNotFoundError at line 1: No module named "
                                         "'no_such_module_anywhere'"),
])
def test_a_program_file_that_fails_at_import_is_one_line_with_its_file_and_line(tmp_path, text, message):
    path = program(tmp_path, text)
    with pytest.raises(UserError) as err:
        load_program(str(path))
    assert str(err.value) == f"program file {path} {message}"


@pytest.mark.parametrize("text", ["import sys\nsys.exit(0)\n", "raise KeyboardInterrupt\n"])
def test_the_command_line_says_it_in_one_line_and_exit_2_not_a_silent_exit(tmp_path, capsys, text):
    path = program(tmp_path, text)
    code = main(["--backend", "local", "--topo", "star", "--workers", "3", "--program", str(path),
                 "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith(f"error: program file {path} failed to load: ")
    assert not (tmp_path / "out").exists()


def test_a_batch_handler_without_its_per_packet_handler_is_one_line_not_a_type_error(tmp_path):
    path = program(tmp_path, "from innet import SwitchProgram, on_batch, on_packet\n\n\nclass Batchy(SwitchProgram):\n"
                             "    name = 'batchy'\n\n    @on_packet('contribution')\n    def one(self, ctx, pkt):\n"
                             "        return None\n\n    @on_batch('routed')\n    def forward(self, ctx, batch):\n"
                             "        return ctx.route_many(batch), ()\n")
    with pytest.raises(UserError) as err:
        load_program(str(path))
    assert str(err.value) == (
        f"program file {path} line 11: Batchy.forward handles a batch of 'routed' packets, but no method handles one; "
        "add an @on_packet('routed') method beside it (it gets the packets the batch handler leaves, and every packet "
        "where frames come one at a time)")


def test_an_operator_that_is_not_an_operator_is_one_line(tmp_path):
    path = program(tmp_path, "from innet import Reduction\n\n\nclass R(Reduction):\n    operator = 'sum'\n")
    with pytest.raises(UserError, match=f"^program file {path}: R.operator is 'sum', not an Operator; give SUM, "):
        load_program(str(path))


@pytest.mark.parametrize("body,message", [
    ("ctx.rout(pkt)", "handler Bad.forward raised AttributeError at line 9: 'Context' object has no attribute 'rout'"),
    ("Emit(99, pkt)", "a handler of Bad sent a packet to port 99, which switch s1 does not have; its ports are 0, 1, 2, "
                      "3 (ctx.ports)"),
    ("Emit(0, pkt.values)", "a handler of Bad returned Emit of array("),
])
def test_a_handler_that_fails_at_run_time_ends_the_run_in_one_line_naming_the_program(tmp_path, body, message):
    path = program(tmp_path, ROUTED.format(body))
    with pytest.raises(UserError) as err:  # the ring's packets are routed through the switch: its handler runs
        innet.run("star", backend="local", workers=3, mode="ring", program=str(path), elements=300)
    assert str(err.value).startswith(f"program bad ({path}): {message}") and "\n" not in str(err.value)


def runtime(tmp_path, text):
    return SwitchRuntime(switch_configs(build("star", workers=2), [])["s1"], load_program(str(program(tmp_path, text))))


def routed_frames(n):
    """``n`` routed frames from h1 to h2 (h1 is behind port 0)."""
    index = {name: i for i, name in enumerate(sorted(build("star", workers=2)))}
    return [make_packet(np.arange(3), job=1, flags=ROUTE).to_frame(index["h1"], index["h2"]) for _ in range(n)]


@pytest.mark.parametrize("returned,why", [
    ("ctx.route_many(batch)", "returned [EmitMany("),
    ("([], [0, 99])", "returned ([], [0, 99]); return (actions, rest): rest the indices (0..5) of the packets"),
])
def test_a_batch_handler_whose_result_has_the_wrong_shape_is_one_line(tmp_path, returned, why):
    rt = runtime(tmp_path, "from innet import SwitchProgram, on_batch, on_packet\n\n\nclass Bad(SwitchProgram):\n"
                           "    name = 'bad'\n\n    @on_packet('routed')\n    def one(self, ctx, pkt):\n"
                           "        return ctx.route(pkt)\n\n    @on_batch('routed')\n    def many(self, ctx, batch):\n"
                           f"        return {returned}\n")
    with pytest.raises(UserError) as err:
        rt.receive_frames(0, routed_frames(6), 0.0)
    assert str(err.value).startswith(f"program bad ({rt.program.source}): batch handler Bad.many {why}")


def test_a_timer_or_start_handler_that_raises_is_one_line_with_its_line(tmp_path):
    rt = runtime(tmp_path, "from innet import SwitchProgram, on_start, on_timer\n\n\nclass Bad(SwitchProgram):\n"
                           "    name = 'bad'\n\n    @on_start\n    def hello(self, ctx):\n        ctx.count('up')\n\n"
                           "    @on_timer(0.1)\n    def tick(self, ctx):\n        return {}['slot']\n")
    assert rt.start(0.0) == [] and rt.ctx.counters == {"up": 1}
    with pytest.raises(UserError) as err:
        rt.run_timers(0.2)
    assert str(err.value) == f"program bad ({rt.program.source}): handler Bad.tick raised KeyError at line 13: 'slot'"
