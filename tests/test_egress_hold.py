"""A host's port behind an eBPF switch (``PortFaults.hold_in``): each frame it receives reaches the endpoint when
its hop is over, the link's latency and the frame's own serialization after it came, in the order they are due,
stamped with that instant (not the wake-up's); frames it sends are held as before, from the instant they answer."""

from innet.node.config import PortFaults
from innet.node.egress import Egress, expire, feed
from innet.wire.faults import FaultSpec

RATE = 1.25e6  # bytes per second: 10 Mbit/s
DELAY = 0.02


class Port:
    def __init__(self, frames):
        self.frames, self.sent = list(frames), []

    def recv_batch(self):
        out, self.frames = self.frames, []
        return out

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
    assert endpoint.seen == [] and egress.next_due() == 1.0 + DELAY + 125 / RATE
    expire(endpoint, egress, 1.0 + DELAY + 0.005)  # woken late: the endpoint sees the instant the hop ended
    assert endpoint.seen == [(small, 1.0 + DELAY + 125 / RATE)]  # the small frame's hop ended first
    assert egress.next_due() == 1.0 + DELAY + 12500 / RATE  # its answer is held for the way back, and the big frame
    expire(endpoint, egress, 1.0 + DELAY + 0.0101)
    assert [f for f, _ in endpoint.seen] == [small, big] and port.sent == []
    answer = 1.0 + DELAY + 125 / RATE + DELAY + 1 / RATE  # its answer held for its own hop from then: the late
    # wake-up (4.9 ms) is absorbed by the answer's hold
    assert egress.next_due() == answer
    expire(endpoint, egress, answer)
    assert port.sent == [b"s"]


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
