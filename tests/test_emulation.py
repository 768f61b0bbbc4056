"""The Mininet backend: real namespaces, veth links and Python switches (needs root)."""

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import innet.backends.mininet.shaper as shaper
from innet.backends.local.run import run_local
from innet.backends.mininet.cleanup import STATE_DIR, Created, records, start_time
from innet.backends.mininet.emulation import run_mininet
from innet.node.codec import from_json
from innet.planning.spec import RunSpec
from topologies import build

pytestmark = pytest.mark.mininet
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def innet_interfaces():
    """Interfaces in the root namespace named like a run's (h1-eth0). Another run on this machine makes such
    names for a moment while it builds (they move into its namespaces at once); one that stays is a leak."""
    for _ in range(30):
        names = [name for name in os.listdir("/sys/class/net") if "-eth" in name]
        if not names:
            break
        time.sleep(0.1)
    return names


def state_records():
    """(path, record) of every run's state file on the machine now."""
    for path in glob.glob(os.path.join(STATE_DIR, "*.json")):
        try:
            with open(path) as fh:
                yield path, json.load(fh)
        except (OSError, ValueError):  # removed, or being replaced, just now
            continue


def our_state_files():
    """The state files of runs this test process made, in-process or as its child. Another run on the machine
    (a second checkout's tests, a demo) leaves its own file while it runs: not this suite's to judge."""
    return [f"{path}: {data['argv']}" for path, data in state_records()
            if os.getpid() in (data["runner"][0], data.get("parent"))]


def assert_nothing_left(state=None):
    """No interface or state file of this suite's runs is left; nor, given a run's state (its file's JSON, or
    its RunState's record), any of its processes or its run directory."""
    assert innet_interfaces() == []
    assert our_state_files() == []
    if isinstance(state, dict):
        state = from_json(Created, state)
    if state:
        for pid, started in state.pids.values():
            assert start_time(pid) != started, f"process {pid} of the run is still alive"
        assert not os.path.exists(state.dir)


@pytest.mark.parametrize("topo,params,elements", [
    ("star", {"workers": 3}, 1),
    ("star", {"workers": 4}, 70001),
    ("leaf-spine", {"racks": 2, "hosts_per_rack": 2}, 999),
    ("leaf-spine", {"racks": 2, "hosts_per_rack": 3, "spines": 2}, 50000),
])
def test_allreduce_is_exact_and_identical_to_the_local_backend(topo, params, elements):
    graph = build(topo, **params)
    spec = RunSpec(elements=elements, iterations=2, min_rto=0.2, initial_rto=1.0)
    real = run_mininet(graph, spec)
    assert real["correct"], real["errors"]
    local = run_local(graph, spec)
    assert real["result_digest"] == local["result_digest"]
    # without faults, the bytes measured at the interfaces are the fabric's bytes, link by link
    assert real["link_bytes"] == local["link_bytes"]
    assert_nothing_left()


@pytest.mark.parametrize("mode", ["innet", "pbox", "ring"])
def test_jumbo_frames_are_exact_and_their_bytes_are_the_local_backends(mode):
    """--packet-elements 2239: 9014-byte frames, the most a 9000-byte MTU takes, set on every link."""
    from innet.wire.packet import MAX_PACKET_ELEMENTS

    graph = build("leaf-spine", racks=2, hosts_per_rack=2)
    spec = RunSpec(mode=mode, elements=50001, iterations=2, packet_elements=MAX_PACKET_ELEMENTS, min_rto=0.2)
    real = run_mininet(graph, spec)
    assert real["correct"], real["errors"]
    assert real["packet_elements"] == MAX_PACKET_ELEMENTS and real["retransmissions"] == 0
    local = run_local(graph, spec)
    assert real["result_digest"] == local["result_digest"]
    assert real["link_bytes"] == local["link_bytes"] == local["predicted_link_bytes"]
    assert_nothing_left()


@pytest.mark.parametrize("mode", ["innet", "pbox"])
def test_topk_sparse_is_exact_and_its_bytes_are_the_local_backends(mode):
    """Sparse chunks of varying length through real sockets: exact sums, and the interfaces count
    the very bytes the fabric does (a fifth of dense at density 0.02)."""
    graph = build("leaf-spine", racks=2, hosts_per_rack=2)
    spec = RunSpec(mode=mode, program="topk_sparse", elements=30000, iterations=2, topk=0.02, min_rto=0.2)
    real = run_mininet(graph, spec)
    assert real["correct"], real["errors"]
    local = run_local(graph, spec)
    assert real["result_digest"] == local["result_digest"]
    assert real["link_bytes"] == local["link_bytes"] and real["bytes_vs_dense"] < 0.2
    assert_nothing_left()


@pytest.mark.parametrize("model,staleness", [("bsp", 0), ("ssp", 2), ("asp", 0)])
def test_training_against_the_pbox_is_exact_and_keeps_its_staleness_bound(model, staleness):
    """Real clocks and sockets: stragglers slow two workers, the parameters still end exact, and no
    read is staler than the bound (ASP: more than SSP's)."""
    run = RunSpec(mode="pbox", consistency=model, staleness=staleness, iterations=12, elements=8000, compute_time=0.02,
                  stragglers=(("h2", 4.0, 0.3), ("h3", 4.0, 0.3)), min_rto=0.05)
    result = run_mininet(build("leaf-spine", racks=2, hosts_per_rack=2), run)
    assert result["correct"], result["errors"]
    assert result["max_staleness"] <= staleness if model != "asp" else result["max_staleness"] > 2
    assert_nothing_left()


def test_p3_on_mininet_is_exact_and_layer_0_is_not_left_last():
    """ResNet-50 in 5000-element slices at 10 Mbit/s: every worker follows the planned P3 order on real
    clocks (a worker out of step would corrupt sums), and the next forward pass waits a small fraction
    of what FIFO makes it wait (FIFO: all of the iteration's communication, ~1.1 s)."""
    run = RunSpec(workload="resnet50", compute_scale=10, iterations=2, slice_elements=5000, priority="p3", min_rto=0.02)
    result = run_mininet(build("star", workers=4, bw=10.0), run)
    assert result["correct"], result["errors"]
    assert result["next_forward_wait_s"] < 0.1 * result["comm_wait_s"]
    assert_nothing_left()


def uplink_bands(pcap: str, sender_mac: bytes) -> list[int]:
    """The priority band of every gradient frame ``sender_mac`` put on the link, in the order they left."""
    from scapy.utils import RawPcapReader

    from innet.wire.packet import AGG_PORT, TOS_OFFSET, band_of

    bands = []
    with RawPcapReader(pcap) as reader:
        for frame, _ in reader:
            if frame[6:12] == sender_mac and len(frame) > 38 and int.from_bytes(frame[36:38], "big") == AGG_PORT:
                bands.append(band_of(frame[TOS_OFFSET]))
    return bands


def test_a_jobs_band_puts_it_first_in_the_real_queues(tmp_path):
    """Two jobs share 4:1 oversubscribed ToR uplinks (htb, with pfifo_fast's three bands under it). What the
    queue did, read from a capture of the uplink: the band-0 job's frames left first (their mean place in
    the departure order well ahead of the band-2 job's; FIFO would interleave them), and both jobs are
    exact. At 5 Mbit/s the uplink, not the CPU, is the bottleneck even on a machine three times slower
    (the capture itself keeps the kernel busy, so the run's CPU verdict is not asked here)."""
    from innet.graph import node_indices, ports
    from innet.wire.packet import node_mac

    graph = build("leaf-spine", racks=2, hosts_per_rack=4, oversubscription=4, bw=5)
    run = RunSpec(jobs=2, elements=60_000, job_priority=(2, 0), min_rto=0.2, packet_elements=256)  # frames to count
    record = run_mininet(graph, run, pcap_dir=str(tmp_path))
    assert record["correct"], record["errors"]
    uplink = next(p for p, peer in ports(graph, "t1").items() if peer.startswith("s"))
    bands = uplink_bands(str(tmp_path / f"t1-eth{uplink}.pcap"), node_mac(node_indices(graph)["t1"]))
    place = {b: sum(i for i, x in enumerate(bands) if x == b) / max(1, bands.count(b)) for b in (0, 2)}
    assert bands.count(0) > 100 and bands.count(2) > 100, (bands.count(0), bands.count(2))
    assert place[0] < 0.75 * place[2], place
    assert_nothing_left()


def test_a_shared_input_stream_is_multicast_exactly_and_saves_the_predicted_bytes():
    """Two jobs read the same input: one multicast stream from the PBox host, copied by the switches.
    Every reader gets its shards bit for bit; the bytes are the planner's and the fabric's, link by link."""
    graph = build("leaf-spine", racks=2, hosts_per_rack=4)
    spec = RunSpec(jobs=2, elements=20000, iterations=2, input_elements=20000, shared_input=True, min_rto=0.2)
    real = run_mininet(graph, spec)
    assert real["correct"], real["errors"]
    i = real["input"]
    assert i["exact"] and i["readers"] == 8, i
    if i["nacks"] == 0:  # a NACK (a reader idle 0.2 s on a loaded machine) adds resent bytes
        assert i["bytes"] == i["predicted_bytes"] == i["unicast_bytes"] - i["saved_bytes"]
    local = run_local(graph, spec)["link_bytes"]
    if i["nacks"] == 0 and real["retransmissions"] == 0:
        assert real["link_bytes"] == local
    else:  # a loaded machine's retransmissions add frames, never take any away
        assert all(real["link_bytes"][link] >= b for link, b in local.items()), (real["link_bytes"], local)
    assert_nothing_left()


@pytest.mark.parametrize("data_plane", ["python", "ebpf"])  # README's fat-tree command (test_guide) runs the default's
def test_fat_tree_k4_brings_up_aggregates_and_tears_down(data_plane):
    if data_plane == "ebpf" and shutil.which("clang") is None:
        pytest.skip("the eBPF switch needs clang and libbpf-dev (make deps)")
    graph = build("fat-tree", k=4)
    result = run_mininet(graph, RunSpec(elements=20000, min_rto=0.05, timeout=30, data_plane=data_plane))
    assert result["correct"] and result["workers"] == 15 and len(result["switch_cpu_share"]) == 20
    assert set(result["switch_data_plane"].values()) == {data_plane}
    assert result["result_digest"] == run_local(graph, RunSpec(elements=20000))["result_digest"]
    assert_nothing_left()


def _start(out, *args):
    """A run in its own process writing into folder ``out``, with SIGINT's default disposition even where this
    suite's was ignored (a shell starts background jobs so, and Python then never turns SIGINT into
    KeyboardInterrupt)."""
    return subprocess.Popen([sys.executable, os.path.join(ROOT, "run_topology.py"), "--out", str(out), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _wait_for_state(proc, phase="all-reduce", timeout=600, hosts=1):
    """Wait until the run's own state record (innet.backends.mininet.cleanup) shows ``phase`` — "building": it is
    written; "all-reduce": processes run in ``hosts`` worker hosts — and return it. The record says what
    happened, not the run's words on stderr."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        for _, state in state_records():
            if state["runner"][0] == proc.pid and (
                    phase == "building" or sum(label.startswith("innet:h") for label in state["pids"]) >= hosts):
                return state
        time.sleep(0.05)
    raise AssertionError(f"run {proc.pid} wrote no state record showing {phase} (exit {proc.poll()})")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_run_leaves_nothing_behind(sig, tmp_path):
    proc = _start(tmp_path / "out", "--elements", "3000000", "--iterations", "3")
    state = _wait_for_state(proc)
    time.sleep(0.3)
    proc.send_signal(sig)
    proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert_nothing_left(state)


@pytest.mark.parametrize("nth", [3, 12, 14, 40])
def test_an_interrupt_inside_a_nodes_shell_command_still_removes_everything(monkeypatch, nth):
    """A signal can land while Mininet reads a node's shell mid-command (the random-interrupt test found it):
    that node is left waiting, and Mininet's own stop() then fails. The run removes what it recorded all the
    same: its processes, interfaces, run directory and state file. ``nth`` picks the command of a 2-worker star's
    build on the Python switch (68 reads in all): a shell's set-up (3), its loopback (12), a node's interface
    settings (14), the counters before "go", read from every node at once so that several shells wait (40)
    (tests/test_ebpf_mininet.py interrupts an eBPF run)."""
    from mininet.node import Node

    import innet.backends.mininet.network as backend

    read, reads, states = Node.read, [], []

    def interrupted_read(node, *args, **kwargs):
        if node.waiting:
            reads.append(node.name)
            if len(reads) == nth:
                raise KeyboardInterrupt
        return read(node, *args, **kwargs)

    class Recorded(backend.RunState):
        def save(self):
            super().save()
            states.append(self.data)

    monkeypatch.setattr(Node, "read", interrupted_read)
    monkeypatch.setattr(backend, "RunState", Recorded)
    with pytest.raises(KeyboardInterrupt):
        run_mininet(build("star", workers=2), RunSpec(elements=10, data_plane="python"))
    assert len(reads) >= nth  # teardown reads the waiting shells on
    assert_nothing_left(states[-1])


def orphan_records() -> list[str]:
    """The state files of runs whose runner is gone: what ``--clean`` will clean, whoever left them."""
    return [path for path, data in state_records() if start_time(data["runner"][0]) != data["runner"][1]]


def htb_hysteresis() -> str | None:
    """htb's machine-wide hysteresis switch (innet.backends.mininet.shaper), None before htb is first loaded."""
    return Path(shaper.HYSTERESIS).read_text().strip() if os.path.exists(shaper.HYSTERESIS) else None


def test_sigkill_then_clean_removes_the_leftovers(tmp_path):
    before = len(orphan_records())  # a record an earlier, unrelated run left is cleaned too, and counted
    mode_was_off = not os.path.exists(shaper.MARKER) and htb_hysteresis() in ("0", None)
    proc = _start(tmp_path / "out", "--elements", "3000000", "--iterations", "3")
    state = _wait_for_state(proc)
    proc.kill()
    proc.communicate(timeout=30)
    out = subprocess.run([sys.executable, os.path.join(ROOT, "run_topology.py"), "--clean"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith(f"cleaned {before + 1} interrupted run(s)"), out.stdout
    assert_nothing_left(state)
    assert state.get(shaper.FLAG)  # the killed run relied on htb's hysteresis mode; if it turned it on, --clean turns it off
    if mode_was_off and not any(live and data.htb_hysteresis for _, data, live in records()):
        assert htb_hysteresis() == "0" and "turned htb's hysteresis mode off" in out.stdout


def test_bad_topology_file_is_one_line_on_the_mininet_backend(tmp_path):
    bad = tmp_path / "bad.graphml"
    bad.write_text("<graphml><graph><node id='a'/>")
    out = subprocess.run([sys.executable, os.path.join(ROOT, "run_topology.py"), "--topo", str(bad)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "is not valid GraphML" in out.stderr
    assert_nothing_left()


def test_pcap_per_interface_is_readable(tmp_path):
    from scapy.utils import rdpcap

    from innet.wire.layer import InnetAgg

    graph = build("star", workers=2)
    result = run_mininet(graph, RunSpec(elements=2 * 2048 + 88, min_rto=0.02), pcap_dir=str(tmp_path))
    assert result["correct"]
    frames = rdpcap(str(tmp_path / "s1-eth0.pcap"))
    aggs = [f[InnetAgg] for f in frames if InnetAgg in f]
    # h1 sent the exponent chunk and three data chunks (jumbo frames of the default 2048 values); it got four results back
    assert len(aggs) == 6 + 2 and {a.count for a in aggs} == {0, 2048, 88}
    assert_nothing_left()


@pytest.mark.parametrize("hosts_per_rack", [2, 3])
def test_in_network_cross_rack_bytes_are_at_most_one_hth_of_the_pbox(hosts_per_rack):
    graph = build("leaf-spine", racks=2, hosts_per_rack=hosts_per_rack)
    spec = RunSpec(elements=60000, min_rto=0.2, initial_rto=1.0)  # patient timers: no spurious retransmission
    innet = run_mininet(graph, spec)
    pbox = run_mininet(graph, RunSpec(mode="pbox", elements=60000, min_rto=0.2, initial_rto=1.0))
    assert innet["correct"] and pbox["correct"]
    assert innet["cross_rack_bytes"] <= 1.05 * pbox["cross_rack_bytes"] / hosts_per_rack
    assert_nothing_left()


@pytest.mark.parametrize("topo,params,mode", [
    ("leaf-spine", {"racks": 2, "hosts_per_rack": 2, "spines": 2}, "innet"),
    ("leaf-spine", {"racks": 2, "hosts_per_rack": 2, "spines": 2}, "pbox"),
    ("fat-tree", {"k": 4}, "pbox"),
])
def test_bytes_at_the_interfaces_match_the_planner(topo, params, mode):
    graph = build(topo, **params)
    result = run_mininet(graph, RunSpec(mode=mode, elements=30011, min_rto=0.2, initial_rto=1.0, timeout=30), pbox_cores=2)
    assert result["correct"] and result["retransmissions"] == 0, result["errors"]
    assert result["link_bytes"] == result["predicted_link_bytes"]
    assert_nothing_left()


def test_each_interface_is_its_link_directions_prediction_and_the_run_its_own_timeline():
    """Star of 4, reduce-scatter in the switch: each end's tx counter is its direction's bytes, equal to the planner's
    prediction for that direction: every uplink all-reduce's stream, every downlink its rank's shard and the
    chunks' headers. The timeline: a slice per rank on the hosts' clock, within the run, and the switch's slots."""
    from innet.results.report import trace_events
    from innet.wire.collectives import Collective
    from innet.wire.packet import PAYLOAD_OFFSET

    graph = build("star", workers=4)
    spec = RunSpec(mode="innet", collective="reduce_scatter", elements=30011, packet_elements=1024, min_rto=0.2,
                   initial_rto=1.0, timeout=30, timeline="t.json")  # the record keeps it; innet.run writes the file
    result = run_mininet(graph, spec)
    assert result.correct and result.retransmissions == 0, result.errors
    hosts = [f"h{i}--s1" for i in range(1, 5)]
    assert result.link_bytes_up == result.predicted_link_bytes_up and result.link_bytes_down == result.predicted_link_bytes_down
    shard = np.diff(Collective.shards(30011, 4, 1024))
    headers = (-(-30011 // 1024) + 1) * PAYLOAD_OFFSET  # the exponent chunk's and every data chunk's
    assert [result.link_bytes_down[h] for h in hosts] == [headers + 4 * int(s) for s in shard]
    assert {result.link_bytes_up[h] for h in hosts} == {headers + 4 * 30011}
    assert result.link_bytes_up["p1--s1"] == result.link_bytes_down["p1--s1"] == 0
    timeline = result.timeline
    assert timeline is not None and sorted((c.rank, c.call) for c in timeline.calls) == [(r, 0) for r in range(4)]
    assert min(c.start_s for c in timeline.calls) == 0.0  # from the first call's start, on the hosts' one clock
    assert all(0 <= c.start_s < c.end_s <= result.completion_s * (1 + 1e-9) for c in timeline.calls)
    [track] = timeline.switches
    assert track.switch == "s1" and track.held and track.held[-1][1] == 0
    assert all(-0.01 < t <= timeline.end_s + 0.01 and 0 <= n <= track.slots for t, n in track.held)
    trace = trace_events([("innet", timeline)])
    assert sum(e["ph"] == "X" for e in trace["traceEvents"]) == 4
    assert_nothing_left()


def test_ring_is_exact_on_mininet_and_close_to_its_prediction():
    graph = build("leaf-spine", racks=2, hosts_per_rack=2)
    result = run_mininet(graph, RunSpec(mode="ring", elements=40000, iterations=2, min_rto=0.02))
    assert result["correct"], result["errors"]
    predicted = sum(result["predicted_link_bytes"].values())
    # spurious retransmissions under the Python data plane's queueing can only add bytes
    assert predicted <= sum(result["link_bytes"].values()) <= 1.10 * predicted
    assert_nothing_left()


def test_pool_slots_reach_the_switch_processes_and_the_record_says_how_busy_the_cores_were():
    from innet.switch.loader import load_program

    real = run_mininet(build("star", workers=3), RunSpec(elements=40000, pool_slots=300, switch_memory=8 << 20))
    assert real["correct"], real["errors"]
    assert real["switch_memory_bytes"] == {"s1": load_program("sum_allreduce", 300).memory_bytes()}
    assert 0 < real["busy_cores"] <= os.cpu_count() + 0.5  # the switch's and the hosts' CPU over the all-reduce's time
    assert 0 < real["machine_busy_cores"] <= os.cpu_count()  # every CPU's, from /proc/stat
    # over the readings around the calls' window, not the workers' start-up and result writing around it
    assert real["completion_s"] <= real["fidelity"]["cpu_over_s"] <= real["completion_s"] + 0.5
    assert real["busy_cores"] == pytest.approx(sum(real["fidelity"]["cpu"].values()), abs=0.03)
    # the scheduler policy each process ended under (innet.io.sched): every one of them, the switch and 3 workers
    from innet.planning.grouping import group_label, group_size, node_groups

    workers = node_groups(["h1", "h2", "h3"], group_size(3, os.cpu_count(), hosts=True))  # a process a core: h1..h2, h3
    assert real["fidelity"]["sched"] == {**{group_label(g): "fifo" for g in workers}, "s1": "fifo"}
    assert_nothing_left()


def test_a_workload_trains_exactly_on_mininet_and_the_model_predicts_its_iterations():
    """VGG-19 (scale 0.01: 19 layers, 1.4M elements) at 10 Mbit/s: every layer's sum is exact, workers waited
    for their gradients, and the timing model's iteration time is within 20%. Few, large calls keep the run
    link-bound even on a machine three times slower (ResNet-50's 54 small calls cost ~16 ms each of CPU there,
    which the model does not count); a run off by more says whether it reported itself CPU-bound."""
    from innet.planning.spec import program_of
    from innet.planning.timing import MININET_HOP, predict
    from innet.schemes.modes import plan_run

    graph = build("star", workers=4, bw=10.0)
    run = RunSpec(workload="vgg19", min_rto=0.02)
    result = run_mininet(graph, run)
    assert result["correct"], result["errors"]
    assert len(result["jobs"][0]["workers"]) == 4 and result["iteration_s"] > result["compute_s"] > 0
    rp = plan_run(graph, run, program_of(run))
    model = predict(graph, run, list(rp.plans), rp.per_packet, MININET_HOP)["iteration_s"]
    error = result["iteration_s"] / model - 1
    cpu = "; ".join(result["fidelity"]["reasons"]) or "faithful: a timing mismatch"
    assert abs(error) <= 0.2, f"measured {result['iteration_s']:.3f} s against the model's {model:.3f} s ({error:+.0%}): {cpu}"
    assert_nothing_left()


@pytest.mark.parametrize("program", ["max_allreduce", "or_allreduce"])
def test_other_operators_are_exact_on_mininet_in_every_mode_and_match_the_fabric(program):
    """README's promise: --program max_allreduce --mode all is correct on both backends, bit for bit alike."""
    graph = build("leaf-spine", racks=2, hosts_per_rack=2)
    for mode in ("innet", "pbox", "ring"):
        spec = RunSpec(mode=mode, program=program, elements=5001, min_rto=0.05)
        real = run_mininet(graph, spec)
        assert real["correct"], (mode, real["errors"])
        assert real["result_digest"] == run_local(graph, spec)["result_digest"]
    assert_nothing_left()
