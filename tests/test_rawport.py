"""RawPort on a real veth pair: recvmmsg hands over every frame byte for byte, in order, and counts what it dropped."""

import ctypes
import os
import subprocess
import time

import numpy as np
import pytest

from innet.io.rawport import RawPort
from innet.wire.packet import make_packet
from scripts.blast import CLONE_NEWNET

pytestmark = pytest.mark.mininet
_libc = ctypes.CDLL(None, use_errno=True)


@pytest.fixture
def veth():
    """A veth pair a <-> b in a namespace of this test's own, removed afterwards."""
    name = f"innet-rawport-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        for cmd in ("sysctl -qw net.ipv6.conf.all.disable_ipv6=1", "sysctl -qw net.ipv6.conf.default.disable_ipv6=1",
                    "ip link add pa type veth peer name pb", "ip link set pa up", "ip link set pb up"):
            subprocess.run(["ip", "netns", "exec", name, *cmd.split()], check=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=True)


def open_in(namespace: str, iface: str, **kwargs) -> RawPort:
    with open("/proc/self/ns/net", "rb") as home, open(f"/run/netns/{namespace}", "rb") as there:
        assert _libc.setns(there.fileno(), CLONE_NEWNET) == 0
        try:
            return RawPort(iface, **kwargs)
        finally:
            _libc.setns(home.fileno(), CLONE_NEWNET)


def frames(n: int, seed: int) -> list[bytes]:
    """Aggregation frames of 1 to 300 elements (so of many lengths), then a few that are not ours."""
    rng = np.random.default_rng(seed)
    out = [make_packet(rng.integers(-2**31, 2**31, rng.integers(1, 300), dtype=np.int64).astype(np.int32),
                       job=1, rank=k % 4, nworkers=4, slot=k % 128, chunk=k).to_frame(1 + k % 4, 9) for k in range(n)]
    return out + [bytes(rng.integers(0, 256, m, dtype=np.uint8)) for m in (60, 61, 1514)]


def receive_all(port: RawPort, count: int) -> list[bytes]:
    """Up to ``count`` frames, waiting at most 0.2 s for the next one."""
    got: list[bytes] = []
    quiet_until = time.monotonic() + 0.2
    while len(got) < count and time.monotonic() < quiet_until:
        block = port.recv_block()
        if block is not None:
            got += [block.frames[k, :block.lengths[k]].tobytes() for k in range(len(block.lengths))]
            quiet_until = time.monotonic() + 0.2
    return got


@pytest.mark.parametrize("max_batch", [1, 7, 256])
def test_every_frame_arrives_byte_exact_and_in_order(veth, max_batch):
    sender, receiver = open_in(veth, "pa"), open_in(veth, "pb", max_batch=max_batch)
    try:
        sent = frames(1500, seed=max_batch)
        got: list[bytes] = []
        for at in range(0, len(sent), 200):
            for frame in sent[at:at + 200]:
                sender.send(frame)
            got += receive_all(receiver, min(len(sent), at + 200) - len(got))
        assert got == sent
        assert receiver.drops() == 0
    finally:
        sender.close()
        receiver.close()


def test_a_full_socket_buffer_drops_and_counts_every_lost_frame(veth):
    sender, receiver = open_in(veth, "pa"), open_in(veth, "pb")
    try:
        sent = frames(20000, seed=3)[:20000]  # far more than the 16 MiB receive buffer holds unread
        for frame in sent:
            sender.send(frame)
        got = receive_all(receiver, len(sent))
        drops = receiver.drops()
        assert drops > 0
        assert len(got) + drops == len(sent)
        assert got == sent[:len(got)]  # the buffer kept the first frames; the kernel dropped the rest
        sender.send(sent[0])
        assert receive_all(receiver, 1) == [sent[0]]
    finally:
        sender.close()
        receiver.close()


def test_backlog_counts_what_is_queued_and_not_read(veth):
    sender, receiver = open_in(veth, "pa"), open_in(veth, "pb", max_batch=64)
    try:
        for frame in frames(300, seed=5)[:300]:
            sender.send(frame)
        receiver.statistics()
        assert receiver.backlog() == 300
        receiver.recv_rows()
        receiver.statistics()
        assert receiver.backlog() == 300 - 64
    finally:
        sender.close()
        receiver.close()


@pytest.mark.parametrize("limit,slots", [(1, 1), (5, 3), (15, 1), (2, 128)])
def test_the_admission_filter_turns_away_whole_units_and_nothing_else(veth, limit, slots):
    """innet.node.admission: contributions whose chunk // (2 x slots) % SPAN is ``limit`` or more are
    dropped by the kernel; results, routed and retransmitted frames and frames that are not innet's all
    pass, byte for byte."""
    from innet.node.admission import SPAN, UNIT_PASSES, admit_program, attach
    from innet.wire.packet import RESULT, RETX, ROUTE

    sender, receiver = open_in(veth, "pa"), open_in(veth, "pb")
    try:
        attach(receiver, admit_program(limit, slots))
        values = np.arange(8, dtype=np.int32)
        chunks = [k + (1 << 30) * (k % 7 == 6) for k in range(600)]
        sent = [(make_packet(values, job=1, rank=k % 4, nworkers=4, slot=k % 128, chunk=c,
                             flags=[0, 0, RESULT, ROUTE, RETX][k % 5]).to_frame(1, 9), k, c) for k, c in enumerate(chunks)]
        other = frames(0, seed=1)  # not innet's
        for frame, _, _ in sent:
            sender.send(frame)
        for frame in other:
            sender.send(frame)
        got = receive_all(receiver, len(sent) + len(other))
        expect = [f for f, k, c in sent if k % 5 > 1 or c // (UNIT_PASSES * slots) % SPAN < limit] + other
        assert got == expect
        assert 0 < len(expect) - len(other) < len(sent) and receiver.drops() == 0
    finally:
        sender.close()
        receiver.close()


def test_a_sockets_room_in_frames_is_what_the_kernel_holds(veth):
    """The admission marks are counted in the frames a port's socket holds unread (socket_frames): measured,
    at the 256-value packet, by sending more than that and counting what was queued before the drops."""
    from innet.node.admission import socket_frames

    sender, receiver = open_in(veth, "pa"), open_in(veth, "pb")
    try:
        frame = make_packet(np.arange(256, dtype=np.int32), job=1, rank=0, nworkers=4, slot=0, chunk=1).to_frame(1, 9)
        room = socket_frames(len(frame))
        for _ in range(room * 5 // 4):
            sender.send(frame)
        receiver.statistics()
        assert receiver.socket_drops > 0
        assert 0.85 * room <= receiver.backlog() <= 1.15 * room
    finally:
        sender.close()
        receiver.close()


def test_a_frame_read_late_carries_the_instant_the_kernel_received_it(veth):
    """recv_stamped: each frame with its receive timestamp on the monotonic clock, so that a host's hold (an eBPF
    switch's hop's end, innet.node.egress) starts when the frame came, not when its process woke to read it."""
    sender, receiver = open_in(veth, "pa"), open_in(veth, "pb", max_batch=4)
    try:
        receiver.recv_stamped()  # asks for stamps
        sent = frames(6, seed=3)[:6]
        times = []
        for frame in sent:
            times.append(time.monotonic())
            sender.send(frame)
            time.sleep(0.004)
        time.sleep(0.3)  # read late: a stamp taken at the read would be 0.3 s after its frame was sent
        read_at = time.monotonic()
        got = receiver.recv_stamped() + receiver.recv_stamped()
        assert [frame for _, frame in got] == sent
        # veth delivers in the sender's send call, or in a softirq soon after: within 2 ms on an idle machine, up to
        # 43 ms seen with both cores busy; never near the read
        for (came, _), at in zip(got, times, strict=True):
            assert at <= came < read_at - 0.15, (came - at, read_at - at)
        assert [came for came, _ in got] == sorted(came for came, _ in got)
    finally:
        sender.close()
        receiver.close()
