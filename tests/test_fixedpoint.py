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


@settings(max_examples=60, deadline=None)
@given(arrays(np.float32, st.integers(1, 300), elements=st.floats(width=32, allow_nan=False, allow_infinity=False)),
       st.integers(-160, 160), st.integers(-2**31, 2**31 - 1))
def test_float32_arithmetic_gives_what_float64_gives(values, scale, peak):
    """quantize and dequantize work in float32 where that is exact: the very ints and floats of float64's."""
    try:
        want = np.rint(values.astype(np.float64) * math.ldexp(1.0, scale))
        refused = float(np.max(np.abs(want))) > fixedpoint.INT32_MAX
    except FloatingPointError:
        refused = True
    if refused:
        with pytest.raises(OverflowError):
            fixedpoint.quantize(values, scale)
    else:
        assert np.array_equal(fixedpoint.quantize(values, scale), want.astype(np.int32))
    ints = np.append(values.view(np.int32), np.int32(peak))
    with np.errstate(over="ignore"):
        want_floats = (ints.astype(np.float64) * math.ldexp(1.0, -scale)).astype(np.float32)
        got = fixedpoint.dequantize(ints, scale)
    assert np.array_equal(got, want_floats)
