"""The batch path (receive_block, sum_allreduce's batch handler) against the per-packet path.

The same random streams of packets (plain contributions, duplicates, retransmissions,
stale and mixed rounds, overflowing values, foreign ranks and ports, junk) go
through one runtime a frame at a time and through another in blocks: registers,
counters and the frames sent per port must be identical.
"""

import numpy as np
import pytest

from innet import OVERFLOW
from innet.planning.configs import switch_configs
from innet.planning.planner import plan_job
from innet.switch.loader import load_program
from innet.switch.runtime import SMALL_BLOCK, SwitchRuntime, flatten
from innet.wire.packet import ALL_RANKS, RESULT, RETX, ROUTE, SPARSE, VER, build_frames, make_packet, pack_frames, parse_block, parse_frame
from innet.wire.sparse import encode
from topologies import build

SLOTS = 4
ELEMENTS = 256  # values per packet in these streams (not the program's default: blocks of many small packets)


def runtimes(switch, program="sum_allreduce"):
    """Two identical runtimes for ``switch`` of a leaf-spine job (s1 is the root, t1 a ToR below it)."""
    graph = build("leaf-spine", racks=2, hosts_per_rack=3)
    plan = plan_job(graph, [f"h{i}" for i in range(1, 7)], method="tor", slots=SLOTS)
    prog = load_program(program, 0, ELEMENTS)
    cfg = switch_configs(graph, [plan] if prog.slots else [])[switch]
    return cfg, SwitchRuntime(cfg, prog), SwitchRuntime(cfg, prog)


def stream(cfg, rng, n, elements, sparse=False):
    """``n`` (port, frame) arrivals in runs per port: workers' rounds in order, with noise
    (duplicates, retransmissions, stale rounds, overflowing values, foreign ranks and ports, truncation).
    ``sparse``: values mostly zero, sent as (index, value) pairs where shorter (innet.wire.sparse)."""
    job = cfg.jobs[1]
    ranks = sorted(job.contributors)
    rounds = [0] * (SLOTS + 1)
    given: list[set] = [set() for _ in range(SLOTS + 1)]
    out = []
    while len(out) < n:
        rank = int(rng.choice(ranks)) if rng.random() < 0.97 else int(rng.integers(0, 20))
        port = job.contributors.get(rank, 0) if rng.random() < 0.97 else int(rng.choice(list(cfg.ports)))
        for _ in range(int(rng.integers(1, 2 * SLOTS))):  # a run of packets from this port
            slot = int(rng.integers(0, SLOTS + (1 if rng.random() < 0.03 else 0)))
            rnd = rounds[slot]
            if rank in given[slot] and rng.random() < 0.8:
                continue
            if rng.random() < 0.05:
                rnd = max(0, rnd - 2)
            given[slot].add(rank)
            if len(given[slot]) >= len(ranks):
                rounds[slot], given[slot] = rounds[slot] + 1, set()
            flags = (VER if rnd % 2 else 0) | (RETX if rng.random() < 0.03 else 0)
            count = elements if rng.random() < 0.97 else max(0, elements - 1)
            big = rng.random() < 0.03
            values = rng.integers(-(1 << 30) if big else -1000, (1 << 30) if big else 1000, count).astype(np.int32)
            if sparse:
                values[rng.random(count) < 0.97] = 0
                if (pairs := encode(values)) is not None:
                    values, flags = pairs, flags | SPARSE
            pkt = make_packet(values, job=1, rank=rank, nworkers=6, slot=slot, chunk=slot + SLOTS * rnd,
                              flags=flags, exp=int(rng.integers(-5, 5)))
            frame = pkt.to_frame(cfg.neighbors[port], cfg.node)
            if rng.random() < 0.02:
                frame = frame[: int(rng.integers(0, len(frame)))]  # truncated
            out.append((port, frame))
    return out[:n]


def by_port(frames):
    ports = {}
    for port, frame in frames:
        ports.setdefault(port, []).append(frame)
    return {p: sorted(f) for p, f in ports.items()}


def count_calls(program, handler):
    """Wrap ``program``'s per-packet ``handler`` to count the packets the batch path left to it."""
    calls = {"per_packet": 0}
    inner = getattr(program, handler)

    def counting(ctx, pkt):
        calls["per_packet"] += 1
        return inner(ctx, pkt)

    setattr(program, handler, counting)
    return calls


def runs_of(arrivals, rng):
    """Consecutive arrivals on one port, cut into blocks of random size (as a receive buffer fills)."""
    blocks, k = [], 0
    while k < len(arrivals):
        port, end = arrivals[k][0], k
        while end < len(arrivals) and arrivals[end][0] == port and end - k < int(rng.integers(1, 64)):
            end += 1
        blocks.append((port, [f for _, f in arrivals[k:end]]))
        k = end
    return blocks


@pytest.mark.parametrize("program", ["sum_allreduce", "topk_sparse", "max_allreduce", "or_allreduce"])
@pytest.mark.parametrize("switch", ["s1", "t1"])
@pytest.mark.parametrize("seed", range(8))
def test_blocks_give_the_same_registers_counters_and_frames_as_single_packets(program, switch, seed):
    cfg, single, batched = runtimes(switch, program)
    rng = np.random.default_rng(seed)
    arrivals = stream(cfg, rng, 600, elements=int(rng.choice([0, 1, 7, ELEMENTS])), sparse=program == "topk_sparse")
    calls = count_calls(batched.program, "contribution")
    want, got = [], []
    for port, frame in arrivals:
        want += single.receive(port, frame, 1.0)
    for port, frames in runs_of(arrivals, rng):
        got += batched.receive_frames(port, frames, 1.0)
    assert by_port(got) == by_port(want)
    for name in vars(single.ctx.regs):
        assert np.array_equal(getattr(single.ctx.regs, name), getattr(batched.ctx.regs, name)), name
    assert single.ctx.counters == batched.ctx.counters
    assert single.report().ports == batched.report().ports
    assert calls["per_packet"] < 0.5 * len(arrivals)  # most packets really took the batch path


@pytest.mark.parametrize("program", ["forward", "sum_allreduce"])
@pytest.mark.parametrize("switch", ["s1", "t1"])
def test_routed_blocks_are_forwarded_exactly_like_single_packets(program, switch):
    cfg, single, batched = runtimes(switch, program)
    rng = np.random.default_rng(3)
    nodes = [*cfg.routes, cfg.node, 500, -1]
    arrivals = []
    for _ in range(400):
        src, dst = int(rng.choice(nodes)), int(rng.choice(nodes))
        port = cfg.routes.get(src, 0) if rng.random() < 0.9 else int(rng.choice(list(cfg.ports)))  # some spoofed
        count = int(rng.choice([0, 5, ELEMENTS]))
        sparse = SPARSE if rng.random() < 0.3 else 0  # SPARSE packets batch whatever their lengths: routed, each keeps its own
        length = count + (int(rng.integers(1, 9)) if sparse else 0)
        pkt = make_packet(rng.integers(-9, 9, length), job=2, rank=1, slot=3, chunk=int(rng.integers(0, 99)), flags=ROUTE | sparse)
        frame = pkt.to_frame(src, dst)
        arrivals.append((port, frame if src >= 0 and dst >= 0 else frame[:26] + b"\x01\x02\x03\x04" + frame[30:]))
    want, got = [], []
    for port, frame in arrivals:
        want += single.receive(port, frame, 0.0)
    for port, frames in runs_of(arrivals, rng):
        got += batched.receive_frames(port, frames, 0.0)
    assert by_port(got) == by_port(want) and len(want) > 100
    assert single.ctx.counters == batched.ctx.counters
    assert single.report().ports == batched.report().ports


@pytest.mark.parametrize("program", ["sum_allreduce", "topk_sparse", "max_allreduce", "or_allreduce"])
@pytest.mark.parametrize("seed", range(4))
def test_result_blocks_at_a_tor_give_the_same_registers_counters_and_frames_as_single_results(program, seed):
    """Results coming down from the spine: fresh, repeated, stale (chunk or state), both versions,
    overflowing, out-of-range slots, too long, from a child port, foreign jobs (and for topk_sparse,
    mostly sparse: (index, value) pairs where shorter); per packet against blocks."""
    cfg, single, batched = runtimes("t1", program)
    job = cfg.jobs[1]
    rng = np.random.default_rng(seed)
    calls = count_calls(batched.program, "result")
    want, got, sent = [], [], 0
    for _ in range(12):  # rounds: the slots' registers set afresh (alike in both), then results arrive
        keys = len(single.ctx.regs.chunk)  # version * slots + slot
        slots = keys // 2
        chunk = rng.integers(0, 50, keys)
        state = rng.choice([0, 1, 2], keys, p=[0.2, 0.7, 0.1])  # COLLECTING, WAITING, DONE
        for rt in (single, batched):
            rt.ctx.regs.chunk[:], rt.ctx.regs.state[:] = chunk, state
        arrivals = []
        for _ in range(30):
            v, slot = int(rng.integers(0, 2)), int(rng.integers(0, SLOTS + (1 if rng.random() < 0.05 else 0)))
            c = max(0, int(chunk[v * slots + min(slot, slots - 1)]) + (0 if rng.random() < 0.8 else int(rng.integers(-2, 3))))
            count = ELEMENTS if rng.random() < 0.95 else int(rng.choice([7, ELEMENTS + 1]))
            flags = RESULT | (VER if v else 0) | (OVERFLOW if rng.random() < 0.1 else 0) | (RETX if rng.random() < 0.1 else 0)
            values = rng.integers(-9999, 9999, count).astype(np.int32)
            if program == "topk_sparse":
                values[rng.random(count) < 0.97] = 0
                if (pairs := encode(values)) is not None:
                    values, flags = pairs, flags | SPARSE
            pkt = make_packet(values, job=1 if rng.random() < 0.95 else 7, rank=ALL_RANKS,
                              nworkers=6, slot=slot, chunk=c, flags=flags, exp=int(rng.integers(-5, 5)))
            port = job.parent if rng.random() < 0.95 else int(rng.choice(job.children))
            arrivals.append((port, pkt.to_frame(cfg.neighbors[port], cfg.node)))
        sent += len(arrivals)
        for port, frame in arrivals:
            want += single.receive(port, frame, 1.0)
        for port, frames in runs_of(arrivals, rng):
            got += batched.receive_frames(port, frames, 1.0)
    assert by_port(got) == by_port(want) and len(want) > 100
    for name in vars(single.ctx.regs):
        assert np.array_equal(getattr(single.ctx.regs, name), getattr(batched.ctx.regs, name)), name
    assert single.ctx.counters == batched.ctx.counters and single.ctx.counters.get("drop:stale")
    assert calls["per_packet"] < 0.3 * sent  # most results really took the batch path


def test_a_full_block_is_summed_exactly_and_multicast_as_blocks():
    cfg, rt, _ = runtimes("s1")
    job = cfg.jobs[1]
    rng = np.random.default_rng(7)
    values = {r: rng.integers(-1000, 1000, (SLOTS, ELEMENTS)).astype(np.int32) for r in job.contributors}
    out = []
    for rank, port in job.contributors.items():
        frames = [make_packet(values[rank][s], job=1, rank=rank, nworkers=6, slot=s, chunk=s).to_frame(
            cfg.neighbors[port], cfg.node) for s in range(SLOTS)]
        buf, lengths = pack_frames(frames)
        out += rt.receive_block(port, parse_block(buf, lengths), 0.0)
    assert sorted(p for p, _ in out) == sorted(job.children)  # one block per child port, not a frame per slot
    for port, block in out:
        assert block.shape == (SLOTS, 58 + 4 * ELEMENTS)
        for s, row in enumerate(block):
            pkt = parse_frame(row.tobytes())
            assert pkt.has(RESULT) and pkt.rank == ALL_RANKS and pkt.slot == s and pkt.dst == cfg.neighbors[port]
            assert np.array_equal(pkt.values, sum(v[s].astype(np.int64) for v in values.values()))


def test_build_frames_is_byte_exact_with_to_frame():
    pkts = [make_packet(np.arange(k, k + 5), job=3, rank=k, slot=k, chunk=1000 + k, exp=-2) for k in range(4)]
    hdr = np.array([p.hdr for p in pkts])
    block = build_frames(5, 9, hdr, np.stack([p.values for p in pkts]))
    assert [row.tobytes() for row in block] == [p.to_frame(5, 9) for p in pkts]


def test_parse_block_agrees_with_parse_frame_on_good_and_bad_frames():
    good = make_packet(np.arange(10), job=1, rank=2, slot=3, chunk=4).to_frame(1, 2)
    frames = [good, good[:-1], good + b"\0\0", good[:30], b"", good[:36] + b"\0\0" + good[38:]]
    block = parse_block(*pack_frames(frames))
    assert block.ok.tolist() == [parse_frame(f) is not None for f in frames]
    assert block.src[0] == 1 and block.dst[0] == 2 and int(block.hdr["chunk"][0]) == 4


@pytest.mark.parametrize("size", [1, SMALL_BLOCK - 1, SMALL_BLOCK, 40])
def test_a_read_of_fewer_than_small_block_frames_goes_frame_by_frame(size):
    """receive_rows (what a switch node calls with each read of a port): a short read takes the per-packet
    handler for every frame, a longer one the batch handler; either way the same frames, registers and counters."""
    cfg, single, rows = runtimes("t1")
    arrivals = stream(cfg, np.random.default_rng(size), 400, elements=ELEMENTS)
    calls, every = count_calls(rows.program, "contribution"), count_calls(single.program, "contribution")
    want, got, blocks = [], [], 0
    for port, frame in arrivals:
        want += single.receive(port, frame, 1.0)
    for port, frames in runs_of(arrivals, np.random.default_rng(0)):
        for k in range(0, len(frames), size):
            buf, lengths = pack_frames(frames[k : k + size])
            got += flatten(rows.receive_rows(port, buf, lengths, 1.0))
            blocks += len(lengths) >= SMALL_BLOCK
    assert by_port(got) == by_port(want)
    for name in vars(single.ctx.regs):
        assert np.array_equal(getattr(single.ctx.regs, name), getattr(rows.ctx.regs, name)), name
    assert single.ctx.counters == rows.ctx.counters
    if size < SMALL_BLOCK:
        assert blocks == 0 and calls == every
    else:
        assert blocks > 0 and calls["per_packet"] < every["per_packet"]
