"""Point-to-point messages through the switches (innet.hosts.p2p): a message's words and frames byte for byte, the
bytes every link carries equal to the planner's prediction on a lossless fabric (and to the switches' own count of
message frames per port, what a Mininet launch reports), every message exact and in order under loss, duplication and
reordering, the messages an exchange sends, the mailbox's matching of receives, and a host's port that takes only
message frames (root)."""

import os
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from innet.backends.local.exchange import Post, exchange
from innet.backends.local.fabric import Fabric
from innet.graph import link_totals
from innet.hosts.background import BACKGROUND_JOB
from innet.hosts.p2p.host import MessageHost
from innet.hosts.p2p.wire import EXCHANGE, P2P_JOB, USER, decode, encode, message_bytes, pieces_of
from innet.integrations.torch.batch import exchange_pairs
from innet.integrations.torch.p2p import Mailbox
from innet.planning.prediction import exchange_direction_bytes, exchange_link_bytes, path_links
from innet.planning.spec import RunSpec, program_of
from innet.results.metrics import message_link_bytes
from innet.schemes.modes import installed_configs, plan_run
from innet.shipped import build
from innet.switch.runtime import SwitchRuntime
from innet.switch.testkit import Harness
from innet.wire.faults import FaultSpec
from innet.wire.layer import to_scapy
from innet.wire.packet import PAYLOAD_OFFSET, ROUTE, make_packet

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def planned(topo: str, workers: int, **faults: float):
    graph = build(topo, workers=workers) if topo == "star" else build(topo)
    run = replace(RunSpec(topo=topo, faults=FaultSpec(**faults)), collective="barrier", workers=workers, elements=1,
                  iterations=1)
    rp = plan_run(graph, run, program_of(run))
    return graph, run, rp, program_of(run, rp.fan_in)


def hosts_of(rp) -> dict[int, str]:
    return {spec.rank: host for host, spec in rp.specs[rp.plans[0].job].items()}


def test_a_message_is_its_preamble_then_its_bytes_padded_to_a_word():
    words = encode(b"\x01\x02\x03\x04\x05", tag=-7)
    assert words.view(np.uint8).tolist() == [5, 0, 0, 0, 0, 0, 0, 0, 0xF9, 0xFF, 0xFF, 0xFF, 1, 2, 3, 4, 5, 0, 0, 0]
    assert decode(words) == (-7, b"\x01\x02\x03\x04\x05")
    assert decode(encode(b"", 3)) == (3, b"")
    assert pieces_of(0, 2048) == 1 and pieces_of(4 * 2045, 2048) == 1 and pieces_of(4 * 2046, 2048) == 2
    # 10 pieces of 2048 values: 10 frames with the words, one ACK of 33 words back
    assert message_bytes(4 * (10 * 2048 - 3), 2048) == (10 * PAYLOAD_OFFSET + 4 * 10 * 2048, PAYLOAD_OFFSET + 4 * 33)


def test_a_piece_is_a_routed_frame_of_the_message_job_that_scapy_reads():
    pkt = make_packet(encode(b"hi", 9), job=P2P_JOB, rank=2, nworkers=EXCHANGE, slot=5, chunk=0, flags=ROUTE)
    frame = to_scapy(pkt.to_frame(3, 7, 1))
    agg = frame["InnetAgg"]
    assert (agg.job, agg.rank, agg.nworkers, agg.slot, agg.chunk, agg.count) == (0xFFFD, 2, 1, 5, 0, 4)
    assert frame["IP"].src == "10.77.0.4" and frame["IP"].dst == "10.77.0.8" and frame["IP"].tos == 4
    assert bytes(frame["InnetAgg"])[16:24] == bytes([2, 0, 0, 0, 0, 0, 0, 0])


@pytest.mark.parametrize("topo,workers", [("star", 4), ("leaf-spine", 4), ("fat-tree", 8)])
def test_an_all_to_all_of_uneven_messages_puts_the_predicted_bytes_on_every_link(topo, workers):
    """Lossless: each message's frames on every link direction of its routed path, its ACKs on the way back,
    exactly."""
    graph, run, rp, program = planned(topo, workers)
    rng = np.random.default_rng(1)
    posts = [Post(s, d, EXCHANGE, rng.integers(0, 256, int(rng.integers(0, 60000)), np.uint8).tobytes())
             for s in range(workers) for d in range(workers) if s != d]
    done = exchange(graph, run, rp, program, posts)
    for post in posts:
        assert [m.data for m in done.received[post.dst] if m.src == post.src] == [post.data]
    hosts = hosts_of(rp)
    messages = [(hosts[p.src], hosts[p.dst], len(p.data)) for p in posts]
    assert {k: v for k, v in done.direction_bytes.items() if v} == exchange_direction_bytes(graph, messages, rp.per_packet)
    assert {k: v for k, v in link_totals(done.direction_bytes).items() if v} == exchange_link_bytes(
        graph, messages, rp.per_packet)
    if topo == "fat-tree":  # a cross-pod message crosses the core: both of its path's links carry it
        assert len(path_links(graph, hosts[0], hosts[workers - 1])) == 6
    assert done.seconds > 0


@pytest.mark.parametrize("faults", [dict(loss=0.05), dict(loss=0.02, dup=0.02, reorder=0.05)])
@pytest.mark.parametrize("seed", [0, 1])
def test_under_loss_duplication_and_reordering_every_message_arrives_exact_and_in_order(faults, seed):
    graph, run, rp, program = planned("leaf-spine", 4, **faults)
    run = replace(run, seed=seed)
    rng = np.random.default_rng(seed)
    posts = [Post(s, d, USER, rng.integers(0, 256, int(rng.integers(1, 100000)), np.uint8).tobytes(), tag=10 * s + d)
             for s in range(4) for d in range(4) if s != d]
    posts += [Post(0, 1, USER, b"", 5), Post(0, 1, USER, b"abc", 6)]  # after the first: handed on after it
    done = exchange(graph, run, rp, program, posts)
    for post in posts:
        assert (post.src, post.tag, post.data) in [(m.src, m.tag, m.data) for m in done.received[post.dst]]
    assert [m.tag for m in done.received[1] if m.src == 0] == [1, 5, 6]
    lossless = exchange(*planned("leaf-spine", 4)[:3], program, posts)
    assert sum(done.direction_bytes.values()) > sum(lossless.direction_bytes.values())  # what was resent, counted


def test_a_receive_takes_the_first_message_it_matches_by_sender_and_tag():
    box, got = Mailbox(), []
    box.deliver(1, 7, b"a")
    box.deliver(2, 7, b"b")
    box.deliver(1, 8, b"c")
    box.post(2, 7, lambda src, data: got.append((src, data)))
    box.post(-1, 8, lambda src, data: got.append((src, data)))
    box.post(-1, 7, lambda src, data: got.append((src, data)))
    box.post(3, 7, lambda src, data: got.append((src, data)))  # waits
    assert got == [(2, b"b"), (1, b"c"), (1, b"a")]
    box.deliver(3, 7, b"d")
    assert got[-1] == (3, b"d") and not box.waiting and not box.messages


def test_an_exchange_sends_one_message_for_every_pair_its_call_names_empty_or_not():
    """all_to_all: every rank to every other; gather: every other rank to the root; scatter: the root to every
    other. The same on both backends, so a receiver on Mininet knows what to await and the prediction is one."""
    assert exchange_pairs("all_to_all", 3, 0) == [(0, 1), (0, 2), (1, 0), (1, 2), (2, 0), (2, 1)]
    assert exchange_pairs("gather", 4, 2) == [(0, 2), (1, 2), (3, 2)]
    assert exchange_pairs("scatter", 4, 1) == [(1, 0), (1, 2), (1, 3)]


def test_the_switches_count_message_frames_per_port_as_the_links_carry_them():
    """On the leaf-spine fabric, every rank to every other (and background frames beside them, not counted): the
    switches' per-port message counters, read as Mininet reads them (a switch's sends, a host's uplink as its switch
    received it), are the fabric's bytes per link and the planner's prediction."""
    graph, run, rp, program = planned("leaf-spine", 4)
    fabric = Fabric(graph)
    for name, cfg in installed_configs(graph, run, rp).items():
        fabric.add_switch(name, SwitchRuntime(cfg, program))
    by_rank = sorted(rp.specs[rp.plans[0].job].items(), key=lambda hs: hs[1].rank)
    nodes = [spec.node for _, spec in by_rank]
    ends = []
    for host, spec in by_rank:
        ends.append(MessageHost(spec, nodes, expected=3))
        fabric.attach(host, ends[-1])
    sizes = {(s, d): 1000 * (1 + s) + 77 * d for s in range(4) for d in range(4) if s != d}
    for (s, d), n in sizes.items():
        ends[s].post(d, EXCHANGE, bytes(n))
    fabric.run()
    assert all(end.done and end.error is None for end in ends)
    counted = message_link_bytes(graph, {name: rt.report().ports for name, rt in fabric.switches.items()})
    hosts = hosts_of(rp)
    predicted = exchange_link_bytes(graph, [(hosts[s], hosts[d], n) for (s, d), n in sizes.items()], rp.per_packet)
    assert counted == {k: v for k, v in fabric.link_bytes().items() if v} == predicted
    assert any(name.startswith("s") for name in counted)  # a spine's link: a switch's sends both ways
    sw = Harness("sum_allreduce", workers=2, slots=0)
    message = make_packet(np.arange(40, dtype=np.int32), job=P2P_JOB, rank=0, flags=ROUTE).to_frame(0, 1)
    background = make_packet(np.arange(40, dtype=np.int32), job=BACKGROUND_JOB, flags=ROUTE).to_frame(0, 1)
    sw.receive(1, message)
    sw.receive_block(1, [message, background] * 4 + [message])  # a block: the batch path counts them too
    stats = sw.runtime.report().ports
    assert stats["s-eth1"].message_rx_bytes == 6 * len(message) and stats["s-eth2"].message_tx_bytes == 6 * len(message)
    assert stats["s-eth2"].tx_bytes == 6 * len(message) + 4 * len(background)


FILTERED = """
import socket, subprocess, sys, time
from innet.io.rawport import RawPort
from innet.wire.packet import make_packet, P2P_JOB, ROUTE
import numpy as np
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
mine, rest = RawPort("lo"), RawPort("lo")
mine.keep_job(P2P_JOB)
rest.keep_job(P2P_JOB, keep=False)
out = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
out.bind(("lo", 0))
for job in (P2P_JOB, 7, P2P_JOB):
    out.send(make_packet(np.full(3, job, np.int32), job=job, flags=ROUTE).to_frame(0, 1))
out.send(b"\\xff" * 12 + b"\\x08\\x06" + bytes(46))  # not innet's (an ARP ethertype)
time.sleep(0.2)
jobs = lambda port: [int.from_bytes(f[42:44], "big") if f[12:14] == bytes([8, 0]) else -1 for f in port.recv_batch()]
print(jobs(mine), jobs(rest))
"""


@pytest.mark.mininet
def test_a_hosts_message_port_takes_only_message_frames_and_the_other_port_every_other_frame():
    """Two raw ports on one interface (loopback, in a network namespace of the test's own), filtered on the job
    number: one gets the message frames (job 0xFFFD) alone, the other the rest, a foreign frame among them."""
    if os.geteuid() != 0:
        pytest.skip("needs root (a network namespace)")
    out = subprocess.run(["unshare", "--net", sys.executable, "-c", FILTERED], capture_output=True, text=True,
                         cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[0] == f"[{P2P_JOB}, {P2P_JOB}] [7, -1]"
