"""Faults, crashes, spoofers, fuzzing and interrupted teardown on real Mininet networks (root)."""

import glob
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest

from innet.backends.local.run import run_local
from innet.backends.mininet.emulation import run_mininet
from innet.graph import node_indices, port_to
from innet.planning.spec import RunSpec
from innet.wire.faults import FaultSpec
from tests.test_emulation import ROOT, _start, _wait_for_state, assert_nothing_left
from topologies import build

pytestmark = pytest.mark.mininet


@pytest.mark.parametrize("mode,faults", [
    ("innet", FaultSpec(loss=0.05)), ("pbox", FaultSpec(loss=0.05)), ("ring", FaultSpec(loss=0.05)),
    ("innet", FaultSpec(loss=0.2)), ("pbox", FaultSpec(loss=0.2)), ("ring", FaultSpec(loss=0.2)),
    ("innet", FaultSpec(dup=0.1, reorder=0.2, reorder_delay=0.002)),
    ("ring", FaultSpec(dup=0.1, reorder=0.2, reorder_delay=0.002)),
], ids=lambda x: str(x))
def test_lossy_links_stay_bit_exact_on_mininet(mode, faults):
    graph = build("leaf-spine", racks=2, hosts_per_rack=2)
    slow = mode == "ring" and faults.loss >= 0.2  # every ring step waits on a lossy hop: 16 s a call for 4000 values on the fabric
    spec = RunSpec(mode=mode, elements=2000 if slow else 20000, iterations=1 if slow else 2, min_rto=0.02, faults=faults,
                   timeout=20)
    result = run_mininet(graph, spec)
    assert result["correct"], result["errors"]
    assert result["result_digest"] == run_local(graph, RunSpec(mode=mode, elements=spec.elements,
                                                                iterations=spec.iterations))["result_digest"]
    if faults.loss:
        assert result["retransmissions"] > 0 and result["drops"]["link:lost"] > 0
    assert_nothing_left()


def test_a_killed_worker_is_named_within_the_timeout():
    """The survivors name the rank that sent nothing: the Python switch's stall abort, which the eBPF switch lacks, so
    ``--data-plane auto`` keeps a run with a crash on the Python switch (given to run_mininet as to --crash)."""
    graph = build("leaf-spine", racks=2, hosts_per_rack=2)
    began = time.monotonic()
    # long enough (~0.4 s at line rate, more here) that the crash lands mid-run on a fast machine too
    result = run_mininet(graph, RunSpec(elements=12_000_000, min_rto=0.02, timeout=4, data_plane="auto"),
                         crash={"h3": 0.3})
    assert set(result["switch_data_plane"].values()) == {"python"}
    assert not result["correct"]
    survivors = [e for e in result["errors"] if "wrote no result" not in e]
    assert survivors and all("rank(s) 2 sent nothing" in e for e in survivors), result["errors"]
    assert time.monotonic() - began < 30
    assert_nothing_left()


@pytest.mark.parametrize("data_plane", ["python", "ebpf"])
def test_100k_malformed_frames_and_a_spoofer_at_live_switches(data_plane):
    if data_plane == "ebpf" and shutil.which("clang") is None:
        pytest.skip("the eBPF switch needs clang and libbpf-dev (make deps)")
    graph = build("leaf-spine", racks=2, hosts_per_rack=3)
    idx = node_indices(graph)
    fuzz = [sys.executable, "-m", "scripts.fuzz", "--iface", "h6-eth0", "--src", str(idx["h6"]), "--dst", str(idx["t2"]),
            "--count", "100000", "--rate", "25000"]
    spec = RunSpec(elements=400_000, iterations=3, workers=4, min_rto=0.02, timeout=30, data_plane=data_plane)
    result = run_mininet(graph, spec, intruders=[("h6", fuzz)])
    assert result["correct"], result["errors"]
    assert set(result["switch_data_plane"].values()) == {data_plane}
    assert result["result_digest"] == run_local(graph, RunSpec(elements=400_000, iterations=3, workers=4))["result_digest"]
    t2 = result["switch_counters"]["t2"]
    # every fuzzed frame is refused before a slot is touched; stale and duplicate drops need a real member's
    # port, so those are the workers' own late retransmissions, not the fuzzer's
    counted = sum(n for k, n in t2.items() if k.startswith(("bad:", "drop:")) and k not in ("drop:stale", "drop:duplicate"))
    # a fuzzed frame the kernel dropped on the way (h6's queue, the veth pair into t2) never reached t2's program:
    # every frame not counted there is one of the drops the two ends of h6--t2 report (which may count the
    # kernel's own frames too), and a few at most: the fuzzer waits for room in its queue
    on_the_way = result.fidelity.drops
    lost = on_the_way.get(f"h6-eth{port_to(graph, 'h6', 't2')}", 0) + on_the_way.get(f"t2-eth{port_to(graph, 't2', 'h6')}", 0)
    missing = 100_000 - counted - result["drops"].get("socket", 0)
    assert 0 <= missing <= lost < 1000, (missing, lost)
    assert_nothing_left()


def test_interrupts_at_random_points_leave_nothing_behind(tmp_path):
    rng = random.Random(2026)
    for n in range(4):  # during the all-reduce, the build (twice), and before the network is complete
        proc = _start(tmp_path / f"out{n}", "--elements", "2000000", "--iterations", "2", "--no-plots")
        if n % 3 == 2:  # sometimes before the network is even complete
            time.sleep(rng.uniform(0.2, 1.0))
            state = None
        else:
            state = _wait_for_state(proc, "building" if n % 2 else "all-reduce")
            time.sleep(rng.uniform(0.0, 1.5))
        proc.send_signal(rng.choice([signal.SIGINT, signal.SIGTERM]))
        _, err = proc.communicate(timeout=60)
        assert proc.returncode in (0, 130), err[-3000:]
        assert_nothing_left(state)


def test_sigkill_at_random_points_then_clean(tmp_path):
    rng = random.Random(7)
    for _ in range(3):
        proc = _start(tmp_path / f"out{len(list(tmp_path.iterdir()))}", "--elements", "2000000", "--no-plots")
        time.sleep(rng.uniform(0.5, 2.5))
        states = []
        for path in glob.glob("/run/innet/*.json"):
            with open(path) as fh:
                state = json.load(fh)
            if state["runner"][0] == proc.pid:
                states.append(state)
        proc.kill()
        proc.communicate(timeout=30)
        out = subprocess.run([sys.executable, os.path.join(ROOT, "run_topology.py"), "--clean"],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        for state in states:
            assert_nothing_left(state)
        assert_nothing_left()


def test_a_spoofing_host_on_mininet_changes_no_sum():
    graph = build("leaf-spine", racks=2, hosts_per_rack=3)
    idx = node_indices(graph)
    spoof = [sys.executable, "-m", "scripts.fuzz", "--iface", "h6-eth0", "--src", str(idx["h6"]), "--dst", str(idx["t2"]),
             "--count", "2000", "--rate", "5000", "--spoof", str(idx["h4"]), str(idx["p1"])]
    spec = RunSpec(elements=300_000, iterations=2, workers=4, min_rto=0.02, timeout=30)
    result = run_mininet(graph, spec, intruders=[("h6", spoof)])
    assert result["correct"], result["errors"]
    assert result["result_digest"] == run_local(graph, RunSpec(elements=300_000, iterations=2, workers=4))["result_digest"]
    t2 = result["switch_counters"]["t2"]
    assert (t2["drop:unknown_job"], t2["drop:result_from_child"]) == (2000, 2000)
    assert t2["drop:not_member"] == 4000 and t2["drop:spoofed_source"] == 4000
    assert_nothing_left()
