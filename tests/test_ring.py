"""The ring's endpoint on its own: block and single-frame paths, loss, and the bands of its frames."""

import numpy as np
import pytest

from innet.hosts.job import JobSpec
from innet.hosts.ring.call import ACK_BAND, RingCall
from innet.hosts.ring.linger import Linger
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


@pytest.mark.parametrize("length, seed", [(1500, 2), (1400, 4), (700, 2)])
def test_a_step_is_sent_in_order_so_a_lossless_fifo_ring_sees_no_hole(length, seed):
    """Each step's short last piece goes out after its step's other pieces: grouped with another step's short piece
    queued ahead of them, it overtook them (a duplicate ACK and 16 DONE repeats on a lossless Mininet run)."""
    calls = ring_of(length, seed=seed)  # 5 or 6 pieces a step, the last short; blocks of 1-40 frames queue a few steps
    sent = [parse_frame(f) for f in run(calls, np.random.default_rng(seed))]
    order: dict[tuple[int, int], list[int]] = {}
    for p in sent:
        if not p.has(RESULT):
            order.setdefault((p.src, p.slot), []).append(p.chunk)
    assert all(chunks == sorted(chunks) for chunks in order.values())
    assert not any(call.receipts.hole_acked for call in calls) and sum(call.retransmissions for call in calls) == 0


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
    """innet.hosts.ring.linger.Linger: after its call a rank keeps answering its predecessor; the predecessor's DONE ends
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
    from innet.hosts.ring.linger import DONE_REPEATS

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


def drive(calls, drop, latency=1e-4):
    """Event by event, every frame ``latency`` on its way (a FIFO path), each dropped where ``drop(pkt)`` says;
    timers fire when due. Returns every frame sent, as (time, sender rank, parsed packet)."""
    import heapq

    sent, flying, now, order = [], [], 0.0, 0

    def send(rank, out):
        nonlocal order
        for frame in frames_of(out):
            pkt = parse_frame(frame)
            sent.append((now, rank, pkt))
            if not drop(pkt):
                order += 1
                heapq.heappush(flying, (now + latency, order, frame))

    for call in calls:
        send(call.rank, call.start(now))
    while not all(call.done for call in calls):
        due = [d for call in calls if (d := call.next_deadline()) is not None]
        now = min(due + [flying[0][0]] if flying else due)
        while flying and flying[0][0] <= now:
            frame = heapq.heappop(flying)[2]
            call = calls[NODES.index(parse_frame(frame).dst)]
            send(call.rank, call.receive(frame, now))
        for call in calls:
            deadline = call.next_deadline()
            if deadline is not None and deadline <= now:
                send(call.rank, call.on_timeout(now))
        assert now < 10.0, "the ring did not finish"
    return sent


def test_every_piece_past_a_hole_is_acknowledged_at_once():
    """Duplicate ACKs (RFC 5681 4.2): each piece that comes past a hole sends an ACK naming the hole, so one lost
    ACK costs the next piece, not the next ACK_EVERY. Rank 0's first data piece is lost once: rank 1 ACKs each of
    the step's 11 pieces after it with the hole at 0 (with one ACK per hole: 1), then the retransmission."""
    calls = ring_of(3000)
    first = len(NODES) - 1  # the first data step
    lost = []

    def drop(pkt):
        if pkt.src == NODES[0] and not pkt.has(RESULT) and pkt.slot == first and pkt.chunk == 0 and not lost:
            lost.append(pkt)
            return True
        return False

    sent = drive(calls, drop)
    acks = [p for _, rank, p in sent if rank == 1 and p.has(RESULT) and p.slot == first]
    holes = [p for p in acks if int(p.values[0]) == 0]
    assert calls[1].pieces == 12 and len(holes) == 11, [int(p.values[0]) for p in acks]
    assert all(calls[r].result_int.tolist() == calls[0].result_int.tolist() for r in range(1, len(NODES)))


def test_a_lost_retransmission_is_sent_again_on_its_own_timer():
    """A retransmission is ACKed on arrival, so one unanswered for two round trips from when it left (at least the
    reordering window: here the 1 ms RTO floor) is sent again (``RingCall._retry_due``), each on its own timer,
    which never backs off. Two pieces of rank 0's last step are lost four times each: each try comes 1 ms after
    the one before (before, one of them waited for a backed-off RTO: 1, 2, 1.2 ms apart)."""
    calls = ring_of(3000)
    last = calls[0].steps - 1
    copies = {3: 0, 7: 0}

    def drop(pkt):
        if pkt.src == NODES[0] and not pkt.has(RESULT) and pkt.slot == last and pkt.chunk in copies:
            copies[pkt.chunk] += 1
            return copies[pkt.chunk] <= 4
        return False

    sent = drive(calls, drop)
    for j in copies:
        times = [t for t, rank, p in sent if rank == 0 and not p.has(RESULT) and p.slot == last and p.chunk == j][:5]
        assert np.diff(times)[1:] == pytest.approx([calls[0].spec.min_rto] * 3), (j, times)
    assert all(calls[r].result_int.tolist() == calls[0].result_int.tolist() for r in range(1, len(NODES)))
