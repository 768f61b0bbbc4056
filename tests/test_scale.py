"""Scale: routes and root choice as arrays, a 128-host fat-tree exact on the fabric, progress, the memory refusal."""

import io
import json
import os
import random
import re
import subprocess
import sys

import networkx as nx
import numpy as np
import pytest

from innet.backends.local import fabric
from innet.backends.local.run import run_local
from innet.cli import Render
from innet.errors import UserError
from innet.events import Event, Progress
from innet.graph import bfs_parents, is_switch, natural_key, node_indices, routes
from innet.hosts.worker.call import AllreduceCall
from innet.planning import memory, planner
from innet.planning.memory import TORCH_RANK, check_memory, check_torch_ranks, estimate_bytes, torch_ranks_bytes
from innet.planning.spec import RunSpec
from innet.results.metrics import tier_bytes
from innet.switch import runtime
from innet.wire.faults import FaultSpec
from innet.wire.packet import Packet, pack_frames, parse_block
from topologies import build

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def graphs():
    yield build("fat-tree", k=4)
    yield build("leaf-spine", racks=3, hosts_per_rack=2)
    yield build("star", workers=4)
    for seed in range(8):  # irregular switch meshes, hosts hung anywhere
        rng = random.Random(seed)
        g = nx.relabel_nodes(nx.connected_watts_strogatz_graph(20, 4, 0.4, seed=seed), lambda i: f"s{i}")
        nx.set_node_attributes(g, "switch", "role")
        for i in range(8):
            g.add_edge(f"h{i}", f"s{rng.randrange(20)}")
            g.nodes[f"h{i}"]["role"] = "host"
        yield g


def reference_routes(graph, node):
    """The definition: the first hop on bfs_parents' path (neighbours in name order, hosts never relay)."""
    parents = bfs_parents(graph, node)

    def hop(dst):
        return dst if parents[dst] == node else hop(parents[dst])

    return {dst: hop(dst) for dst in parents}


def reference_closest(graph, candidates, workers):
    def cost(s):
        dist = nx.single_source_shortest_path_length(graph, s)
        lengths = [dist.get(w, 10**9) for w in workers]
        return (sum(lengths), max(lengths), natural_key(s))

    return min(candidates, key=cost)


def test_array_routes_and_root_choice_are_the_breadth_first_definitions():
    for g in graphs():
        assert node_indices(g) == {n: i for i, n in enumerate(sorted(g, key=natural_key))}
        for n in g:
            assert routes(g, n) == reference_routes(g, n), n
        hosts = sorted((n for n in g if g.nodes[n]["role"] == "host"), key=natural_key)
        switches = [n for n in g if is_switch(g, n)]
        for workers in (hosts, hosts[::3], hosts[1:2]):
            assert planner._closest_switch(g, switches, workers) == reference_closest(g, switches, workers)


@pytest.mark.parametrize("mode", ["innet", "pbox", "ring"])
def test_a_128_host_fat_tree_is_exact_and_moves_the_predicted_bytes(mode):
    graph = build("fat-tree", k=8)
    result = run_local(graph, RunSpec(mode=mode, elements=1000, seed=3))
    assert result.correct, result.errors  # every worker's sum equals numpy's, integer for integer
    assert len(result.jobs[0].workers) == 127
    assert result["link_bytes"] == result["predicted_link_bytes"]


def record_of(graph, run):
    r = run_local(graph, run)
    assert r.correct, r.errors
    return (r["completion_s"], r["link_bytes"], r["result_digest"], r["retransmissions"], r["drops"],
            [(j["completion_s"], j["retransmissions"]) for j in r["jobs"]])


@pytest.mark.parametrize("faults", [FaultSpec(), FaultSpec(loss=0.03, dup=0.02)])
def test_the_fast_paths_end_where_the_general_ones_do(monkeypatch, faults):
    """A worker's one-frame path, parsed packets' int fields and a clean link's shortcut against the block path,
    the numpy fields and the fault injector: the same virtual times, bytes, results and retransmissions."""
    graph, run = build("leaf-spine", racks=2, hosts_per_rack=3), RunSpec(elements=20000, seed=4, faults=faults)
    fast = record_of(graph, run)
    monkeypatch.setattr(AllreduceCall, "receive",
                        lambda self, frame, now: self.receive_block(parse_block(*pack_frames([frame])), now))
    parse = runtime.parse_frame
    monkeypatch.setattr(runtime, "parse_frame", lambda frame, port=-1: (lambda p: p and Packet(
        p.hdr, p.values, p.port, p.src, p.dst, p.band))(parse(frame, port)))
    monkeypatch.setattr(fabric.LinkDirection, "__post_init__", lambda link: setattr(link, "clean", False))
    assert record_of(graph, run) == fast
    assert fast[3] > 0 if faults.loss else fast[3] == 0


def test_the_calendar_runs_each_instant_in_the_order_it_was_scheduled():
    """Earlier instants first; within one, scheduling order, events added for the instant being run joining its end."""
    fab = fabric.Fabric(build("star", workers=2))
    ran = []

    def event(name, then=None):
        ran.append((fab.now, name))
        if then:
            fab._at(*then)

    fab._at(2.0, event, "c")
    fab._at(1.0, event, "a", (1.0, event, "b2"))
    fab._at(1.0, event, "b")
    fab._at(0.5, event, "x", (0.1, event, "late"))  # in the past: runs now, after what is due now
    fab._at(0.5, event, "y")
    fab.run()
    assert ran == [(0.5, "x"), (0.5, "y"), (0.5, "late"), (1.0, "a"), (1.0, "b"), (1.0, "b2"), (2.0, "c")]


def test_plan_only_predicts_what_the_run_measures():
    graph = build("fat-tree", k=8)
    out = subprocess.run([sys.executable, "run_topology.py", "--backend", "local", "--topo", "fat-tree", "--k", "8",
                          "--plan-only", "--elements", "1000"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    measured = run_local(graph, RunSpec(elements=1000))["link_bytes"]
    for tier, b in tier_bytes(graph, measured).items():
        assert f"{tier:>12}: {b:>12}  (lower bound" in out
    busiest = max(sorted(measured), key=lambda k: measured[k])
    assert f"busiest link {busiest}: {measured[busiest]}" in out


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_progress_is_silent_at_first_then_an_event_every_few_seconds(said):
    clock = Clock()
    progress = Progress("local", after=3, every=5, clock=clock)
    for t in range(0, 20):
        clock.now = t
        progress.update(lambda t=t: f"step {t}")
    assert [e.message for e in said if e.kind == "progress"] == [
        "local: step 3 (3s)", "local: step 8 (8s)", "local: step 13 (13s)", "local: step 18 (18s)"]


def test_the_command_line_draws_progress_in_place_on_a_terminal_and_every_few_seconds_in_a_log():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    clock, tty, log = Clock(), Tty(), io.StringIO()
    on_tty, in_log = Render(tty, clock=clock), Render(log, every=5, clock=clock)
    for t in range(12):
        clock.now = t
        for render in (on_tty, in_log):
            render(Event("progress", f"local: step {t}"))
    on_tty(Event("phase", "done"))
    assert tty.getvalue() == "".join(f"\rlocal: step {t}" for t in range(12)) + "\ninnet: done\n"  # tqdm's line
    assert log.getvalue().splitlines() == ["local: step 0", "local: step 5", "local: step 10"]


def test_a_local_run_reports_its_progress(monkeypatch, said):
    monkeypatch.setattr(fabric, "Progress", lambda label: Progress(label, after=0, every=0))
    assert run_local(build("fat-tree", k=4), RunSpec(elements=524288)).correct  # tens of thousands of events
    lines = [e.message for e in said if e.kind == "progress" and e.message.startswith("local: virtual time")]
    assert lines and lines[-1].endswith("s)") and "/15 hosts done" in lines[-1]


def test_a_run_too_big_for_memory_is_refused_in_one_line_before_anything_is_built(tmp_path):
    out = tmp_path / "results"
    proc = subprocess.run([sys.executable, "run_topology.py", "--backend", "local", "--topo", "fat-tree", "--k", "64",
                           "--elements", "1000000", "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: this run needs about ")
    assert "65535 workers x 1000000 elements" in proc.stderr and "--elements" in proc.stderr
    assert not out.exists()


def test_the_estimate_grows_with_the_job_and_refuses_a_mininet_fat_tree_k16():
    k8 = build("fat-tree", k=8)
    assert estimate_bytes(k8, RunSpec(elements=65536), "local") > estimate_bytes(k8, RunSpec(elements=16384), "local")
    # a process per switch and worker (--node-group off): 1344 of them for k=16 do not fit in 24 GiB
    with pytest.raises(UserError, match="local backend"):
        check_memory(build("fat-tree", k=16), RunSpec(elements=16384), "mininet", available=24 << 30, node_group=1)
    assert check_memory(k8, RunSpec(elements=16384), "local", available=24 << 30) < 1 << 30


def test_torch_ranks_are_counted_and_refused_in_one_line_when_they_cannot_fit():
    assert torch_ranks_bytes(4, 1000) == 4 * (TORCH_RANK + memory.LOCAL_PER_ELEMENT * 1000)
    assert check_torch_ranks(4, 65536, available=24 << 30) > 4 * TORCH_RANK
    with pytest.raises(UserError, match=r"^127 torch ranks need about 33\.\d GiB \(270 MiB each\) but 24\.0 GiB"):
        check_torch_ranks(127, 0, available=24 << 30)
    k8, star = build("fat-tree", k=8), build("star", workers=4)
    gloo, innet = RunSpec(elements=65536, backend="gloo"), RunSpec(elements=65536, mode="innet")
    # gloo's ranks in place of innet's processes: on the fat-tree, ten times innet's estimate, past the machine
    assert estimate_bytes(k8, gloo, "mininet") > 127 * TORCH_RANK > 3 * estimate_bytes(k8, innet, "mininet")
    with pytest.raises(UserError, match="127 workers x 65536 elements, 270 MiB a torch rank"):
        check_memory(k8, gloo, "mininet", available=24 << 30)
    assert check_memory(star, gloo, "mininet", available=24 << 30) < 2 << 30
    assert memory.wont_fit(star, gloo, "mininet", available=24 << 30) == ""
    assert memory.wont_fit(k8, gloo, "mininet", available=24 << 30).startswith("this run needs about 34.")


@pytest.mark.skipif(os.geteuid() != 0, reason="a Mininet spec needs root (nothing is built)")
def test_mode_all_leaves_gloo_out_where_its_ranks_cannot_fit(monkeypatch):
    pytest.importorskip("torch")
    from innet.api import prepare

    monkeypatch.setattr(memory, "available_bytes", lambda: 24 << 30)
    modes = {}
    for topo, size in (("star", {}), ("fat-tree", {"k": 8})):
        prepared = prepare(topo, backend="mininet", mode="all", bw=100, calibrate=False, **size)
        modes[topo] = ([(m.spec.mode, m.spec.backend) for m in prepared.runs], prepared.notes)
    assert modes["star"] == ([("innet", "mininet"), ("pbox", "mininet"), ("ring", "mininet"), ("ring", "gloo")], ())
    assert modes["fat-tree"][0] == [("innet", "mininet"), ("pbox", "mininet"), ("ring", "mininet")]
    assert len(modes["fat-tree"][1]) == 1 and modes["fat-tree"][1][0].startswith("gloo left out: this run needs about 34.")


def test_the_scale_bench_prints_time_memory_and_estimate_for_small_fat_trees():
    proc = subprocess.run([sys.executable, "scripts/bench_scale.py", "--skip-mininet", "--local", "4:2048",
                           "--modes", "innet,ring", "--plan-only-k", "4", "--runs", "1"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, check=True)
    table = proc.stdout.split("== local scale\n")[1].splitlines()
    assert table[0].split() == ["fat-tree", "hosts", "mode", "elements", "wall", "s", "peak", "MiB", "estimate", "MiB"]
    rows = [line.split() for line in table[1:]]
    assert [r[2] for r in rows] == ["innet", "ring", "plan-only"]
    for r in rows[:2]:
        assert float(r[5]) < float(r[6])  # the estimate errs high
    with open(os.path.join(ROOT, "results", "bench.jsonl"), encoding="utf-8") as fh:
        assert "local scale" in [json.loads(line)["bench"] for line in fh.readlines()[-5:]]


def readme_commands():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as fh:
        text = fh.read()
    start = text.index("## Scaling up\n")
    block = re.findall(r"```sh\n(.*?)```", text[start:text.index("\n## ", start + 1)], re.S)[0]
    return [line.split("#")[0].split() for line in block.strip().splitlines()]


def test_the_readme_scaling_commands_run_as_written(tmp_path):
    """Each command of README's "Scaling up", run; the bench at small sizes (its k=32 is the bench's, not a test's).
    The Mininet (sudo) command is run by tests/test_grouping.py."""
    commands = readme_commands()
    assert len(commands) == 5 and sum(argv[0] == "sudo" for argv in commands) == 1
    for argv in (c for c in commands if c[0] != "sudo"):
        argv = [sys.executable if a == "python" else a for a in argv]
        if "scripts/bench_scale.py" in argv:
            argv += ["--local", "4:2048", "--plan-only-k", "4", "--runs", "1"]
        elif "--plan-only" not in argv:
            argv += ["--no-plots", "--out", str(tmp_path / "out")]
        proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600)
        if "1000000" in argv:
            assert proc.returncode == 2 and "needs about 1507" in proc.stderr  # the figure the README quotes
        else:
            assert proc.returncode == 0, proc.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="a Mininet spec needs root (nothing is built)")
def test_mode_all_goes_on_without_a_gloo_that_did_not_finish(monkeypatch):
    """At 20% loss gloo's TCP did not finish within its ranks' limit: --mode all reports innet's three modes and
    says in one line that gloo is left out; --backend gloo alone still ends with the error."""
    pytest.importorskip("torch")
    import innet
    from innet import api
    from innet.errors import Unfinished

    def gloo(prepared, m):  # gloo's ranks out of time
        raise Unfinished("torch ranks did not finish within 130s")

    def mininet(prepared, m):  # innet's modes on the local fabric
        return api.BACKENDS["local"](prepared, m)

    monkeypatch.setitem(api.BACKENDS, "gloo", gloo)
    monkeypatch.setitem(api.BACKENDS, "mininet", mininet)
    events = []
    report = innet.run("star", backend="mininet", mode="all", bw=100, workers=4, elements=4099, loss=0.2, plots=False,
                       dilation="off", on_event=events.append)
    assert [r.mode for r in report.runs] == ["innet", "pbox", "ring"] and all(r.correct for r in report.runs)
    warnings = [e.message for e in events if e.kind == "warning"]
    assert warnings == ["gloo left out: torch ranks did not finish within 130s at 20% loss"], events
    with pytest.raises(Unfinished):
        innet.run("star", backend="gloo", bw=100, workers=4, elements=4099, loss=0.2, plots=False,
                  dilation="off")


@pytest.mark.parametrize("topo", ("fat-tree", "topologies/examples/aarnet.graphml"))
@pytest.mark.parametrize("mode", ("innet", "pbox", "ring"))
def test_initial_rtos_equal_a_search_from_every_worker(topo, mode):
    """configs.initial_rtos searches once per switch the workers hang off (a search per worker took over ten
    minutes for a k=32 plan); each worker's RTO is still four round trips to its farthest peer, as a search from
    the worker itself finds it."""
    from innet.api import spec_of
    from innet.planning.configs import PAYLOAD_OFFSET, initial_rtos
    from innet.schemes.modes import plan_run
    from innet.switch.loader import load_program

    spec, graph = spec_of(topo, backend="local", mode=mode, elements=100001, delay=0.0005)
    plan = plan_run(graph, spec, load_program(spec.program)).plans[0]
    got, bits = initial_rtos(graph, plan, 2048, spec), 8 * (PAYLOAD_OFFSET + 4 * 2048)
    for w in plan.workers:
        far = nx.single_source_dijkstra_path_length(
            graph, w, weight=lambda u, v, d: d.get("latency", 0.0) + 0.0005 + bits / (d.get("bw", 1000.0) * 1e6))
        want = max(spec.min_rto, 8 * max(far[n] for n in (plan.root, plan.pbox, *plan.workers) if n in far))
        assert got[w] == pytest.approx(want, rel=1e-12), w


@pytest.mark.parametrize("multihomed", (False, True))
def test_graph_distances_equal_dijkstra_from_each_source(multihomed):
    """GraphIndex.distances (all sources at once; over switches only when every host has one link) finds what a
    dijkstra from each source finds, on random link costs, from switches and from hosts; inf where unreachable."""
    from innet.graph import indexed

    graph = build("fat-tree", k=4)
    rng = random.Random(7)
    for _, _, d in graph.edges(data=True):
        d["latency"] = rng.uniform(1e-6, 1e-3)
    if multihomed:  # h1 on two ToRs: a host relays, so the search runs over every node
        graph.add_edge("h1", max((n for n in graph if graph.nodes[n]["role"] == "tor"), key=natural_key), latency=1e-7)
    graph.add_node("x1", role="switch")  # linked to nothing
    ix = indexed(graph)
    weights = [graph.edges[v, ix.names[u]]["latency"] for v in ix.names
               for u in ix.indices[ix.indptr[ix.index[v]]:ix.indptr[ix.index[v] + 1]]]
    for sources in (sorted(rng.sample(np.flatnonzero(ix.switch).tolist(), 8)), sorted(rng.sample(range(len(ix.names)), 8))):
        got = ix.distances(np.array(sources), np.array(weights))
        for row, src in zip(got, sources, strict=True):
            want = nx.single_source_dijkstra_path_length(graph, ix.names[src], weight="latency")
            assert {n: c for n, c in zip(ix.names, row.tolist(), strict=True) if c < np.inf} == pytest.approx(want, rel=1e-12)
