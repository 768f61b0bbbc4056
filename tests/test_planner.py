"""The placement planner on small hand-built graphs, and its byte predictions."""

import os
from dataclasses import replace

import networkx as nx
import pytest

from innet.backends.local.run import run_local
from innet.errors import UserError
from innet.graph import hosts
from innet.planning.planner import JobRequest, plan_job, plan_jobs
from innet.planning.prediction import predicted_link_bytes, stream_bytes, tier_lower_bounds
from innet.planning.spec import RunSpec, program_of
from innet.planning.timing import predict
from innet.results.metrics import tier_bytes
from innet.schemes.modes import plan_run
from topologies import build
from topologies.files import load_file

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "topologies", "examples")


def two_racks_two_spines():
    """h1,h2 - t1; h3,h4 - t2; both ToRs to s1 and s2; a PBox on s2."""
    g = nx.Graph(name="hand")
    for s in ("s1", "s2"):
        g.add_node(s, role="spine")
    for t, hs in (("t1", ("h1", "h2")), ("t2", ("h3", "h4"))):
        g.add_node(t, role="tor")
        g.add_edge(t, "s1", bw=1000.0, latency=1e-6)
        g.add_edge(t, "s2", bw=1000.0, latency=1e-6)
        for h in hs:
            g.add_node(h, role="host")
            g.add_edge(h, t, bw=1000.0, latency=1e-6)
    g.add_node("p1", role="pbox")
    g.add_edge("p1", "s2", bw=1000.0, latency=1e-6)
    return g


WORKERS = ("h1", "h2", "h3", "h4")


def test_root_method_has_one_aggregator_and_relays():
    plan = plan_job(two_racks_two_spines(), WORKERS, method="root")
    assert plan.root == "s1" and plan.aggregators == ("s1",)
    assert plan.parents == {"t1": "s1", "t2": "s1", "h1": "t1", "h2": "t1", "h3": "t2", "h4": "t2"}
    t1 = plan.switch_ports["t1"]
    assert not t1.aggregate and t1.contributors == {0: 0, 1: 1} and t1.parent == 2
    assert plan.switch_ports["s1"].contributors == {0: 0, 1: 0, 2: 1, 3: 1}


def test_tor_method_aggregates_racks_then_root():
    plan = plan_job(two_racks_two_spines(), WORKERS, method="tor")
    assert plan.aggregators == ("s1", "t1", "t2")
    assert plan.switch_ports["s1"].contributors == {0: 0, 2: 1}  # one partial per rack, by its lowest rank
    assert plan.switch_ports["t2"].rank == 2 and plan.switch_ports["t2"].rank_ports == {2: 0, 3: 1}


def test_tree_method_spans_only_what_the_workers_need():
    plan = plan_job(two_racks_two_spines(), ("h1", "h2"), method="tree")
    assert plan.root == "t1" and plan.aggregators == ("t1",) and set(plan.switch_ports) == {"t1"}
    plan = plan_job(two_racks_two_spines(), WORKERS, method="tree")
    assert len(plan.aggregators) == 3 and plan.root in ("s1", "s2")


def test_pbox_method_and_unknown_method():
    plan = plan_job(two_racks_two_spines(), WORKERS, method="pbox")
    assert plan.pbox == "p1" and plan.switch_ports == {} and plan.aggregators == ()
    with pytest.raises(ValueError, match="unknown placement method 'nope'"):
        plan_job(two_racks_two_spines(), WORKERS, method="nope")
    g = two_racks_two_spines()
    g.remove_node("p1")
    with pytest.raises(UserError, match="needs a PBox"):
        plan_job(g, WORKERS, method="pbox")


def test_jobs_share_switch_memory_then_fall_back_to_the_pbox():
    g = two_racks_two_spines()
    p = plan_jobs(g, [JobRequest(1, ("h1", "h3"), 100), JobRequest(2, ("h2", "h4"), 100),
                      JobRequest(3, ("h1", "h2"), 10)], method="tor", pool_slots=128)
    assert p.outcomes == {1: "full: 100 slots", 2: "reduced: 28 of 100 slots",
                          3: "fallback: switch memory full, aggregated by p1"}
    one, two, three = p.plans
    assert one.switch_ports["t1"].slot_base == 0 and two.switch_ports["t1"].slot_base == 100
    assert two.switch_ports["t1"].slots == 28 and three.method == "pbox"
    assert p.free_slots == {"s1": 0, "t1": 0, "t2": 0}


def test_impossible_requests_get_clear_errors():
    g = two_racks_two_spines()
    g.remove_node("p1")
    with pytest.raises(UserError, match="switch s1 has no free slots and there is no PBox"):
        plan_jobs(g, [JobRequest(1, WORKERS, 128), JobRequest(2, WORKERS, 1)], pool_slots=128)
    with pytest.raises(UserError, match="job id 1 is used twice"):
        plan_jobs(g, [JobRequest(1, WORKERS), JobRequest(1, WORKERS)])
    with pytest.raises(UserError, match="at least 1"):
        plan_jobs(g, [JobRequest(1, WORKERS, 0)])
    with pytest.raises(UserError, match="at least one worker"):
        plan_job(g, ())


def test_tier_lower_bounds_by_hand():
    g = two_racks_two_spines()
    s = stream_bytes(1000, 256)
    assert s == 58 + 3 * (58 + 1024) + 58 + 4 * 232
    assert tier_lower_bounds(g, WORKERS, 1000, 256) == {"host-tor": 8 * s, "pbox-spine": 0, "tor-spine": 4 * s}


@pytest.mark.parametrize("topo,params", [("leaf-spine", {"racks": 3, "hosts_per_rack": 2, "spines": 2}), ("fat-tree", {"k": 4})])
@pytest.mark.parametrize("mode,placement", [("innet", "root"), ("innet", "tor"), ("innet", "tree"), ("pbox", "tor"), ("ring", "tor")])
def test_measured_bytes_equal_the_prediction(topo, params, mode, placement):
    g = build(topo, **params)
    r = run_local(g, RunSpec(mode=mode, placement=placement, elements=5003, iterations=2))
    assert r["correct"]
    assert r["link_bytes"] == r["predicted_link_bytes"]
    bounds = tier_lower_bounds(g, hosts(g), 5003, program_of(RunSpec()).elements)
    for t, b in r["tier_bytes"].items():
        assert b >= 2 * bounds[t]  # two iterations; no mode beats the bound


def test_in_network_hierarchy_meets_the_lower_bound_on_every_tier():
    g = build("leaf-spine", racks=3, hosts_per_rack=3)
    r = run_local(g, RunSpec(elements=4000))
    assert r["tier_bytes"] == {t: b for t, b in tier_lower_bounds(g, hosts(g), 4000, program_of(RunSpec()).elements).items()}


@pytest.mark.parametrize("topo,params", [
    ("star", {"workers": 6}),
    ("leaf-spine", {}), ("leaf-spine", {"racks": 3, "hosts_per_rack": 3, "spines": 2}),
    ("leaf-spine", {"racks": 4, "hosts_per_rack": 4, "spines": 2, "oversubscription": 2}),
    ("fat-tree", {"k": 4}), ("fat-tree", {"k": 6}), ("fat-tree", {"k": 8}),
    ("phub-rack", {}),
    (os.path.join(EXAMPLES, "two_racks.graphml"), {}), (os.path.join(EXAMPLES, "triangle.json"), {}),
])
def test_the_default_placement_meets_the_lower_bound_on_every_tier(topo, params):
    """The default (``auto``: the placement the timing model finds fastest) puts no more bytes on any tier
    than the tier's lower bound: fat-trees, where rack-then-root (tor) puts 1.5x it on agg-core, included."""
    g = build(topo, **params) if not topo.startswith("/") else load_file(topo)
    run = RunSpec(elements=4000)
    rp = plan_run(g, run, program_of(run))
    links: dict[str, int] = {}
    for plan in rp.plans:
        for name, b in predicted_link_bytes(g, "innet", plan, 4000, rp.per_packet).items():
            links[name] = links.get(name, 0) + b
    bounds = tier_lower_bounds(g, [w for p in rp.plans for w in p.workers], 4000, rp.per_packet)
    assert tier_bytes(g, links) == {t: bounds.get(t, 0) for t in tier_bytes(g, links)}
    if topo == "fat-tree":
        tor = plan_run(g, replace(run, placement="tor"), program_of(run)).plans[0]
        assert rp.plans[0].method == "tree" and sum(predicted_link_bytes(g, "innet", tor, 4000, 256).values()) > sum(links.values())


def test_auto_picks_the_placement_the_model_finds_fastest_and_ties_go_to_tor():
    g = build("fat-tree", k=4)
    run = RunSpec(elements=65536)
    times = {}
    for method in ("tor", "tree", "root"):
        rp = plan_run(g, replace(run, placement=method), program_of(run))
        times[method] = predict(g, replace(run, placement=method), list(rp.plans), rp.per_packet, 0.0)["completion_s"]
    chosen = plan_run(g, run, program_of(run)).plans[0].method
    assert times[chosen] == min(times.values()) and times["tor"] > 1.2 * times["tree"]
    assert plan_run(build("leaf-spine"), run, program_of(run)).plans[0].method == "tor"  # tor == tree there


def test_the_tree_takes_the_fast_spine_where_hop_counts_tie():
    """Two spines, equal hops: the Steiner tree weighted by 1/bandwidth goes through the 1000 Mbit/s spine,
    not the first by name (a 100 Mbit/s one)."""
    g = two_racks_two_spines()
    for t in ("t1", "t2"):
        g.edges[t, "s1"]["bw"] = 100.0
    plan = plan_job(g, hosts(g), method="tree")
    assert plan.root == "s2" and "s1" not in plan.switch_ports
    slow = plan_job(two_racks_two_spines(), hosts(g), method="tree")
    assert slow.root == "s1"  # all links alike: ties by name, as before


def test_prediction_names_every_link():
    g = two_racks_two_spines()
    plan = plan_job(g, WORKERS, method="tor")
    pred = predicted_link_bytes(g, "innet", plan, 1000, 256)
    assert len(pred) == g.number_of_edges() and pred["s2--t1"] == 0 and pred["p1--s2"] == 0
