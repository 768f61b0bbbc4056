"""``--data-plane ebpf`` on Mininet (needs root, clang): the tc program's sums bit-identical to the Python
switch's and to numpy's, the same frames byte for byte, a program it cannot translate left to the Python
switch with one line, and nothing of it left behind, also after an interrupted run."""

import dataclasses
import json
import shutil
import signal
import subprocess
from collections import Counter, defaultdict
from itertools import pairwise

import numpy as np
import pytest
from scapy.utils import RawPcapReader

from innet.backends.mininet.emulation import run_mininet
from innet.backends.mininet.shaper import burst_bytes
from innet.graph import indexed, is_switch, ports
from innet.planning.spec import RunSpec
from innet.planning.timing.dilation import dilate_graph
from innet.wire.packet import RESULT, parse_frame
from tests.test_emulation import _start, _wait_for_state, assert_nothing_left
from topologies import build

pytestmark = [pytest.mark.mininet,
              pytest.mark.skipif(shutil.which("clang") is None or shutil.which("bpftool") is None,
                                 reason="the eBPF switch needs clang, libbpf-dev and bpftool (make deps)")]
FALLBACK = "--data-plane ebpf: the Python switch runs this run"
ANSWERS = ("ebpf:answered", "ebpf:resent_up", "drop:duplicate", "drop:stale")  # what a repeat comes to


def our_programs():
    """The eBPF switch's programs loaded in the kernel now (each run's are gone when it ends)."""
    out = subprocess.run(["bpftool", "-j", "prog", "show"], capture_output=True, text=True, check=True).stdout
    return [p["id"] for p in json.loads(out) if p.get("name") == "innet_switch"]


def frames_by_interface(folder):
    """Every interface's frames (bytes), as a multiset: the order two CPUs' frames interleave in is the kernel's."""
    out = {}
    for path in sorted(folder.glob("*.pcap")):
        with RawPcapReader(str(path)) as reader:
            out[path.stem] = Counter(bytes(data) for data, _ in reader)
    return out


def run(graph, tmp_path=None, **options):
    spec = RunSpec(dilation="off", min_rto=0.2, initial_rto=1.0, **options)
    return run_mininet(graph, spec, pcap_dir=str(tmp_path) if tmp_path else None)


def test_star_frames_are_the_python_switchs_byte_for_byte_and_sums_exact(tmp_path):
    graph = build("star", workers=4)
    ebpf = run(graph, tmp_path / "ebpf", elements=5000, data_plane="ebpf")
    python = run(graph, tmp_path / "python", elements=5000, data_plane="python")
    assert ebpf["correct"] and python["correct"], (ebpf["errors"], python["errors"])
    assert ebpf["switch_data_plane"] == {"s1": "ebpf"}
    assert python["switch_data_plane"] == {"s1": "python"}
    assert ebpf["result_digest"] == python["result_digest"]
    assert ebpf["link_bytes"] == python["link_bytes"]
    seen, expected = frames_by_interface(tmp_path / "ebpf"), frames_by_interface(tmp_path / "python")
    assert seen == expected
    # each result is numpy's exact int32 sum of the four contributions of its chunk
    ups, downs = defaultdict(list), {}
    for frames in seen.values():
        for frame in frames:
            pkt = parse_frame(frame)
            if pkt is not None and pkt.flags & RESULT:
                downs[pkt.chunk] = pkt.values
            elif pkt is not None:
                ups[pkt.chunk].append(pkt.values.astype(np.int64))
    data = [c for c in ups if len(ups[c][0])]
    assert len(data) == 3 and all(len(ups[c]) == 4 for c in ups)
    for chunk in data:
        assert np.array_equal(downs[chunk], np.sum(ups[chunk], axis=0).astype(np.int32))
    assert our_programs() == []
    assert_nothing_left()


def test_leaf_spine_aggregates_in_both_tiers_as_the_python_switch_does():
    """Tor placement: each ToR sums its rack and sends the partial up, the spine multicasts the result down and
    the ToRs pass it on; 147 chunks go through 128 slots, so slots are reused and their shadow copies cleared."""
    graph = build("leaf-spine", racks=2, hosts_per_rack=2)
    ebpf = run(graph, elements=300_000, placement="tor", data_plane="ebpf")
    python = run(graph, elements=300_000, placement="tor")
    assert ebpf["correct"], ebpf["errors"]
    assert ebpf["switch_data_plane"] == {"s1": "ebpf", "t1": "ebpf", "t2": "ebpf"}
    assert ebpf["result_digest"] == python["result_digest"]
    assert ebpf["link_bytes"] == python["link_bytes"] and ebpf["link_bytes"]["s1--t1"] > 0
    assert our_programs() == []
    assert_nothing_left()


def result_timing(folder):
    """From the switch ports' pcaps (kernel timestamps): for each data chunk, how long after its last contribution
    came in its first result went out, and the gaps between consecutive results out of each port."""
    last_in, out = defaultdict(float), defaultdict(list)
    for path in sorted(folder.glob("*.pcap")):
        with RawPcapReader(str(path)) as reader:
            for data, meta in reader:
                pkt, t = parse_frame(bytes(data)), meta.sec + meta.usec / 1e6
                if pkt is not None and len(pkt.values):
                    if pkt.flags & RESULT:
                        out[path.stem].append((t, pkt.chunk))
                    else:
                        last_in[pkt.chunk] = max(last_in[pkt.chunk], t)
    first = {c: min(t for times in out.values() for t, k in times if k == c) for c in last_in}
    gaps = [b[0] - a[0] for times in out.values() for a, b in pairwise(sorted(times))]
    return [first[c] - last_in[c] for c in sorted(last_in)], gaps


def test_a_dilated_star_runs_the_ebpf_switch_each_hop_held_as_the_python_switchs(tmp_path, said):
    """The calibration's star at 10 Mbit/s real: the eBPF switch forwards each result at once, its port's htb paces
    the results at the link's rate, and the host at the hop's end holds each frame for the link's latency and
    serialization (without that hold the run took 0.86 of the local backend's time); the Python switch holds them
    itself. Both exact, the same sums and bytes on every link."""
    from innet.backends.mininet.calibration import calibration_case, local_completion

    graph, spec, factor = calibration_case(10.0)
    ebpf = run_mininet(graph, dataclasses.replace(spec, data_plane="ebpf"), pcap_dir=str(tmp_path / "ebpf"),
                       dilation=factor)
    python = run_mininet(graph, dataclasses.replace(spec, data_plane="python"), pcap_dir=str(tmp_path / "python"),
                         dilation=factor)
    assert ebpf["correct"] and python["correct"], (ebpf["errors"], python["errors"])
    assert ebpf["switch_data_plane"] == {"s1": "ebpf"} and python["switch_data_plane"] == {"s1": "python"}
    assert ebpf["result_digest"] == python["result_digest"] and ebpf["link_bytes"] == python["link_bytes"]
    assert [e.message.endswith("; dilated 10000x, each hop held by the host at its end (--dilation auto takes the eBPF "
                               "switch's calibration)") for e in said if "as a tc program" in e.message] == [True]
    frame_s = 8250 * 8 / 10e6  # a data frame's serialization at 10 Mbit/s: 6.6 ms
    hop_s = graph.edges["h1", "s1"]["latency"] * factor + frame_s  # what a hop holds a data frame for: 26.6 ms
    lag, gaps = result_timing(tmp_path / "ebpf")
    assert len(lag) == 32 and max(lag) < 0.005  # forwarded in the kernel at once: the hop is held at its end
    assert min(gaps) > 0.8 * frame_s  # the redirected results pass the port's htb (burst: an eighth of a frame)
    lag, gaps = result_timing(tmp_path / "python")
    assert len(lag) == 32 and min(lag) >= hop_s and min(gaps) > 0.8 * frame_s
    local = local_completion(graph)
    assert 0.97 * local < ebpf["completion_s"] < 1.3 * local, ebpf["completion_s"] / local
    assert our_programs() == []
    assert_nothing_left()


def test_a_program_it_cannot_translate_runs_on_the_python_switch_with_one_line(said):
    graph = build("star", workers=2)
    record = run(graph, elements=3000, program="max_allreduce", data_plane="ebpf")
    assert record["correct"], record["errors"]
    assert record["switch_data_plane"] == {"s1": "python"}
    lines = [e.message for e in said if FALLBACK in e.message]
    assert lines == [f"{FALLBACK} (program max_allreduce is not the built-in sum reduction)"]
    assert_nothing_left()


def test_an_interrupted_run_leaves_no_program_hook_or_process(tmp_path):
    proc = _start(tmp_path / "out", "--topo", "star", "--workers", "2", "--elements", "3000000", "--iterations", "3",
                  "--dilation", "off", "--data-plane", "ebpf")
    state = _wait_for_state(proc)
    assert our_programs() != []
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert our_programs() == []
    assert_nothing_left(state)


def test_a_switch_whose_program_does_not_load_runs_the_python_switch_and_says_so(monkeypatch, tmp_path, said):
    import innet.backends.mininet.dataplane as dataplane

    broken = tmp_path / "switch.o"
    broken.write_bytes(b"not an object file")
    monkeypatch.setattr(dataplane, "object_path", lambda *args: str(broken))
    record = run(build("star", workers=2), elements=3000, data_plane="ebpf")
    assert record["correct"], record["errors"]
    assert record["switch_data_plane"] == {"s1": "python"}
    lines = [e.message for e in said if "run(s) the Python switch" in e.message]
    assert len(lines) == 1 and lines[0].startswith("--data-plane ebpf: s1 run(s) the Python switch (the eBPF switch "
                                                   "did not load"), lines
    assert our_programs() == []
    assert_nothing_left()


def test_resends_on_timeout_are_answered_exactly_once():
    """Timers far shorter than a round trip: workers resend chunks the switches already hold. The ToRs answer a
    finished slot's repeat from it and send a waiting slot's partial up again, the spine drops repeats of what
    it has: every sum still exact, the local backend's."""
    from innet.backends.local.run import run_local

    graph = build("leaf-spine", racks=2, hosts_per_rack=2)
    spec = RunSpec(dilation="off", elements=300_000, placement="tor", min_rto=0.0002, initial_rto=0.0005,
                   data_plane="ebpf")
    record = run_mininet(graph, spec)
    assert record["correct"], record["errors"]
    assert record["switch_data_plane"] == {"s1": "ebpf", "t1": "ebpf", "t2": "ebpf"}
    assert record["result_digest"] == run_local(graph, RunSpec(elements=300_000, placement="tor"))["result_digest"]
    if record["retransmissions"]:  # a machine fast enough to beat 0.2 ms would resend nothing
        counters = record["switch_counters"]
        assert sum(n for c in counters.values() for k, n in c.items() if k in ANSWERS) > 0, counters
    assert our_programs() == []
    assert_nothing_left()


def port_frames(folder, graph):
    """From the switch ports' pcaps (kernel timestamps), per (host, data chunk): when its first contribution came
    into the host's ToR, and when its first result went out to the host (the htb's instant), and each result's
    length."""
    index = indexed(graph).index
    came, out, length = {}, {}, {}
    for path in sorted(folder.glob("*.pcap")):
        switch, port = path.stem.split("-eth")
        peer = ports(graph, switch)[int(port)]
        if is_switch(graph, peer):
            continue
        with RawPcapReader(str(path)) as reader:
            for data, meta in reader:
                pkt, t = parse_frame(bytes(data)), meta.sec + meta.usec / 1e6
                if pkt is None or not len(pkt.values):
                    continue
                if pkt.src == index[peer] and not pkt.flags & RESULT:
                    came.setdefault((peer, pkt.chunk), t)
                elif pkt.src == index[switch] and pkt.flags & RESULT:
                    out.setdefault((peer, pkt.chunk), t)
                    length[pkt.chunk] = len(data)
    return came, out, length


def htb(queued, rate, burst, length):
    """When a link's htb lets each frame through (``queued``: chunk -> the instant it was queued), in hysteresis
    mode (innet.backends.mininet.shaper): a class sends while its tokens are above minus its burst, and once below
    waits until they are back to zero; its tokens fill at ``rate`` bytes a second up to ``burst`` bytes."""
    out, tokens, last, wait = {}, burst, None, False
    for chunk in sorted(queued, key=queued.get):
        at = queued[chunk] if last is None else max(queued[chunk], last)
        tokens = tokens if last is None else min(burst, tokens + (at - last) * rate)
        floor = 0.0 if wait else -burst
        if tokens < floor:
            at, tokens = at + (floor - tokens) / rate, floor
        tokens -= length[chunk]
        last, wait, out[chunk] = at, tokens < -burst, at
    return out


def python_switch_deliveries(graph, came, length):
    """When the Python switch's run would deliver each (host, chunk)'s result, from the instants its contributions
    came into their ToRs: each ToR's partial when its rack's last came, the spine's result when the last ToR's
    partial arrived, and on every hop (ToR up, spine down, ToR to host) what the Python switch's port does: hold
    each frame for the link's latency and its serialization, not before the frame before it, then its htb.
    ``graph``: the wire's."""
    def hop(ready, a, b):
        link, due, last = graph.edges[a, b], {}, 0.0
        rate = link["bw"] * 1e6 / 8
        for chunk in sorted(ready, key=ready.get):
            due[chunk] = last = max(ready[chunk] + link["latency"] + length[chunk] / rate, last)
        return htb(due, rate, burst_bytes(link["bw"], max(length.values())), length)

    racks = {t: sorted(h for h in graph[t] if not is_switch(graph, h)) for t in graph if str(t).startswith("t")}
    chunks = {c for _, c in came}
    up = {t: hop({c: max(came[h, c] for h in hosts) for c in chunks}, t, "s1") for t, hosts in racks.items()}
    root = {c: max(up[t][c] for t in racks) for c in chunks}
    deliveries = {}
    for t, hosts in racks.items():
        down = hop(root, "s1", t)
        for h in hosts:
            deliveries.update({(h, c): at for c, at in hop(down, t, h).items()})
    return deliveries


def dilated_leaf_spine(tmp_path, data_plane, factor=100.0):
    """A leaf-spine (2 racks of 2) at ``factor`` (host links 10 Mbit/s, ToR-spine 20), tor placement, 2 slots so
    that a worker sends chunk c + 2 only once chunk c's result reached it, 32 chunks: its record, its wire graph
    and the folder of its pcaps (None: no pcaps)."""
    graph = build("leaf-spine", racks=2, hosts_per_rack=2)
    spec = RunSpec(placement="tor", pool_slots=2, seed=1, data_plane=data_plane, elements=32 * 2048)
    folder = tmp_path / data_plane if tmp_path else None
    return run_mininet(graph, spec, pcap_dir=folder and str(folder), dilation=factor), dilate_graph(graph, factor), folder


def test_a_dilated_leaf_spine_runs_the_ebpf_switch_exact_as_the_python_switch(said):
    ebpf, _, _ = dilated_leaf_spine(None, "ebpf")
    python, _, _ = dilated_leaf_spine(None, "python")
    assert ebpf["correct"] and python["correct"], (ebpf["errors"], python["errors"])
    assert ebpf["switch_data_plane"] == {"s1": "ebpf", "t1": "ebpf", "t2": "ebpf"}
    assert python["switch_data_plane"] == {"s1": "python", "t1": "python", "t2": "python"}
    assert ebpf["result_digest"] == python["result_digest"] and ebpf["link_bytes"] == python["link_bytes"]
    assert [e.message.endswith("each hop held by the host at its end and the hops between switches on its path "
                               "(--dilation auto takes the eBPF switch's calibration)")
            for e in said if "as a tc program" in e.message] == [True]
    assert our_programs() == []
    assert_nothing_left()


def test_a_dilated_leaf_spine_on_the_ebpf_switch_delivers_each_result_when_the_python_switch_would(tmp_path):
    """Both ToR-spine hops are held by the worker at the path's end (nobody stands at a hop between two switches):
    each result reaches its worker when the Python switch's ports would have delivered it, replayed from the
    instants the contributions came in (measured 0.06-0.19 ms after it; a frame is 6.6 ms at the host link), and
    the worker sends the chunk that takes its slot next only after that (without the hold it sent it
    2 x (0.2 ms + 3.3 ms) early)."""
    ebpf, wire, folder = dilated_leaf_spine(tmp_path, "ebpf")
    assert ebpf["correct"] and ebpf["switch_data_plane"] == {"s1": "ebpf", "t1": "ebpf", "t2": "ebpf"}
    came, out, length = port_frames(folder, wire)
    host, spine = wire.edges["h1", "t1"], wire.edges["t1", "s1"]
    frame_s = 8250 * 8 / (host["bw"] * 1e6)  # 6.6 ms

    def hold(chunk):  # what the worker holds a result for: its own hop, and the two between switches
        bits = length[chunk] * 8
        return host["latency"] + bits / (host["bw"] * 1e6) + 2 * (spine["latency"] + bits / (spine["bw"] * 1e6))

    model = python_switch_deliveries(wire, came, length)
    late = [out[k] + hold(k[1]) - model[k] for k in model]
    assert len(late) == 4 * 32 and -0.02 * frame_s < min(late) and max(late) < 0.1 * frame_s, (min(late), max(late))
    gaps = [came[h, c + 2] - out[h, c] for h, c in out if (h, c + 2) in came]
    assert min(gaps) > 2 * (host["latency"] + frame_s) + 0.9 * 2 * (spine["latency"] + frame_s / 2), min(gaps)
    assert our_programs() == []
    assert_nothing_left()
