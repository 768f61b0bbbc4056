"""A host's port behind an eBPF switch (``PortFaults.hold_in``): each frame it receives reaches the endpoint when
its hop is over, the link's latency and the frame's own serialization after it came, in the order they are due,
stamped with that instant (not the wake-up's); frames it sends are held as before, from the instant they answer."""

from innet.node.config import PortFaults
from innet.node.egress import Egress, expire, feed
from innet.wire.faults import FaultSpec

RATE = 1.25e6  # bytes per second: 10 Mbit/s
DELAY = 0.02


class Port:
    def __init__(self, frames, at=1.0):
        self.frames, self.sent, self.at = list(frames), [], at  # the instant its frames came (the kernel's stamp)
        self.stamping = False

    def stamp_receive(self):
        self.stamping = True

    def recv_batch(self):
        out, self.frames = self.frames, []
        return out

    def recv_stamped(self):
        return [(self.at, frame) for frame in self.recv_batch()]

    def send(self, frame):
        self.sent.append(frame)


class Echo:
    """An endpoint that answers every frame with its first byte, and notes when it saw it."""

    def __init__(self):
        self.seen = []

    def receive(self, frame, now):
        self.seen.append((frame, now))
        return [frame[:1]]

    def receive_block(self, block, now):  # the hold hands frames one by one: never called
        raise AssertionError("a held port delivers frame by frame")

    def next_deadline(self):
        return None


def test_received_frames_reach_the_endpoint_when_their_hop_is_over():
    big, small = b"b" * 12500, b"s" * 125  # 10 ms and 0.1 ms at 10 Mbit/s
    port, endpoint = Port([big, small]), Echo()
    egress = Egress({0: port}, {0: PortFaults(FaultSpec(delay=DELAY), 0, RATE, hold_in=True)})
    feed(port, endpoint, egress, 1.0)
    assert endpoint.seen == [] and egress.next_due() == 1.0 + DELAY + 12500 / RATE
    expire(endpoint, egress, 1.0 + DELAY + 0.015)  # woken late: the endpoint sees the instant each hop ended
    ends = [1.0 + DELAY + 12500 / RATE, 1.0 + DELAY + 12500 / RATE + 125 / RATE]  # the small frame behind the big one
    assert endpoint.seen == [(big, ends[0]), (small, ends[1])]
    answer = ends[0] + DELAY + 1 / RATE  # the big frame's answer held for its own hop from then: the late wake-up
    # (4.9 ms) is absorbed by the answer's hold
    assert egress.next_due() == answer and port.sent == []
    expire(endpoint, egress, answer)
    assert port.sent == [b"b"]


def test_a_holding_port_asks_the_kernel_for_receive_stamps_before_any_frame_comes():
    """The kernel stamps frames some time after a socket first asks, and a frame that came before is stamped when
    read: asked at the first read, each worker's first frame (the exponent's answer) began its hold 0.25-0.66 ms
    late. A port that holds what it receives asks as the egress is made; one that does not never asks."""
    held, plain = Port([]), Port([])
    Egress({0: held, 1: plain}, {0: PortFaults(FaultSpec(delay=DELAY), 0, RATE, hold_in=True),
                                 1: PortFaults(FaultSpec(delay=DELAY), 0, RATE)})
    assert held.stamping and not plain.stamping


def test_frames_the_shaper_lets_through_together_end_their_hops_one_frame_apart():
    """htb's burst (2 ms of the rate above 36 Mbit/s) hands a host several frames at once: each one's hop ends a
    serialization after the one ahead of it, as on a link that sends one frame at a time, not all at once after
    the first's (the calibration's eBPF star ran faster than its links at 80 Mbit/s); a frame that comes after the
    link fell idle is held from its own arrival."""
    frame = b"f" * 1250  # 1 ms at 10 Mbit/s
    port, endpoint = Port([frame] * 3), Echo()
    egress = Egress({0: port}, {0: PortFaults(FaultSpec(delay=DELAY), 0, RATE, hold_in=True)})
    feed(port, endpoint, egress, 1.0)
    port.frames, port.at = [frame], 1.0005
    feed(port, endpoint, egress, 1.0005)  # behind the three: its hop ends a frame after theirs
    port.frames, port.at = [frame], 1.1
    feed(port, endpoint, egress, 1.2)  # the link idle since: its own latency and serialization from when it came
    expire(endpoint, egress, 2.0)
    assert [round(at - 1.0 - DELAY, 6) for _, at in endpoint.seen] == [0.001, 0.002, 0.003, 0.004, 0.101]


def test_a_frame_read_late_is_held_from_when_it_came():
    """The hold starts at the kernel's receive timestamp (RawPort.recv_stamped), not when the host woke to read
    the frame: a host busy for 4 ms ends the hop on time all the same."""
    frame = b"f" * 1250
    port, endpoint = Port([frame], at=1.0), Echo()
    egress = Egress({0: port}, {0: PortFaults(FaultSpec(delay=DELAY), 0, RATE, hold_in=True)})
    feed(port, endpoint, egress, 1.004)
    assert egress.next_due() == 1.0 + DELAY + 1250 / RATE

def test_without_hold_in_frames_go_straight_to_the_endpoint():
    port, endpoint = Port([b"x" * 100]), Echo()
    egress = Egress({0: port}, {0: PortFaults(FaultSpec(delay=DELAY), 0, RATE)})
    egress_feed_per_frame(port, endpoint, egress)
    assert endpoint.seen == [(b"x" * 100, 2.0)] and egress.next_due() == 2.0 + DELAY + 1 / RATE


def egress_feed_per_frame(port, endpoint, egress):
    """``feed`` on an endpoint without a block path (RawPort's ``recv_block`` is not faked here)."""
    class Plain:
        def __init__(self, inner):
            self.receive = inner.receive

    feed(port, Plain(endpoint), egress, 2.0)


def test_a_host_wakes_at_its_deadline_not_at_the_next_whole_millisecond():
    """A host's holds end hops of a frame's time or less (0.4 ms at 160 Mbit/s with jumbo frames): poll() waited
    whole milliseconds, rounded up and one more, so a hold 0.3 ms ahead woke 0.7-1.7 ms late and each eBPF hop's
    end (held by a host) went that much over. Median of 21 waits, on a socket pair no frame comes to."""
    import socket
    import statistics
    import time

    from innet.node.egress import serve_once

    class Timer(Echo):
        def __init__(self):
            super().__init__()
            self.due, self.late = None, []

        def next_deadline(self):
            return self.due

        def on_timeout(self, now):
            self.late.append(now - self.due)
            self.due = None
            return []

    quiet, other = socket.socketpair()
    try:
        port, endpoint = Port([]), Timer()
        port.fileno = quiet.fileno
        egress = Egress({0: port}, {0: PortFaults()})
        for _ in range(21):
            endpoint.due = time.monotonic() + 0.0003
            while endpoint.due is not None:
                serve_once(port, endpoint, egress)
    finally:
        quiet.close()
        other.close()
    assert statistics.median(endpoint.late) < 0.0004, endpoint.late


def test_a_frame_is_held_for_the_hops_between_switches_it_crossed_unheld_too():
    """Behind two hops between eBPF switches (2 x 1 ms latency, 2 x 20 Mbit/s): a frame is held for its own link's
    hop and theirs, each with its bytes' serialization, as the Python switch's ports would have held it hop by hop."""
    frame = b"f" * 2500  # 2 ms at 10 Mbit/s, 1 ms at 20
    port, endpoint = Port([frame]), Echo()
    path = (2 * 0.001, 2 / (RATE * 2))
    egress = Egress({0: port}, {0: PortFaults(FaultSpec(delay=DELAY), 0, RATE, hold_in=True, hold_path=path)})
    feed(port, endpoint, egress, 1.0)
    due = 1.0 + DELAY + 0.002 + 0.002 + 2 * 0.001
    assert abs(egress.next_due() - due) < 1e-12
    expire(endpoint, egress, due - 1e-6)
    assert endpoint.seen == []
    expire(endpoint, egress, due)
    assert [f for f, _ in endpoint.seen] == [frame] and abs(endpoint.seen[0][1] - due) < 1e-12


def test_frames_from_a_source_that_crossed_other_hops_are_held_for_theirs_in_a_chain_of_their_own():
    """A ring rank hears its predecessor's values across the spine (two hops held) and its successor's ACKs from its
    own rack (none, ``hold_from``): an ACK that came just after a value frame is held for its own hop only, not
    behind the value frame, which is held for its two more."""
    from innet.wire.packet import frame_prefix

    values = frame_prefix(4, 0, 2500 - 42) + b"v" * (2500 - 42)  # from node 4, 2 ms at 10 Mbit/s
    ack = frame_prefix(2, 0, 100 - 42) + b"a" * (100 - 42)  # from node 2
    port, endpoint = Port([values, ack]), Echo()
    path = (0.005, 0.0)
    faults = PortFaults(FaultSpec(delay=DELAY), 0, RATE, hold_in=True, hold_path=path, hold_from={2: (0.0, 0.0)})
    egress = Egress({0: port}, {0: faults})
    feed(port, endpoint, egress, 1.0)
    ack_due, values_due = 1.0 + DELAY + 100 / RATE, 1.0 + DELAY + 0.005 + 2500 / RATE
    expire(endpoint, egress, values_due)
    assert [(f[-1:], round(t, 9)) for f, t in endpoint.seen] == [(b"a", round(ack_due, 9)), (b"v", round(values_due, 9))]


def test_a_host_holds_what_it_sends_for_the_hops_its_flow_must_meet_others_after():
    """``hold_out``: each frame sent waits that long (and its bytes' share) beyond its own hop's latency and
    serialization, not before the frame before it (the shaper under the port then paces them)."""
    port = Port([])
    egress = Egress({0: port}, {0: PortFaults(FaultSpec(delay=DELAY), 0, RATE, hold_out=(0.003, 1 / RATE))})
    egress.send(0, b"x" * 1250, 1.0)  # 1 ms at 10 Mbit/s
    egress.send(0, b"y" * 625, 1.0)
    assert [round(d, 9) for d, *_ in egress.held] == [round(1.0 + DELAY + 0.003 + 0.001 + 0.001, 9)] * 2


def test_a_blocks_first_frame_leaves_alone_at_its_hops_end_and_the_rest_half_a_frame_later_in_one_send():
    """A worker's window at its answer (32 frames in the calibration): every frame's hop ends at the same instant,
    the shaper paces them after. The first goes out then, alone; the rest half a frame's serialization later, in one
    sendmmsg, while the first is still on the wire. Sent one by one at that instant, they held the core while the
    other workers' first frames waited (their hops ended with it). Nothing sent later overtakes them."""
    import numpy as np

    class Blocks(Port):
        def __init__(self):
            super().__init__([])
            self.calls = []

        def send(self, frame):
            self.calls.append([frame])

        def send_block(self, block):
            self.calls.append([row.tobytes() for row in block])

    block = np.arange(4 * 1250, dtype=np.uint8).reshape(4, 1250)  # 1 ms a frame at 10 Mbit/s
    port = Blocks()
    egress = Egress({0: port}, {0: PortFaults(FaultSpec(delay=DELAY), 0, RATE)})
    egress.send_all(0, [block], 1.0)
    egress.send(0, b"late" * 10, 1.0)  # a frame after the block: behind it on the link
    block[:] = 0  # the caller's buffer, reused: what was given is sent
    end = 1.0 + DELAY + 0.001  # the block's hop end (``send``'s for each of its frames)
    egress.flush(end - 1e-6)
    assert port.calls == []
    egress.flush(end)
    assert port.calls == [[np.arange(1250, dtype=np.uint8).tobytes()]]
    assert egress.next_due() == end + 0.0005
    egress.flush(end + 0.0005)
    rows = np.arange(4 * 1250, dtype=np.uint8).reshape(4, 1250)
    assert port.calls[1:] == [[row.tobytes() for row in rows[1:]], [b"late" * 10]]


def test_a_workers_first_status_line_is_written_a_status_period_after_its_first_wake_up(tmp_path):
    """Written at the first wake-up, right after each worker sent its exponent frame, the status file held the cores
    from the other workers whose exponent frames were due at the same instant (two of four 0.5-0.7 ms late)."""
    from innet.node.client import STATUS_EVERY, AllreduceClient

    class Waiting:
        def waiting(self):
            return "in-network: rank 0 waiting for chunk 3"

    client = AllreduceClient.__new__(AllreduceClient)  # its port is not needed to report
    client.proc, client.status, client.status_at = Waiting(), str(tmp_path / "h1.npz.status"), 0.0
    client.report(100.0)
    client.report(100.0 + STATUS_EVERY - 0.001)
    assert not (tmp_path / "h1.npz.status").exists()
    client.report(100.0 + STATUS_EVERY)
    assert (tmp_path / "h1.npz.status").read_text() == "in-network: rank 0 waiting for chunk 3"


def test_a_block_sent_is_held_for_the_hops_its_flow_must_meet_others_after_as_a_frame_is():
    """``hold_out`` on ``send_block``'s path too (a worker's window at its answer): its first row leaves at the hop's
    end plus the hold, as ``send`` would send it."""
    import numpy as np

    port = Port([])
    egress = Egress({0: port}, {0: PortFaults(FaultSpec(delay=DELAY), 0, RATE, hold_out=(0.003, 1 / RATE))})
    egress.send_block(0, np.zeros((3, 1250), dtype=np.uint8), 1.0)  # 1 ms a row at 10 Mbit/s
    assert round(egress.held[0][0], 9) == round(1.0 + DELAY + 0.003 + 0.001 + 0.001, 9)


def test_a_finished_host_sends_what_it_holds_and_forgets_what_it_hears():
    """A node group's finished worker (innet.node.worker.serve_workers) leaves once what it said is sent: frames it
    receives after (a predecessor's 16 DONE repeats) are forgotten, as by a worker alone in its process, which has
    exited. Kept, their past hop ends were its poll's deadline: a k=8 ring's worker process spun at a core's worth
    for minutes after its calls (F = 6520, 2026-11-29), never leaving."""
    port, endpoint = Port([b"d" * 58] * 16), Echo()
    egress = Egress({0: port}, {0: PortFaults(FaultSpec(delay=DELAY), 0, RATE, hold_in=True)})
    egress.send(0, b"x" * 1250, 1.0)  # its last ACK, held for its hop
    feed(port, endpoint, egress, 1.0)
    assert not egress.settle(1.0) and egress.next_due() == 1.0 + DELAY + 1250 / RATE  # the ACK: not sent yet
    assert not egress.settle(1.0 + DELAY) and port.sent == []
    assert egress.settle(1.0 + DELAY + 1250 / RATE) and port.sent == [b"x" * 1250]
    assert egress.next_due() is None and endpoint.seen == []  # nothing left to wake it: the DONEs were never delivered
