"""Collectives as values: shards, what each rank streams and keeps, and every collective exact on the fabric
in every mode against numpy (bit sets: exact integers, no fixed point between them and the reference)."""

import numpy as np
import pytest

from innet.api import spec_of
from innet.backends.local.run import LocalRun
from innet.errors import UserError
from innet.planning.spec import make_bitsets
from innet.results.check import outcome_of
from innet.wire.collectives import ALL_GATHER, ALLREDUCE, BARRIER, BROADCAST, COLLECTIVES, REDUCE, REDUCE_SCATTER, Collective
from innet.wire.operators import BOR, SUM

MODES = ("innet", "pbox", "ring")


def test_shards_are_whole_packets_and_cover_the_tensor():
    b = Collective.shards(1_000_003, 8, 2048)
    assert b[0] == 0 and b[-1] == 1_000_003 and (np.diff(b) >= 0).all()
    assert all(x % 2048 == 0 for x in b[:-1])
    chunks = -(-1_000_003 // 2048)
    owners = Collective.owner_of(chunks, 8)
    counts = [int(np.sum(owners == r)) for r in range(8)]
    assert sum(counts) == chunks and max(counts) - min(counts) == 1 and (np.diff(owners) >= 0).all()
    for r in range(8):  # each chunk's owner holds it in its shard
        assert {int(c) for c in np.flatnonzero(owners == r)} == set(range(b[r] // 2048, -(-b[r + 1] // 2048)))


def test_streams_and_kept():
    t = np.arange(10, dtype=np.float32) + 1
    assert ALL_GATHER.contribution(t, 1, 2, 0, 4, 0.0).tolist() == [0, 0, 0, 0, 5, 6, 7, 8, 9, 10]
    assert BROADCAST.contribution(t, 1, 2, 1, 4, 0.0).tolist() == t.tolist()
    assert not BROADCAST.contribution(t, 0, 2, 1, 4, 0.0).any()
    assert BARRIER.contribution(t, 0, 2, 0, 4, 0.0).size == 0
    assert REDUCE_SCATTER.kept(t, 0, 2, 0, 4).tolist() == [1, 2, 3, 4]
    assert REDUCE.kept(t, 0, 2, 1, 4).size == 0 and REDUCE.kept(t, 1, 2, 1, 4).size == 10
    assert ALLREDUCE.streams([t], 0, 2, 0, 4, SUM)[0] is t
    assert BOR.identity == ALL_GATHER.streams([t.astype(np.int32)], 1, 2, 0, 4, BOR)[0][0]
    assert REDUCE_SCATTER.routed and REDUCE.rooted and not ALL_GATHER.combines and not BARRIER.payload


def reference(name, inputs, rank, root, unit):
    """What rank ``rank`` must hold, from numpy alone (bit sets: or)."""
    n = len(inputs)
    whole = np.bitwise_or.reduce(np.stack(inputs), axis=0)
    b = Collective.shards(len(inputs[0]), n, unit)
    if name == "reduce_scatter":
        return whole[b[rank] : b[rank + 1]]
    if name == "reduce":
        return whole if rank == root else whole[:0]
    if name == "all_gather":
        return np.concatenate([inputs[r][b[r] : b[r + 1]] for r in range(n)])
    if name == "broadcast":
        return inputs[root]
    return whole[:0] if name == "barrier" else whole


def run_ranks(topology, **options):
    spec, graph = spec_of(topology, default_backend="local", plots=False, **options)
    local = LocalRun(graph, spec)
    record = local.finish()
    return spec, record, {(p.spec.job, p.spec.rank): outcome_of(p).ints for p in local.procs}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", COLLECTIVES)
def test_every_collective_exact_against_numpy(mode, name):
    """Bit sets over a tensor of uneven shards (5 workers, 3 packets of 512 and a short one)."""
    root = 3 if name in ("broadcast", "reduce") else 0
    spec, record, got = run_ranks("star", workers=5, elements=1800, mode=mode, collective=name, program="or_allreduce",
                                  packet_elements=512, **({"root": root} if root else {}))
    assert record.correct, record.errors
    inputs = [make_bitsets(0, 1, r, [1800])[0] for r in range(5)]
    for r in range(5):
        assert np.array_equal(got[1, r][0], reference(name, inputs, r, root, 512)), (mode, name, r)


@pytest.mark.parametrize("name", ("reduce_scatter", "all_gather", "broadcast", "reduce", "barrier"))
def test_collectives_exact_under_faults_on_a_tree_with_two_jobs(name):
    for mode in MODES:
        _, record, _ = run_ranks("leaf-spine", elements=30_001, mode=mode, collective=name, jobs=2, placement="tor"
                                 if mode == "innet" else "auto", loss=0.2, dup=0.05, reorder=0.05)
        assert record.correct, (mode, record.errors)


def test_rules_are_one_line_errors():
    with pytest.raises(UserError, match="root"):
        spec_of("star", default_backend="local", collective="allreduce", root=1)
    with pytest.raises(UserError, match="not a rank"):
        spec_of("star", default_backend="local", collective="broadcast", root=9)
    with pytest.raises(UserError, match="identity is no float"):
        spec_of("star", default_backend="local", collective="all_gather", program="max_allreduce")
    with pytest.raises(UserError, match="workload"):
        spec_of("star", default_backend="local", collective="reduce_scatter", workload="resnet50")
