"""``--data-plane ebpf``'s choices without root: what it translates, what stays on the Python switch and why,
and its program built once and then taken from the cache."""

import os
import shutil

import pytest

from innet.backends.mininet import dataplane
from innet.backends.mininet.dataplane import calibrated_plane, unsupported_run
from innet.ebpf import holds as routes
from innet.ebpf.build import object_path, unsupported_program
from innet.ebpf.holds import HostHold, path_holds
from innet.graph import indexed
from innet.node.config import PortFaults
from innet.planning.spec import RunSpec, program_of
from innet.schemes.modes import plan_run
from innet.switch.loader import load_program
from innet.wire.faults import FaultSpec
from topologies import build


def test_only_the_built_in_sum_reduction_translates(tmp_path):
    assert unsupported_program(load_program("sum_allreduce")) == ""
    assert unsupported_program(load_program("sum_allreduce", 16, 512)) == ""
    assert "not the built-in sum" in unsupported_program(load_program("max_allreduce"))
    assert "not the built-in sum" in unsupported_program(load_program("forward"))
    assert "is sparse" in unsupported_program(load_program("topk_sparse"))
    assert "more than 64 contributors" in unsupported_program(load_program("sum_allreduce", fan_in=128))
    mine = tmp_path / "my_sum.py"
    mine.write_text("from innet import SUM, Reduction, on_timer\n\n\nclass MySum(Reduction):\n    name = 'my_sum'\n"
                    "    operator = SUM\n\n    @on_timer(1.0)\n    def watch_stalls(self, ctx):\n        return []\n")
    assert "overrides Reduction's handlers" in unsupported_program(load_program(str(mine)))
    routing = tmp_path / "my_routing_sum.py"
    routing.write_text("from innet import SUM, Reduction, on_packet\n\n\nclass MySum(Reduction):\n"
                       "    name = 'my_routing_sum'\n    operator = SUM\n\n    @on_packet('routed')\n"
                       "    def mine(self, ctx, pkt):\n        return ctx.route(pkt)\n")
    assert "handles routed frames itself" in unsupported_program(load_program(str(routing)))


def test_runs_it_cannot_serve_say_why():
    program = load_program("sum_allreduce")
    clean = [{0: PortFaults(), 1: PortFaults()}]
    assert unsupported_run(RunSpec(), program, clean, 1.0) == ""
    for collective in ("reduce_scatter", "all_gather", "broadcast", "reduce", "barrier"):  # all six collectives
        assert unsupported_run(RunSpec(collective=collective), program, clean, 1.0) == ""
    # pbox and ring: the switches only route, whatever the collective or the program, unless it routes itself
    for mode in ("pbox", "ring"):
        assert unsupported_run(RunSpec(mode=mode), program, clean, 1.0) == ""
        assert unsupported_run(RunSpec(mode=mode, collective="reduce_scatter"), load_program("max_allreduce"), clean,
                               1.0) == ""
        assert unsupported_run(RunSpec(mode=mode), load_program("forward"), clean, 1.0) == ""
        assert "handles routed frames itself" in unsupported_run(RunSpec(mode=mode), load_program("dynamic_tree"),
                                                                 clean, 1.0)
        assert "faults" in unsupported_run(RunSpec(mode=mode), program, [{0: PortFaults(FaultSpec(loss=0.01))}], 1.0)
    # dilated, each hop is held by the host at its end: one switch between hosts runs it, links between switches do not
    held = [{0: PortFaults(FaultSpec(delay=0.02), 0, 1.25e6), 1: PortFaults(FaultSpec(delay=0.02), 0, 1.25e6)}]
    assert unsupported_run(RunSpec(), program, held, 150.0) == ""
    assert unsupported_run(RunSpec(), program, held, 150.0, unheld="why") == "why"
    assert unsupported_run(RunSpec(), program, held, 1.0, unheld="why") == ""  # undilated, nothing is held
    # the timeline's slot track is recorded by the Python switch only (an eBPF run's was empty); a routing run has none
    assert "--timeline" in unsupported_run(RunSpec(timeline="t.json"), program, clean, 1.0)
    assert unsupported_run(RunSpec(mode="ring", timeline="t.json"), program, clean, 1.0) == ""
    lossy = [{0: PortFaults(FaultSpec(loss=0.01))}]
    assert "faults" in unsupported_run(RunSpec(), program, lossy, 1.0)
    assert "faults" in unsupported_run(RunSpec(), program, [{0: PortFaults(FaultSpec(delay=0.001))}], 1.0)
    assert "faults" in unsupported_run(RunSpec(), program, [{0: PortFaults(FaultSpec(reorder=0.1), 0, 1.25e6)}], 150.0)
    assert "not the built-in sum" in unsupported_run(RunSpec(), load_program("max_allreduce"), clean, 1.0)


def holds_of(graph, run=None):
    run = run or RunSpec()
    return path_holds(graph, run, plan_run(graph, run, program_of(run)).plans)


def test_the_hops_between_switches_are_held_by_the_hosts_where_every_switch_hears_its_children_alike():
    """A leaf-spine's result crossed two hops between switches unheld (up to the spine, down again): each worker
    holds it for both, 2 x (latency + bytes at 2000 Mbit/s); a fat-tree's, four (edge-aggregation-core and back)."""
    holds, why = holds_of(build("leaf-spine", racks=2, hosts_per_rack=2))
    assert why == "" and set(holds) == {"h1", "h2", "h3", "h4"}
    assert all(h == HostHold((pytest.approx(2 * 2e-6, rel=1e-12), pytest.approx(2 * 8 / 2000e6, rel=1e-12)))
               for h in holds.values())
    holds, why = holds_of(build("fat-tree", k=4))
    assert why == "" and len(holds) == 15  # its 16th host is the PBox
    assert all(h == HostHold((pytest.approx(4 * 2e-6, rel=1e-12), pytest.approx(4 * 8 / 1000e6, rel=1e-12)))
               for h in holds.values())
    with_delay = RunSpec(faults=FaultSpec(delay=0.001))  # --delay on every link: every hop alike still
    assert holds_of(build("leaf-spine", racks=2, hosts_per_rack=2), with_delay)[1] == ""
    # one rack's uplink slower: the spine would hear t2's partials later than t1's, after the Python switch's time
    uneven = build("leaf-spine", racks=2, hosts_per_rack=2)
    uneven.edges["s1", "t2"]["bw"] = 1000.0
    holds, why = holds_of(uneven)
    assert holds == {} and "unequal hops between switches" in why
    delayed = RunSpec(link_faults=(("s1--t2", FaultSpec(delay=0.001)),))
    assert "unequal hops" in holds_of(build("leaf-spine", racks=2, hosts_per_rack=2), delayed)[1]
    assert holds_of(build("star", workers=4)) == ({f"h{i}": HostHold() for i in range(1, 5)}, "")


def hop(latency, mbps, n=1):
    return pytest.approx((n * latency, n * 8 / (mbps * 1e6)), rel=1e-9, abs=1e-15)


def test_frames_from_host_to_host_are_held_by_their_destination_for_their_routes_hops():
    """--mode pbox and ring: each frame crossed its route's hops between switches unheld. A leaf-spine's PBox on the
    spine hears every worker after one (its ToR's uplink) and they hear it after one (the spine's downlink); a ring
    rank hears its predecessor across the spine after two and its successor's ACKs (node index 1: h2) from its
    own rack after none, or the other way round."""
    graph = build("leaf-spine", racks=2, hosts_per_rack=2)
    holds, why = holds_of(graph, RunSpec(mode="pbox"))
    assert why == "" and set(holds) == {"h1", "h2", "h3", "h4", "p1"}
    assert all(h.into == hop(2e-6, 2000) and h.out == (0.0, 0.0) and h.by_source == {} for h in holds.values())
    holds, why = holds_of(graph, RunSpec(mode="ring"))
    index = indexed(graph).index
    assert why == "" and set(holds) == {"h1", "h2", "h3", "h4"}
    assert holds["h1"].into == hop(2e-6, 2000, 2) and holds["h1"].by_source == {index["h2"]: (0.0, 0.0)}
    assert holds["h2"].into == (0.0, 0.0) and holds["h2"].by_source == {index["h3"]: hop(2e-6, 2000, 2)}
    # a fat-tree's PBox shares an edge switch (t8) with h15: a worker of another pod crossed four hops between
    # switches before the queue into the PBox, one of its pod (t7's) two, h15 none; each holds its frames for those
    # hops before it sends them, so that they meet there as on the Python switch, and the PBox's answers for the
    # hops back
    fat = build("fat-tree", k=4)
    holds, why = holds_of(fat, RunSpec(mode="pbox"))
    assert why == ""
    assert holds["h1"].out == hop(2e-6, 1000, 4) and holds["h1"].into == hop(2e-6, 1000, 4)
    assert holds["h13"].out == hop(2e-6, 1000, 2) and holds["h13"].into == hop(2e-6, 1000, 2)
    assert holds["h15"] == HostHold() and holds["p1"] == HostHold()


def test_flows_that_no_hold_makes_meet_as_on_the_python_switch_say_why():
    """Two flows sharing two queues, one hop apart before the first and two before the second: no hold at their
    senders makes both queues the Python switch's."""
    flows = [("h1", "h9", True), ("h2", "h9", True)]
    early = [{("a", "b"): (0.0, 0.0), ("b", "c"): (1.0, 0.0)}, {("a", "b"): (1.0, 0.0), ("b", "c"): (3.0, 0.0)}]
    pre, why = routes._pre_holds(flows, early, {("a", "b"): [0, 1], ("b", "c"): [0, 1]})
    assert pre == {} and why == ("h1->h9 and h2->h9 share b->c's queue after hops between switches that no hold at "
                                 "their senders evens out")
    pre, why = routes._pre_holds(flows, early[:1] + [{("a", "b"): (1.0, 0.0), ("b", "c"): (2.0, 0.0)}],
                                    {("a", "b"): [0, 1], ("b", "c"): [0, 1]})
    assert why == "" and pre == {0: (0.0, 0.0), 1: (1.0, 0.0)}


def test_auto_takes_the_ebpf_switch_only_where_this_machine_can_load_it(monkeypatch):
    star = build("star", workers=4)
    monkeypatch.setattr(dataplane.shutil, "which", lambda name: "/usr/bin/clang")
    monkeypatch.setattr(dataplane.os, "geteuid", lambda: 0)
    assert RunSpec().data_plane == "auto" and calibrated_plane(star, RunSpec()) == "ebpf"  # the default
    assert calibrated_plane(star, RunSpec(data_plane="auto", mode="ring")) == "ebpf"  # its switches route in the kernel
    assert calibrated_plane(star, RunSpec(data_plane="auto", collective="all_gather")) == "ebpf"
    assert calibrated_plane(star, RunSpec(data_plane="auto", program="max_allreduce")) == "python"
    monkeypatch.setattr(dataplane.os, "geteuid", lambda: 1000)
    assert calibrated_plane(star, RunSpec(data_plane="auto")) == "python"
    assert calibrated_plane(star, RunSpec(data_plane="ebpf")) == "ebpf"  # asked for: the run says what it lacks


def test_auto_takes_the_calibration_of_the_data_plane_it_runs_on(monkeypatch):
    """The default run on the eBPF switch is dilated by the eBPF switch's calibration, measured first where it is
    missing: the Python switch's carries 8-16x less, so its factor kept every call that much longer."""
    from innet.api import dilation_choice
    from innet.backends.mininet import calibration

    asked = []
    cal = calibration.Calibration(calibration.machine_key("v"), 5.0, 1e5, 1.02, {}, "now", 0.0025)
    monkeypatch.setattr(calibration, "calibration", lambda data_plane="python": asked.append(data_plane) or cal)
    monkeypatch.setattr(dataplane.os, "geteuid", lambda: 0)
    monkeypatch.setattr(dataplane.shutil, "which", lambda name: "/usr/bin/clang")
    star = build("star", workers=4)
    for plane in ("auto", "ebpf", "python"):
        dilation_choice(star, RunSpec(data_plane=plane, backend="mininet"))
    dilation_choice(star, RunSpec(backend="mininet", program="max_allreduce"))  # does not translate: Python's
    assert asked == ["ebpf", "ebpf", "python", "python"]


@pytest.mark.skipif(shutil.which("clang") is None, reason="clang (make deps) builds the eBPF switch")
def test_the_program_is_built_once_per_shape_and_cached(tmp_path):
    first = object_path(512, 32, str(tmp_path))
    assert os.path.getsize(first) > 0 and first.endswith(".o")
    stamp = os.stat(first).st_mtime_ns
    assert object_path(512, 32, str(tmp_path)) == first and os.stat(first).st_mtime_ns == stamp
    assert object_path(2048, 256, str(tmp_path)) != first
    with open(first, "rb") as f:
        assert f.read(4) == b"\x7fELF"


@pytest.mark.skipif(shutil.which("clang") is None or shutil.which("bpftool") is None,
                    reason="clang and bpftool (make deps) build and read the eBPF switch")
def test_the_loaders_structs_are_the_programs_field_for_field(tmp_path):
    """What the loader writes into the maps has switch.c's layout: each struct's size and its fields' offsets,
    read from the built object's BTF."""
    import ctypes
    import json
    import subprocess

    from innet.ebpf import loader

    out = subprocess.run(["bpftool", "-j", "btf", "dump", "file", object_path(512, 32, str(tmp_path))],
                         capture_output=True, text=True, check=True).stdout
    btf = {t["name"]: t for t in json.loads(out)["types"] if t.get("kind") == "STRUCT"}
    mine = {"config": loader.Config, "port_info": loader.PortInfo, "job_info": loader.JobInfo,
            "member_key": loader.Pair, "member": loader.Pair}
    for name, struct in mine.items():
        assert btf[name]["size"] == ctypes.sizeof(struct), name
        offsets = [m["bits_offset"] // 8 for m in btf[name]["members"]]
        assert offsets == [getattr(struct, f).offset for f, _ in struct._fields_], name
    head = [m["bits_offset"] // 8 for m in btf["slot"]["members"][:3]]
    assert head == [getattr(loader.SlotHead, f).offset for f, _ in loader.SlotHead._fields_]
    assert btf["port_stats"]["size"] == 4 * 8 and len(btf["port_stats"]["members"]) == 4


def test_a_dilated_run_the_hosts_cannot_hold_exactly_runs_the_python_switch_with_one_line(said):
    """One rack's uplink slower: its partials would reach the spine later than the other's, which no host's hold
    can give back; the run stays on the Python switch and says why, once."""
    from innet.backends.mininet.dataplane import ebpf_object
    from innet.backends.mininet.nodes import port_faults

    graph = build("leaf-spine", racks=2, hosts_per_rack=2)
    graph.edges["s1", "t2"]["bw"] = 1000.0
    for edge in graph.edges:
        graph.edges[edge].setdefault("latency", 2e-6)
    run = RunSpec(data_plane="ebpf")
    plans = plan_run(graph, run, program_of(run)).plans
    switches = ["s1", "t1", "t2"]
    assert ebpf_object(run, program_of(run), graph, switches, lambda n: port_faults(graph, run, n, True, True), 100.0,
                       plans) == ("", {})
    assert [e.message for e in said] == ["--data-plane ebpf: the Python switch runs this run (job 1's switches hear "
                                         "their children after unequal hops between switches, which the hosts cannot "
                                         "hold for them)"]
