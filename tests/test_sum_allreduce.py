"""sum_allreduce on the in-process fabric and on a bare runtime: exact, exactly once."""

import numpy as np
import pytest

from innet.backends.local.run import run_local
from innet.planning.spec import RunSpec
from innet.switch.loader import load_program
from innet.wire.packet import (
    ALL_RANKS,
    MAX_PACKET_ELEMENTS,
    OVERFLOW,
    PAYLOAD_OFFSET,
    RESULT,
    RETX,
    VER,
    link_mtu,
    make_packet,
    parse_frame,
)
from tests.helpers import ints, star_runtime
from topologies import build


@pytest.mark.parametrize("workers,elements", [(2, 1), (3, 257), (5, 1000), (8, 4099), (16, 777), (32, 3001)])
def test_exact_integer_sum_on_a_star(workers, elements):
    result = run_local(build("star", workers=workers), RunSpec(elements=elements, iterations=2, seed=workers))
    assert result["correct"], result["errors"]
    assert result["retransmissions"] == 0 and result["packets_dropped"] == 0


@pytest.mark.parametrize("placement", ["root", "tor", "tree"])
@pytest.mark.parametrize("topo,params", [("leaf-spine", {"racks": 3, "hosts_per_rack": 3, "spines": 2}), ("fat-tree", {"k": 4})])
def test_exact_on_hierarchies(topo, params, placement):
    result = run_local(build(topo, **params), RunSpec(elements=3001, placement=placement, iterations=2))
    assert result["correct"], result["errors"]


@pytest.mark.parametrize("pool", [1, 8, 512])
def test_pool_slots_sizes_every_switchs_pool_and_the_workers_window(pool):
    from innet.schemes.modes import plan_run

    graph = build("leaf-spine", racks=2, hosts_per_rack=2)
    run = RunSpec(elements=20000, pool_slots=pool, iterations=2, switch_memory=16 << 20)  # 512 slots of 2048 values: 8 MiB
    result = run_local(graph, run)
    assert result["correct"], result["errors"]
    program = load_program("sum_allreduce", pool)
    assert program.slots == pool and program.name == "sum_allreduce"
    per_slot = load_program("sum_allreduce", 2).memory_bytes() - load_program("sum_allreduce", 1).memory_bytes()
    assert program.memory_bytes() == load_program("sum_allreduce").memory_bytes() + (pool - 128) * per_slot
    assert set(result["switch_memory_bytes"].values()) == {program.memory_bytes()}
    specs = plan_run(graph, run, program).specs[1]
    assert {s.slots for s in specs.values()} == {pool}  # each worker keeps that many chunks in flight


@pytest.mark.parametrize("mode", ["innet", "pbox", "ring"])
@pytest.mark.parametrize("per_packet", [1, 100, 1024, MAX_PACKET_ELEMENTS])
def test_packet_elements_sizes_every_frame_and_the_bytes_follow(mode, per_packet):
    graph = build("leaf-spine", racks=2, hosts_per_rack=2)
    result = run_local(graph, RunSpec(mode=mode, elements=5001, packet_elements=per_packet, iterations=2))
    assert result["correct"], result["errors"]
    assert result["packet_elements"] == per_packet
    assert result["link_bytes"] == result["predicted_link_bytes"]
    if mode != "ring":  # a worker's link carries its chunks up and the results down: one header per chunk frame
        default = run_local(graph, RunSpec(mode=mode, elements=5001, iterations=2))
        more_frames = -(-5001 // per_packet) - -(-5001 // load_program("sum_allreduce").elements)
        assert result["link_bytes"]["h1--t1"] - default["link_bytes"]["h1--t1"] == 2 * 2 * PAYLOAD_OFFSET * more_frames


def test_packet_elements_sizes_the_pool_and_is_bounded_by_a_jumbo_frame():
    from innet.errors import UserError

    base = load_program("sum_allreduce")
    wide = load_program("sum_allreduce", 0, 1024)
    assert wide.elements == 1024 and wide.slots == base.slots == 128
    assert wide.memory_bytes() - base.memory_bytes() == 2 * 128 * (1024 - base.elements) * 4  # two versions of int32 slots
    assert base.elements == 2048 and base.memory_bytes() <= 4 << 20  # the default: a jumbo frame; fits the default memory
    assert load_program("sum_allreduce", 300, 1024).slots == 300
    assert link_mtu(MAX_PACKET_ELEMENTS) == 9000 and link_mtu(MAX_PACKET_ELEMENTS + 1) > 9000
    assert link_mtu(256) == 1500 and link_mtu(364) == 1500 and link_mtu(365) == 1504
    for bad in (MAX_PACKET_ELEMENTS + 1, -1):
        with pytest.raises(UserError, match=r"^packet_elements must be 1\.\.2239"):
            load_program("sum_allreduce", 0, bad)


def contribution(rank, values, chunk=5, slot=1, flags=0, port=None):
    pkt = make_packet(values, job=1, rank=rank, nworkers=3, slot=slot, chunk=chunk, flags=flags, exp=3)
    return pkt.to_frame(rank, 99), rank if port is None else port  # star: h<r+1> is node r on port r


def test_duplicate_and_retransmitted_contributions_are_counted_once():
    _, _, rt = star_runtime(workers=3)
    a, b, c = ints(10, 1), ints(10, 2), ints(10, 3)
    frame, port = contribution(0, a)
    assert rt.receive(port, frame, 0.0) == []
    assert rt.receive(port, frame, 0.0) == []                     # duplicate: dropped
    retx, _ = contribution(0, a, flags=RETX)
    assert rt.receive(port, retx, 0.0) == []                      # retransmission before completion: dropped
    rt.receive(1, contribution(1, b)[0], 0.0)
    out = rt.receive(2, contribution(2, c)[0], 0.0)
    assert sorted(p for p, _ in out) == [0, 1, 2]                 # multicast to the three workers
    res = parse_frame(out[0][1])
    assert res.has(RESULT) and res.rank == ALL_RANKS and res.chunk == 5
    assert np.array_equal(res.values, a.astype(np.int64) + b + c)
    assert rt.ctx.counters["drop:duplicate"] == 2
    # a worker that lost the result retransmits: it alone gets the result again, still the same sum
    again = rt.receive(1, contribution(1, b, flags=RETX)[0], 0.0)
    assert [p for p, _ in again] == [1]
    assert np.array_equal(parse_frame(again[0][1]).values, res.values)


def test_a_duplicate_of_a_finished_slots_contribution_is_dropped_not_answered():
    """The network's copy of a contribution the slot has counted asks for nothing: answering it put a whole result
    frame on the worker's link (star of 4, 10 Mbit/s, --dup 0.01, seed 3: 0.4132 s on the fabric, 0.3934 lossless);
    a retransmission (RETX) of it is still answered."""
    _, _, rt = star_runtime(workers=2)
    a, b = ints(10, 1), ints(10, 2)
    rt.receive(0, contribution(0, a)[0], 0.0)
    last, port = contribution(1, b)
    assert sorted(p for p, _ in rt.receive(port, last, 0.0)) == [0, 1]
    assert rt.receive(port, last, 0.0) == []  # the link's duplicate of the completing contribution
    assert rt.ctx.counters["drop:duplicate"] == 1
    assert [p for p, _ in rt.receive(port, contribution(1, b, flags=RETX)[0], 0.0)] == [1]


def test_stale_retransmission_after_the_slot_moved_on_is_dropped():
    _, plan, rt = star_runtime(workers=2)
    slots = plan.slots
    for rank in (0, 1):
        rt.receive(rank, contribution(rank, ints(4, rank), chunk=1, slot=1)[0], 0.0)
    # next round of slot 1 uses the other version; then the round after reuses version 0
    for rank in (0, 1):
        rt.receive(rank, contribution(rank, ints(4), chunk=1 + slots, slot=1, flags=VER)[0], 0.0)
        rt.receive(rank, contribution(rank, ints(4), chunk=1 + 2 * slots, slot=1)[0], 0.0)
    late, _ = contribution(0, ints(4, 9), chunk=1, slot=1, flags=RETX)
    assert rt.receive(0, late, 0.0) == []
    assert rt.ctx.counters["drop:stale"] == 1


def test_spoofed_rank_wrong_port_and_unknown_job_are_dropped():
    _, _, rt = star_runtime(workers=2)
    claimed = make_packet(ints(4), job=1, rank=0, slot=0, chunk=1).to_frame(1, 99)
    assert rt.receive(1, claimed, 0.0) == []        # rank 0 claimed from rank 1's port
    posing, _ = contribution(0, ints(4))
    assert rt.receive(1, posing, 0.0) == []         # ... and with rank 0's address too
    other = make_packet(ints(4), job=9, rank=0, slot=0, chunk=1).to_frame(0, 99)
    assert rt.receive(0, other, 0.0) == []
    outside = make_packet(ints(4), job=1, rank=0, slot=10_000, chunk=1).to_frame(0, 99)
    assert rt.receive(0, outside, 0.0) == []
    assert rt.ctx.counters == {"drop:not_member": 1, "drop:spoofed_source": 1, "drop:unknown_job": 1, "drop:bad_slot": 1}


def test_int32_overflow_is_flagged_never_silently_wrapped():
    _, _, rt = star_runtime(workers=2)
    big = np.full(3, 2**31 - 10, np.int32)
    rt.receive(0, contribution(0, big)[0], 0.0)
    out = rt.receive(1, contribution(1, big)[0], 0.0)
    assert parse_frame(out[0][1]).has(OVERFLOW)


def test_results_are_identical_with_heavy_loss_duplication_and_reordering():
    from innet.wire.faults import FaultSpec

    graph = build("leaf-spine", racks=2, hosts_per_rack=3)
    clean = run_local(graph, RunSpec(elements=5000, iterations=2))
    lossy = run_local(graph, RunSpec(elements=5000, iterations=2, faults=FaultSpec(loss=0.2)))
    assert lossy["correct"] and lossy["retransmissions"] > 0 and lossy["drops"]["link:lost"] > 0
    shuffled = run_local(graph, RunSpec(elements=5000, iterations=2, faults=FaultSpec(dup=0.2, reorder=0.3)))
    assert shuffled["correct"] and shuffled["drops"]["drop:duplicate"] > 0
    for faulty in (lossy, shuffled):
        assert faulty["max_abs_error"] == clean["max_abs_error"]


def test_program_needing_more_memory_than_the_switch_has_is_refused():
    from innet.errors import UserError

    with pytest.raises(UserError, match="needs .* bytes of register memory but switch s1 has 1024"):
        run_local(build("star", workers=2), RunSpec(elements=10, switch_memory=1024))
