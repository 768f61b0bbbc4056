"""The eBPF switch's fold run frame by frame in the kernel (BPF_PROG_TEST_RUN: root and clang, no network): each
partial numpy's exact int32 sum of its round's contributions, int32 wraps flagged as the Python switch flags them
(any addition in arrival order), a slot's next round starting from its first contribution, repeats not added."""

import ctypes
import os
import shutil

import numpy as np
import pytest

from innet.ebpf.build import object_path
from innet.wire.packet import OVERFLOW, RESULT, VER, make_packet, parse_frame
from tests.test_ebpf_replicas import xdp_takes

pytestmark = pytest.mark.skipif(shutil.which("clang") is None or os.geteuid() != 0,
                                reason="loading the eBPF switch needs root and clang (make deps)")
SHOT, REDIRECT = 2, 7  # TC_ACT_SHOT, TC_ACT_REDIRECT
NODE, NEIGHBOR, WORKERS, SLOTS = 9, 3, 4, 8


class RunOpts(ctypes.Structure):  # libbpf's struct bpf_test_run_opts
    _fields_ = [("sz", ctypes.c_size_t), ("data_in", ctypes.c_void_p), ("data_out", ctypes.c_void_p),
                ("data_size_in", ctypes.c_uint32), ("data_size_out", ctypes.c_uint32), ("ctx_in", ctypes.c_void_p),
                ("ctx_out", ctypes.c_void_p), ("ctx_size_in", ctypes.c_uint32), ("ctx_size_out", ctypes.c_uint32),
                ("retval", ctypes.c_uint32), ("repeat", ctypes.c_int), ("duration", ctypes.c_uint32),
                ("flags", ctypes.c_uint32), ("cpu", ctypes.c_uint32), ("batch_size", ctypes.c_uint32)]


@pytest.fixture(params=[False, True], ids=["tc", "xdp"])
def switch(tmp_path, request):
    """A switch whose one port (the loopback a test run's frames arrive on) holds all WORKERS ranks of job 1 and
    its parent: every completed slot's partial comes back as the run's redirected frame. xdp: each frame to
    switch.c's XDP half first, which must take every contribution but the completing one (its verdict SHOT)."""
    from innet.ebpf import loader

    plane = loader.EbpfPlane(object_path(256, 2 * SLOTS, str(tmp_path)), {}, request.param)
    try:
        plane._put("cfg", loader.U32(0), loader.Config(NODE, SLOTS))
        plane._clear_pool(2 * SLOTS)
        plane._put("ports", loader.U32(1), loader.PortInfo(1, NEIGHBOR))
        plane._put("port_of", loader.U32(1), loader.U32(1))
        plane._put("jobs", loader.U32(1), loader.JobInfo(WORKERS, WORKERS, 1, 0, 7, 0, SLOTS, 0, 0))
        for rank in range(WORKERS):
            plane._put("members", loader.Pair(1, rank), loader.Pair(rank, 1))
        plane.lib.bpf_prog_test_run_opts.argtypes = [ctypes.c_int, ctypes.c_void_p]
        seen: dict[int, set[int]] = {}  # each chunk's ranks so far

        def send(values, rank, chunk):
            frame = make_packet(values, job=1, rank=rank, nworkers=WORKERS, slot=chunk % SLOTS, chunk=chunk,
                                flags=VER if chunk // SLOTS % 2 else 0).to_frame(NEIGHBOR, NODE)
            if request.param:
                ranks = seen.setdefault(chunk, set())
                taken = xdp_takes(plane, frame, 1)  # a first contribution that does not complete its slot
                assert taken == (rank not in ranks and len(ranks) < WORKERS - 1)
                ranks.add(rank)
                if taken:
                    return SHOT, None
            out = ctypes.create_string_buffer(len(frame) + 256)
            opts = RunOpts(ctypes.sizeof(RunOpts), ctypes.cast(ctypes.c_char_p(frame), ctypes.c_void_p),
                           ctypes.cast(out, ctypes.c_void_p), len(frame), len(out))
            assert plane.lib.bpf_prog_test_run_opts(plane.prog_fd, ctypes.byref(opts)) == 0
            return opts.retval, parse_frame(out.raw[:opts.data_size_out])

        yield send
    finally:
        plane.close()


def folded(contrib):
    """The rows added one by one as int32 (wrapping), and whether any addition wrapped: the Python switch's fold."""
    acc, wrapped = np.zeros(contrib.shape[1], np.int64), False
    for row in contrib:
        exact = acc + row
        wrapped |= bool(((exact < -2**31) | (exact >= 2**31)).any())
        acc = exact.astype(np.int32).astype(np.int64)
    return acc.astype(np.int32), wrapped


def test_each_partial_is_numpys_exact_sum_and_a_wrap_is_flagged_in_arrival_order(switch):
    rng = np.random.default_rng(49)
    flagged = []
    for chunk in range(1, 3 * SLOTS + 1):  # every key through three rounds: each starts from its first contribution
        big = chunk % 3 == 0  # values near the int32 limits: some additions wrap
        contrib = rng.integers(-2**31 if big else -2**20, 2**31 if big else 2**20, (WORKERS, 256), dtype=np.int64)
        verdicts = [switch(contrib[rank].astype(np.int32), rank, chunk) for rank in range(WORKERS)]
        assert [v for v, _ in verdicts] == [SHOT] * (WORKERS - 1) + [REDIRECT]
        partial = verdicts[-1][1]
        total, wrapped = folded(contrib)
        assert np.array_equal(partial.values, total) and partial.has(OVERFLOW) == wrapped
        flagged.append(wrapped)
        assert (partial.chunk, partial.rank, partial.dst, partial.has(RESULT)) == (chunk, 7, NEIGHBOR, False)
    assert 0 < sum(flagged) < len(flagged)


def test_a_wrap_undone_by_a_later_addition_is_still_flagged_and_repeats_are_not_added(switch):
    top = np.full(256, 2**31 - 1, np.int32)
    assert switch(top, 0, 1)[0] == SHOT and switch(top, 0, 1)[0] == SHOT  # a repeat: dropped, not added
    assert switch(np.ones(256, np.int32), 1, 1)[0] == SHOT  # wraps to -2**31
    assert switch(np.full(256, -1, np.int32), 2, 1)[0] == SHOT  # and back: the sum fits, an addition wrapped
    verdict, partial = switch(np.zeros(256, np.int32), 3, 1)
    assert verdict == REDIRECT and np.array_equal(partial.values, top) and partial.has(OVERFLOW)
    for chunk in (1 + SLOTS, 1 + 2 * SLOTS):  # the other version's round, then the key's next: no trace of this one
        for rank in range(WORKERS):
            verdict, partial = switch(np.full(256, rank, np.int32), rank, chunk)
    assert verdict == REDIRECT and np.array_equal(partial.values, np.full(256, 6)) and not partial.has(OVERFLOW)


def test_a_short_or_odd_count_folds_exactly_its_values(switch):
    """Fewer values than the program's packet holds, an odd count (its last 64-bit word half a value): exact."""
    rng = np.random.default_rng(7)
    for chunk, n in ((1, 256), (2, 3), (1 + SLOTS, 255), (2 + SLOTS, 1), (1 + 2 * SLOTS, 17)):
        big = n % 2 == 0  # a full frame near the limit, then odd counts that cannot wrap: a word's other half
        contrib = rng.integers(2**30 if big else -9, 2**31 if big else 9, (WORKERS, n), dtype=np.int64)  # adds 0
        verdicts = [switch(contrib[rank].astype(np.int32), rank, chunk) for rank in range(WORKERS)]
        total, wrapped = folded(contrib)
        partial = verdicts[-1][1]
        assert verdicts[-1][0] == REDIRECT and len(partial.values) == n
        assert np.array_equal(partial.values, total) and partial.has(OVERFLOW) == wrapped
