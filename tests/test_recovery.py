"""Loss detection that reordering does not fool (innet.hosts.recovery): the known and the measured reordering
window, DSACK-like proof of a spurious retransmission, and whole runs under reordering alone."""

import numpy as np
import pytest

import innet
from innet.hosts.recovery import REORDER_CAP, Rack, Undo


def test_the_window_covers_the_reordering_the_run_injects_and_what_it_measures():
    rack = Rack(0.001)
    assert rack.window(None) == 0.001 and rack.reordering(None) == 0.0  # a FIFO path: the floor, and no wait at all
    rack.reordered(0.002)
    assert rack.window(None) == pytest.approx(0.0025)  # a quarter more than the latest answer seen
    rack.reordered(1.0)
    assert rack.window(None) == REORDER_CAP * 0.001  # measured alone (it may be another's loss): bounded
    known = Rack(0.001, reorder=0.003)
    assert known.window(None) == 0.003
    known.reordered(0.02)
    assert known.window(0.01) == pytest.approx(0.01)  # where the run reorders: up to the smoothed RTT (RFC 8985)


def test_a_second_answer_for_a_resent_chunk_proves_the_retransmission_spurious_once():
    undo = Undo(4)
    undo.answered(np.array([1, 2]), np.array([9, 10]), np.array([True, False]), np.array([0.004, 0.001]))
    assert undo.duplicates(np.array([2]), np.array([10])).tolist() == []  # never resent: nothing to undo
    assert undo.duplicates(np.array([1]), np.array([5])).tolist() == []  # an older chunk of that slot: stale only
    assert undo.duplicates(np.array([1]), np.array([9])).tolist() == [0.004]  # late by how long it was suspect
    assert undo.duplicates(np.array([1]), np.array([9])).tolist() == []  # proven once


@pytest.mark.parametrize("mode", ["innet", "ring"])
def test_reordering_without_loss_is_not_taken_for_loss(mode):
    """5% of frames held back 1-3 ms on every link, no loss, star of 4, 128 chunks a worker (512 data packets):
    exact, and at most 5% of the packets retransmitted (before the reordering window: 376-544 in-network,
    195-325 ring). Not yet the PBox (17-400: an answer that completes behind a 4:1 incast queue)."""
    run = innet.run("star", workers=4, mode=mode, backend="local", elements=262144, reorder=0.05, seed=3).runs[0]
    assert run.correct
    assert run.retransmissions <= 0.05 * 512, run.retransmissions
    assert 0 <= run.spurious_retransmissions


def test_a_slow_call_says_what_it_waits_for():
    """The progress line's words (innet.results.progress.waits): a worker's oldest chunk unanswered and from
    whom, a ring rank's first missing piece and from which rank, each with its retransmissions; nothing once done."""
    from innet.hosts.ring import RingCall
    from innet.hosts.worker import AllreduceCall, JobSpec
    from innet.results.progress import waits

    def spec(rank, **kw):
        return JobSpec(job=1, rank=rank, nworkers=4, slots=8, elements=16, node=rank, first_hop=9, **kw)

    call = AllreduceCall(spec(2), np.ones(100, np.float32), first_chunk=0)
    call.start(0.0)
    assert call.waiting() == "in-network: rank 2 waiting for chunk 0 from its switch, 0 retransmissions"
    call.on_timeout(call.rto)
    pbox = AllreduceCall(spec(1, pbox=7), np.ones(100, np.float32), first_chunk=0)
    pbox.start(0.0)
    ring = RingCall(spec(3), [0, 1, 2, 3], np.ones(100, np.float32), 0)
    ring.start(0.0)
    assert waits([call, pbox, ring], most=3) == (
        "; in-network: rank 2 waiting for chunk 0 from its switch, 1 retransmissions"
        "; PBox: rank 1 waiting for chunk 0 from the PBox, 0 retransmissions"
        "; ring: rank 3 waiting for piece 0 of step 0 from rank 2, 0 retransmissions")
    call.finished_at = 1.0
    assert waits([call]) == ""


def test_the_run_tells_its_workers_how_long_its_links_hold_frames_back():
    """innet.planning.configs.reorder_window: 1.5 reorder_delay where a link reorders (the worst held-back frame),
    else nothing: a FIFO path waits no longer."""
    from innet.planning.configs import reorder_window
    from innet.planning.spec import RunSpec
    from innet.wire.faults import FaultSpec

    assert reorder_window(RunSpec()) == 0.0
    assert reorder_window(RunSpec(faults=FaultSpec(loss=0.2))) == 0.0
    assert reorder_window(RunSpec(faults=FaultSpec(reorder=0.05))) == pytest.approx(0.003)
    assert reorder_window(RunSpec(link_faults=(("h1--s1", FaultSpec(reorder=0.1, reorder_delay=0.01)),))) == pytest.approx(0.015)
