"""uniform_histogram counts exactly as np.histogram(values, bins=n), and stays valid where numpy refuses."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rl_otel.sinks.uniform_histogram import uniform_histogram

pytestmark = pytest.mark.slow  # the slow layer (tests/conftest.py)

FLOAT_DTYPES = st.sampled_from([np.float64, np.float32, np.float16])


@st.composite
def arrays(draw):
    """Arbitrary finite arrays: any magnitudes, constant arrays, clusters within a few ulps, one element."""
    dtype = draw(FLOAT_DTYPES)
    kind = draw(st.sampled_from(["any", "constant", "tiny", "cluster"]))
    size = draw(st.integers(1, 300))
    finite = hnp.from_dtype(np.dtype(dtype), allow_nan=False, allow_infinity=False)
    if kind == "any":
        return draw(hnp.arrays(dtype, size, elements=finite))
    base = draw(finite)
    if kind == "constant":
        return np.full(size, base, dtype=dtype)
    if kind == "tiny":  # values within a few ulps of each other (stepping towards zero: never to infinity)
        steps = draw(hnp.arrays(np.int64, size, elements=st.integers(0, 8)))
        out = np.full(size, base, dtype=dtype)
        toward = dtype(-np.inf if base > 0 else np.inf)
        for i, n in enumerate(steps):
            for _ in range(n):
                out[i] = np.nextafter(out[i], toward)
        return out
    scale = draw(st.floats(1e-30, 1e30))
    with np.errstate(over="ignore", invalid="ignore"):
        out = (base + scale * draw(hnp.arrays(np.float64, size, elements=st.floats(-1, 1)))).astype(dtype)
    return out[np.isfinite(out)] if np.isfinite(out).any() else np.array([base], dtype=dtype)


def numpy_reference(values: np.ndarray, bins: int):
    try:
        with np.errstate(over="ignore", invalid="ignore"):
            return np.histogram(values, bins=bins)
    except ValueError:  # "Too many bins for data range" (range too narrow or overflowing the dtype)
        return None
    except IndexError:  # one bin over a range overflowing the dtype: numpy's own index computation breaks
        return None


@settings(max_examples=1500, deadline=None)
@given(arrays(), st.integers(1, 100))
@example(np.array([0.0, 1.0, 2.0, 2.0, 3.0]), 10)
@example(np.array([5.0]), 64)
@example(np.full(7, -3.25), 64)
@example(np.array([1.0, 1.0 + 2.0 ** -52]), 64)  # numpy refuses: too narrow for 65 edges
@example(np.array([-1e308, 0.0, 1e308]), 4)  # numpy refuses: hi - lo overflows
@example(np.array([-7.01537869e+294, 1.79769313e+308]), 1)  # numpy raises IndexError
@example(np.array([1.5e-323, 0.0]), 5)  # subnormal range: linspace's edges come out unsorted
@example(np.full(3, 1e20), 8)  # constant so large that +-0.5 does not move it
@example(np.array([0.1, 0.7, 0.3], dtype=np.float32), 3)
def test_counts_equal_np_histogram_and_are_valid_where_numpy_refuses(values, bins):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow RuntimeWarning from the training path either
        h = uniform_histogram(values, bins)
    assert h is not None and h.num == values.size
    assert h.min == float(values.min()) and h.max == float(values.max())
    assert h.counts.shape == (bins,) and h.edges.shape == (bins + 1,)
    ref = numpy_reference(values, bins)
    if ref is not None:
        counts, edges = ref
        assert h.counts.tolist() == counts.tolist()
        assert h.edges.tolist() == edges.tolist() and h.edges.dtype == edges.dtype
    else:  # every value counted once, in a bin whose edges hold it
        assert int(h.counts.sum()) == values.size
        assert np.isfinite(h.edges).all() and (h.edges[1:] >= h.edges[:-1]).all()
        assert h.edges[0] <= h.min and h.edges[-1] >= h.max
    with np.errstate(over="ignore", invalid="ignore"):
        assert h.sum == float(values.sum()) or (np.isnan(h.sum) and np.isnan(float(values.sum())))
        assert h.sum_squares == float(np.dot(values, values))


def test_non_finite_values_are_left_out():
    values = np.array([np.nan, 1.0, np.inf, 2.0, -np.inf, 4.0])
    h = uniform_histogram(values, 3)
    counts, edges = np.histogram(values[np.isfinite(values)], bins=3)
    assert h.counts.tolist() == counts.tolist() and h.edges.tolist() == edges.tolist()
    assert (h.num, h.sum, h.sum_squares, h.min, h.max) == (3, 7.0, 21.0, 1.0, 4.0)


@pytest.mark.parametrize("values", [np.array([]), np.array([np.nan, np.inf, -np.inf])])
def test_no_finite_value_gives_none(values):
    assert uniform_histogram(values, 8) is None


@pytest.mark.filterwarnings("ignore:Converting input from bool")  # numpy's own note on bool input
def test_integer_and_bool_arrays_are_binned_like_numpy():
    for values in (np.arange(17), np.array([True, False, True])):
        counts, edges = np.histogram(values, bins=5)
        h = uniform_histogram(values, 5)
        assert h.counts.tolist() == counts.tolist() and h.edges.tolist() == edges.tolist()
