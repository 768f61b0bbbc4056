"""The switch-program API: decorators, registers, actions, timers, loading."""

import numpy as np
import pytest

from innet import Drop, Emit, Register, SwitchProgram, on_packet, on_start, on_timer
from innet.backends.local.fabric import Fabric
from innet.errors import UserError
from innet.planning.configs import switch_configs
from innet.planning.planner import plan_job
from innet.switch.loader import available, load_program
from innet.switch.runtime import SwitchRuntime
from innet.wire.packet import make_packet, parse_frame
from topologies import build


class Counter(SwitchProgram):
    name = "counter"
    slots = 4
    registers = (Register("hits", ("slots",), np.int64), Register("table", (3, "elements"), np.int16))

    @on_start
    def hello(self, ctx):
        ctx.count("started")

    @on_timer(0.5)
    def tick(self, ctx):
        ctx.count("ticks")
        return Emit(0, make_packet(np.array([ctx.regs.hits.sum()]), job=1, flags=4))  # ROUTE to port 0

    @on_packet("contribution")
    def hit(self, ctx, pkt):
        ctx.regs.hits[pkt.slot % self.slots] += 1
        return Drop("counted")


def test_registers_are_allocated_up_front_and_their_memory_reported():
    assert Counter.memory_bytes() == 4 * 8 + 3 * 256 * 2
    regs = Counter.allocate()
    assert regs.hits.shape == (4,) and regs.table.dtype == np.int16


def test_handlers_are_found_by_their_tags():
    packet, timers, starts = Counter.handlers()
    assert packet == {"contribution": "hit"} and timers == {"tick": 0.5} and starts == ["hello"]
    with pytest.raises(ValueError, match="unknown packet kind"):
        on_packet("nope")


def test_start_timer_and_packet_handlers_run_in_the_fabric():
    graph = build("star", workers=2)
    plan = plan_job(graph, ["h1", "h2"], method="root", slots=4)
    rt = SwitchRuntime(switch_configs(graph, [plan])["s1"], Counter)
    fabric = Fabric(graph)
    fabric.add_switch("s1", rt)
    for slot in (1, 1, 2):
        fabric._at(0.1, fabric._deliver, "s1", 0, make_packet(np.arange(3), job=1, slot=slot).to_frame(0, 3))
    fabric.run(until=1.2)
    assert rt.ctx.counters == {"started": 1, "ticks": 2, "drop:counted": 3}
    assert list(rt.ctx.regs.hits) == [0, 2, 1, 0]
    assert rt.stats[0].tx_packets == 2


def test_unhandled_kinds_are_dropped_and_unparsable_frames_counted():
    graph = build("star", workers=2)
    plan = plan_job(graph, ["h1", "h2"], method="root", slots=4)
    rt = SwitchRuntime(switch_configs(graph, [plan])["s1"], Counter)
    assert rt.receive(0, make_packet(np.arange(2), job=1, flags=1).to_frame(0, 3), 0.0) == []  # a result: no handler
    assert rt.receive(0, b"\x00" * 70, 0.0) == []
    assert rt.ctx.counters == {"drop:no_handler": 1, "bad:foreign": 1}


def test_forward_program_routes_by_destination():
    graph = build("star", workers=3)
    rt = SwitchRuntime(switch_configs(graph, [])["s1"], load_program("forward"))
    index = {n: i for i, n in enumerate(sorted(graph))}
    frame = make_packet(np.arange(4), job=3, flags=4).to_frame(index["h1"], index["h3"])
    [(port, out)] = rt.receive(0, frame, 0.0)
    assert port == 2 and out == frame and parse_frame(out).dst == index["h3"]


def test_shipped_programs_load_and_bad_ones_give_one_clear_error(tmp_path):
    assert {"forward", "sum_allreduce"} <= set(available())
    with pytest.raises(UserError, match="unknown program 'nope'"):
        load_program("nope")
    broken = tmp_path / "broken.py"
    broken.write_text("class X(:\n")
    with pytest.raises(UserError, match="syntax error at line 1"):
        load_program(str(broken))
    empty = tmp_path / "empty.py"
    empty.write_text("x = 1\n")
    with pytest.raises(UserError, match="exactly one SwitchProgram"):
        load_program(str(empty))
