"""Time dilation's arithmetic (innet.planning.timing.dilation) and the CLI's factor: rates divided, every given time
multiplied, every measured time divided, and the flag's errors one line each."""

import os

import pytest

from innet.cli import main
from innet.errors import UserError
from innet.planning.options import parse_dilation
from innet.planning.rules import validate
from innet.planning.spec import RunSpec
from innet.planning.timing.dilation import (
    LOCAL_MIN_RTO,
    MININET_MIN_RTO,
    auto_factor,
    carried_rate,
    dilate_graph,
    dilate_spec,
    dilate_times,
    host_link_rate,
    virtual,
)
from innet.wire.faults import FaultSpec
from topologies import build


def test_the_flag_takes_auto_off_or_a_factor_of_at_least_one():
    assert parse_dilation("auto") == "auto"
    assert parse_dilation("off") == 1.0
    assert parse_dilation("250") == 250.0
    for bad in ("0.5", "fast", "-3", "nan"):
        with pytest.raises(ValueError, match="wants auto, off or a factor"):
            parse_dilation(bad)


def test_auto_divides_the_host_link_rate_by_the_faithful_rate_and_never_speeds_up():
    graph = build("leaf-spine", racks=2, hosts_per_rack=2, bw=100000)
    assert host_link_rate(graph) == 100000
    assert auto_factor(host_link_rate(graph), 5.0) == 20000  # not the 200000 of its uplinks
    assert auto_factor(3.0, 5.0) == 1.0  # a run the machine keeps up with runs at its own speed


def test_auto_dilates_as_much_more_as_the_run_keeps_more_links_busy_than_the_calibrations_star():
    """The star of 4 keeps 8 link directions busy, as the calibration's did: the host links' factor. The
    default leaf-spine adds its 4 uplink directions: 1.5 times that. A fat-tree k=8's in-network tree
    keeps hundreds busy; its PBox mode, held up by the PBox's one link, few at a time."""
    from innet.planning.spec import program_of
    from innet.schemes.modes import auto_dilation, plan_run

    def factor(graph, mode):
        run = RunSpec(mode=mode)
        return auto_dilation(graph, run, plan_run(graph, run, program_of(run)), 10.0)

    star = build("star", workers=4, bw=1000)
    assert [factor(star, m) for m in ("innet", "pbox", "ring")] == pytest.approx([100.0, 100.0, 100.0])
    leaf = build("leaf-spine", racks=2, hosts_per_rack=2, bw=1000)
    assert factor(leaf, "innet") == pytest.approx(150.0)
    assert carried_rate(leaf, {("h1", "t1"): 1000.0, ("t1", "s1"): 1000.0}) == pytest.approx(2000.0)  # both busy as long
    k8 = build("fat-tree", k=8)
    assert factor(k8, "innet") > 20 * factor(k8, "pbox") > 20 * 100
    assert auto_factor(1000.0, 10.0, carried_mbps=8000.0) == 100.0 and auto_factor(1000.0, 10.0, 16000.0) == 200.0


def test_a_dilated_graph_has_rates_divided_and_latencies_multiplied():
    graph = build("star", workers=4, bw=100000)
    slow = dilate_graph(graph, 2000)
    for u, v, data in slow.edges(data=True):
        assert data["bw"] == graph.edges[u, v]["bw"] / 2000 == 50
        assert data["latency"] == pytest.approx(graph.edges[u, v]["latency"] * 2000)
    assert graph.edges["h1", "s1"]["bw"] == 100000  # the requested graph is left as it was


def test_a_dilated_run_has_every_given_time_multiplied():
    run = RunSpec(faults=FaultSpec(delay=0.001, reorder=0.1, reorder_delay=0.002), timeout=10.0, initial_rto=1.0,
                  min_rto=MININET_MIN_RTO, compute_time=0.01, compute_scale=2.0,
                  link_faults=(("h1--s1", FaultSpec(delay=0.005)),))
    slow = dilate_spec(run, 100)
    assert slow.faults == FaultSpec(delay=0.1, reorder=0.1, reorder_delay=0.2)
    assert slow.link_faults == (("h1--s1", FaultSpec(delay=0.5, reorder_delay=0.2)),)
    assert (slow.timeout, slow.initial_rto, slow.compute_time, slow.compute_scale) == (1000.0, 100.0, 1.0, 200.0)
    assert dilate_spec(run, 10).min_rto == MININET_MIN_RTO  # the machine's real floor: 1 ms x 10 is less
    assert dilate_spec(run, 5000).min_rto == LOCAL_MIN_RTO * 5000  # the local backend's virtual floor, dilated
    assert (slow.elements, slow.mode, slow.seed) == (run.elements, run.mode, run.seed)
    assert dilate_spec(run, 1) is run


def test_crash_times_are_dilated_and_measured_instants_come_back():
    assert dilate_times({"h2": 0.5}, 40) == {"h2": 20.0}
    assert virtual([40.0, 41.0, 44.0], 40) == [1.0, 1.025, 1.1]


def _spec(**kw):
    return RunSpec(**{"backend": "mininet", "topo": "star", **kw})


def test_dilated_links_must_be_ones_tclink_can_shape():
    assert validate(_spec(bw=100000.0, dilation="200")).dilation == 200.0
    with pytest.raises(UserError, match=r"bw 100000 is 1000\.5 Mbit/s on the dilated links .* dilate by at least 100,"):
        validate(_spec(bw=100000.0, dilation="99.95"))
    with pytest.raises(UserError, match=r"bw 2000 is 2000 Mbit/s on the dilated links \(dilation factor 1\)"):
        validate(_spec(bw=2000.0, dilation="off"))


def test_the_local_backend_runs_in_virtual_time_and_refuses_a_factor(capsys):
    assert validate(_spec(backend="local", dilation="auto")).dilation == "auto"
    assert validate(_spec(backend="local", dilation="off")).dilation == 1.0
    for extra in (["--plan-only"], ["--no-plots", "--out", os.devnull]):  # the same rules for a plan and a run
        assert main(["--backend", "local", "--topo", "star", "--dilation", "5", *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: --dilation 5 slows Mininet's clock; the local backend runs in virtual time and needs none: "
                   "use --dilation auto or off there"] * 2


def test_a_dilated_run_says_before_its_build_what_its_calls_take_in_real_time(said):
    """fat-tree k=8's ring at F = 8350 took 120 s of calls: a run says what its calls take before it builds."""
    from innet.backends.local.run import run_local
    from innet.backends.mininet.emulation import announce, model_time
    from innet.planning.spec import program_of
    from innet.schemes.modes import plan_run

    graph, run = build("fat-tree", k=4), RunSpec(mode="ring", elements=16384)
    rp = plan_run(graph, run, program_of(run))
    model = model_time(graph, run, rp, 8000)
    assert model == pytest.approx(run_local(graph, run).completion_s, rel=0.01)  # the time the links allow
    announce(graph, run, rp, 8000)
    announce(graph, run, rp, 1)  # undilated: nothing to say
    assert [e.message for e in said] == [
        f"dilation 8000: links at 0.125 Mbit/s real; its calls' {model:.3g} s (the timing model) take about "
        f"{model * 8000:.0f} s of real time"]
