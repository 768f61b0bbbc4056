"""The worker's batch data path: prebuilt chunk frames, results taken a block at a time."""

import mmap
import os

import numpy as np

from innet.hosts.job import JobSpec
from innet.hosts.worker.call import AllreduceCall
from innet.hosts.worker.framing import buffers
from innet.hosts.worker.process import WorkerProcess
from innet.results.check import check
from innet.switch.runtime import flatten
from innet.wire import fixedpoint
from innet.wire.layer import scapy_frame
from innet.wire.packet import (
    FLAGS_OFFSET,
    HEADER_DTYPE,
    HEADER_OFFSET,
    PAYLOAD_OFFSET,
    RESULT,
    RETX,
    VER,
    make_packet,
    pack_frames,
    parse_block,
    parse_frame,
)

SWITCH = 9


def spec(rank, n, slots=8, elements=16):
    return JobSpec(job=1, rank=rank, nworkers=n, slots=slots, elements=elements, node=rank, first_hop=SWITCH)


def frames_of(out):
    return [f for _, f in flatten([(0, o) for o in out])]


def test_chunk_frames_are_byte_identical_to_scapy():
    tensor = np.linspace(-3, 5, 40, dtype=np.float32)  # 16 + 16 + 8: the last chunk is short
    call = AllreduceCall(spec(2, 3), tensor, first_chunk=13)
    [exp_frame] = frames_of(call.start(0.0))
    assert exp_frame == scapy_frame(2, SWITCH, job=1, rank=2, nworkers=3, slot=13 % 8, chunk=13, exp=call.local_exp,
                                    flags="VER")
    agreed = call.local_exp + 1
    result = make_packet(None, job=1, rank=2, nworkers=3, slot=13 % 8, chunk=13, flags=RESULT | VER, exp=agreed)
    sent = frames_of(call.receive(result.to_frame(SWITCH, 2), 0.001))
    q = fixedpoint.quantize(tensor, fixedpoint.scale_for(agreed, 3))
    assert len(sent) == 3
    for k, frame in enumerate(sent):
        chunk = 14 + k
        assert frame == scapy_frame(2, SWITCH, job=1, rank=2, nworkers=3, slot=chunk % 8, chunk=chunk, exp=agreed,
                                    flags="VER" if (chunk // 8) & 1 else 0, values=q[16 * k:16 * k + 16].tolist())
    # a retransmission is the same frame with the RETX flag set, and only for the chunks still out
    resent = frames_of(call.on_timeout(0.001 + call.rto))
    assert [parse_frame(f).chunk for f in resent] == [14, 15, 16]
    for old, new in zip(sent, resent, strict=True):
        assert new[FLAGS_OFFSET] == old[FLAGS_OFFSET] | RETX
        assert new[:FLAGS_OFFSET] + new[FLAGS_OFFSET + 1:] == old[:FLAGS_OFFSET] + old[FLAGS_OFFSET + 1:]
    assert call.retransmissions == 3


def test_the_data_frames_headers_are_written_while_the_exponent_is_agreed():
    """A worker's data frames need the agreed exponent only for their values and one header byte: their buffer,
    prefixes and headers are written when the call starts, its exponent frame out, so its answer quantizes straight
    into them. Every frame is the one scapy builds, the short last one's too."""
    tensor = np.linspace(-3, 5, 16 * 5 + 7, dtype=np.float32)
    call = AllreduceCall(spec(1, 4, slots=4, elements=16), tensor, first_chunk=3)
    call.start(0.0)
    heads = call.frames.rows[:, :PAYLOAD_OFFSET].copy()
    assert heads.shape == (5, PAYLOAD_OFFSET)
    agreed = call.local_exp + 2
    answer = make_packet(None, job=1, rank=1, nworkers=4, slot=3, chunk=3, flags=RESULT, exp=agreed).to_frame(SWITCH, 1)
    sent = frames_of(call.receive(answer, 0.001))
    assert [parse_frame(f).chunk for f in sent] == [4, 5, 6, 7]  # the window: 4 slots
    exp_at = HEADER_OFFSET + HEADER_DTYPE.fields["exp"][1]
    after = call.frames.rows[:, :PAYLOAD_OFFSET]
    assert (np.delete(after, exp_at, axis=1) == np.delete(heads, exp_at, axis=1)).all()  # only the exponent's byte
    assert (after[:, exp_at] == agreed).all() and (heads[:, exp_at] == 0).all()
    q = fixedpoint.quantize(tensor, fixedpoint.scale_for(agreed, 4))
    for chunk in range(4, 10):
        values = q[16 * (chunk - 4):16 * (chunk - 3)].tolist()
        assert call.frames.one(chunk) == scapy_frame(1, SWITCH, job=1, rank=1, nworkers=4, slot=chunk % 4, chunk=chunk,
                                                     exp=agreed, flags="VER" if (chunk // 4) & 1 else 0, values=values)


def test_results_in_shuffled_blocks_are_exact_and_slots_never_overlap():
    """A switch that answers in random order and delivers in random blocks: each result frees only
    its own slot, every worker gets the exact sum, and no worker ever has two chunks in one slot."""
    rng = np.random.default_rng(7)
    n, slots, elements = 3, 8, 16
    tensors = [rng.normal(size=1000).astype(np.float32) * 10 ** float(rng.integers(-3, 3)) for _ in range(n)]
    calls = [AllreduceCall(spec(r, n, slots, elements), t, first_chunk=5) for r, t in enumerate(tensors)]
    in_slot: dict[tuple[int, int], int] = {}  # (rank, slot) -> the chunk the worker has in flight there
    got: dict[int, dict[int, tuple[np.ndarray, int]]] = {}  # chunk -> rank -> (values, exp)
    to_worker: list[list[bytes]] = [[] for _ in range(n)]
    uplink = [(r, f) for r, c in enumerate(calls) for f in frames_of(c.start(0.0))]
    now, blocks = 0.0, 0
    while not all(c.done for c in calls):
        for rank, frame in uplink:
            pkt = parse_frame(frame)
            assert in_slot.get((rank, pkt.slot), pkt.chunk) == pkt.chunk, "two chunks in flight in one slot"
            in_slot[(rank, pkt.slot)] = pkt.chunk
            got.setdefault(pkt.chunk, {})[rank] = (np.array(pkt.values, np.int64), pkt.exp)
            if len(got[pkt.chunk]) == n:
                total = np.sum([v for v, _ in got[pkt.chunk].values()], axis=0)
                exp = max(e for _, e in got[pkt.chunk].values())
                res = make_packet(total, job=1, rank=0, nworkers=n, slot=pkt.slot, chunk=pkt.chunk,
                                  flags=RESULT | (pkt.flags & VER), exp=exp)
                for r in range(n):
                    to_worker[r].append(res.to_frame(SWITCH, r))
        uplink = []
        now += 0.0001
        for r, call in enumerate(calls):
            pending = to_worker[r]
            rng.shuffle(pending)
            take = int(rng.integers(1, len(pending) + 1)) if pending else 0
            block, to_worker[r] = pending[:take], pending[take:]
            if not block:
                continue
            for frame in block:
                pkt = parse_frame(frame)
                in_slot.pop((r, pkt.slot), None)
            blocks += 1
            uplink += [(r, f) for f in frames_of(call.receive_block(parse_block(*pack_frames(block)), now))]
    correct, _, _ = check([[t] for t in tensors], [[c.result_int] for c in calls], [[c.result] for c in calls])
    assert correct and all(c.error is None for c in calls)
    assert blocks < n * calls[0].end  # results really came several to a block
    assert all(c.retransmissions == 0 for c in calls)


def test_holdoff_only_while_half_the_window_is_in_flight():
    call = AllreduceCall(spec(0, 2, slots=8, elements=4), np.ones(100, np.float32), first_chunk=0)  # 25 chunks
    call.start(0.0)
    assert call.holdoff() == 0.0  # no RTT measured yet
    res = make_packet(None, job=1, rank=0, nworkers=2, slot=0, chunk=0, flags=RESULT, exp=call.local_exp)
    call.receive(res.to_frame(SWITCH, 0), 0.001)  # the exponent: 8 chunks go out, but it gives no RTT sample
    frames = []
    for chunk in range(1, 5):
        r = make_packet(np.zeros(4, np.int32), job=1, rank=0, nworkers=2, slot=chunk % 8, chunk=chunk, flags=RESULT,
                        exp=call.local_exp)
        frames.append(r.to_frame(SWITCH, 0))
    call.receive_block(parse_block(*pack_frames(frames)), 0.005)  # RTT 4 ms; 4 freed slots refilled: 8 in flight
    assert call.window.timer.srtt == 0.004
    assert call.holdoff() == min(0.001, call.rto / 8)
    call.window.in_flight[:5] = -1  # only 3 of 8 in flight: every result is needed at once
    assert call.holdoff() == 0.0
    call.window.in_flight[:5] = 1
    call.window.sent_all = True  # every chunk is out: results only end the call
    assert call.holdoff() == 0.0


def present(array: np.ndarray) -> float:
    """The share of ``array``'s pages that are in memory now (/proc/self/pagemap's present bit)."""
    size = os.sysconf("SC_PAGE_SIZE")
    first, last = array.ctypes.data // size, (array.ctypes.data + array.nbytes - 1) // size
    with open("/proc/self/pagemap", "rb") as fh:
        fh.seek(first * 8)
        entries = np.frombuffer(fh.read((last - first + 1) * 8), np.uint64)
    return float(np.mean(entries >> np.uint64(63) == 1))


def test_prepared_buffers_are_in_memory_before_the_run_and_the_calls_fill_exactly_them():
    """``prepare`` (before "go") writes every page of each call's result and frame arrays, so the run does not
    fault them in; the calls then take exactly those arrays, and the results are exact (one worker: its own
    quantized tensor)."""
    one = spec(0, 1, slots=8, elements=2048)
    tensors = [np.linspace(-2, 3, 1_000_000, dtype=np.float32), np.linspace(5, -1, 300_001, dtype=np.float32)]
    proc = WorkerProcess(one, tensors)
    proc.prepare()
    arrays = [a for group in proc.resident.free.values() for a in group]
    assert sorted(a.nbytes for a in arrays) == sorted(
        n for length in map(len, tensors) for n in (buffers(one, length)[0][0] * 4,
                                                    int(np.prod(buffers(one, length)[1]))))
    assert [present(a) for a in arrays] == [1.0] * 4
    fresh = mmap.mmap(-1, 4 << 20)  # new memory, as a large allocation of a fresh process gets: not in memory until written
    assert present(np.frombuffer(fresh, np.uint8)) == 0.0
    prepared = {id(a) for a in arrays}
    out, now = frames_of(proc.start(0.0)), 0.0
    while not proc.done:
        now += 1e-4
        echoed = []
        for frame in out:  # a one-worker job's switch: each chunk comes back as its own result
            pkt = parse_frame(frame)
            echoed.append(make_packet(np.array(pkt.values, np.int64), job=1, rank=0, nworkers=1, slot=pkt.slot,
                                      chunk=pkt.chunk, flags=RESULT | (pkt.flags & VER), exp=pkt.exp).to_frame(SWITCH, 0))
        out = frames_of(proc.receive_block(parse_block(*pack_frames(echoed)), now))
    assert [id(c._padded) in prepared and id(c.frames.rows) in prepared for c in proc.calls] == [True, True]
    assert not any(proc.resident.free.values())  # every prepared array was taken
    for call, tensor in zip(proc.calls, tensors, strict=True):
        assert call.error is None
        np.testing.assert_array_equal(call.result_int, fixedpoint.quantize(tensor, call.scale))


def test_a_result_for_a_later_chunk_resends_the_earlier_one_a_reordering_window_later():
    """RACK by order (innet.hosts.recovery): chunk 15's result back while 14's is not marks 14 lost, resent once a
    reordering window (the RTO floor here) passed, long before its RTO; the original's late answer is spurious."""
    call = AllreduceCall(spec(0, 2), np.ones(100, np.float32), first_chunk=13)
    call.start(0.0)
    agreed = make_packet(None, job=1, rank=0, nworkers=2, slot=13 % 8, chunk=13, flags=RESULT | VER, exp=call.local_exp)
    window = frames_of(call.receive(agreed.to_frame(SWITCH, 0), 0.0))
    assert [parse_frame(f).chunk for f in window] == list(range(14, 21))

    def result(chunk, now):
        pkt = make_packet(np.zeros(16, np.int32), job=1, rank=0, nworkers=2, slot=chunk % 8, chunk=chunk,
                          flags=RESULT | (VER if (chunk // 8) & 1 else 0))
        return frames_of(call.receive(pkt.to_frame(SWITCH, 0), now))

    assert result(15, 0.001) == []  # only a suspect yet: it may just be reordered
    due = call.next_deadline()
    assert due == 0.001 + call.spec.min_rto < call.window.last_progress + call.rto
    resent = frames_of(call.on_timeout(due))
    assert [parse_frame(f).chunk for f in resent] == [14] and parse_frame(resent[0]).has(RETX)
    assert call.retransmissions == 1 and call.spurious == 0
    result(14, due + 0.0001)  # sooner than any round trip after the retransmission: the original's answer
    assert call.spurious == 1


def test_a_call_that_lost_nothing_never_probes():
    """Tail probes only after a loss: a clean call waits for its RTO, so a slow answer is never retransmitted early."""
    call = AllreduceCall(spec(0, 2), np.ones(100, np.float32), first_chunk=13)
    call.start(0.0)
    agreed = make_packet(None, job=1, rank=0, nworkers=2, slot=13 % 8, chunk=13, flags=RESULT | VER, exp=call.local_exp)
    call.receive(agreed.to_frame(SWITCH, 0), 0.0)
    assert call.window.probe_due() == np.inf
    assert call.next_deadline() == call.rto  # the RTO, from the last progress (0.0)


def test_a_chunk_still_in_the_hosts_queue_is_not_sent_again():
    """Order asks for a chunk whose last copy this host's link has not sent yet: nothing goes (as Linux's TCP
    does not retransmit what is still in the host's queue). The case: chunk 2's late original completes its slot
    and the answer counts for chunk 2's retransmission, sent after chunk 1's; chunk 1's, still queued, is then
    suspect. Without the check it went again, and a call longer than its slot pool flooded (innet.hosts.worker.window:
    ``Window.queue``)."""
    from dataclasses import replace

    from innet.wire.packet import PAYLOAD_OFFSET

    elements = 16
    frame_bits = (PAYLOAD_OFFSET + 4 * elements) * 8
    call = AllreduceCall(replace(spec(0, 2, slots=8, elements=elements), nic_bps=frame_bits / 0.001, lossy=True),
                         np.ones(20 * elements, np.float32), first_chunk=0)  # this host's link sends a frame a ms

    def result(chunk, now):
        pkt = make_packet(np.zeros(elements, np.int32), job=1, rank=0, nworkers=2, slot=chunk % 8, chunk=chunk,
                          flags=RESULT | (VER if (chunk // 8) & 1 else 0), exp=call.local_exp)
        return frames_of(call.receive_block(parse_block(*pack_frames([pkt.to_frame(SWITCH, 0)])), now))

    call.start(0.0)
    exp = make_packet(None, job=1, rank=0, nworkers=2, slot=0, chunk=0, flags=RESULT, exp=call.local_exp)
    assert len(frames_of(call.receive(exp.to_frame(SWITCH, 0), 0.001))) == 8  # chunks 1-8: gone by 0.009
    for chunk in range(3, 9):
        result(chunk, 0.0095)  # chunks 1 and 2 unanswered: suspect; 11-16 take their slots, gone by 0.0155
    resent = frames_of(call.on_timeout(0.0095 + call.window.rack.window(call.window.timer.srtt)))
    assert [parse_frame(f).chunk for f in resent] == [1, 2]  # their copies long gone; these leave by 0.0175
    result(2, 0.012)  # chunk 2's original, late: its answer counts for the retransmission, the newest sent
    assert (call.window.suspect_at[[1, 3, 4, 5, 6, 7, 0]] == 0.012).all()  # chunks 1 and 11-16: sent before it
    due = 0.012 + call.window.rack.window(call.window.timer.srtt)
    assert call.window.left_at[[3, 4]].max() < due < call.window.left_at[[1, 7, 0]].min()
    assert [parse_frame(f).chunk for f in frames_of(call.on_timeout(due))] == [11, 12, 13, 14]  # not 1, 15, 16
    assert (call.retransmissions, call.host_queued) == (6, 3)


def test_an_answer_of_the_wrong_shape_is_dropped_and_named_if_the_call_then_times_out():
    """A result for a chunk in flight with the wrong number of values (a switch program's bug, or a spoofer's frame)
    is not taken; the call goes on (a spoofer must not end it), and if it then times out its error says why, by the
    frame and the block path alike."""
    for path in ("frame", "block"):
        call = AllreduceCall(spec(0, 2), np.ones(100, np.float32), first_chunk=13)
        call.start(0.0)
        agreed = make_packet(None, job=1, rank=0, nworkers=2, slot=13 % 8, chunk=13, flags=RESULT | VER,
                             exp=call.local_exp)
        call.receive(agreed.to_frame(SWITCH, 0), 0.0)
        short = make_packet(np.zeros(5, np.int32), job=1, rank=0, nworkers=2, slot=14 % 8, chunk=14,
                            flags=RESULT | VER, exp=call.local_exp).to_frame(SWITCH, 0)
        if path == "frame":
            call.receive(short, 0.001)
        else:
            call.receive_block(parse_block(*pack_frames([short])), 0.001)
        assert call.error is None and not call.done
        while not call.done:
            call.on_timeout(call.next_deadline())
        assert str(call.error).endswith("; its switch answered chunk 14 with 5 values where 16 were due: the switch "
                                        "program's result has the wrong shape"), (path, call.error)


def _window_state(call):
    """Everything a call's window holds, its timers' too, as one comparable string."""
    def plain(obj, skip=()):
        return {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in vars(obj).items() if k not in skip}
    window = call.window
    parts = ("timer", "rack", "undo", "host")
    return repr((plain(window, ("spec", "frame", *parts)), *(plain(getattr(window, p), ("spec",)) for p in parts)))


def test_the_exponents_answer_by_plain_ints_is_the_block_paths_and_a_rehearsal_changes_nothing():
    """The exponent's answer taken by ``receive``'s plain ints sends what the block path sends and leaves the call
    as it does: a plain answer, then its repeat (stale); one carrying values (misshapen, dropped). A process
    rehearsed before "go" (a throwaway call agreed and answered once, nothing sent) sends the same frames."""
    tensor = np.linspace(-3, 5, 16 * 5 + 7, dtype=np.float32)
    agreed = fixedpoint.magnitude_exponent(tensor) + 2
    plain = make_packet(None, job=1, rank=1, nworkers=4, slot=3, chunk=3, flags=RESULT, exp=agreed).to_frame(SWITCH, 1)
    valued = make_packet(np.ones(2, np.int32), job=1, rank=1, nworkers=4, slot=3, chunk=3, flags=RESULT,
                         exp=agreed).to_frame(SWITCH, 1)
    for answers in ([plain, plain], [valued]):
        calls = [AllreduceCall(spec(1, 4, slots=4, elements=16), tensor, first_chunk=3) for _ in range(2)]
        for call in calls:
            call.start(0.0)
        for k, frame in enumerate(answers):
            by_frame = frames_of(calls[0].receive(frame, 0.001 * (k + 1)))
            by_block = frames_of(calls[1].receive_block(parse_block(*pack_frames([frame])), 0.001 * (k + 1)))
            assert by_frame == by_block and len(by_frame) == (4 if answers[0] is plain and k == 0 else 0)
            assert _window_state(calls[0]) == _window_state(calls[1])
        assert [c.scale for c in calls] == [fixedpoint.scale_for(agreed, 4) if answers[0] is plain else None] * 2
        assert calls[0].misshapen == calls[1].misshapen and bool(calls[0].misshapen) == (answers[0] is valued)
    procs = [WorkerProcess(spec(1, 4, slots=4, elements=16), [tensor], first_chunk=3) for _ in range(2)]
    rehearsal = procs[0].rehearse()
    assert rehearsal.scale is not None and rehearsal.window.in_flight.tolist().count(-1) == 1  # agreed, one answered
    sent = [frames_of(p.start(0.0)) + frames_of(p.receive(plain, 0.001)) for p in procs]
    assert sent[0] == sent[1] and len(sent[0]) == 5 and [len(p.calls) for p in procs] == [1, 1]
    assert _window_state(procs[0].current) == _window_state(procs[1].current)
