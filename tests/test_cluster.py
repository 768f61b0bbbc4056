"""``--cluster``: one run spread over 2 and 3 servers gives the one-machine result and bytes; bad input is one line.

The servers are scripts/cluster_servers.py's: namespaces of this machine, each with its own sshd (installed by the
script when missing), so the mininet-marked tests need nothing but root. After each, nothing may be left: no
namespace, interface (VXLAN devices included), run record or process (sshd, node shells, innet processes).
"""

import json
import os
import re
import subprocess
import sys
import time
from contextlib import contextmanager

import pytest

from innet.backends.cluster.servers import Cluster, cluster_figures, parse_servers, place, tunnels
from innet.errors import UserError
from innet.graph import switches
from topologies import build

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "cluster_servers.py")
DIR = "/run/innet-cluster"
RUN = ["--elements", "16384", "--no-plots"]  # leaf-spine: 2 racks x 2 hosts, 1 spine, a PBox


def test_servers_are_read_each_once_and_anything_else_is_refused():
    assert parse_servers("10.0.0.1,srv2,root@srv3.lab") == ("10.0.0.1", "srv2", "root@srv3.lab")
    for bad in ("", "a,,b", "-oProxyCommand=touch /tmp/x", "a b", "a;reboot"):
        with pytest.raises(UserError, match="wants servers as HOST1,HOST2"):
            parse_servers(bad)
    with pytest.raises(UserError, match="names a more than once"):
        parse_servers("a,b,a")


def test_switches_are_dealt_evenly_and_hosts_go_with_their_switch():
    g = build("leaf-spine")  # s1; t1 (h1 h2); t2 (h3 h4); p1 on s1
    two = place(g, ("A", "B"))
    assert {n: two[n] for n in ("s1", "t1", "p1", "h1", "h2")} == dict.fromkeys(("s1", "t1", "p1", "h1", "h2"), "A")
    assert {n: two[n] for n in ("t2", "h3", "h4")} == dict.fromkeys(("t2", "h3", "h4"), "B")
    assert tunnels(g, two) == ["s1--t2"]
    three = place(g, ("A", "B", "C"))
    assert (three["s1"], three["p1"], three["t1"], three["h2"], three["t2"], three["h4"]) == ("A", "A", "B", "B", "C", "C")
    assert tunnels(g, three) == ["s1--t1", "s1--t2"]
    ft = build("fat-tree", k=4)
    where = place(ft, ("A", "B", "C"))
    assert set(where) == set(ft) and [sum(where[s] == x for s in switches(ft)) for x in "ABC"] == [7, 7, 6]
    figures = cluster_figures(g, three, ("A", "B", "C"), {"s1--t1": 5, "s1--t2": 7, "h1--t1": 9})
    assert figures.tunnel_bytes == {"s1--t1": 5, "s1--t2": 7} and figures.cross_server_bytes == 12


def test_ssh_uses_only_the_given_key_and_host_keys():
    argv = Cluster(("10.0.0.1",), key="/k", known_hosts="/kh").ssh("10.0.0.1", tty=True)
    assert argv[-1] == "root@10.0.0.1" and "-tt" in argv and "BatchMode=yes" in argv
    assert argv[argv.index("-i") + 1] == "/k" and "IdentitiesOnly=yes" in argv and "UserKnownHostsFile=/kh" in argv


def _leftovers() -> set[str]:
    """What a cluster run or the test servers could leave behind on this machine (which hosts every server)."""
    found = set()
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    found |= {f"namespace {line.split()[0]}" for line in ns.splitlines() if line.startswith("innet-srv")}
    links = json.loads(subprocess.run(["ip", "-d", "-j", "link", "show"], capture_output=True, text=True, check=True).stdout)
    found |= {f"interface {d['ifname']}" for d in links
              if d["ifname"].startswith(("innet-c", "innet-vx")) or d.get("linkinfo", {}).get("info_kind") == "vxlan"}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{pid}/stat") as fh:
                zombie = fh.read().rsplit(")", 1)[1].split()[0] == "Z"
        except OSError:
            continue
        if not zombie and (DIR in cmd or "mininet:" in cmd or "innet.node" in cmd or "mnexec" in cmd):
            found.add(f"process {pid} {cmd.strip()}")
    if os.path.isdir("/run/innet"):
        found |= {f"run record {f}" for f in os.listdir("/run/innet")}
    if os.path.exists(DIR):
        found.add(f"directory {DIR}")
    return found


def _sshd(i: int) -> int:
    with open(f"{DIR}/srv{i}/sshd.pid") as fh:
        return int(fh.read())


def _server_processes(n: int) -> list[list[int]]:
    """The processes in each server's namespace, once the sessions of a finished run have closed (at most 5 s)."""
    deadline = time.monotonic() + 5
    while True:
        pids = [sorted(int(p) for p in subprocess.run(["ip", "netns", "pids", f"innet-srv{i}"], capture_output=True,
                                                      text=True, check=True).stdout.split())
                for i in range(1, n + 1)]
        if all(len(p) == 1 for p in pids) or time.monotonic() > deadline:
            return pids
        time.sleep(0.1)


@contextmanager
def servers(n: int):
    """``n`` test servers, up for the block; afterwards nothing of them, or of the runs on them, is left."""
    before = _leftovers()
    up = subprocess.run([sys.executable, SCRIPT, "up", str(n)], capture_output=True, text=True, timeout=300)
    try:
        assert up.returncode == 0, up.stderr
        flags = re.search(r"run with: (.*)$", up.stdout.strip()).group(1).split()
        yield flags
        assert _server_processes(n) == [[_sshd(i)] for i in range(1, n + 1)]  # no session, nothing a run started
    finally:
        down = subprocess.run([sys.executable, SCRIPT, "down"], capture_output=True, text=True, timeout=60)
        assert down.returncode == 0, down.stderr
    assert _leftovers() - before == set()


def run_topology(*args: str, tmp: str) -> tuple[subprocess.CompletedProcess, dict]:
    path = os.path.join(tmp, "r.json")
    out = subprocess.run([sys.executable, os.path.join(ROOT, "run_topology.py"), *args, "--out", tmp, "--json", path],
                         capture_output=True, text=True, timeout=600, cwd=tmp)
    if not os.path.exists(path):
        return out, {}
    with open(path) as fh:
        return out, json.load(fh)["runs"][0]


@pytest.fixture(scope="module")
def one_machine(tmp_path_factory):
    out, record = run_topology(*RUN, tmp=str(tmp_path_factory.mktemp("one")))
    assert out.returncode == 0, out.stderr
    return record


@pytest.mark.mininet
@pytest.mark.parametrize("n", [2, 3])
def test_a_run_over_servers_gives_the_one_machine_result_and_bytes_per_link(n, one_machine, tmp_path):
    with servers(n) as flags:
        out, record = run_topology(*RUN, *flags, tmp=str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert record["correct"] and record["result_digest"] == one_machine["result_digest"]  # the exact sums, checked
    if record["retransmissions"] == 0 and one_machine["retransmissions"] == 0:
        assert record["link_bytes"] == one_machine["link_bytes"]
    else:  # a loaded machine retransmitted: never fewer bytes than the fabric's
        assert all(record["link_bytes"][k] >= b for k, b in one_machine["link_bytes"].items())
    servers_used = flags[1].split(",")
    expected = tunnels(build("leaf-spine"), place(build("leaf-spine"), tuple(servers_used)))
    c = record["cluster"]
    assert list(c["servers"]) == servers_used and list(c["tunnel_bytes"]) == expected
    assert c["tunnel_bytes"] == {k: record["link_bytes"][k] for k in expected}
    assert c["cross_server_bytes"] == sum(c["tunnel_bytes"].values()) > 0
    assert f"{c['cross_server_bytes']} B crossed servers on {len(expected)} tunnel link(s)" in out.stdout


@pytest.fixture(scope="module")
def one_server():
    with servers(1) as flags:
        yield flags


def _one_line_error(out: subprocess.CompletedProcess, says: str) -> None:
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and out.stderr.startswith("error: "), out.stderr
    assert says in out.stderr, out.stderr


@pytest.mark.mininet
def test_an_unreachable_server_a_missing_or_refused_key_and_a_bad_value_are_one_line_and_leave_nothing(one_server, tmp_path):
    before = _leftovers()
    address = one_server[1]
    key, known = one_server[3], one_server[5]
    unreachable = ["--cluster", f"{address},10.213.57.99", "--cluster-key", key, "--cluster-known-hosts", known]
    out, _ = run_topology(*RUN, *unreachable, tmp=str(tmp_path))
    _one_line_error(out, "cannot reach server 10.213.57.99 over ssh: ")
    missing = ["--cluster", address, "--cluster-key", str(tmp_path / "no-such-key"), "--cluster-known-hosts", known]
    out, _ = run_topology(*RUN, *missing, tmp=str(tmp_path))
    _one_line_error(out, f"--cluster-key {tmp_path / 'no-such-key'}: no such file")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other")], check=True)
    refused = ["--cluster", address, "--cluster-key", str(tmp_path / "other"), "--cluster-known-hosts", known]
    out, _ = run_topology(*RUN, *refused, tmp=str(tmp_path))
    _one_line_error(out, f"server {address} refused the ssh login as root with key {tmp_path / 'other'}")
    for bad, says in ((["--cluster", "a,,b"], "--cluster wants servers as HOST1,HOST2,..."),
                      (["--cluster", f"{address},{address}"], f"--cluster names {address} more than once"),
                      (["--cluster=-oProxyCommand=x"], "--cluster wants servers"),
                      (["--cluster", address, "--backend", "local"], "--cluster is Mininet's: it means nothing with --backend local"),
                      (["--cluster-key", key], "--cluster-key means nothing without --cluster")):
        out, _ = run_topology(*RUN, *bad, tmp=str(tmp_path))
        _one_line_error(out, says)
    assert _leftovers() == before  # the server's own sshd is still up, and nothing else
