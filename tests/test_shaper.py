"""The links' shaper (innet.backends.mininet.shaper): bursts by rate, and htb's machine-wide hysteresis mode turned on
only while innet runs use it, and off again only if an innet run turned it on."""

import json
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

import innet.backends.mininet.cleanup as cleanup
import innet.backends.mininet.shaper as shaper
from innet.backends.mininet.cleanup import RunState
from innet.backends.mininet.shaper import burst_bytes, burst_command, hold, release
from innet.wire.packet import make_packet


def test_a_burst_is_2_ms_of_the_rate_or_under_half_a_frame_where_a_frame_takes_0_2_ms_or_longer():
    assert burst_bytes(1000, 9014) == 250_000
    assert burst_bytes(400, 9014) == 100_000
    assert burst_bytes(80, 1514) == 20_000  # 0.15 ms a frame: 13 at once
    for mbps in (160, 80, 40):  # 2 ms of these rates passed 5-10 frames at once at veth speed (the eBPF star early)
        assert burst_bytes(mbps, 9014) == 1126
    assert burst_bytes(20, 9014) == 1126  # 2 ms of 20 Mbit/s is 5000 bytes: each frame waits for its own tokens
    assert burst_bytes(20, 1514) == 189
    assert burst_bytes(2.68, 1514) == 189
    for mbps in (0.5, 2.68, 10, 20, 36, 80, 320):  # hysteresis stops a class a burst below zero: one frame must overspend it
        assert 8250 > 2 * burst_bytes(mbps, 9014) and 1514 > 2 * burst_bytes(mbps / 10, 1514)
    assert burst_command("s1-eth0", 1000, 9014) == ("tc class change dev s1-eth0 parent 5:0 classid 5:1 htb rate "
                                                   "1000.000000Mbit burst 250000 cburst 250000 quantum 200000")


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """The mode's switch as a file of its own, and a state directory of its own."""
    switch = tmp_path / "htb_hysteresis"
    switch.write_text("0\n")
    state_dir = tmp_path / "state"
    for module in (cleanup, shaper):
        monkeypatch.setattr(module, "STATE_DIR", str(state_dir))
    monkeypatch.setattr(shaper, "HYSTERESIS", str(switch))
    monkeypatch.setattr(shaper, "MARKER", str(state_dir / "htb_hysteresis.innet"))
    return switch


def run_record(name, tmp_path):
    return RunState(name, str(tmp_path / name))


def test_the_last_run_using_the_mode_turns_it_off_and_not_before(machine, tmp_path):
    a, b = run_record("a", tmp_path), run_record("b", tmp_path)
    assert hold(a) and machine.read_text() == "1"
    assert hold(b) and machine.read_text() == "1"
    assert not release(own=a.path) and machine.read_text() == "1"  # b relies on it still
    a.remove()
    assert release(own=b.path) and machine.read_text() == "0"
    assert not release() and machine.read_text() == "0"


def test_a_mode_someone_else_turned_on_is_left_on(machine, tmp_path):
    machine.write_text("1\n")
    run = run_record("a", tmp_path)
    assert hold(run)
    assert not release(own=run.path) and machine.read_text() == "1\n"


def test_a_dead_runs_record_does_not_keep_the_mode_on(machine, tmp_path):
    dead = run_record("dead", tmp_path)
    assert hold(dead)
    dead.data.runner = (4_194_304, 1)  # no process has this pid (the kernel's pid_max): its runner died
    dead.save()
    assert release() and machine.read_text() == "0"
    assert json.loads(Path(dead.path).read_text())["htb_hysteresis"]  # its record is --clean's to remove


def test_where_the_switch_cannot_be_read_links_keep_per_frame_shaping(machine, tmp_path):
    machine.unlink()
    run = run_record("a", tmp_path)
    assert not hold(run) and not run.data.htb_hysteresis
    assert not release(own=run.path)


@pytest.mark.mininet
def test_a_run_shapes_in_bursts_and_leaves_the_mode_as_it_found_it():
    from innet.backends.mininet.emulation import network
    from topologies import build

    switch = Path(shaper.HYSTERESIS)
    before = switch.read_text() if switch.exists() else None
    with network(build("star", workers=2, bw=1000), mtu=9000) as emu:
        assert switch.read_text().strip() == "1" and emu.bursts
        shown = emu.net.get("s1").cmd("tc class show dev s1-eth0")
        assert "rate 1Gbit" in shown and "burst 250000b" in shown, shown
    after = switch.read_text()
    assert after == before or (before is None and after.strip() == "0")
    if before is not None and before.strip() == "0":
        assert not os.path.exists(shaper.MARKER)


@pytest.mark.mininet
@pytest.mark.parametrize("mbps", [2, 80])
def test_a_slow_link_sends_its_frames_one_by_one_at_its_rate(tmp_path, mbps):
    """htb's hysteresis mode overspends a burst by one more frame: with a burst of a whole frame, a 2 Mbit/s link
    sent its jumbo frames in pairs (three after a pause) at veth speed, and with 2 ms of the rate an 80 Mbit/s link
    sent five at once. Paced, each of 6 frames given at once leaves a frame's time (33 ms, 0.825 ms) after the one
    before (the first 7/8 of one: a class starts with its burst), on a veth pair in a namespace of this test's
    own; the arrivals are the kernel's receive timestamps."""
    from tests.test_rawport import open_in

    state = RunState(f"test-shaper-{os.getpid()}", str(tmp_path / "run"))  # a live run relying on the mode
    name = f"innet-shaper-{os.getpid()}"
    frame = make_packet(np.zeros(2048, np.int32), job=1).to_frame(1, 2)  # 8250 bytes
    each = len(frame) * 8 / (mbps * 1e6)
    try:
        if not hold(state):
            pytest.skip("htb's hysteresis mode cannot be turned on here")
        subprocess.run(["ip", "netns", "add", name], check=True)
        for cmd in ("ip link add pa type veth peer name pb", "ip link set pa mtu 9000", "ip link set pb mtu 9000",
                    "ip link set pa up", "ip link set pb up", "tc qdisc add dev pa root handle 5:0 htb default 1",
                    f"tc class add dev pa parent 5:0 classid 5:1 htb rate {mbps}Mbit", burst_command("pa", mbps, 9014)):
            subprocess.run(["ip", "netns", "exec", name, *cmd.split()], check=True)
        tx, rx = open_in(name, "pa"), open_in(name, "pb")
        rx.recv_stamped()  # asks for the kernel's timestamps
        for _ in range(6):
            tx.send(frame)
        arrivals: list[float] = []
        deadline = time.monotonic() + 10 * each + 0.5
        while len(arrivals) < 6 and time.monotonic() < deadline:
            arrivals += [came for came, _ in rx.recv_stamped()]
            time.sleep(each / 4)
        tx.close()
        rx.close()
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)
        release(own=state.path)
        state.remove()
    gaps = np.diff(arrivals) / each
    assert len(arrivals) == 6 and gaps.min() > 0.8, gaps  # 2 Mbit/s was 0, 0, 2, 0, 2; 80 Mbit/s 0, 0, 0, 0, 2.5
    assert (arrivals[-1] - arrivals[0]) / each > 0.9 * 5, gaps


class _Port:
    """A raw port that records what it sends."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def send(self, frame: bytes) -> None:
        self.sent.append(frame)


def test_a_dilated_port_holds_each_frame_for_its_serialization_in_order_after_its_latency():
    """htb lets a frame that finds tokens through at once, so a latency-bound run skipped every hop's serialization
    (fat-tree k=8's ring took 0.46x its links' time): a dilated run's port holds a frame for its bytes at the link's
    rate and its latency, never before the frame ahead of it, reordering's delay on top."""
    from innet.backends.mininet.nodes import port_faults
    from innet.node.config import PortFaults
    from innet.node.egress import Egress
    from innet.planning.spec import RunSpec
    from innet.planning.timing.dilation import dilate_graph
    from innet.wire.faults import FaultSpec
    from topologies import build

    graph = dilate_graph(build("star", workers=2, bw=1000), 100)  # 10 Mbit/s, 0.2 ms latency: 1000 bytes take 0.8 ms
    faults = port_faults(graph, RunSpec(), "h1", latency=True)
    assert faults[0].rate == 1.25e6 and faults[0].spec.delay == pytest.approx(2e-4)
    assert port_faults(graph, RunSpec(), "h1")[0].rate == 0  # undilated: htb alone
    port = _Port()
    egress = Egress({0: port}, faults)  # type: ignore[dict-item]
    egress.send(0, b"a" * 1000, 10.0)  # 0.8 ms on the wire, then 0.2 ms: due at 10.001
    egress.send(0, b"b" * 100, 10.0)  # a small frame behind it does not overtake it
    egress.send(0, b"c" * 1000, 10.01)  # the link idle again: 0.8 + 0.2 ms after it was given
    assert [round(due, 6) for due, *_ in sorted(egress.held)] == [10.001, 10.001, 10.011]
    egress.flush(10.0009)
    assert port.sent == []
    egress.flush(10.001)
    assert port.sent == [b"a" * 1000, b"b" * 100]
    reorder = Egress({0: port}, {0: PortFaults(FaultSpec(delay=2e-4, reorder=0.99, reorder_delay=0.01), 1, 1.25e6)})  # type: ignore[dict-item]
    reorder.send(0, b"d" * 1000, 0.0)
    assert min(due for due, *_ in reorder.held) > 0.001 + 0.005  # reordering's extra delay comes on top


def test_a_dilated_port_that_reorders_paces_its_frames_so_a_held_frame_is_overtaken_only_by_a_few():
    """A window handed to htb at once left a frame held back for reordering behind the whole window (star of 4,
    10 Mbit/s, 1% loss and 1% reordering: 14-40 spurious retransmissions a run on Mininet, 1-4 on the fabric):
    where the link reorders, each frame is held until its own serialization is over, the held one its extra delay
    more, so that only the frames of that delay overtake it, as on the fabric's links."""
    from innet.node.config import PortFaults
    from innet.node.egress import Egress
    from innet.wire.faults import FaultSpec

    port = _Port()
    spec = FaultSpec(delay=2e-4, reorder=0.3, reorder_delay=0.001)  # 0.5-1.5 ms more, a frame takes 0.8 ms
    egress = Egress({0: port}, {0: PortFaults(spec, 7, 1.25e6)})  # type: ignore[dict-item]
    for k in range(20):
        egress.send(0, bytes([k]) * 1000, 10.0)
    held = sorted(egress.held)
    assert 0 < egress.injectors[0].reordered < 20
    plain = [due for due, _, _, frame in held if due - 10.0 - 0.0008 * (frame[0] + 1) < 2.1e-4]
    assert len(plain) == 20 - egress.injectors[0].reordered
    for due, _, _, frame in held:  # its serialization, in order, then the latency; a held frame 0.5-1.5 ms more
        extra = due - 10.0 - 0.0008 * (frame[0] + 1) - 2e-4
        assert extra == pytest.approx(0, abs=1e-9) or 0.0005 - 1e-9 <= extra <= 0.0015 + 1e-9
    order = [frame[0] for *_, frame in held]
    assert all(order.index(k) - k <= 2 for k in range(20))  # a held frame falls behind two frames at most
