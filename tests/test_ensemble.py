"""Ensembles sharing one input stream: group tables, multicast in the switch, exact delivery, and the
bytes sharing saves, measured against the planner's prediction."""

import numpy as np
import pytest

from innet.backends.local.run import run_local
from innet.hosts.ensemble import group_tables, input_shard
from innet.planning.configs import switch_configs
from innet.planning.spec import RunSpec
from innet.schemes.modes import plan_run
from innet.switch.loader import load_program
from innet.switch.runtime import SwitchRuntime
from innet.wire.faults import FaultSpec
from innet.wire.packet import GROUP_BASE, INPUT_JOB, ROUTE, make_packet, parse_frame
from tests.helpers import ints
from topologies import build


def _leaf_spine():
    return build("leaf-spine", racks=2, hosts_per_rack=4, bw=100)


def test_group_tables_are_the_reverse_route_tree_of_each_ranks_readers():
    """Two jobs on 8 hosts: rank 0 is h1 (job 1) and h2 (job 2), both under t1; the spine sends each
    group towards one ToR, the ToR out of its two readers' ports."""
    graph = _leaf_spine()
    rp = plan_run(graph, RunSpec(jobs=2, input_elements=1000, shared_input=True), load_program("sum_allreduce"))
    assert [(r.host, r.job, r.rank) for r in rp.input.receivers][:2] == [("h1", 1, 0), ("h3", 1, 1)]
    g = GROUP_BASE
    assert group_tables(graph, rp.input) == {
        "s1": {g: (1,), g + 1: (1,), g + 2: (2,), g + 3: (2,)},  # s1's port 1 is t1, port 2 is t2
        "t1": {g: (0, 1), g + 1: (2, 3)},                          # h1, h2 | h3, h4
        "t2": {g + 2: (0, 1), g + 3: (2, 3)},
    }


def test_the_switch_copies_a_group_frame_out_of_its_ports_byte_for_byte():
    graph = _leaf_spine()
    rp = plan_run(graph, RunSpec(jobs=2, input_elements=1000, shared_input=True), load_program("sum_allreduce"))
    config = switch_configs(graph, [], groups=group_tables(graph, rp.input))["t1"]
    rt = SwitchRuntime(config, load_program("sum_allreduce"))
    p1 = 8
    frame = make_packet(ints(256), job=INPUT_JOB, rank=0, chunk=3, flags=ROUTE).to_frame(p1, GROUP_BASE, 2)
    assert parse_frame(frame).band == 2
    for out in (rt.receive(4, frame, 0.0), rt.receive_frames(4, [frame, frame], 0.0)):
        assert sorted({port for port, _ in out}) == [0, 1]
        assert all(f == frame for _, f in out)
    assert len(rt.receive_frames(4, [frame, frame], 0.0)) == 4  # per-packet and batch paths alike
    assert rt.ctx.counters["input_bytes"] == 10 * len(frame)  # 2 + 4 + 4 copies
    stray = make_packet(ints(4), job=INPUT_JOB, rank=0, flags=ROUTE).to_frame(p1, GROUP_BASE + 7)
    assert rt.receive(4, stray, 0.0) == [] and rt.receive_frames(4, [stray], 0.0) == []
    assert rt.ctx.counters["drop:no_group"] == 2


def _run(shared, **kw):
    spec = RunSpec(jobs=kw.pop("jobs", 2), elements=20000, iterations=2, input_elements=5000, shared_input=shared, **kw)
    record = run_local(_leaf_spine(), spec)
    assert record["correct"], record["errors"]
    return record


def test_every_reader_gets_its_shards_exactly_and_sharing_saves_what_the_planner_says():
    unicast, shared = _run(False), _run(True)
    for record in (unicast, shared):
        i = record["input"]
        assert i["exact"] and i["readers"] == 8 and i["nacks"] == 0
        assert i["bytes"] == i["predicted_bytes"]  # measured at the server and the switches
    assert unicast["input"]["bytes"] == unicast["input"]["unicast_bytes"]
    # what sharing saved is what the links carried less, all traffic counted
    saved = sum(unicast["link_bytes"].values()) - sum(shared["link_bytes"].values())
    assert saved == shared["input"]["saved_bytes"] > 0.3 * unicast["input"]["bytes"]
    assert shared["result_digest"] == unicast["result_digest"]  # the gradients are untouched


def test_lost_input_chunks_are_nacked_and_resent_until_exact():
    record = _run(True, jobs=4, faults=FaultSpec(loss=0.05))
    i = record["input"]
    assert i["exact"] and i["nacks"] > 0 and i["bytes"] > i["predicted_bytes"]


def test_input_shards_are_seeded_and_differ_by_rank_and_iteration():
    a = input_shard(0, 0, 0, 100)
    assert np.array_equal(a, input_shard(0, 0, 0, 100))
    assert not np.array_equal(a, input_shard(0, 1, 0, 100)) and not np.array_equal(a, input_shard(0, 0, 1, 100))


@pytest.mark.parametrize("kw,message", [
    ({"shared_input": True}, "shared_input needs input_elements"),
    ({"input_elements": -1}, "^input_elements must be between 0 and"),
])
def test_bad_input_flags_are_one_clear_error(kw, message):
    from innet.errors import UserError

    with pytest.raises(UserError, match=message):
        plan_run(_leaf_spine(), RunSpec(**kw), load_program("sum_allreduce"))
