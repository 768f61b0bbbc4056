"""The PBox's block path against its per-packet path: same sums, same state, same frames, same counters."""

import numpy as np
import pytest

from innet.hosts.pbox import PBoxJob, PBoxServer
from innet.wire.packet import RESULT, RETX, ROUTE, SPARSE, VER, make_packet, pack_frames, parse_block
from innet.wire.sparse import encode

NODE, SLOTS, ELEMENTS = 99, 4, 8
MEMBERS = {0: 10, 1: 11, 2: 12, 3: 13}  # rank -> node


def servers(cores=1, core=0):
    jobs = [PBoxJob(1, MEMBERS, SLOTS, ELEMENTS), PBoxJob(2, {0: 20, 1: 21}, SLOTS, ELEMENTS, sparse=True)]
    return PBoxServer(NODE, jobs, cores, core), PBoxServer(NODE, jobs, cores, core)


def stream(rng, n):
    """``n`` frames for the PBox: the workers' rounds of every key in about the order they send them, with
    noise (duplicates, retransmissions, stale rounds, short chunks, values that overflow, strangers, a
    sparse job, results, frames for another node, truncation)."""
    rounds = [0] * (2 * SLOTS)
    given: list[set] = [set() for _ in range(2 * SLOTS)]
    out = []
    while len(out) < n:
        job = 1 if rng.random() < 0.9 else 2
        members = MEMBERS if job == 1 else {0: 20, 1: 21}
        rank = int(rng.choice(list(members))) if rng.random() < 0.97 else int(rng.integers(0, 9))
        src = members.get(rank, 50) if rng.random() < 0.97 else int(rng.choice(list(MEMBERS.values())))
        key = int(rng.integers(0, 2 * SLOTS))
        rnd = rounds[key]
        if job == 1 and rank in given[key] and rng.random() < 0.8:
            continue
        if rng.random() < 0.05:
            rnd = max(0, rnd - 1)
        if job == 1:
            given[key].add(rank)
            if len(given[key]) >= len(MEMBERS):
                rounds[key], given[key] = rounds[key] + 1, set()
        version, slot = divmod(key, SLOTS)
        slot += SLOTS if rng.random() < 0.02 else 0  # outside the job's slots
        flags = ROUTE | (VER if version % 2 else 0) | (RETX if rng.random() < 0.03 else 0)
        flags |= RESULT if rng.random() < 0.01 else 0
        count = ELEMENTS if rng.random() < 0.95 else int(rng.integers(1, ELEMENTS))
        big = rng.random() < 0.03
        values = rng.integers(-(2**31) if big else -1000, 2**31 - 1 if big else 1000, count).astype(np.int32)
        if job == 2 and (pairs := encode(np.where(rng.random(count) < 0.7, 0, values).astype(np.int32))) is not None:
            values, flags = pairs, flags | SPARSE
        pkt = make_packet(values, job=job, rank=rank, nworkers=len(members), slot=slot,
                          chunk=(slot + SLOTS * (2 * rnd + version % 2)), flags=flags, exp=int(rng.integers(-5, 5)))
        frame = pkt.to_frame(src, NODE if rng.random() < 0.98 else 98)
        if rng.random() < 0.02:
            frame = frame[: int(rng.integers(0, len(frame)))]
        out.append(frame)
    return out


def as_frames(outputs):
    """Every frame an endpoint gave (bytes, or rows of a block), sorted: the block path sends a block's
    results before the frames it leaves to ``receive``, so only the order may differ."""
    frames = []
    for out in outputs:
        frames += [out] if isinstance(out, bytes) else [row.tobytes() for row in out]
    return sorted(frames)


def assert_same_state(one, other):
    for job in one.state:
        for name, value in vars(one.state[job].engine.r).items():
            np.testing.assert_array_equal(value, getattr(other.state[job].engine.r, name), err_msg=name)
    assert one.counters == other.counters


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("cores,core", [(1, 0), (2, 1)])
def test_blocks_give_the_same_sums_state_frames_and_counters_as_single_frames(seed, cores, core):
    rng = np.random.default_rng(seed)
    frames = stream(rng, 3000)
    single, batched = servers(cores, core)
    want, got, at = [], [], 0
    while at < len(frames):
        run = frames[at:at + int(rng.integers(1, 200))]
        at += len(run)
        now = at * 1e-4
        for frame in run:
            want += single.receive(frame, now)
        got += batched.receive_block(parse_block(*pack_frames(run)), now)
    assert as_frames(got) == as_frames(want)
    assert_same_state(single, batched)
    assert single.counters.get("stale", 0) and single.counters.get("duplicate", 0)  # the noise reached it


def test_a_block_of_every_workers_contributions_is_summed_exactly_and_answered_as_one_block():
    rng = np.random.default_rng(7)
    values = rng.integers(-2**28, 2**28, (len(MEMBERS), SLOTS, ELEMENTS)).astype(np.int32)
    frames = [make_packet(values[rank, slot], job=1, rank=rank, nworkers=4, slot=slot, chunk=slot, flags=ROUTE)
              .to_frame(node, NODE) for slot in range(SLOTS) for rank, node in MEMBERS.items()]
    server, _ = servers()
    out = server.receive_block(parse_block(*pack_frames(frames)), 0.0)
    assert len(out) == 1 and isinstance(out[0], np.ndarray) and len(out[0]) == SLOTS * len(MEMBERS)
    sums = values.astype(np.int64).sum(axis=0)
    block = parse_block(*pack_frames([row.tobytes() for row in out[0]]))
    assert (block.hdr["flags"] == RESULT | ROUTE).all() and block.ok.all()
    np.testing.assert_array_equal(block.dst, np.tile(list(MEMBERS.values()), SLOTS))
    np.testing.assert_array_equal(block.values(slice(None), ELEMENTS), np.repeat(sums, len(MEMBERS), axis=0))
    assert server.counters == {}
