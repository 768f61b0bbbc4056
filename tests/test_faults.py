"""Faults, crashes, tenants, spoofers, overflow and garbage, on the in-process fabric."""

from collections import Counter

import numpy as np
import pytest

from innet.backends.local.fabric import Fabric
from innet.backends.local.run import LocalRun, run_local
from innet.errors import UserError
from innet.graph import node_indices
from innet.hosts.job import JobSpec
from innet.hosts.worker.call import AllreduceCall
from innet.hosts.worker.process import WorkerProcess
from innet.planning.spec import MODES, RunSpec
from innet.wire.faults import FaultSpec
from innet.wire.packet import PAYLOAD_OFFSET
from scripts.fuzz import forged_frames, malformed_frames
from topologies import build


def small():
    return build("leaf-spine", racks=2, hosts_per_rack=2)


GRID = [FaultSpec(loss=loss, dup=noise, reorder=noise, reorder_delay=0.001)
        for loss in (0.01, 0.05, 0.2) for noise in (0.0, 0.05)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("faults", [*GRID, FaultSpec(dup=0.2), FaultSpec(reorder=0.3, reorder_delay=0.001)], ids=str)
def test_every_mode_stays_bit_exact_under_faults(mode, faults):
    """Loss of 1, 5 and 20%, with and without 5% duplication and 5% reordering, on every link of the
    default leaf-spine: each mode's result is exactly the fault-free one (at 20% loss a PBox round trip
    crosses six lossy links: a worker may wait seconds for a lost result while the others move on)."""
    graph = build("leaf-spine")
    clean = run_local(graph, RunSpec(mode=mode, elements=65536))
    faulty = run_local(graph, RunSpec(mode=mode, elements=65536, faults=faults, seed=0))
    assert faulty["correct"], faulty["errors"]
    assert faulty["result_digest"] == clean["result_digest"]
    if faults.loss >= 0.05:
        assert faulty["retransmissions"] > 0 and faulty["drops"]["link:lost"] > 0
    if faults.dup:
        assert faulty["drops"].get("drop:duplicate", 0) + faulty["drops"].get("pbox:duplicate", 0) > 0 or mode == "ring"


def test_a_straggler_slows_the_job_but_never_corrupts_it():
    clean = run_local(small(), RunSpec(elements=20000))
    slow = run_local(small(), RunSpec(elements=20000, link_faults=(("h3--t2", FaultSpec(delay=0.002)),)))
    assert slow["correct"] and slow["result_digest"] == clean["result_digest"]
    assert slow["completion_s"] > clean["completion_s"] + 0.002


@pytest.mark.parametrize("mode", ["innet", "pbox"])
def test_a_crashed_worker_is_named_the_slots_are_freed_and_the_next_job_succeeds(mode):
    graph = small()
    run = RunSpec(mode=mode, elements=400000, timeout=2.0)  # 196 chunks: more than a window, so h3 crashes mid-stream
    first = LocalRun(graph, run, crash={"h3": 0.0005})
    result = first.finish()
    assert not result["correct"]
    survivors = [e for e in result["errors"] if "crashed" not in e]
    assert survivors and all("rank(s) 2 sent nothing" in e and "aborted the job" in e for e in survivors)
    assert first.fabric.now < 2.0  # the others knew within the stall timeout (1 s) plus a check period
    for rt in first.runtimes.values():  # every slot of the job is free again
        assert (rt.ctx.regs.chunk == -1).all()
    # the next job runs on the very same switches (and PBox), from a clean slate
    again = Fabric(graph, seed=1)
    for name, rt in first.runtimes.items():
        again.add_switch(name, rt)
    for server in first.servers:
        again.attach("p1", server)
    procs = []
    for w, spec in first.rp.specs[1].items():
        proc = WorkerProcess(spec, [np.full(3000, spec.rank + 1.0, np.float32)])
        again.attach(w, proc)
        procs.append(proc)
    again.run()
    assert all(p.error is None for p in procs)
    assert all(np.array_equal(p.calls[0].result, np.full(3000, 10.0, np.float32)) for p in procs)


def test_tenants_share_switches_and_the_overflowing_job_falls_back_exactly():
    graph = build("leaf-spine", racks=2, hosts_per_rack=3)
    result = run_local(graph, RunSpec(elements=20000, jobs=3, job_slots=64, iterations=2))
    assert result["correct"] and result["fallbacks"] == 1
    assert [j["outcome"] for j in result["jobs"]] == ["full: 64 slots", "full: 64 slots",
                                                      "fallback: switch memory full, aggregated by p1"]
    assert result["link_bytes"] == result["predicted_link_bytes"]


class Spoofer:
    """A host that forges every kind of packet it can think of, all through the run."""

    daemon = True
    done = False

    def __init__(self, me, tor, victim, pbox, rounds=300):
        self.forged = forged_frames(me, tor, victim, pbox)
        self.left = rounds
        self.sent = Counter()

    def start(self, now):
        return []

    def receive(self, frame, now):
        return []

    def next_deadline(self):
        return None if self.left <= 0 else 0.0001 * (300 - self.left)

    def on_timeout(self, now):
        self.left -= 1
        self.sent.update(kind for kind, _ in self.forged)
        return [frame for _, frame in self.forged]


def test_a_spoofing_host_cannot_change_anyone_elses_sums():
    graph = build("leaf-spine", racks=2, hosts_per_rack=3)
    clean = run_local(graph, RunSpec(elements=30000, workers=4))
    lr = LocalRun(graph, RunSpec(elements=30000, workers=4))
    idx = node_indices(graph)
    spoofer = Spoofer(idx["h6"], idx["t2"], idx["h4"], idx["p1"])
    lr.attach("h6", spoofer)
    result = lr.finish()
    assert result["correct"] and result["result_digest"] == clean["result_digest"]
    counters = lr.runtimes["t2"].ctx.counters
    assert spoofer.sent["delivered"] > 5  # rounds sent while the job ran
    assert {k: v for k, v in counters.items() if k.startswith("drop:")} == {k: v for k, v in spoofer.sent.items() if k != "delivered"}


class Fuzzer(Spoofer):
    daemon = False  # the run lasts until every frame went out

    def __init__(self, frames):
        self.frames = frames
        self.left = len(frames)
        self.drained_at = None  # done once the link had time to deliver everything sent
        self.done = False

    def next_deadline(self):
        return self.drained_at if self.left == 0 else 0.0

    def on_timeout(self, now):
        if self.left == 0:
            self.done = now >= self.drained_at
            return []
        batch, self.frames = self.frames[:200], self.frames[200:]
        self.left = len(self.frames)
        if self.left == 0:
            self.drained_at = now + 2.0
        return batch


def test_100k_malformed_frames_at_a_live_switch_are_all_counted_and_change_nothing():
    graph = build("leaf-spine", racks=2, hosts_per_rack=3)
    clean = run_local(graph, RunSpec(elements=100000, workers=4))
    lr = LocalRun(graph, RunSpec(elements=100000, workers=4))
    idx = node_indices(graph)
    frames = malformed_frames(100_000, idx["h6"], idx["t2"], seed=7)
    lr.attach("h6", Fuzzer(frames))
    result = lr.finish()
    assert result["correct"] and result["result_digest"] == clean["result_digest"]
    t2 = lr.runtimes["t2"]
    counted = sum(n for k, n in t2.ctx.counters.items() if k.startswith(("bad:", "drop:")))
    assert counted == 100_000
    assert t2.stats[2].rx_packets == 100_000  # h6 is port 2 of t2


def test_a_crashed_ring_member_is_named_by_a_neighbour():
    result = LocalRun(small(), RunSpec(mode="ring", elements=50000, timeout=2.0), crash={"h3": 0.0005}).finish()
    assert not result["correct"]
    named = ("rank 3: nothing new from rank 2 (its predecessor", "rank 1: rank 2 (its successor in the ring) acknowledged nothing")
    assert any(e.startswith("job 1 ") and any(n in e for n in named) for e in result["errors"]), result["errors"]


def test_overflow_is_never_silent():
    class Rogue(AllreduceCall):
        """A member whose fixed-point values ignore the agreed scale."""

        def _agree(self, exp):
            super()._agree(exp)
            self.frames.ensure(len(self.frames.rows))  # every frame built now, then spoiled
            for frames in (self.frames.rows, self.frames.tail):
                frames[:, PAYLOAD_OFFSET:].view("<i4")[:] = 2**31 - 1

    graph = build("star", workers=3)
    lr = LocalRun(graph, RunSpec(elements=1000))
    lr.procs[0].make_call = Rogue
    result = lr.finish()
    assert not result["correct"]
    assert any("int32 overflow" in e for e in result["errors"])


def test_extreme_magnitudes_stay_exact_and_nan_is_refused():
    graph = build("star", workers=2)
    lr = LocalRun(graph, RunSpec(elements=10))
    lr.procs[0].tensors = [np.full(10, 3e37, np.float32)]
    lr.procs[1].tensors = [np.full(10, -1e-30, np.float32)]
    lr.fabric.run()
    got = [p.calls[0].result for p in lr.procs]
    assert np.array_equal(got[0], got[1]) and np.allclose(got[0], 3e37, rtol=1e-6)
    spec = JobSpec(job=1, rank=0, nworkers=2, slots=4, elements=4, node=0, first_hop=1)
    with pytest.raises(UserError, match="NaN or Inf"):
        AllreduceCall(spec, np.array([1.0, np.nan], np.float32), 0)


def test_one_seed_rule_gives_both_backends_the_same_fault_seeds():
    """Every link direction's injector is seeded by fault_seed(run seed, sender, receiver), on the fabric
    and in the Mininet processes' configs alike; another run seed gives other seeds."""
    from innet.backends.local.fabric import Fabric
    from innet.backends.mininet.nodes import port_faults
    from innet.graph import ports

    graph = small()
    run = RunSpec(seed=5, faults=FaultSpec(loss=0.1))
    fabric = Fabric(graph, faults=run.faults_on, seed=run.seed)
    for node in graph:
        for port, conf in port_faults(graph, run, node).items():
            peer = ports(graph, node)[port]
            assert conf.seed == fabric.links[(node, peer)].injector.seed
            assert conf.spec.loss == 0.1
    other = Fabric(graph, faults=run.faults_on, seed=6)
    assert all(other.links[k].injector.seed != link.injector.seed for k, link in fabric.links.items())
    assert len({link.injector.seed for link in fabric.links.values()}) == len(fabric.links)


def test_a_duplicate_takes_the_wire_after_its_original_as_on_a_real_link():
    """A duplicated frame is sent twice: the copy follows its original on the wire and delays what comes after,
    as Mininet's shaper sends it (on the fabric it came free, with its original: star of 4, 10 Mbit/s, --dup 0.01,
    the fabric at the lossless time where each duplicate cost Mininet's link a frame)."""
    graph = build("star", workers=2, bw=10)
    fabric = Fabric(graph, faults=FaultSpec(dup=0.5), seed=3)
    arrived: list[tuple[float, bytes]] = []
    fabric._deliver = lambda node, port, frame: arrived.append((fabric.now, frame))  # type: ignore[method-assign]
    link = fabric.links[("h1", "s1")]
    for name in b"abcd":
        fabric.transmit("h1", 0, bytes([name]) * 1250)  # 1 ms each at 10 Mbit/s
    fabric.run()
    copies = 4 + link.injector.duplicated
    assert 4 < copies < 8
    assert [round((t - link.latency) * 1e3, 9) for t, _ in arrived] == [float(k) for k in range(1, copies + 1)]
    assert [f[0] for _, f in arrived] == sorted(f[0] for _, f in arrived)  # each copy right behind its original
