"""Elastic background (``--background PATTERN:LOAD:tcp``): parsing, the local fabric's TCP-like flows (window,
ACK clock, halving on a mark), their goodput with and without the job, and the two backends side by side."""

import pytest

import innet
from innet.errors import UserError
from innet.hosts.background import FRAME_BYTES, BackgroundSpec, parse_background
from innet.hosts.elastic import CE, ECT, INITIAL_WINDOW, NOTSENT, QUEUE_FRAMES, SEGMENT, STALL_S, Flow, marked
from innet.wire.packet import TOS_OFFSET


def test_parse_transport():
    assert parse_background("permutation:0.5:tcp") == BackgroundSpec("permutation", 0.5, "", "tcp")
    assert parse_background("permutation:0.5:udp") == parse_background("permutation:0.5") == BackgroundSpec("permutation", 0.5)
    assert parse_background("hotspot:a1--c1:0.25:tcp") == BackgroundSpec("hotspot", 0.25, "a1--c1", "tcp")
    assert str(parse_background("hotspot:a1--c1:0.25:tcp")) == "hotspot:a1--c1:0.25:tcp"
    assert str(parse_background("permutation:0.5:udp")) == "permutation:0.5"
    for bad in ("permutation:tcp", "permutation:0.5:quic", "tcp:0.5", "permutation:0.5:tcp:tcp", "hotspot:0.5:tcp"):
        with pytest.raises(ValueError):
            parse_background(bad)


def test_bad_transport_is_one_line():
    with pytest.raises(UserError) as err:
        innet.run("star", backend="local", background="permutation:0.5:quic")
    assert "background" in str(err.value) and "\n" not in str(err.value)


def test_window_and_ack_clock():
    """Without acknowledgements the flow stops at its window; an acknowledgement lets as many more out; slow
    start grows the window only while the flow uses half of it; a mark halves it, once a window."""
    rate = 8e9  # payload bits per second: a segment's worth accrues in ~8.2 us
    flow = Flow(1, 2, 0, rate, 0.0)
    sent, t = 0, 0.0
    for _ in range(40):
        t += SEGMENT * 8 / rate
        sent += len(flow.send(t))
    assert sent == INITIAL_WINDOW and flow.sent - flow.acked == INITIAL_WINDOW
    assert flow.unsent <= NOTSENT  # the writer skipped what it could not write
    assert flow.next_write(t) == flow.progress_at + STALL_S  # waiting for acknowledgements
    flow.on_ack(4, False, t)  # 10 out, window 10 < 2 * 10: slow start grows it by what was acknowledged
    assert flow.cwnd == INITIAL_WINDOW + 4
    assert len(flow.send(t)) == 2  # as much as the writer has (NOTSENT), within the window
    flow.on_ack(6, True, t)  # a mark: halved
    assert flow.cwnd == flow.ssthresh == (INITIAL_WINDOW + 4) / 2 and flow.halvings == 1
    flow.on_ack(7, True, t)  # the same window's marks: once only
    assert flow.halvings == 1
    idle = Flow(1, 2, 0, rate, 0.0)
    for k in range(1, 30):  # acknowledged at once: 1-2 segments out, the window never limits and never grows
        idle.send(k * 1e-5)
        idle.on_ack(idle.sent, False, k * 1e-5)
    assert idle.cwnd == INITIAL_WINDOW and idle.sent > 20


def test_a_full_queue_marks_elastic_frames_only():
    frame = bytearray(FRAME_BYTES)
    frame[TOS_OFFSET] = ECT
    full = QUEUE_FRAMES * FRAME_BYTES
    assert marked(bytes(frame), full - 1) == bytes(frame)
    assert marked(bytes(frame), full)[TOS_OFFSET] == CE
    plain = bytes(FRAME_BYTES)
    assert marked(plain, 10 * full) == plain


def test_elastic_background_backs_off_for_the_job():
    """Fat-tree k=4, 256 KiB per worker, 50% permutation of TCP-like flows: the job stays exact (the quiet run's
    result), the background delivers a fraction of what it delivers alone (its frames wait behind the job's in
    every queue, in a lower band, and its window comes back that much later), and the job is slowed a little (by
    the segments in service and queued when it starts: the background runs alone first). Exact figures: the fabric
    is deterministic."""
    quiet = innet.run("fat-tree", backend="local", mode="innet", elements=65536).runs[0]
    report = innet.run("fat-tree", backend="local", mode="innet", elements=65536, background="permutation:0.5:tcp")
    run = report.runs[0]
    bg = run.figures["background"]
    assert run.correct and run.result_digest == quiet.result_digest
    assert bg.transport == "tcp" and bg.flows == 15 and bg.offered_mbps == 5281.818
    assert (bg.delivered_mbps, bg.alone_mbps, bg.goodput_loss) == (1137.97, 5205.024, 0.7814)
    assert bg.job_alone_s == round(quiet.completion_s, 6) and bg.slowdown == 1.1419
    assert ("innet: background permutation:0.5:tcp: 15 flows, offered 5281.82 Mbit/s, delivered 1137.97 Mbit/s while "
            "the job ran, 5205.02 Mbit/s alone (the job took 78.1% of it); the job took 1.142x its time without it "
            "(2.469 ms)") in report.lines()
    assert bg.sent_bytes == bg.received_bytes  # no loss on the fabric: what was sent arrived (in flight drained)
    udp = innet.run("fat-tree", backend="local", mode="innet", elements=65536, background="permutation:0.5").runs[0]
    assert udp.figures["background"].delivered_mbps > 4 * bg.delivered_mbps  # open-loop flows do not back off


@pytest.mark.mininet
def test_the_backends_agree_on_an_elastic_background():
    """Leaf-spine 2 racks x 2, 1 MiB per worker, 50% permutation of TCP flows (the kernel's on Mininet, dilated):
    both exact; what the background delivers alone, the share the job takes of it, and the job's slowdown (on each
    backend against a second run without the background) within 10% of each other. During the job the background delivers only
    a window or two of segments in all (behind the job's frames; Mininet 68-134 Mbit/s over runs, local 67: whole
    windows, so the figure moves in steps of ~67), so there the bound is 8% of what it delivers alone, a step and a
    few segments (goodput_loss within 10% alone would allow ~9.7%)."""
    options = dict(racks=2, hosts_per_rack=2, elements=262144, mode="innet", plots=False)
    local = innet.run("leaf-spine", backend="local", background="permutation:0.5:tcp", **options).runs[0]
    real = innet.run("leaf-spine", backend="mininet", background="permutation:0.5:tcp", **options).runs[0]
    assert local.correct and real.correct and real.result_digest == local.result_digest
    lb, mb = local.figures["background"], real.figures["background"]
    assert mb.transport == "tcp" and mb.flows == lb.flows == 4 and mb.offered_mbps == lb.offered_mbps == 2000.0
    assert mb.alone_mbps == pytest.approx(lb.alone_mbps, rel=0.1)
    assert mb.goodput_loss == pytest.approx(lb.goodput_loss, rel=0.1)
    assert abs(mb.delivered_mbps - lb.delivered_mbps) <= 0.08 * lb.alone_mbps
    # the job's slowdown on Mininet: against a second Mininet run without the background, as the local one
    assert mb.job_alone_s > 0 and mb.slowdown == pytest.approx(real.completion_s / mb.job_alone_s, abs=1e-3)  # rounded
    assert mb.slowdown == pytest.approx(lb.slowdown, rel=0.1)
