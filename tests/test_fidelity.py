"""A run's fidelity verdict (innet.results.fidelity) and what it is measured from (innet.node.usage):
CPU seconds from /proc/<pid>/stat, drops from tc and ip's counters."""

import json
import os
import subprocess
import sys
import time

from innet.node.usage import (
    Samples,
    drops_between,
    has_exited,
    interface_drops,
    process_cpu_s,
    process_times,
    queue_drops,
)
from innet.results.fidelity import (
    CPU_BOUND,
    FAITHFUL,
    NOT_FAITHFUL,
    fidelity,
    fidelity_line,
    virtual_fidelity,
    with_model,
    with_retransmissions,
)


def test_a_quiet_run_without_drops_is_faithful():
    fid = fidelity(2000, {"s1": 0.3, "h1": 0.1}, {"s1-eth1": 0}, {"s1-eth1": 0}, {"s1": 0}, cores=2, wait={"s1": 0.02})
    assert fid.to_json() == {"dilation": 2000.0, "verdict": FAITHFUL, "reasons": [], "cpu": {"h1": 0.1, "s1": 0.3},
                   "wait": {"s1": 0.02}, "drops": {"s1-eth1": 0}}


def test_a_process_that_waited_for_a_core_was_cpu_bound_though_it_ran_little():
    """Other programs (or this run's other processes) held the cores: the worker wanted one 82% of the run."""
    fid = fidelity(1, {"h1": 0.12, "h2": 0.1}, {}, {}, cores=2, wait={"h1": 0.7, "h2": 0.3})
    assert fid.reasons == ("h1 used 0.12 of a core and waited 0.70 of the run for one",)


def test_a_cpu_bound_process_and_dropping_queues_are_named():
    fid = fidelity(1, {"s1": 0.97, "h1": 0.2}, {"s1-eth1": 3, "s1-eth2": 1, "h1-eth0": 0}, {"s1-eth2": 2},
                   {"s1": 5}, cores=2)
    assert fid.verdict == NOT_FAITHFUL
    assert fid.reasons == ("s1 used 0.97 of a core",
                           "2 interface(s) dropped frames at their queues (s1-eth1: 3, s1-eth2: 1)",
                           "1 interface(s) dropped frames at the interface (s1-eth2: 2)",
                           "1 switch(es) dropped frames at their sockets (s1: 5)")
    assert fid.drops == {"h1-eth0": 0, "s1-eth1": 3, "s1-eth2": 3}
    assert fidelity_line({"mode": "innet", "backend": "mininet", "fidelity": fid.to_json()}).startswith(
        "fidelity: innet: not faithful (no dilation): s1 used 0.97 of a core; 2 interface(s)")


def test_processes_that_together_fill_the_cores_are_not_faithful():
    assert fidelity(1, {"h0": 0.5, "h1": 0.5}, {}, {}, cores=2).verdict == FAITHFUL
    assert fidelity(1, {"s1": CPU_BOUND - 0.01}, {}, {}, cores=2).verdict == FAITHFUL
    assert fidelity(1, {"s1": CPU_BOUND}, {}, {}, cores=2).reasons == (f"s1 used {CPU_BOUND:.2f} of a core",)
    many = {f"h{i}": 0.5 for i in range(4)}
    assert fidelity(1, many, {}, {}, cores=2).reasons == ("the run's processes kept 2.0 of the 2 cores busy",)


def test_retransmissions_without_injected_faults_are_a_late_process():
    fid = fidelity(1, {"s1": 0.1}, {}, {})
    assert with_retransmissions(fid, 0, lossy=False) == fid
    assert with_retransmissions(fid, 12, lossy=True) == fid  # --loss: retransmitting is the protocol's job
    late = with_retransmissions(fid, 12, lossy=False)
    assert late.verdict == NOT_FAITHFUL and late.reasons == (
        "12 retransmission(s) on links without injected faults: results came back after the RTO",)


def test_a_run_slower_than_its_links_allow_is_not_faithful():
    """The undilated 1000 Mbit/s run with 64-value packets: 0.78 s where the links allow 0.0103 s."""
    fid = fidelity(1, {"s1": 0.09}, {}, {})
    assert with_model(fid, 0.0105, 0.0103).verdict == FAITHFUL and with_model(fid, 0.0105, 0.0103).model_ratio == 1.0194
    slow = with_model(fid, 0.78, 0.0103)
    assert slow.verdict == NOT_FAITHFUL and slow.reasons == ("took 75.73x the 0.0103 s its links allow (the timing model)",)
    assert with_model(fid, float("nan"), 0.0103).verdict == FAITHFUL  # a failed run is the check's to report
    # fat-tree k=8's ring at dilation 4175 (links shaped at 0.24 Mbit/s): 0.0064 s where the links allow 0.0137 s
    fast = with_model(fid, 0.0064, 0.0137)
    assert fast.verdict == NOT_FAITHFUL and fast.reasons == (
        "took 0.47x the 0.0137 s its links allow (the timing model): faster than its links were shaped to carry it",)
    assert with_model(fid, 0.0095, 0.0103).verdict == FAITHFUL  # 0.92x: within the tolerance


def test_the_local_backend_is_faithful_by_construction():
    fid = virtual_fidelity()
    assert fid.verdict == FAITHFUL and fid.dilation == 1.0 and fid.cpu == {} == fid.drops


def test_cpu_seconds_come_from_proc_and_survive_until_the_process_is_reaped():
    mine = process_cpu_s(os.getpid())
    deadline = time.process_time() + 0.2
    while time.process_time() < deadline:
        pass
    assert process_cpu_s(os.getpid()) >= mine + 0.1
    child = subprocess.Popen([sys.executable, "-c", "import time\nt = time.process_time() + 0.3\nwhile time.process_time() < t: pass"])
    while not has_exited(child.pid):
        time.sleep(0.01)
    assert process_cpu_s(child.pid) >= 0.25  # exited, not reaped: still readable
    cpu, wait = process_times(child.pid)
    assert cpu >= 0.25 and wait >= 0
    child.wait()
    assert process_cpu_s(child.pid) is None and process_times(child.pid) is None and has_exited(child.pid)


def test_cpu_seconds_are_read_to_the_nanosecond_not_in_clock_ticks():
    """A 3 ms burst reads as 3 ms (a short call's window held none of stat's 10 ms ticks: CI saw 0 busy cores)."""
    before, _ = process_times(os.getpid())
    deadline = time.process_time() + 0.003
    while time.process_time() < deadline:
        pass
    after, _ = process_times(os.getpid())
    assert 0.003 <= after - before < 0.009


def test_shares_are_taken_over_the_window_asked_for_not_the_whole_wait():
    """A process idle, then busy 0.3 s of CPU, then idle again (as a worker generates, all-reduces, saves):
    over the readings around its busy window it used a core, over the whole wait a fraction of one."""
    burn = ("import time\ntime.sleep(0.3)\nprint(time.monotonic(), flush=True)\nt = time.process_time() + 0.3\n"
            "while time.process_time() < t: pass\nprint(time.monotonic(), flush=True)\ntime.sleep(0.3)")
    child = subprocess.Popen([sys.executable, "-c", burn], stdout=subprocess.PIPE, text=True)
    samples = Samples(lambda: {"child": process_times(child.pid)}, 0.05)
    while not has_exited(child.pid):
        samples.due()
        time.sleep(0.01)
    samples.take()
    out, _ = child.communicate()
    start, end = (float(line) for line in out.split())
    seconds, cpu, wait, busy = samples.shares(start, end, os.cpu_count())
    whole, whole_cpu, _, _ = samples.shares(samples.taken[0].at, samples.taken[-1].at, os.cpu_count())
    assert end - start <= seconds <= end - start + 0.3  # the readings around the window, not the whole wait
    assert whole >= seconds + 0.4
    assert cpu["child"] * seconds >= 0.28  # all its CPU fell in the window
    # most of its CPU falls in the window, its start-up's outside: 0.11 of 0.41 CPU-s in a quiet CI (0.75 failed there)
    assert cpu["child"] * seconds >= whole_cpu["child"] * whole * 0.5
    assert wait["child"] >= 0 and 0 < busy <= os.cpu_count()


def test_drops_are_read_from_tc_and_ip_inside_a_node():
    tc = [{"kind": "htb", "handle": "5:", "root": True, "dev": "s1-eth1", "drops": 7},
          {"kind": "pfifo_fast", "handle": "10:", "parent": "5:1", "dev": "s1-eth1", "drops": 7},
          {"kind": "noqueue", "root": True, "dev": "lo", "drops": 0}]
    ip = [{"ifname": "lo", "stats64": {"rx": {"dropped": 0}, "tx": {"dropped": 0}}},
          {"ifname": "s1-eth1", "stats64": {"rx": {"dropped": 2}, "tx": {"dropped": 1}}}]
    assert queue_drops(json.dumps(tc)) == {"s1-eth1": 7}  # the root's count has its children's in it: counted once
    assert interface_drops(json.dumps(ip)) == {"s1-eth1": 3}
    assert queue_drops("Cannot find device") == {}
    assert drops_between({"s1-eth1": 5}, {"s1-eth1": 7, "s1-eth2": 1}) == {"s1-eth1": 2, "s1-eth2": 1}


def test_the_verdict_holds_against_the_model_what_the_model_predicts():
    """Two jobs sharing the links and top-k are in the timing model (docs/validation.md's Mininet grid: within 2%),
    so a Mininet run of either is held against it; a lossy run's time is the draw of its losses, and is not."""
    from innet.backends.mininet.emulation import _modelled
    from innet.planning.spec import RunSpec
    from innet.wire.faults import FaultSpec

    assert _modelled(RunSpec()) and _modelled(RunSpec(jobs=2)) and _modelled(RunSpec(topk=0.1))
    assert not _modelled(RunSpec(faults=FaultSpec(loss=0.01))) and not _modelled(RunSpec(consistency="ssp"))
