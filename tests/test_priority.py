"""Per-port strict-priority queues: the band travels as the frame's DSCP, the switch emits a job's
packets in its band, and a link sends the most urgent queued frame first."""

import networkx as nx
import numpy as np
import pytest

from innet.backends.local.fabric import Fabric
from innet.backends.local.run import run_local
from innet.planning.configs import switch_configs
from innet.planning.planner import plan_job
from innet.planning.spec import RunSpec
from innet.switch.loader import load_program
from innet.switch.runtime import SwitchRuntime
from innet.wire.layer import scapy_frame
from innet.wire.packet import RESULT, ROUTE, TOS_OFFSET, build_frames, make_packet, parse_block, parse_frame
from tests.helpers import ints
from topologies import build


@pytest.mark.parametrize("band", [0, 1, 2])
def test_band_is_the_dscp_byte_exact_with_scapy_and_parsed_back(band):
    values = ints(5)
    frame = make_packet(values, job=3, rank=1, nworkers=2, slot=4, chunk=9).to_frame(1, 7, band)
    assert frame == scapy_frame(1, 7, band, job=3, rank=1, nworkers=2, slot=4, chunk=9, values=values.tolist())
    assert frame[TOS_OFFSET] == band << 2
    assert parse_frame(frame).band == band
    hdr = np.zeros(2, parse_frame(frame).hdr.dtype)
    hdr["count"] = 5
    block = build_frames(1, 7, hdr, np.stack([values, values]), band)
    assert parse_block(block, np.full(2, block.shape[1])).band.tolist() == [band, band]


class Recorder:
    """A host endpoint that notes every frame's arrival time and band."""

    daemon = False

    def __init__(self, expect):
        self.expect, self.got = expect, []

    @property
    def done(self):
        return len(self.got) >= self.expect

    def start(self, now):
        return []

    def receive(self, frame, now):
        self.got.append((now, parse_frame(frame).chunk, parse_frame(frame).band))
        return []

    def next_deadline(self):
        return None


def _two_hosts(bw=8.0):
    graph = nx.Graph()
    graph.add_node("a", role="host")
    graph.add_node("b", role="host")
    graph.add_edge("a", "b", bw=bw, latency=0.0)
    return graph


def test_a_busy_link_sends_the_most_urgent_queued_frame_first():
    """Four bulk frames then two urgent ones, all at t=0: the first bulk frame is already on the wire,
    the urgent ones overtake the other three; each band stays FIFO; the link never idles."""
    fabric = Fabric(_two_hosts())
    sink = Recorder(6)
    fabric.attach("b", sink)
    frames = [(c, 2) for c in range(4)] + [(10, 0), (11, 0)]
    for chunk, band in frames:
        fabric.transmit("a", 0, make_packet(ints(250), chunk=chunk).to_frame(0, 1, band))
    fabric.run()
    assert [chunk for _, chunk, _ in sink.got] == [0, 10, 11, 1, 2, 3]
    size = len(make_packet(ints(250)).to_frame(0, 1)) * 8 / 8e6
    assert np.allclose([t for t, _, _ in sink.got], size * np.arange(1, 7))


def test_one_lower_band_alone_keeps_plain_fifo_timing():
    fabric = Fabric(_two_hosts())
    sink = Recorder(3)
    fabric.attach("b", sink)
    for chunk in range(3):
        fabric.transmit("a", 0, make_packet(ints(250), chunk=chunk).to_frame(0, 1, 1))
    fabric.run()
    size = len(make_packet(ints(250)).to_frame(0, 1)) * 8 / 8e6
    assert [chunk for _, chunk, _ in sink.got] == [0, 1, 2]
    assert np.allclose([t for t, _, _ in sink.got], size * np.arange(1, 4))


def test_the_switch_sends_a_jobs_packets_in_its_band_and_routed_ones_in_theirs():
    graph = build("star", workers=2)
    prog = load_program("sum_allreduce")
    plan = plan_job(graph, ["h1", "h2"], method="root", slots=prog.slots)
    rt = SwitchRuntime(switch_configs(graph, [plan], bands={plan.job: 2})["s1"], prog)
    s1, h1, h2 = 2, 0, 1  # node indices: hosts first
    a, b = ints(8, 1), ints(8, 2)
    rt.receive(0, make_packet(a, job=plan.job, rank=0, nworkers=2, slot=1, chunk=1).to_frame(h1, s1), 0.0)
    out = rt.receive(1, make_packet(b, job=plan.job, rank=1, nworkers=2, slot=1, chunk=1).to_frame(h2, s1), 0.0)
    assert sorted(port for port, _ in out) == [0, 1]
    for _, frame in out:
        pkt = parse_frame(frame)
        assert pkt.has(RESULT) and pkt.band == 2 and frame[TOS_OFFSET] == 2 << 2
        assert np.array_equal(pkt.values, a + b)
    routed = make_packet(a, job=9, flags=ROUTE).to_frame(h1, h2, 1)
    [(port, frame)] = rt.receive_frames(0, [routed], 0.0)  # the batch path (route_many)
    assert port == 1 and frame == routed
    [(port, frame)] = rt.receive(0, routed, 0.0)
    assert port == 1 and frame == routed


def _two_jobs(**kw):
    graph = build("leaf-spine", racks=2, hosts_per_rack=4, oversubscription=4, bw=100)
    record = run_local(graph, RunSpec(jobs=2, elements=100_000, **kw))
    assert record["correct"], record["errors"]
    return {j["job"]: j["completion_s"] for j in record["jobs"]}


def test_the_urgent_job_finishes_as_if_alone_and_the_other_is_not_slowed():
    """Two jobs share the ToR uplinks (4:1 oversubscribed). Equal bands: they share them and finish
    together. Job 1 in band 0, job 2 in band 2: job 1 takes the uplinks (about half the time), job 2
    ends when it would have anyway (the link never idles)."""
    shared = _two_jobs()
    assert abs(shared[1] - shared[2]) < 0.05 * shared[2]
    urgent = _two_jobs(job_priority=(0, 2))
    assert urgent[1] < 0.6 * shared[1]
    assert urgent[2] == pytest.approx(shared[2], rel=0.05)
    swapped = _two_jobs(job_priority=(2, 0))
    assert swapped[2] < 0.6 * swapped[1]
