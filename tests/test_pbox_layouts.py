"""--pbox-layout: PHub's hierarchical reduction (rack) and a stock sharded PS (sharded), against the central PBox:
exact sums, the planner's bytes on every link, where the bytes go, and the PHub experiment's comparison."""

import json

import numpy as np
import pytest

import innet
from innet.errors import UserError
from innet.hosts.pbox import PBoxJob, RackPBox
from innet.wire.packet import RESULT, RETX, ROUTE, make_packet, parse_frame
from topologies import build


def run(layout, hosts_per_rack=3, elements=5003, **extra):
    ready = innet.prepare("phub-rack", backend="local", racks=2, hosts_per_rack=hosts_per_rack, bw=100,
                          elements=elements, mode="pbox", pbox_layout=layout, **extra)
    [record] = innet.run(ready).runs
    return ready.graph, record


@pytest.mark.parametrize("layout", ["central", "rack", "sharded"])
@pytest.mark.parametrize("elements", [5003, 65536])
def test_every_layout_is_exact_with_the_planners_bytes_on_every_link(layout, elements):
    _, r = run(layout, elements=elements)
    assert r.correct and r.retransmissions == 0
    assert r.link_bytes == r.predicted_link_bytes


def test_the_hierarchy_sends_one_partial_per_rack_across_the_core():
    """rack: each rack's PBox takes its 3 workers' streams and sends one partial up; the central PBox's link and
    each ToR's uplink carry one stream per rack each way, as in-network's rack-then-root tree puts on the uplinks."""
    g, r = run("rack")
    one = r.link_bytes["h1--t1"] // 2  # a worker's stream, each way
    assert r.link_bytes["pr1--t1"] == r.link_bytes["pr2--t2"] == 2 * (3 + 1) * one
    assert r.link_bytes["s1--t1"] == r.link_bytes["s1--t2"] == 2 * one
    assert r.link_bytes["p1--tp"] == 2 * 2 * one
    assert r.link_bytes["s1--tp"] == 2 * 2 * one
    assert r.cross_rack_bytes == 8 * one  # s1--t1, s1--t2, s1--tp


def test_the_stock_ps_spreads_every_workers_keys_over_a_server_per_worker():
    g, r = run("sharded", elements=65536)  # 32 chunks of 2048 and the exponent's: 6 or 5 per server
    servers = sorted(n for n in g if n.startswith("ps"))
    assert len(servers) == 6 and all(g.edges[s, next(iter(g[s]))]["bw"] == 100 for s in servers)
    assert r.link_bytes["p1--tp"] == 0  # the central PBox is not used
    per_server = [r.link_bytes[f"{s}--{next(iter(g[s]))}"] for s in servers]
    assert min(per_server) > 0 and max(per_server) - min(per_server) == 6 * 2 * (58 + 4 * 2048)  # a key each, at most
    assert sum(per_server) == sum(r.link_bytes[f"h{k}--t{(k - 1) // 3 + 1}"] for k in range(1, 7))


def test_the_layouts_are_refused_where_they_mean_nothing():
    with pytest.raises(UserError, match="pbox_layout.*rack.*needs a PBox host on every worker's ToR"):
        innet.prepare("leaf-spine", backend="local", mode="pbox", pbox_layout="rack")
    with pytest.raises(UserError, match="pbox_layout.*needs.*mode.*pbox"):
        innet.prepare("phub-rack", backend="local", mode="innet", pbox_layout="sharded")
    with pytest.raises(UserError, match="topk"):
        innet.prepare("phub-rack", backend="local", mode="pbox", pbox_layout="rack", topk=0.1)
    with pytest.raises(UserError, match="pbox_layout is Local.s: it means nothing with backend mininet"):
        innet.prepare("phub-rack", backend="mininet", mode="pbox", pbox_layout="rack")


def test_phub_rack_builds_the_racks_boxes_only_when_asked():
    assert not [n for n in build("phub-rack", racks=2, hosts_per_rack=2) if n.startswith(("pr", "ps"))]
    g = build("phub-rack", racks=2, hosts_per_rack=2, rack_servers="pbox")
    assert g.edges["pr1", "t1"]["bw"] == g.edges["p1", "tp"]["bw"] == 2 * g.edges["h1", "t1"]["bw"]
    assert sorted(n for n in build("phub-rack", racks=2, hosts_per_rack=2, rack_servers="host")
                  if n.startswith("ps")) == ["ps1", "ps2", "ps3", "ps4"]


def test_a_rack_pbox_resends_its_partial_until_the_total_comes_then_answers_with_the_total():
    box = RackPBox(50, PBoxJob(1, {0: 10, 1: 11}, 4, 3), up=60, racks=2, nworkers=4)

    def push(rank, values, flags=ROUTE):
        pkt = make_packet(np.array(values, np.int32), job=1, rank=rank, slot=1, chunk=1, nworkers=4, flags=flags)
        return [parse_frame(f) for f in box.receive(pkt.to_frame(10 + rank, 50), 0.0)]

    assert push(0, [1, 2, 3]) == []
    [up] = push(1, [10, 20, 30])
    assert (up.dst, up.rank, up.nworkers, up.values.tolist()) == (60, 0, 2, [11, 22, 33])
    assert push(1, [10, 20, 30]) == []  # the link's duplicate asks for nothing
    [again] = push(1, [10, 20, 30], ROUTE | RETX)  # a worker's retransmission before the total: the partial again
    assert (again.dst, again.values.tolist(), again.has(RETX)) == (60, [11, 22, 33], True)  # the PBox answers a RETX
    total = make_packet(np.array([111, 222, 333], np.int32), job=1, rank=0, slot=1, chunk=1, nworkers=2,
                        flags=RESULT | ROUTE)
    down = [parse_frame(f) for f in box.receive(total.to_frame(60, 50), 0.0)]
    assert [(d.dst, d.rank, d.nworkers, d.values.tolist()) for d in down] == [(10, 0, 4, [111, 222, 333]),
                                                                             (11, 1, 4, [111, 222, 333])]
    assert push(0, [1, 2, 3]) == []
    [answer] = push(0, [1, 2, 3], ROUTE | RETX)  # a retransmission after it: answered with the total, from the box
    assert (answer.dst, answer.values.tolist()) == (10, [111, 222, 333])
    assert box.receive(total.to_frame(60, 50), 0.0) == [] and box.counters == {"stale_result": 1, "duplicate": 2}


@pytest.mark.slow
def test_phubs_comparison_who_wins_and_by_how_much(reproduced):
    """The PHub experiment's full sweep: PHub's hierarchical PBox beats the stock PS, more so as racks fill (the
    stock PS's, and the flat PBox's, cross-rack bytes grow with the workers; the hierarchy's stay at one partial
    per rack); the flat PBox is as fast as the stock PS here (both bound by the 4:1 core); in-network beats
    them all. Virtual time: the same on every machine."""
    out, folder = reproduced("phub")
    assert out.returncode == 0, out.stderr
    data = json.loads((folder / "points.json").read_text())
    speedup = data["summary"]["speedup"]
    at = {(p["series"], p["hosts_per_rack"]): p for p in data["points"]}
    assert 1.7 < speedup["phub"]["2"] < 1.9 and 3.0 < speedup["phub"]["8"] < 3.3
    assert all(speedup["phub"][str(n)] < speedup["innet"][str(n)] < 4.2 for n in (2, 3, 4, 6, 8))
    assert all(0.95 < speedup["pbox"][str(n)] < 1.05 for n in (2, 3, 4, 6, 8))
    for n in (2, 8):
        stock = at["stock", n]["cross_rack_bytes"]
        assert at["pbox", n]["cross_rack_bytes"] == 2 * stock
        assert at["phub", n]["cross_rack_bytes"] == at["phub", 2]["cross_rack_bytes"] == 2 * at["innet", n]["cross_rack_bytes"]
    assert at["stock", 8]["cross_rack_bytes"] == 4 * at["stock", 2]["cross_rack_bytes"]


@pytest.mark.parametrize("layout,says", [
    ("rack", "every worker sends to its rack's PBox (pr1, pr2), which sends its rack's sums to PBox p1"),
    ("sharded", "every worker sends key (slot) k to server k % 4 of ps1, ps2, ps3, ps4")])
def test_the_plan_says_where_each_layout_sends(layout, says):
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-m", "innet", "plan", "--topo", "phub-rack", "--hosts-per-rack", "2",
                          "--mode", "pbox", "--pbox-layout", layout], capture_output=True, text=True, timeout=120,
                         cwd=root, env=dict(os.environ, PYTHONPATH=root))
    assert out.returncode == 0, out.stderr
    assert f"  {says}\n" in out.stdout
