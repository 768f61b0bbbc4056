"""Small builders shared by tests."""

import networkx as nx
import numpy as np

from innet.hosts.ensemble import INPUT_BAND
from innet.planning.configs import switch_configs
from innet.planning.planner import plan_job
from innet.planning.spec import RunSpec
from innet.switch.loader import load_program
from innet.switch.runtime import SwitchRuntime
from innet.wire.layer import scapy_frame
from innet.wire.packet import (
    ABORT,
    ALL_RANKS,
    FALLBACK,
    HEADER_DTYPE,
    INPUT_JOB,
    OVERFLOW,
    RESULT,
    RETX,
    ROUTE,
    SPARSE,
    VER,
    build_frames,
    make_packet,
)
from innet.wire.sparse import encode
from topologies import build


def star_runtime(workers=3, program="sum_allreduce", slots=None):
    graph = build("star", workers=workers)
    prog = load_program(program)
    hosts = [f"h{i + 1}" for i in range(workers)]
    plan = plan_job(graph, hosts, method="root", slots=slots or prog.slots)
    cfg = switch_configs(graph, [plan])["s1"]
    return graph, plan, SwitchRuntime(cfg, prog)


def run(**kw):
    return RunSpec(**kw)


def ints(n, seed=0):
    return np.random.default_rng(seed).integers(-1000, 1000, n).astype(np.int32)


def p4utils_topology(multigraph=False):
    """A topology.json as p4-utils' p4run writes it: networkx node_link_data with links under "links", nodes
    marked isHost / isSwitch / isP4Switch with their switch options, links with ports, interfaces, bw and delay."""
    g = nx.MultiGraph() if multigraph else nx.Graph()
    for n, host in (("h1", "10.0.1.1/24"), ("h2", "10.0.2.2/24")):
        g.add_node(n, isHost=True, ip=host, defaultRoute=f"via {host[:-4]}254", log_enabled=False, cls=None)
    for i, n in enumerate(("s1", "s2", "s3"), 1):
        g.add_node(n, isSwitch=True, isP4Switch=True, device_id=i, thrift_port=9089 + i, cpu_port=False,
                   json_path=f"p4src/{n}.json", pcap_dump=False, sw_bin="simple_switch", cls=None)
    links = [("h1", "s1", {"bw": 10, "delay": "5ms"}), ("h2", "s2", {"bw": 10, "delay": "250us"}),
             ("s1", "s2", {"delay": 2}), ("s2", "s3", {})]  # s3: a switch with one link (no host on it)
    links += [("s1", "s2", {})] if multigraph else []
    ports = {}
    for a, b, opts in links:
        pa, pb = ports.setdefault(a, 0) + 1, ports.setdefault(b, 0) + 1
        ports[a], ports[b] = pa, pb
        g.add_edge(a, b, node1=a, node2=b, port1=pa, port2=pb, intfName1=f"{a}-eth{pa}", intfName2=f"{b}-eth{pb}",
                   addr1=f"00:00:00:00:0{pa}:0{pb}", weight=1, **opts)
    return nx.node_link_data(g, edges="links")


def every_kind():
    """One frame of each kind innet sends, made by the builders the hosts and switches use."""
    rng = np.random.default_rng(22)
    grad = rng.integers(-(2**31), 2**31, 256, dtype=np.int64).astype(np.int32)
    grad[:2] = -(2**31), 2**31 - 1
    sparse = np.zeros(300, np.int32)
    sparse[[0, 17, 299]] = 5, -6, 2**31 - 1
    hdr = np.zeros(2, HEADER_DTYPE)
    hdr["job"], hdr["rank"], hdr["chunk"], hdr["count"], hdr["flags"], hdr["nworkers"] = INPUT_JOB, 3, [7, 8], 16, ROUTE, 2
    frames = [
        make_packet(None, job=1, rank=0, nworkers=4, chunk=0, exp=-7).to_frame(0, 9),  # a call's exponent chunk
        make_packet(grad, job=1, rank=2, nworkers=4, slot=127, chunk=2**32 - 1, exp=12).to_frame(2, 9),
        make_packet(grad[:88], job=1, rank=2, nworkers=4, slot=5, chunk=133, flags=RETX | VER).to_frame(2, 9, 1),
        make_packet(grad, job=1, rank=ALL_RANKS, nworkers=4, slot=5, chunk=133, flags=RESULT | VER).to_frame(9, 0),
        make_packet(grad[:3], job=2, rank=1, slot=1, chunk=1, flags=RESULT | OVERFLOW).to_frame(9, 1),
        make_packet(encode(sparse), job=1, rank=3, nworkers=4, slot=2, chunk=2, flags=SPARSE).to_frame(3, 9),
        make_packet(encode(sparse), job=1, rank=ALL_RANKS, slot=2, chunk=2, flags=RESULT | SPARSE).to_frame(9, 3),
        make_packet(grad[:16], job=1, rank=1, slot=3, chunk=3, flags=FALLBACK).to_frame(9, 11),
        make_packet(grad[:16], job=1, rank=1, slot=3, chunk=3, flags=ROUTE).to_frame(1, 11),  # to the PBox
        make_packet(np.array([9, 1, 3]), job=1, rank=ALL_RANKS, flags=ABORT).to_frame(9, 0),  # s1 gave up on 1, 3
        make_packet(np.array([11, 2]), job=1, rank=0, flags=ABORT | ROUTE).to_frame(11, 0),  # the PBox did
        *build_frames(11, 0, hdr, grad[:32].reshape(2, 16), INPUT_BAND),  # an ensemble's input stream
        make_packet(np.array([3, 2]), job=INPUT_JOB, rank=3, flags=ROUTE | RETX).to_frame(0, 11),  # its NACK
        make_packet(np.array([4, -1]), job=0, rank=1, slot=2, chunk=6, flags=ROUTE | RESULT).to_frame(1, 0),  # ring ACK
        scapy_frame(1, 2, band=2, job=65535, rank=65535, nworkers=65535, slot=65535, chunk=2**32 - 1, flags=0xFF,
                    exp=-128, values=[1, 2, 3]),  # every bit and every maximum at once
    ]
    return [bytes(f) for f in frames]
