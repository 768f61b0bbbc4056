"""The ring's endpoint on its own: block and single-frame paths, loss, and the bands of its frames."""

import numpy as np
import pytest

from innet.hosts.ring import ACK_BAND, Linger, RingCall
from innet.hosts.worker import JobSpec
from innet.wire import fixedpoint
from innet.wire.packet import RESULT, ROUTE, make_packet, pack_frames, parse_block, parse_frame

NODES = [10, 11, 12, 13]


def ring_of(length, band=0, seed=0):
    rng = np.random.default_rng(seed)
    tensors = [rng.standard_normal(length).astype(np.float32) for _ in NODES]
    calls = [RingCall(JobSpec(job=1, rank=r, nworkers=len(NODES), slots=8, elements=64, node=node, first_hop=99,
                              band=band), NODES, tensors[r], 0) for r, node in enumerate(NODES)]
    return calls


def frames_of(out):
    """An endpoint's output as single frames (blocks split into rows)."""
    for item in out:
        yield from ([item] if isinstance(item, bytes) else (row.tobytes() for row in item))


def run(calls, rng, loss=0.0, blocks=True):
    """Deliver every frame to its addressee, in blocks of random size (or one at a time), dropping
    ``loss`` of them; on silence, fire the timers. Returns every frame sent."""
    queues = {node: [] for node in NODES}
    sent = []

    def deliver(out):
        for frame in frames_of(out):
            sent.append(frame)
            if rng.random() >= loss:
                queues[parse_frame(frame).dst].append(frame)

    now = 0.0
    for call in calls:
        deliver(call.start(now))
    for _ in range(100_000):
        if all(call.done for call in calls):
            return sent
        now += 1e-4
        busy = [node for node in NODES if queues[node]]
        for node in busy:
            call, take = calls[NODES.index(node)], int(rng.integers(1, 40)) if blocks else 1
            frames, queues[node] = queues[node][:take], queues[node][take:]
            if blocks:
                deliver(call.receive_block(parse_block(*pack_frames(frames)), now))
            else:
                for frame in frames:
                    deliver(call.receive(frame, now))
        if not busy:
            now += 2.0
            for call in calls:
                deliver(call.on_timeout(now))
    raise AssertionError("the ring did not finish")


@pytest.mark.parametrize("blocks", [True, False])
@pytest.mark.parametrize("loss", [0.0, 0.05])
def test_every_rank_gets_the_exact_sum_in_blocks_or_frame_by_frame(blocks, loss):
    calls = ring_of(5000, seed=3)
    run(calls, np.random.default_rng(7), loss=loss, blocks=blocks)
    want = sum(call.quantized.astype(np.int64) for call in calls)
    for call in calls:
        assert call.error is None
        assert np.array_equal(call.result_int, want)
    if loss:
        assert sum(call.retransmissions for call in calls) > 0


@pytest.mark.parametrize("band, data_band", [(0, 1), (1, 1), (2, 2)])
def test_acks_jump_the_queue_of_data(band, data_band):
    calls = ring_of(3000, band=band)
    sent = [parse_frame(f) for f in run(calls, np.random.default_rng(1))]
    acks = [p for p in sent if p.has(RESULT)]
    data = [p for p in sent if not p.has(RESULT)]
    assert acks and data
    assert {p.band for p in acks} == {ACK_BAND} and {p.band for p in data} == {data_band}


def test_a_block_of_data_frames_is_byte_exact_with_single_packets():
    calls = ring_of(3000)
    sent = run(calls, np.random.default_rng(2))
    call = calls[1]
    frame = next(f for f in sent if parse_frame(f).src == NODES[1] and parse_frame(f).slot == len(NODES) - 1
                 and not parse_frame(f).has(RESULT))  # its first reduce-scatter step: its own values
    piece = parse_frame(frame)
    lo = call.segments[call._segment_sent(piece.slot)][0] + (piece.chunk - call.first) * call.spec.elements
    want = make_packet(call.quantized[lo:lo + piece.count], job=1, rank=1, nworkers=len(NODES), slot=piece.slot,
                       chunk=piece.chunk, flags=ROUTE, exp=call.q).to_frame(NODES[1], NODES[2], call.data_band)
    assert frame == want
    assert call.scale == fixedpoint.scale_for(call.q, len(NODES))


@pytest.mark.parametrize("elements", [1, 3, 1025, 2049, 5001])
def test_the_ring_moves_the_bytes_the_prediction_says(elements):
    """Segments of unequal piece counts (1025 values: 256, 256, 256 and 257, so two pieces a step and an
    empty last piece for three of them) are priced as sent: every step sends the same number of pieces."""
    from innet.backends.local.run import run_local
    from innet.planning.spec import RunSpec
    from topologies import build

    result = run_local(build("leaf-spine", racks=2, hosts_per_rack=2), RunSpec(mode="ring", elements=elements, iterations=2))
    assert result["correct"], result["errors"]
    assert result["link_bytes"] == result["predicted_link_bytes"]


def test_a_rank_lingers_until_its_predecessors_done_or_the_last_resort_bound():
    """innet.hosts.ring.Linger: after its call a rank keeps answering its predecessor; the predecessor's DONE ends
    that at once, the bound (the run's timeout) only when no DONE comes; other calls have no linger."""
    calls = ring_of(3000)
    sent = run(calls, np.random.default_rng(2))
    lingers = [Linger(call, 100.0, 5.0) for call in calls]
    dones = [f for f in sent if parse_frame(f).has(RESULT) and parse_frame(f).slot == calls[0].steps]
    assert len(dones) == len(NODES)  # every rank said it is done, once
    for frame in dones:
        call = calls[NODES.index(parse_frame(frame).dst)]
        if not call.predecessor_done:  # still on its way when the ring finished
            assert not lingers[calls.index(call)].over(100.0)
            call.receive(frame, 100.0)
    assert all(linger.over(100.0) for linger in lingers)
    alone = ring_of(3000)[0]
    assert not Linger(alone, 0.0, 5.0).over(4.9) and Linger(alone, 0.0, 5.0).over(5.0)  # its predecessor died
    assert Linger(None, 0.0, 5.0).over(0.0)  # not a ring's call: nothing to wait for


def test_a_call_that_lost_something_resends_its_done_while_it_lingers():
    """A lost DONE held the successor for the whole timeout (2000 s on Mininet at x200): a call whose links
    lose resends it DONE_REPEATS times, a probe's spacing apart, and lingers until they are out; a clean one never."""
    from innet.hosts.ring import DONE_REPEATS

    calls = ring_of(3000)
    run(calls, np.random.default_rng(2))
    clean = Linger(calls[0], 100.0, 5.0)
    assert clean.due() == float("inf") and clean.repeat(100.0) == []
    calls[0].retransmissions = 1  # as after a loss
    calls[0].predecessor_done = True
    linger = Linger(calls[0], 100.0, 5.0)
    sent, now = [], 100.0
    while not linger.over(now):
        assert now < 105.0
        sent += linger.repeat(now)
        now = max(now, linger.due()) if linger.due() < float("inf") else now
    assert len(sent) == DONE_REPEATS and len(set(sent)) == 1
    done = parse_frame(sent[0])
    assert done.has(RESULT) and done.slot == calls[0].steps and done.dst == calls[0].next_node
    assert now < 100.0 + DONE_REPEATS * calls[0].quiet() + 1e-9  # then over, long before the bound
