"""The eBPF switch's XDP half at a job's root, on live frames: four veth pairs in a network namespace of the test's
own, the switch's ends (s-eth0..3) running switch.c (tc and XDP halves), the hosts' ends (h-eth0..3, GRO on: their
NAPI takes XDP frames) sending each rank's contributions and catching what comes back. A contribution completing a
slot becomes the result in XDP and leaves by every child's port at once (bpf_redirect_map, BPF_F_BROADCAST; each
port's headers written by innet_devmap); a repeat is still answered by the tc program. Every frame the hosts get is
the Python switch's for the same input, byte for byte, out of the same port, and each result is numpy's int32 sum."""

import os
import select
import shutil
import socket
import subprocess
import time

import numpy as np
import pytest

from innet.ebpf.build import object_path
from innet.ebpf.loader import EbpfPlane
from innet.switch.loader import load_program
from innet.switch.program import JobPort
from innet.switch.runtime import SwitchConfig, SwitchRuntime
from innet.wire.packet import OVERFLOW, RESULT, RETX, parse_frame
from tests.test_ebpf_replicas import frame, netns  # noqa: F401 (netns: a fixture)

pytestmark = pytest.mark.skipif(shutil.which("clang") is None or os.geteuid() != 0,
                                reason="veths, XDP and the eBPF switch need root and clang (make deps)")
NODE, SLOTS, ELEMS, PORTS = 10, 4, 256, 4
PACKET_OUTGOING, ETH_P_ALL = 4, 3
WAIT_S = 2.0  # the longest a frame the Python switch sends may take to reach its host (a loaded machine's scheduling)


class Star:
    """The root switch of one sum all-reduce job, ranks 0-3 behind ports 0-3 (nodes 0-3), as the eBPF switch on
    veths and as the Python switch's runtime."""

    def __init__(self, tmp: str) -> None:
        for conf in ("all", "default"):  # no IPv6 (its neighbour discovery) on the namespace's links: innet's frames alone
            subprocess.run(["sysctl", "-qw", f"net.ipv6.conf.{conf}.disable_ipv6=1"], check=True)
        for p in range(PORTS):
            subprocess.run(["ip", "link", "add", f"s-eth{p}", "type", "veth", "peer", "name", f"h-eth{p}"], check=True)
            for end in (f"s-eth{p}", f"h-eth{p}"):
                subprocess.run(["ip", "link", "set", end, "up"], check=True)
            subprocess.run(["ethtool", "-K", f"h-eth{p}", "gro", "on"], check=True, capture_output=True)
        job = JobPort(job=1, nworkers=PORTS, children=tuple(range(PORTS)), parent=None, aggregate=True,
                      contributors={r: r for r in range(PORTS)}, rank=0, rank_ports={r: r for r in range(PORTS)},
                      slot_base=0, slots=SLOTS)
        neighbors = {p: p for p in range(PORTS)}
        config = SwitchConfig(name="s1", node=NODE, tier="tor", ports={p: f"s-eth{p}" for p in neighbors},
                              neighbors=neighbors, routes={n: p for p, n in neighbors.items()}, jobs={1: job})
        self.runtime = SwitchRuntime(config, load_program("sum_allreduce", SLOTS, ELEMS))
        self.plane = EbpfPlane(object_path(ELEMS, 2 * SLOTS, tmp), config.ports, xdp=True)
        self.plane.install(config, SLOTS)
        self.hosts = []
        for p in range(PORTS):
            s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
            s.bind((f"h-eth{p}", 0))
            s.setblocking(False)
            self.hosts.append(s)

    def close(self) -> None:
        self.plane.close()
        for s in self.hosts:
            s.close()
        for p in range(PORTS):
            subprocess.run(["ip", "link", "del", f"s-eth{p}"], check=True)

    def send(self, port: int, data: bytes) -> list[tuple[int, bytes]]:
        """``data`` from the host behind ``port`` into both switches: what the hosts got back, (port, frame), sorted,
        asserted to be what the Python switch sends."""
        self.hosts[port].send(data)
        python = sorted(self.runtime.receive(port, data, 0.0))
        got = self._caught(len(python))
        assert got == python
        return got

    def _caught(self, count: int) -> list[tuple[int, bytes]]:
        got: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + (WAIT_S if count else 0.02)
        while len(got) < count or not count:
            ready, _, _ = select.select(self.hosts, [], [], max(deadline - time.monotonic(), 0))
            if not ready:
                break
            for s in ready:
                data, addr = s.recvfrom(65536)
                if addr[2] != PACKET_OUTGOING:  # not the host's own send
                    got.append((self.hosts.index(s), data))
        return sorted(got)

    def xdp_sent(self) -> int:
        """The frames the switch's ports sent as XDP frames (veth's tx_queue_0_xdp_xmit, summed)."""
        total = 0
        for p in range(PORTS):
            out = subprocess.run(["ethtool", "-S", f"s-eth{p}"], capture_output=True, text=True, check=True).stdout
            total += sum(int(line.split(":")[1]) for line in out.splitlines() if line.strip().startswith("tx_queue_0_xdp_xmit:"))
        return total


@pytest.mark.usefixtures("netns")
def test_the_roots_results_leave_as_xdp_frames_identical_to_the_python_switchs_and_repeats_are_answered(tmp_path):
    rng = np.random.default_rng(4949)
    star = Star(str(tmp_path))
    try:
        for rank in rng.permutation(PORTS):  # the exponent chunk: headers alone, their largest exponent to all
            sent = star.send(int(rank), frame(int(rank), 0, PORTS, exp=int(rank) - 2, mark=PORTS))
        assert [parse_frame(f).exp for _, f in sent] == [1] * PORTS
        chunks, wraps, answers = 3 * SLOTS, 0, [0] * PORTS  # every key through three rounds, both versions
        for chunk in range(1, chunks + 1):
            n = ELEMS if chunk < chunks else 17  # the tensor's last chunk is short (an odd count)
            bound = 2**31 if chunk % 2 else 2**29  # odd chunks' sums wrap somewhere, even chunks' never
            values = rng.integers(-bound, bound, (PORTS, n), dtype=np.int64).astype(np.int32)
            order = [int(r) for r in rng.permutation(PORTS)]
            for k, rank in enumerate(order):
                sent = star.send(rank, frame(rank, chunk, PORTS, values[rank], mark=PORTS))
                assert sent == [] or k == PORTS - 1
            total = values.astype(np.int64).sum(axis=0)
            assert sorted(p for p, _ in sent) == list(range(PORTS))
            for port, result in sent:
                got = parse_frame(result)
                assert got.has(RESULT) and got.dst == port and np.array_equal(got.values, total.astype(np.int32))
                assert got.has(OVERFLOW) == bool(((total > 2**31 - 1) | (total < -2**31)).any())
            wraps += parse_frame(sent[0][1]).has(OVERFLOW)
            late = order[0]  # a resend once the slot is done: answered by the tc program, to the one who asked
            [(port, answer)] = star.send(late, frame(late, chunk, PORTS, values[late], RETX, mark=PORTS))
            assert port == late and np.array_equal(parse_frame(answer).values, total.astype(np.int32))
            answers[late] += 1
        assert wraps == chunks // 2  # each odd chunk's sums wrapped, and no even chunk's
        assert star.xdp_sent() == PORTS * (chunks + 1)  # every result went out as XDP frames, the answers did not
        assert star._caught(0) == []  # and nothing else came
        stats = star.plane.port_stats()  # innet_devmap counts each port's copy as the tc program counts its own
        assert [stats[p].tx_packets for p in range(PORTS)] == [chunks + 1 + answers[p] for p in range(PORTS)]
    finally:
        star.close()
