"""The aggregation engine: exactly once at any fan-in, any operator, the batch path equal to the per-packet one."""

import numpy as np
import pytest

from innet import BAND, BOR, MAX, MIN, SUM, Operator
from innet.switch.engine import ADDED, ANSWER, BAD_COUNT, COMPLETE, DUPLICATE, STALE, Engine, new_pool

OPERATORS = [SUM, MAX, MIN, BOR, BAND]
PROD = Operator("prod", "multiply", identity=1, rule="bits", arithmetic="wrap")
COUNT = Operator("count", "add", identity=0, rule="bits", arithmetic="saturate")


@pytest.mark.parametrize("fan_in", [1, 2, 63, 64, 65, 300, 1000, 10000])
def test_a_slot_completes_exactly_when_every_contributor_came_once(fan_in):
    rng = np.random.default_rng(fan_in)
    engine = Engine(new_pool(4, 3, fan_in), SUM)
    values = rng.integers(-1000, 1000, (fan_in, 3)).astype(np.int32)
    arrivals = np.concatenate([rng.permutation(fan_in), rng.integers(0, fan_in, fan_in // 3 + 1)])  # then repeats
    outcomes = [engine.contribute(2, int(w), fan_in, 5, 0, values[w], 0.0) for w in arrivals]
    assert outcomes[:fan_in - 1] == [ADDED] * (fan_in - 1) and outcomes[fan_in - 1] == COMPLETE
    assert set(outcomes[fan_in:]) == {DUPLICATE}  # before the result is out, a repeat is only a duplicate
    engine.finish(2, down=True)
    assert [engine.contribute(2, int(w), fan_in, 5, 0, values[w], 0.0) for w in range(fan_in)] == [ANSWER] * fan_in
    assert np.array_equal(engine.values(2), values.astype(np.int64).sum(axis=0))
    assert engine.missing(2, fan_in) == []


@pytest.mark.parametrize("op", OPERATORS, ids=lambda o: o.name)
def test_every_operator_folds_to_its_numpy_reduction_and_keeps_its_rules(op):
    rng = np.random.default_rng(1)
    values = rng.integers(-(1 << 20), 1 << 20, (5, 64)).astype(np.int32)
    engine = Engine(new_pool(2, 64, 5), op)
    for w in range(5):
        engine.contribute(1, w, 5, 0, w - 2, values[w], 0.0)
    assert np.array_equal(engine.values(1), op.reduce(list(values)))
    assert engine.r.exp[1] == 2  # the exponents' max, whatever the operator
    assert engine.contribute(1, 0, 5, -1, 0, values[0], 0.0) == STALE
    assert engine.contribute(1, 0, 5, 0, 0, values[0], 0.0) == DUPLICATE  # seen, not finished
    engine.contribute(1, 0, 5, 1, 0, values[0], 0.0)  # a new round
    assert engine.contribute(1, 1, 5, 1, 0, values[1, :7], 0.0) == BAD_COUNT


def test_a_sum_that_wraps_int32_is_flagged_and_other_operators_never_overflow():
    big = np.full(4, 2**30 + 5, np.int32)
    for op, flagged in ((SUM, True), (MAX, False), (BOR, False)):
        engine = Engine(new_pool(2, 4, 2), op)
        engine.contribute(0, 0, 2, 0, 0, big, 0.0)
        engine.contribute(0, 1, 2, 0, 0, big, 0.0)
        assert bool(engine.r.overflow[0]) is flagged, op.name


@pytest.mark.parametrize("fan_in", [3, 64, 65, 200])
@pytest.mark.parametrize("op", [SUM, MAX, BOR, PROD, COUNT], ids=lambda o: o.name)
def test_batches_give_the_same_registers_as_single_packets(fan_in, op):
    """Random streams (rounds in order, repeats, retransmissions, stale chunks, mixed rounds, overflow-prone
    values) folded packet by packet in one pool and a block at a time in another: identical registers."""
    rng = np.random.default_rng(fan_in)
    keys, count = 6, 16
    single, batched = (Engine(new_pool(keys, count, fan_in), op) for _ in range(2))
    rounds, given = [0] * keys, [set() for _ in range(keys)]
    completed_single, completed_batched = 0, 0
    for _ in range(60):
        n = int(rng.integers(1, 3 * fan_in))
        rows = []
        for _ in range(n):
            key = int(rng.integers(0, keys))
            who = int(rng.integers(0, fan_in))
            chunk = rounds[key] * keys + key - (2 * keys if rng.random() < 0.03 else 0)
            retx = rng.random() < 0.03
            big = rng.random() < 0.02
            values = rng.integers(-(1 << 30) if big else -999, (1 << 30) if big else 999, count).astype(np.int32)
            rows.append((key, who, chunk, int(rng.integers(-3, 3)), values, not retx))
            given[key].add(who)
            if len(given[key]) == fan_in and rng.random() < 0.7:
                rounds[key], given[key] = rounds[key] + 1, set()
        k, w, c, e, v, plain = (np.array(x) for x in zip(*rows, strict=True))
        for i in range(len(rows)):
            completed_single += single.contribute(int(k[i]), int(w[i]), fan_in, int(c[i]), int(e[i]), v[i], 1.0) == COMPLETE
        folded = batched.contribute_many(k, w, fan_in, c, e.astype(np.int8), v, plain, 1.0)
        completed_batched += len(folded.completed)
        for i in sorted(set(range(len(rows))) - set(folded.taken.tolist())):
            completed_batched += batched.contribute(int(k[i]), int(w[i]), fan_in, int(c[i]), int(e[i]), v[i], 1.0) == COMPLETE
    for name, value in vars(single.r).items():
        assert np.array_equal(value, getattr(batched.r, name)), name
    assert completed_single == completed_batched > 0


def test_a_wrapping_product_and_a_saturating_count_fold_as_numpy_does_on_int32_in_both_paths():
    rng = np.random.default_rng(7)
    values = rng.integers(-(2**31), 2**31, (5, 64)).astype(np.int32)
    product = np.multiply.reduce(values, axis=0, dtype=np.int32)
    count = np.clip(values.view(np.uint32).astype(np.int64).sum(axis=0), 0, 2**32 - 1).astype(np.uint32).view(np.int32)
    assert (count == -1).sum() > 10 and (product != np.prod(values.astype(np.int64), axis=0)).all()
    for op, expected in ((PROD, product), (COUNT, count)):
        single, batched = Engine(new_pool(2, 64, 5), op), Engine(new_pool(2, 64, 5), op)
        for w in range(5):
            single.contribute(1, w, 5, 0, 0, values[w], 0.0)
        folded = batched.contribute_many(np.ones(5, np.int64), np.arange(5), 5, np.zeros(5, np.int64),
                                         np.zeros(5, np.int8), values, np.ones(5, bool), 0.0)
        assert folded.completed.tolist() == [1] and not single.r.overflow[1]
        assert np.array_equal(single.values(1), expected) and np.array_equal(batched.values(1), expected), op.name
