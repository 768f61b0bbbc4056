"""Node groups (innet.planning.grouping): several switches or workers in one Mininet process, every node still in
its own namespace with its own links; when a run groups its nodes, and that a grouped run is the same run."""

import os
import subprocess
import sys

import pytest

from innet.planning.grouping import group_label, group_size, node_groups, process_count, start_timeout
from innet.planning.memory import MININET_PER_PROCESS, estimate_bytes
from innet.planning.options import parse_node_group
from innet.planning.spec import RunSpec
from topologies import build

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_small_runs_keep_a_process_per_node_and_a_fat_tree_k8_is_grouped():
    assert group_size(20, cores=2) == 1 and group_size(24, cores=2) == 1  # fat-tree k=4: 20 switches, 16 hosts
    assert group_size(80, cores=2) == 10 and process_count(80, cores=2) == 8  # k=8: 80 switches in 8 processes
    assert group_size(127, cores=2) == 16 and process_count(127, cores=2) == 8  # its 127 workers likewise
    assert group_size(80, cores=16) == 1  # a machine with the cores for them runs a process each
    assert group_size(20, cores=2, wanted=4) == 4 and process_count(20, cores=2, wanted=4) == 5
    assert group_size(80, cores=2, wanted=1) == 1
    with pytest.raises(ValueError):
        group_size(8, cores=2, wanted=0)


def test_groups_keep_the_order_and_never_span_two_servers():
    names = [f"h{i}" for i in range(1, 8)]
    assert node_groups(names, 3) == [["h1", "h2", "h3"], ["h4", "h5", "h6"], ["h7"]]
    assert node_groups(names, 1) == [[n] for n in names]
    placement = {n: "s1" if i % 2 else "s2" for i, n in enumerate(names)}
    groups = node_groups(names, 3, placement)
    assert sorted(n for g in groups for n in g) == sorted(names)
    assert all(len({placement[n] for n in g}) == 1 and len(g) <= 3 for g in groups)
    assert [group_label(g) for g in node_groups(names, 3)] == ["h1..h3", "h4..h6", "h7"]


def test_the_start_deadline_grows_with_the_processes_and_the_load():
    assert start_timeout(1, cores=2, load=0.0) == pytest.approx(20.75)
    assert start_timeout(80, cores=2, load=0.0) > start_timeout(8, cores=2, load=0.0)
    assert start_timeout(80, cores=2, load=8.0) == pytest.approx(4 * (start_timeout(80, cores=2, load=0.0) - 20) + 20)


def test_the_flag_and_the_memory_estimate():
    assert parse_node_group("auto") is None and parse_node_group("off") == 1 and parse_node_group("8") == 8
    for bad in ("0", "-2", "x"):
        with pytest.raises(ValueError, match="wants auto, off or a number"):
            parse_node_group(bad)
    k8, run = build("fat-tree", k=8), RunSpec(elements=16384)
    grouped, alone = (estimate_bytes(k8, run, "mininet", g, cores=2) for g in (None, 1))
    assert alone - grouped == MININET_PER_PROCESS * ((80 + 127) - (8 + 8))


@pytest.mark.mininet
def test_a_grouped_fat_tree_k4_is_the_same_run_and_leaves_nothing():
    """Switches 4 to a process and workers likewise: the bytes at every interface are the planner's, every
    switch's CPU is its own, the fidelity record names the groups, and nothing of the run is left."""
    from innet.backends.mininet.emulation import run_mininet
    from tests.test_emulation import assert_nothing_left

    result = run_mininet(build("fat-tree", k=4), RunSpec(elements=30011, min_rto=0.2, initial_rto=1.0, timeout=30),
                         node_group=4)
    assert result["correct"] and result["retransmissions"] == 0, result["errors"]
    assert result["link_bytes"] == result["predicted_link_bytes"]
    shares = result["switch_cpu_share"]  # each switch's own: more different figures than there are groups
    assert len(shares) == 20 and sum(shares.values()) > 0 and len(set(shares.values())) > 5, shares
    assert {"a1..a4", "t1..t4", "c1..c4", "h1..h4"} <= set(result["fidelity"]["cpu"])
    assert_nothing_left()


@pytest.mark.mininet
def test_the_readme_mininet_scale_bench_runs_as_written():
    """README's "Scaling up" Mininet bench, at k=4 with its switches and workers forced 4 to a process: every run
    correct (the bench checks), grouped (the processes its state file recorded), nothing left behind."""
    from tests.test_emulation import assert_nothing_left
    from tests.test_scale import readme_commands

    argv = next(c for c in readme_commands() if c[0] == "sudo")[1:]
    argv = [sys.executable if a == "python" else a for a in argv] + ["--k", "4", "--node-group", "4", "--runs", "1"]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    row = proc.stdout.split("== emulation scale\n")[1].splitlines()[1].split()
    assert row[:3] == ["fat-tree-k4", "innet", "4"], proc.stdout
    left, processes = int(row[-3]), int(row[-2])
    assert left == 0 and processes == 36 + 5 + 4, proc.stdout  # 36 node shells, 5 switch and 4 worker groups
    assert_nothing_left()
