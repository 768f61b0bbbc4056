"""Topology files in the conventions users have: p4-utils' topology.json (node-link, links under "links"),
networkx node-link JSON and GraphML; read with roles and link attributes, written back for innet, networkx
and p4-utils alike, and one clear line for a file that cannot be used."""

import json
import os
import subprocess
import sys

import networkx as nx
import pytest

from innet.backends.local.run import run_local
from innet.errors import UserError
from innet.graph import port_to
from innet.planning.spec import RunSpec
from tests.helpers import p4utils_topology
from topologies import build
from topologies.files import load_file, save_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_p4utils_topology_json_loads_with_its_roles_and_links_and_runs(tmp_path):
    path = tmp_path / "topology.json"
    path.write_text(json.dumps(p4utils_topology()))
    assert '"links": [' in path.read_text()
    g = build(str(path))
    assert {n: g.nodes[n]["role"] for n in g} == {"h1": "host", "h2": "host", "s1": "tor", "s2": "tor", "s3": "spine"}
    assert (g["h1"]["s1"]["bw"], g["h1"]["s1"]["latency"]) == (10.0, 0.005)
    assert (g["h2"]["s2"]["latency"], g["s1"]["s2"]["latency"]) == (0.00025, 0.002)  # "250us"; a bare 2 is ms
    assert (g["s2"]["s3"]["bw"], g["s2"]["s3"]["latency"]) == (1000.0, 2e-6)  # innet's defaults
    assert run_local(g, RunSpec(elements=3000)).correct


def test_plain_node_link_json_with_edges_and_graphml_load_too(tmp_path):
    g = nx.path_graph(["h1", "s1", "s2", "h2"])
    nx.set_edge_attributes(g, 100, "bw")
    (tmp_path / "t.json").write_text(json.dumps(nx.node_link_data(g)))  # networkx's own default key: "edges"
    nx.write_graphml(g, tmp_path / "t.graphml")
    for name in ("t.json", "t.graphml"):
        loaded = build(str(tmp_path / name))
        assert [loaded.nodes[n]["role"] for n in ("h1", "s1", "s2", "h2")] == ["host", "tor", "tor", "host"]
        assert loaded["s1"]["s2"]["bw"] == 100


@pytest.mark.parametrize("topo,params", [("star", {"workers": 3}), ("leaf-spine", {"racks": 2, "spines": 2}),
                                         ("fat-tree", {"k": 4}), ("phub-rack", {})])
@pytest.mark.parametrize("suffix", [".json", ".graphml"])
def test_a_saved_topology_loads_back_the_same(tmp_path, topo, params, suffix):
    g = build(topo, **params)
    path = str(tmp_path / f"t{suffix}")
    save_file(g, path)
    back = load_file(path)
    assert back.graph["name"] == g.graph["name"]
    assert {n: back.nodes[n]["role"] for n in back} == {n: g.nodes[n]["role"] for n in g}
    assert ({frozenset((u, v)): (d["bw"], d["latency"]) for u, v, d in back.edges(data=True)}
            == {frozenset((u, v)): (d["bw"], d["latency"]) for u, v, d in g.edges(data=True)})


def test_a_saved_json_is_node_link_with_links_and_p4utils_attributes(tmp_path):
    g = build("leaf-spine", racks=2, hosts_per_rack=2)
    save_file(g, str(tmp_path / "t.json"))
    data = json.loads((tmp_path / "t.json").read_text())
    assert "links" in data and "edges" not in data
    nodes = {n["id"]: n for n in data["nodes"]}
    assert nodes["h1"]["isHost"] and not nodes["h1"]["isSwitch"] and nodes["p1"]["isHost"] and nodes["t1"]["isSwitch"]
    assert nodes["h1"]["ip"] == "10.77.0.1/16"  # the address h1's frames carry (node index 0)
    for link in data["links"]:
        a, b = link["node1"], link["node2"]
        assert {a, b} == {link["source"], link["target"]}
        assert (link["port1"], link["port2"]) == (port_to(g, a, b), port_to(g, b, a))
        assert (link["intfName1"], link["intfName2"]) == (f"{a}-eth{link['port1']}", f"{b}-eth{link['port2']}")
    assert nx.is_isomorphic(nx.node_link_graph(data, edges="links"), g)


@pytest.mark.parametrize("content,message", [
    (lambda: p4utils_topology(multigraph=True), "s1 and s2 are joined by 2 links; innet takes one link per pair"),
    (lambda: {"program": "p4src/l2.p4", "topology": {"hosts": {"h1": {}}, "links": [["h1", "s1"]]}},
     "is a p4run configuration \\(p4app.json\\), not a topology: give the topology.json p4run writes"),
    (lambda: [1, 2], "node-link JSON has a \"nodes\" list and a \"links\" list"),
    (lambda: {"nodes": [{"id": "h1"}], "links": [{"source": "h1"}]}, "a link has no target \\(link h1--None\\)"),
    (lambda: {**p4utils_topology(), "links": [{"source": "h1", "target": "s1", "delay": "fast"}]},
     "link h1--s1 has delay 'fast'; give it as a number of ms or with a unit"),
])
def test_unusable_json_gets_one_clear_line(tmp_path, content, message):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(content()))
    with pytest.raises(UserError, match=message):
        build(str(path))


def test_saving_refuses_an_unknown_format():
    with pytest.raises(UserError, match="name it .json \\(node-link\\) or .graphml"):
        save_file(build("star"), "t.txt")


def test_the_cli_saves_the_topology_it_runs_and_reads_it_back(tmp_path):
    def cli(*args):
        return subprocess.run([sys.executable, os.path.join(ROOT, "run_topology.py"), "--backend", "local", "--plan-only",
                               *args], capture_output=True, text=True, timeout=120)

    saved = cli("--topo", "leaf-spine", "--racks", "3", "--save-topology", str(tmp_path / "ls.graphml"))
    assert saved.returncode == 0, saved.stderr
    assert saved.stdout.startswith(f"topology: {tmp_path / 'ls.graphml'}\n")
    again = cli("--topo", str(tmp_path / "ls.graphml"))
    assert again.returncode == 0, again.stderr
    assert again.stdout == saved.stdout.split("\n", 1)[1]  # the same plan, from the file
    bad = cli("--save-topology", str(tmp_path / "t.yaml"))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "name it .json (node-link) or .graphml" in bad.stderr
