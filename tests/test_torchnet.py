"""torch.distributed ranks in Mininet hosts (innet.integrations.ranks.mininet): the IP network beside innet's frames,
``--backend gloo`` and DDP trained through the switches with the ClientState hook."""

import json
import os
import re
import signal
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from innet.backends.mininet.iplane import host_address, ip_commands, link_addresses
from innet.errors import UserError
from innet.graph import hosts
from innet.integrations.ranks.mininet import gloo_record, torch_available
from innet.planning.rules import validate
from innet.planning.spec import RunSpec, program_of
from innet.results.outcome import WorkerOutcome
from innet.schemes.modes import plan_run
from tests.test_emulation import _wait_for_state, assert_nothing_left
from topologies import build

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
needs_torch = pytest.mark.skipif(not torch_available(), reason="torch is not installed (pip install -e '.[torch]')")


def _routed_path(commands, src, address):
    """Follow the routing tables the commands install, from ``src`` to ``address``: the nodes passed."""
    owner = {a: n for (n, _), a in link_addresses_of(commands).items()}
    path, node = [src], src
    while owner.get(address) != node:
        route = next(c for c in commands[node] if c.startswith(f"ip route add {address}/32 "))
        node = owner[route.split()[5]]
        assert node not in path, f"routing loop: {path + [node]}"
        path.append(node)
    return path


def link_addresses_of(commands):
    out = {}
    for node, cmds in commands.items():
        for c in cmds:
            if c.startswith("ip addr add "):
                out[(node, c.split()[5])] = c.split()[3].split("/")[0]
    return out


@pytest.mark.parametrize("topo,params", [("star", {"workers": 4}), ("leaf-spine", {"racks": 2, "hosts_per_rack": 2, "spines": 2}),
                                         ("fat-tree", {"k": 4})])
def test_the_ip_network_routes_every_host_to_every_host_through_switches_only(topo, params):
    graph = build(topo, **params)
    commands = ip_commands(graph)
    addresses = link_addresses(graph)
    assert len(set(addresses.values())) == len(addresses) == 2 * graph.number_of_edges()
    for src in hosts(graph):
        for dst in hosts(graph):
            if src != dst:
                path = _routed_path(commands, src, host_address(graph, dst))
                assert path[-1] == dst and all(graph.nodes[n]["role"] != "host" for n in path[1:-1])
                assert len(path) - 1 == len(__import__("networkx").shortest_path(graph, src, dst)) - 1
    forwarding = {n for n, cmds in commands.items() if "sysctl -qw net.ipv4.ip_forward=1" in cmds}
    assert forwarding == {n for n in graph if graph.nodes[n]["role"] not in ("host", "pbox")}


def _gloo_outcomes(run, rp, perturb=0.0):
    tensors = [run.tensors(1, r) for r in range(4)]
    total = np.sum([t[0] for t in tensors], axis=0, dtype=np.float32)  # float32, summed as a ring would
    outcomes = []
    for rank in range(4):
        got = total.copy()
        got[7] += perturb
        outcomes.append(WorkerOutcome(1, rank, [], [got], [0.0], [0.5 + rank / 10], 0))
    return outcomes


def test_gloos_verdict_is_the_float_sum_within_float32_rounding_and_its_bytes_are_the_links_per_direction():
    graph = build("star", workers=4)
    ring = RunSpec(mode="ring", elements=5000)
    rp = plan_run(graph, ring, program_of(ring))
    directions = {("h1", "s1"): 99, ("s1", "h1"): 9, ("h2", "s1"): 98, ("s1", "h2"): 8, ("h3", "s1"): 97,
                  ("s1", "h3"): 7, ("h4", "s1"): 96, ("s1", "h4"): 6, ("p1", "s1"): 0, ("s1", "p1"): 0}
    good = gloo_record(graph, ring, rp, _gloo_outcomes(ring, rp), directions)
    assert good["mode"] == "gloo" and good["correct"] and good["max_abs_error"] < 1e-5, good["errors"]
    assert good["completion_s"] == pytest.approx(0.8) and good["link_bytes"]["h1--s1"] == 108
    assert (good["link_bytes_up"]["h1--s1"], good["link_bytes_down"]["h1--s1"]) == (99, 9)
    assert good["predicted_link_bytes"]["h1--s1"] > 2 * 2 * 3 / 4 * 4 * 5000  # the ring's, both directions
    bad = gloo_record(graph, ring, rp, _gloo_outcomes(ring, rp, perturb=1e-3), directions)
    assert not bad["correct"] and bad["errors"] and bad["max_abs_error"] >= 1e-3 * 0.99


def test_gloo_is_a_backend_not_a_mode():
    """--mode gloo is argparse's one line; gloo's own refusals name the backend."""
    out = subprocess.run([sys.executable, os.path.join(ROOT, "run_topology.py"), "--backend", "local", "--mode", "gloo"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stdout == "" and "--mode: invalid choice: 'gloo'" in out.stderr.splitlines()[-1]
    for given, says in (({"program": "max_allreduce"}, "{backend} gloo sums plain tensors"),
                        ({"mode": "ring"}, "{backend} gloo runs torch.distributed's own all-reduce: it takes no {mode} "
                                           "(got ring)"),
                        ({"placement": "tor"}, "{placement} picks the switches that aggregate: it means nothing with "
                                               "{backend} gloo"),
                        ({"dilation": 2.0}, "{dilation} 2 slows Mininet's clock; gloo's TCP runs undilated")):
        with pytest.raises(UserError) as err:
            validate(RunSpec(backend="gloo", **given))
        assert err.value.args[0].startswith(says), err.value


@pytest.mark.mininet
def test_backend_gloo_on_links_tclink_cannot_shape_is_one_line_before_anything_is_built():
    """gloo runs on undilated links: --bw 2000 suits innet's modes (dilated), not gloo."""
    out = subprocess.run([sys.executable, os.path.join(ROOT, "run_topology.py"), "--backend", "gloo",
                          "--bw", "2000"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.splitlines() == ["error: --backend gloo runs on undilated links, which TCLink shapes up to 1000 Mbit/s; "
                                       "this topology's hosts have 2000 Mbit/s links"]
    assert_nothing_left()


@pytest.mark.mininet
@needs_torch
def test_backend_gloo_sums_like_numpy_and_its_link_bytes_cover_a_ring(tmp_path):
    elements, n = 300000, 3
    out = subprocess.run([sys.executable, os.path.join(ROOT, "run_topology.py"), "--backend", "gloo", "--topo", "star",
                          "--workers", str(n), "--elements", str(elements), "--iterations", "2",
                          "--bw", "200", "--out", str(tmp_path), "--no-plots"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    (run,) = json.loads((tmp_path / "results.json").read_text())["runs"]
    assert (run["mode"], run["backend"]) == ("gloo", "gloo") and run["correct"] and run["completion_s"] > 0, run["errors"]
    exact = np.sum([RunSpec(elements=elements, iterations=2).tensors(1, r)[1].astype(np.float64) for r in range(n)], axis=0)
    assert run["max_abs_error"] <= n * np.finfo(np.float32).eps * np.abs(exact).max() * 4
    ring_payload = 2 * (n - 1) / n * 4 * elements * 2  # per host link: each direction carries 2(N-1)/N of the tensor
    for h in range(1, n + 1):
        assert 2 * ring_payload <= run["link_bytes"][f"h{h}--s1"] <= 2 * ring_payload * 1.3  # both directions, + headers
    assert_nothing_left()


@pytest.mark.mininet
@needs_torch
def test_ddp_through_the_switch_trains_to_plain_ddps_accuracy():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "ddp_digits.py"), "--backend", "mininet",
                          "--procs", "3", "--batch", "30", "--epochs", "10"], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr
    hook = re.search(r"innet hook: test accuracy ([\d.]+) .* (\d+) all-reduces through the switch", out.stdout)
    plain = float(re.search(r"plain DDP:  test accuracy ([\d.]+)", out.stdout).group(1))
    assert int(hook.group(2)) == 10 * (1437 // 30)  # every step's bucket went through the switch
    assert abs(float(hook.group(1)) - plain) <= 0.005 and plain > 0.9, out.stdout
    assert_nothing_left()


@pytest.mark.mininet
@needs_torch
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_ddp_ranks_leave_nothing_behind(sig):
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "scripts", "ddp_digits.py"), "--backend", "mininet",
                             "--procs", "2", "--epochs", "30"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    state = _wait_for_state(proc, hosts=2)  # its ranks run in the worker hosts
    assert sum(1 for name in state["pids"] if name.startswith("innet:h")) == 2  # the ranks are recorded
    proc.send_signal(sig)
    proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert_nothing_left(state)


def test_gloo_is_left_out_of_what_it_cannot_run():
    from innet.planning.rules import gloo_applies

    assert gloo_applies(RunSpec())
    assert gloo_applies(replace(RunSpec(), faults=replace(RunSpec().faults, loss=0.01)))  # the kernel loses as innet's ports do
    for run in (RunSpec(program="max_allreduce"), RunSpec(topk=0.1), RunSpec(jobs=2), RunSpec(train="digits"),
                replace(RunSpec(), faults=replace(RunSpec().faults, loss=0.01, dup=0.01)),
                replace(RunSpec(), link_faults=(("h1--s1", replace(RunSpec().faults, loss=0.01)),))):
        assert not gloo_applies(run)


@pytest.mark.mininet
@needs_torch
def test_the_ring_vs_gloo_script_prints_each_modes_median_and_their_ratio():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "ring_vs_gloo.py"), "--bw", "200", "--repeats", "1",
                          "--elements", "100000", "--modes", "ring", "gloo", "--dilation", "off"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    row = out.stdout.splitlines()[2].split()
    ring, gloo, theory, ratio = (float(x) for x in row[1:5])
    assert row[0] == "200" and theory == pytest.approx(2 * 3 / 4 * 4 * 100000 * 8 / 200e6, abs=1e-3)
    assert ring > 0 and gloo > 0 and ratio == pytest.approx(ring / gloo, rel=0.1)
    assert_nothing_left()


@pytest.mark.mininet
@needs_torch
def test_gloo_under_loss_sums_like_numpy_and_the_script_gives_its_time_over_its_lossless_time():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "ring_vs_gloo.py"), "--bw", "200", "--repeats", "1",
                          "--elements", "100000", "--workers", "3", "--modes", "gloo", "--loss", "0", "0.05"],
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr  # every run's result checked (the script asserts it correct)
    line = next(ln for ln in out.stdout.splitlines() if "loss 0.05 / loss 0:" in ln)
    assert float(re.search(r"gloo ([0-9.]+)x", line).group(1)) > 0.5
    assert_nothing_left()


@needs_torch
def test_ranks_that_do_not_meet_in_time_say_unfinished(tmp_path):
    """A rank whose peers never join (their TCP connects lost, as at 20% loss) says "unfinished", not "ready", and
    exits 5: ``--mode all`` then goes on without gloo (``ranks._start_ranks`` raises Unfinished), where a rank that
    could not start at all fails the run."""
    import socket

    from innet.integrations.ranks.rank import RankConfig

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    conf = RankConfig(rank=0, world=2, port="lo", timeout=2.0, rendezvous=f"tcp://127.0.0.1:{port}",
                      result=str(tmp_path / "r.out"))
    path = tmp_path / "rank.json"
    path.write_text(json.dumps({"rank": 0, "world": 2, "port": "lo", "timeout": 2.0, "rendezvous": conf.rendezvous,
                                "result": conf.result}))
    done = subprocess.run([sys.executable, "-m", "innet.integrations.ranks.rank", str(path)], cwd=ROOT,
                          capture_output=True, timeout=120)
    assert done.returncode == 5, done.stderr.decode()[-2000:]
    assert done.stdout.decode().startswith("unfinished: "), done.stdout
