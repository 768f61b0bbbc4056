import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from innet.errors import UserError
from innet.wire import fixedpoint


def test_magnitude_exponent():
    assert fixedpoint.magnitude_exponent(np.array([0.5], np.float32)) == 0
    assert fixedpoint.magnitude_exponent(np.array([-3.0, 1.0], np.float32)) == 2
    assert fixedpoint.magnitude_exponent(np.zeros(3, np.float32)) == fixedpoint.EXP_MIN


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_and_inf_are_refused(bad):
    with pytest.raises(UserError, match="NaN or Inf"):
        fixedpoint.magnitude_exponent(np.array([1.0, bad], np.float32))


def test_quantize_refuses_what_does_not_fit():
    with pytest.raises(OverflowError):
        fixedpoint.quantize(np.array([2.0**31], np.float64), 0)


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(1, 32),
    data=arrays(np.float32, st.integers(1, 64), elements=st.floats(-1e6, 1e6, width=32)),
    seed=st.integers(0, 2**16),
)
def test_sum_is_exact_and_error_within_documented_bound(n, data, seed):
    rng = np.random.default_rng(seed)
    inputs = [data * np.float32(rng.uniform(0.01, 1)) for _ in range(n)]
    q = max(fixedpoint.magnitude_exponent(x) for x in inputs)
    scale = fixedpoint.scale_for(q, n)
    ints = [fixedpoint.quantize(x, scale).astype(np.int64) for x in inputs]
    total = np.sum(ints, axis=0)
    assert np.all(np.abs(total) < 2**31)  # the agreed scale cannot overflow int32
    true_sum = np.sum([x.astype(np.float64) for x in inputs], axis=0)
    err = np.abs(fixedpoint.dequantize(total, scale).astype(np.float64) - true_sum)
    assert np.all(err <= fixedpoint.error_bound(true_sum, scale, n))


def test_error_bound_formula():
    # N=4 workers, scale 20: each value off by <= 2**-21, four of them, plus float32 rounding.
    bound = fixedpoint.error_bound(np.array([0.0, 1.0]), 20, 4)
    assert bound[0] == 4 * 2.0**-21
    assert math.isclose(bound[1], 4 * 2.0**-21 + 2.0**-24)
