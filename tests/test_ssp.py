"""Training against the PBox under BSP, SSP and ASP: exact parameters, the staleness bound, stragglers."""

import numpy as np
import pytest

from innet.backends.local.run import run_local
from innet.cli import main
from innet.hosts.ssp import Consistency, ParameterKeys
from innet.planning.spec import RunSpec
from innet.wire.faults import FaultSpec
from innet.wire.packet import RESULT, parse_frame
from topologies import build

STRAGGLERS = (("h2", 4.0, 0.3), ("h3", 4.0, 0.3))


def train(model, staleness=0, seed=0, loss=0.0, iterations=12, stragglers=STRAGGLERS, topo="leaf-spine"):
    run = RunSpec(mode="pbox", consistency=model, staleness=staleness, iterations=iterations, elements=3000,
                  compute_time=0.01, stragglers=stragglers, seed=seed, faults=FaultSpec(loss=loss), timeout=30)
    return run_local(build(topo), run)


def answers(frames):
    return [(p.rank, p.chunk, p.values.tolist()) for p in map(parse_frame, frames)]


def test_a_push_waits_exactly_as_long_as_the_bound_says():
    """Two workers, one key of 2 values, s = 1: rank 0 may read iteration 1 before rank 1 pushed
    iteration 1, but not iteration 2 before rank 1 pushed iteration 1 (worked by hand)."""
    keys = ParameterKeys({0: 10, 1: 11}, elements=2, slots=4, node=20, job=1, cons=Consistency("ssp", 1, 3, 2))
    assert keys.receive(0, 0, 5, np.zeros(0, np.int32)) == []
    [a, b] = keys.receive(1, 0, 7, np.zeros(0, np.int32))  # the exponent: the max, to both
    assert [parse_frame(f).exp for f in (a, b)] == [7, 7]
    push = lambda rank, t, v: answers(keys.receive(rank, 1 + t, 0, np.array(v, np.int32)))  # noqa: E731
    assert push(0, 0, [1, 2]) == [(0, 1, [0, 1, 2])]  # t=0 needs clock >= 0: answered at once, clock 0
    assert push(0, 1, [10, 20]) == [(0, 2, [])]  # t=1 needs clock >= 1: acknowledged, waits for rank 1
    assert push(0, 1, [10, 20]) == [(0, 2, [])]  # its retransmission: acknowledged again, not added twice
    # rank 1's t=0 lifts the clock to 1: its own read (staleness 0) and rank 0's waiting t=1 (staleness 1)
    assert sorted(push(1, 0, [100, 200])) == [(0, 2, [1, 111, 222]), (1, 1, [1, 111, 222])]
    assert push(0, 2, [0, 0]) == [(0, 3, [])]  # t=2 needs clock >= 2
    assert push(0, 3, []) == [(0, 4, [])]  # the final read is BSP: it waits for everyone's last iteration
    assert push(1, 1, [1000, 2000]) == [(0, 3, [2, 1111, 2222]), (1, 2, [2, 1111, 2222])]
    assert push(0, 1, [10, 20]) == [(0, 2, [2, 1111, 2222])]  # a lost answer is given again
    push(1, 2, [0, 0])
    assert sorted(push(1, 3, [])) == [(0, 4, [4, 1111, 2222]), (1, 4, [4, 1111, 2222])]
    assert all(parse_frame(f).has(RESULT) for f in keys.receive(1, 4, 0, np.zeros(0, np.int32)))


@pytest.mark.parametrize("model,staleness", [("bsp", 0), ("ssp", 1), ("ssp", 3)])
@pytest.mark.parametrize("seed", range(3))
def test_every_read_is_within_the_bound_and_the_parameters_are_exact(model, staleness, seed):
    result = train(model, staleness, seed)
    assert result["correct"], result["errors"]
    assert result["max_staleness"] <= staleness and result["staleness_bound"] == staleness
    if model == "ssp":
        assert result["max_staleness"] == staleness  # the stragglers push the fast workers to the bound


def test_asp_is_unbounded_and_fastest_bsp_slowest():
    bsp, ssp, asp = train("bsp"), train("ssp", 2), train("asp")
    assert all(r["correct"] for r in (bsp, ssp, asp))
    assert asp["staleness_bound"] is None and asp["max_staleness"] > 2
    assert bsp["iterations_per_s"] < ssp["iterations_per_s"] < asp["iterations_per_s"]
    # without stragglers every worker keeps the same pace: nothing to gain, nothing stale
    even = train("ssp", 2, stragglers=())
    assert even["correct"] and even["max_staleness"] <= 1


@pytest.mark.parametrize("model,staleness", [("ssp", 2), ("asp", 0)])
def test_lossy_links_lose_no_update(model, staleness):
    result = train(model, staleness, loss=0.05, iterations=6)
    assert result["correct"], result["errors"]
    assert result["retransmissions"] > 0
    assert model == "asp" or result["max_staleness"] <= staleness


def test_consistency_flags_are_checked(capsys):
    assert main(["--backend", "local", "--mode", "innet", "--consistency", "ssp", "--no-plots"]) == 2
    assert "--consistency trains against the PBox" in capsys.readouterr().err
    assert main(["--backend", "local", "--mode", "pbox", "--consistency", "ssp", "--straggler", "h2:0.5",
                 "--no-plots"]) == 2
    assert "argument --straggler: wants a host, a factor of at least 1" in capsys.readouterr().err
