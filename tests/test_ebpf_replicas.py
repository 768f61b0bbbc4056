"""All-gather and broadcast on the eBPF switch, frame by frame against the Python switch's runtime: switch.c run on
each frame by the kernel's BPF_PROG_TEST_RUN (root and clang), inside a network namespace of the test's own whose
loopback stands for every port, so that the result's copies (bpf_clone_redirect) are caught there and told apart by
their neighbour's address. Every frame either switch sends is the other's byte for byte, out of the same port, and
each slot's values are numpy's: the one source rank's, whichever of its frames brought them (one rank sends a chunk's
values, the others its header alone), or none when the source is not below the switch."""

import ctypes
import os
import shutil
import socket
import subprocess

import numpy as np
import pytest

from innet.ebpf.build import object_path
from innet.ebpf.loader import U32, EbpfPlane
from innet.switch.loader import load_program
from innet.switch.program import JobPort
from innet.switch.routed import replica_mark
from innet.switch.runtime import SwitchConfig, SwitchRuntime
from innet.wire.collectives import ALL_GATHER, BROADCAST
from innet.wire.packet import ALL_RANKS, RESULT, RETX, VER, make_packet, parse_frame

pytestmark = pytest.mark.skipif(shutil.which("clang") is None or os.geteuid() != 0,
                                reason="BPF_PROG_TEST_RUN needs root; clang (make deps) builds the eBPF switch")
CLONE_NEWNET, PACKET_OUTGOING, ETH_P_ALL = 0x40000000, 4, 3
SKB_SIZE = 192  # sizeof(struct __sk_buff) on 6.x kernels
NODE, PARENT, SLOTS, ELEMS = 10, 11, 4, 256
_libc = ctypes.CDLL(None, use_errno=True)


class RunOpts(ctypes.Structure):
    """libbpf's struct bpf_test_run_opts."""

    _fields_ = [("sz", ctypes.c_size_t), ("data_in", ctypes.c_void_p), ("data_out", ctypes.c_void_p),
                ("data_size_in", U32), ("data_size_out", U32), ("ctx_in", ctypes.c_void_p), ("ctx_out", ctypes.c_void_p),
                ("ctx_size_in", U32), ("ctx_size_out", U32), ("retval", U32), ("repeat", ctypes.c_int),
                ("duration", U32), ("flags", U32), ("cpu", U32), ("batch_size", U32)]


class XdpMd(ctypes.Structure):
    """struct xdp_md, a test run's context: the frame's bounds and the interface it came in at."""

    _fields_ = [(name, U32) for name in ("data", "data_end", "data_meta", "ingress_ifindex", "rx_queue_index",
                                         "egress_ifindex")]


XDP_DROP, XDP_PASS = 1, 2


def xdp_takes(plane: EbpfPlane, frame: bytes, ifindex: int) -> bool:
    """switch.c's XDP half run on ``frame`` in at ``ifindex`` (BPF_PROG_TEST_RUN): True when it took the frame
    (XDP_DROP: folded or counted), False when it passed it on to the tc program untouched (asserted)."""
    out = ctypes.create_string_buffer(len(frame) + 256)
    md = XdpMd(0, len(frame), 0, ifindex, 0, 0)
    opts = RunOpts(ctypes.sizeof(RunOpts), ctypes.cast(ctypes.c_char_p(frame), ctypes.c_void_p).value,
                   ctypes.addressof(out), len(frame), len(out), ctypes.addressof(md), None, ctypes.sizeof(md), 0)
    assert plane.lib.bpf_prog_test_run_opts(plane.xdp_fd, ctypes.byref(opts)) == 0
    assert opts.retval in (XDP_DROP, XDP_PASS)
    assert opts.retval == XDP_DROP or out.raw[:opts.data_size_out] == frame
    return opts.retval == XDP_DROP


@pytest.fixture
def netns():
    """This test's own network namespace, its loopback up, entered for the test and left (and removed) after."""
    name = f"innet-replicas-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        with open("/proc/self/ns/net", "rb") as home, open(f"/run/netns/{name}", "rb") as there:
            assert _libc.setns(there.fileno(), CLONE_NEWNET) == 0
            try:
                yield
            finally:
                assert _libc.setns(home.fileno(), CLONE_NEWNET) == 0
    finally:
        subprocess.run(["ip", "netns", "del", name], check=True)


class Both:
    """One switch as the eBPF program and as the Python runtime, each given the same frames. Ranks 0-3 sit behind
    ports 0-3 (nodes 0-3); below the root, the parent switch behind port 4."""

    def __init__(self, tmp: str, nworkers: int, root: bool, xdp: bool = False) -> None:
        job = JobPort(job=1, nworkers=nworkers, children=(0, 1, 2, 3), parent=None if root else 4, aggregate=True,
                      contributors={r: r for r in range(4)}, rank=0, rank_ports={r: r for r in range(4)}, slot_base=0,
                      slots=SLOTS)
        neighbors = {0: 0, 1: 1, 2: 2, 3: 3} | ({} if root else {4: PARENT})
        config = SwitchConfig(name="s1", node=NODE, tier="tor", ports={p: f"s1-eth{p}" for p in neighbors},
                              neighbors=neighbors, routes={n: p for p, n in neighbors.items()}, jobs={1: job})
        program = load_program("sum_allreduce", SLOTS, ELEMS)
        self.runtime = SwitchRuntime(config, program)
        self.port_of = {n: p for p, n in neighbors.items()}
        self.lo = socket.if_nametoindex("lo")
        self.tap = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        self.tap.bind(("lo", 0))
        self.tap.setblocking(False)
        self.plane = EbpfPlane(object_path(ELEMS, 2 * SLOTS, tmp), {}, xdp)  # xdp: each frame to its XDP half first
        self.taken = 0  # frames the XDP half took
        self.plane.ifindex = dict.fromkeys(config.ports, self.lo)  # every port's copies leave by the loopback
        self.plane.install(config, SLOTS)
        if xdp:  # the loopback takes no XDP frames: the root's result multicast stays the tc program's here (it is
            # test_ebpf_fanout's, on veths)
            assert self.plane.lib.bpf_map_delete_elem(self.plane.maps["fanout"], ctypes.byref(U32(1))) == (0 if root else -2)
        self.plane.lib.bpf_prog_test_run_opts.argtypes = [ctypes.c_int, ctypes.POINTER(RunOpts)]

    def close(self) -> None:
        self.plane.close()
        self.tap.close()

    def send(self, port: int, frame: bytes) -> list[tuple[int, bytes]]:
        """``frame`` in on ``port`` at both switches: what each sent, (port, frame), sorted; asserted the same."""
        self.plane._put("port_of", U32(self.lo), U32(port))
        if self.plane.xdp_fd >= 0 and xdp_takes(self.plane, frame, self.lo):
            self.taken += 1
            assert self.runtime.receive(port, frame, 0.0) == []
            return []
        out = ctypes.create_string_buffer(ELEMS * 4 + 256)
        ctx_in, ctx_out = ctypes.create_string_buffer(SKB_SIZE), ctypes.create_string_buffer(SKB_SIZE)
        opts = RunOpts(ctypes.sizeof(RunOpts), ctypes.cast(ctypes.c_char_p(frame), ctypes.c_void_p).value,
                       ctypes.addressof(out), len(frame), len(out), ctypes.addressof(ctx_in), ctypes.addressof(ctx_out),
                       SKB_SIZE, SKB_SIZE)
        assert self.plane.lib.bpf_prog_test_run_opts(self.plane.prog_fd, ctypes.byref(opts)) == 0
        sent = [self._port(f) for f in self._copies()]
        if opts.retval == 7:  # TC_ACT_REDIRECT: the frame itself, as it left
            sent.append(self._port(out.raw[:opts.data_size_out]))
        else:
            assert opts.retval == 2  # TC_ACT_SHOT: taken (a frame left to the Python switch would be TC_ACT_OK)
        python = sorted(self.runtime.receive(port, frame, 0.0))
        assert sorted(sent) == python
        return python

    def _copies(self) -> list[bytes]:
        got = []
        while True:
            try:
                data, addr = self.tap.recvfrom(65536)
            except BlockingIOError:
                return got
            if addr[2] == PACKET_OUTGOING:
                got.append(data)

    def _port(self, frame: bytes) -> tuple[int, bytes]:
        return self.port_of[int.from_bytes(frame[4:6], "big")], frame


def frame(rank, chunk, nworkers, values=None, flags=0, exp=0, src=None, dst=NODE, mark=None):
    pkt = make_packet(values, job=1, rank=rank, nworkers=replica_mark(nworkers) if mark is None else mark,
                      slot=chunk % SLOTS, chunk=chunk, flags=flags | (VER if chunk // SLOTS % 2 else 0), exp=exp)
    return pkt.to_frame(rank if src is None else src, dst)


@pytest.mark.parametrize("collective,root,nworkers,is_root,xdp", [
    (ALL_GATHER, 0, 4, True, False),  # the star's root switch: every chunk's owner below it
    (ALL_GATHER, 0, 8, False, False),  # a ToR of 8 ranks: half the chunks' owners elsewhere (its partial a header)
    (ALL_GATHER, 0, 8, False, True),  # and the XDP half before the tc program
    (BROADCAST, 2, 8, False, False),  # the root rank below this ToR
    (BROADCAST, 6, 8, False, False),  # the root rank elsewhere: every partial a header
    (BROADCAST, 3, 4, True, False),
    (BROADCAST, 3, 4, True, True),
])
def test_replicated_slots_carry_the_source_ranks_values_as_the_python_switch_sends_them(
        netns, tmp_path, collective, root, nworkers, is_root, xdp):
    rng = np.random.default_rng(49 + root + nworkers)
    chunks = 3 * SLOTS  # data chunks 1..chunks (chunk 0: the exponent's headers), every key through three rounds
    source = collective.source(chunks, nworkers, root)
    both = Both(str(tmp_path), nworkers, is_root, xdp)
    bad = 0
    try:
        for rank in rng.permutation(4):  # the exponent chunk: headers of every rank, the job's size as its mark
            sent = both.send(int(rank), frame(int(rank), 0, nworkers, exp=int(rank) - 2, mark=nworkers))
        assert [parse_frame(f).exp for _, f in sent] == [1] * len(sent)
        for chunk in range(1, chunks + 1):
            src = int(source[chunk - 1])
            n = ELEMS if chunk < chunks else 17  # the tensor's last chunk is short
            values = rng.integers(-2**31, 2**31, n, dtype=np.int64).astype(np.int32)
            mine = values if src < 4 else values[:0]  # the slot's values here: the source's, if it is below
            exps = rng.integers(-3, 4, 4)
            order = [int(r) for r in rng.permutation(4)]
            bogus = chunk % 5 == 0 and src < 4  # after the source's values, values from a rank with none: both drop
            if bogus:
                order.remove(src)
                order.insert(0, src)
                bad += 1
            for k, rank in enumerate(order):
                if bogus and k == 1:
                    assert both.send(rank, frame(rank, chunk, nworkers, values[:n - 1], exp=int(exps[rank]))) == []
                sent = both.send(rank, frame(rank, chunk, nworkers, values if rank == src else None,
                                             exp=int(exps[rank])))
                assert sent == [] or k == 3
            if not is_root:  # the partial went up; a repeat while it waits sends it up again; then the parent's result
                [(port, partial)] = sent
                got = parse_frame(partial)
                assert port == 4 and got.rank == 0 and not got.has(RESULT) and got.exp == exps.max()
                assert np.array_equal(got.values, mine)
                [(port, again)] = both.send(order[0], frame(order[0], chunk, nworkers, flags=RETX))
                assert port == 4 and parse_frame(again).has(RETX) and np.array_equal(parse_frame(again).values, mine)
                sent = both.send(4, frame(ALL_RANKS, chunk, nworkers, values, RESULT, exp=5, src=PARENT))
            assert sorted(p for p, _ in sent) == [0, 1, 2, 3]
            for port, result in sent:
                got = parse_frame(result)
                assert got.has(RESULT) and got.dst == port and np.array_equal(got.values, values)
            late = next(r for r in order if r != src)  # a header's repeat once the slot is done: answered with the values
            [(port, answer)] = both.send(late, frame(late, chunk, nworkers, flags=RETX, exp=int(exps[late])))
            assert port == late and np.array_equal(parse_frame(answer).values, values)
        assert both.plane.counters().get("drop:bad_count", 0) == bad
        # the XDP half took every frame that only folds (3 of a chunk's 4 contributions) and the bogus ones
        assert both.taken == (3 * (chunks + 1) + bad if xdp else 0)
    finally:
        both.close()


def test_a_repeat_without_retx_is_the_networks_copy_and_dropped_as_the_python_switch_drops_it(netns, tmp_path):
    """A counted contribution come again unflagged (a link's duplicate, not the worker's resend): neither switch answers
    it nor sends the partial up again; both count it a duplicate. Flagged RETX, both answer."""
    for is_root, xdp in ((True, False), (False, False), (False, True)):
        both = Both(str(tmp_path), 4, is_root, xdp)
        try:
            values = np.arange(5, dtype=np.int32)
            for rank in range(4):
                both.send(rank, frame(rank, 1, 4, values if rank == 1 else None))
            assert both.send(2, frame(2, 1, 4)) == [] and both.send(1, frame(1, 1, 4, values)) == []
            assert both.plane.counters()["drop:duplicate"] == both.runtime.ctx.counters["drop:duplicate"] == 2
            [(port, again)] = both.send(2, frame(2, 1, 4, flags=RETX))
            assert port == (2 if is_root else 4) and np.array_equal(parse_frame(again).values, values)
        finally:
            both.close()
