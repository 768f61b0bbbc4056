"""Topology builders, the registry, and loading graph files."""

import json
import os

import networkx as nx
import pytest

from innet.errors import UserError
from innet.graph import hosts, pboxes, ports, routes, switches, tier
from topologies import build

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "topologies", "examples")


def test_fat_tree_k4_has_16_host_places_and_20_switches():
    g = build("fat-tree", k=4)
    assert len(switches(g)) == 20 and len(hosts(g)) == 15 and pboxes(g) == ["p1"]
    assert {g.nodes[s]["role"] for s in switches(g)} == {"tor", "agg", "core"}
    assert all(g.degree(s) == 4 for s in switches(g))


def test_leaf_spine_oversubscription_sets_uplink_capacity():
    g = build("leaf-spine", racks=3, hosts_per_rack=4, spines=2, bw=100, oversubscription=4)
    assert len(hosts(g)) == 12 and g["t1"]["s2"]["bw"] == 100 * 4 / 2 / 4
    assert tier(g, "t1", "s1") == "tor-spine" and tier(g, "h1", "t1") == "host-tor"


def test_phub_rack_puts_the_pbox_behind_its_own_tor():
    g = build("phub-rack", racks=2, hosts_per_rack=4)
    assert list(g["p1"]) == ["tp"] and g["t1"]["s1"]["bw"] == 1000


def test_ports_and_routes_are_deterministic_and_never_transit_hosts():
    g = build("leaf-spine", racks=2, hosts_per_rack=2, spines=2)
    assert ports(g, "t1") == {0: "h1", 1: "h2", 2: "s1", 3: "s2"}
    r = routes(g, "h1")
    assert r["h4"] == "t1" and routes(g, "t1")["h4"] == "s1"


def test_example_files_load():
    g = build(os.path.join(EXAMPLES, "two_racks.graphml"))
    assert hosts(g) == ["w11", "w12", "w13", "w21", "w22", "w23"] and g["w11"]["tor1"]["bw"] == 500
    t = build(os.path.join(EXAMPLES, "triangle.json"))  # no roles: inferred
    assert {t.nodes[n]["role"] for n in t} == {"host", "tor"}


@pytest.mark.parametrize("content,suffix,message", [
    ("<graphml><graph>", ".graphml", "is not valid GraphML"),
    ("{not json", ".json", "is not valid JSON"),
    ('{"nodes": 3}', ".json", "is not a networkx graph"),
    (None, ".graphml", "has unknown role 'router'"),
    (None, ".json", "is not connected"),
])
def test_unusable_files_get_one_clear_error(tmp_path, content, suffix, message):
    path = tmp_path / f"t{suffix}"
    if content is None and suffix == ".graphml":
        g = nx.Graph()
        g.add_node("a", role="router")
        g.add_edge("a", "b")
        nx.write_graphml(g, path)
    elif content is None:
        g = nx.Graph([("h1", "s1"), ("h2", "s1"), ("h3", "s2"), ("h4", "s2")])
        path.write_text(json.dumps(nx.node_link_data(g, edges="links")))
    else:
        path.write_text(content)
    with pytest.raises(UserError, match=message):
        build(str(path))


def test_bad_links_are_named():
    from innet.graph import validate

    g = nx.Graph()
    g.add_node("s1", role="tor")
    g.add_node("h1", role="host")
    g.add_edge("h1", "s1", bw="fast")
    with pytest.raises(UserError, match="link h1--s1 has a non-numeric bw"):
        validate(g)
    g["h1"]["s1"]["bw"] = -5
    with pytest.raises(UserError, match="needs a finite bw > 0"):
        validate(g)
