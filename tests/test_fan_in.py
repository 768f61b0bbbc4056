"""Any fan-in: more than 64 contributors at one aggregation point, in every mode and placement."""

import pytest

from innet.backends.local.run import run_local
from innet.cli import main
from innet.planning.spec import RunSpec
from topologies import build


@pytest.mark.parametrize("workers", [65, 300, 1000])
@pytest.mark.parametrize("mode", ["innet", "pbox"])
def test_a_star_of_many_workers_is_exact(workers, mode):
    record = run_local(build("star", workers=workers), RunSpec(mode=mode, elements=600))
    assert record["correct"], record["errors"]
    assert record["workers"] == workers


def test_a_ring_of_65_is_exact():
    record = run_local(build("star", workers=65), RunSpec(mode="ring", elements=600))
    assert record["correct"], record["errors"]


@pytest.mark.parametrize("k,mode,placement", [
    *[(8, "innet", p) for p in ("tor", "tree", "root", "pbox")], (8, "pbox", "tor"), (8, "ring", "tor"),
    *[(16, "innet", p) for p in ("tor", "tree", "root")], (16, "pbox", "tor"),  # placement pbox is PBox mode's path
])
def test_fat_trees_are_exact_in_every_mode_and_placement(k, mode, placement):
    """k=8: 128 hosts (root placement: 127 contributors at one core switch); k=16: 1024 hosts (1023 at
    the root). The ring at k=16 is left out: 1023 ranks send O(N^2) packets (a star of 300 takes two minutes);
    so is k=16's pbox placement, which takes PBox mode's path (20 s here)."""
    record = run_local(build("fat-tree", k=k), RunSpec(mode=mode, placement=placement, elements=300))
    assert record["correct"], record["errors"]
    assert record["workers"] == k**3 // 4 - 1


@pytest.mark.parametrize("args", [
    ["--topo", "star", "--workers", "300", "--placement", "root"],
    ["--topo", "fat-tree", "--k", "8", "--mode", "pbox"],
    ["--topo", "star", "--workers", "70", "--pool-slots", "100000"],
])
def test_plan_only_and_a_run_accept_the_same(args, capsys, tmp_path):
    common = ["--backend", "local", "--elements", "300"]
    planned = main([*common, *args, "--plan-only"])  # a plan writes nothing: no --out
    plan_err = capsys.readouterr().err
    ran = main([*common, "--out", str(tmp_path), *args])
    run_err = capsys.readouterr().err
    assert planned == ran
    if planned:
        assert plan_err.strip().splitlines()[-1] == run_err.strip().splitlines()[-1]
