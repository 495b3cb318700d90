from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rl_otel._internal.pipeline.values import SMALL_CPU_TENSOR, BadValue, as_histogram, coerce, flatten


def test_flatten_joins_nested_dicts_with_slashes():
    assert dict(flatten({"a": {"b": 1, "c": {"d": 2}}, "e": 3})) == {"a/b": 1, "a/c/d": 2, "e": 3}


@pytest.mark.parametrize("value,expected", [
    (1, 1.0), (2.5, 2.5), (True, 1.0), (False, 0.0), (np.float32(0.25), 0.25), (np.int64(7), 7.0),
    (np.bool_(True), 1.0), (torch.tensor(0.5), 0.5), (torch.tensor(3, dtype=torch.int64), 3.0),
    (torch.tensor(1.5, dtype=torch.bfloat16), 1.5), (np.array(4.0), 4.0),
])
def test_scalars_become_floats(value, expected):
    assert coerce(value) == expected


def test_nan_and_inf_pass_through():
    assert math.isnan(coerce(float("nan")))
    assert coerce(float("-inf")) == -math.inf
    assert math.isnan(coerce(torch.tensor(float("nan"))))


def test_none_is_skipped():
    assert coerce(None) is None


@pytest.mark.parametrize("value", [torch.tensor([1.0, 2.0]), np.array([1, 2]), [1, 2], (1.0, 2.0),
                                   torch.tensor([1, 2], dtype=torch.float16)])
def test_one_dimensional_values_become_float64_arrays(value):
    out = coerce(value)
    assert isinstance(out, np.ndarray) and out.dtype == np.float64 and out.tolist() == [1.0, 2.0]


@pytest.mark.parametrize("value", ["0.5", object(), 1 + 2j, 10**400, np.zeros((2, 2)), torch.zeros(2, 2),
                                   ["a", "b"], torch.tensor([1j]), np.array(["x"])])
def test_other_values_are_bad(value):
    with pytest.raises(BadValue):
        coerce(value)


@pytest.mark.parametrize("n", [5, 693, SMALL_CPU_TENSOR, SMALL_CPU_TENSOR + 1])
def test_small_and_large_cpu_tensors_bucket_alike(n):
    """A small CPU tensor goes through numpy, a large one through torch: the same counts either way, with
    float32 values on a bound and NaN/Inf left out and counted."""
    import torch

    from rl_otel._internal.pipeline.histogram import BulkHistogram
    from rl_otel.stats.histogram import bucket

    bounds = (-1.0, 0.0, 0.1, 0.5, 2.0)
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=g)
    x[: min(n, 4)] = torch.tensor([0.1, float("nan"), float("inf"), -1.0])[: min(n, 4)]
    via_log = BulkHistogram(bounds)
    non_finite = via_log.add(as_histogram(x, bounds))
    via_torch = bucket(x, bounds)
    assert via_log.counts.tolist() == list(via_torch.counts)
    assert non_finite == via_torch.non_finite
    assert via_log.count == via_torch.count
    assert via_log.sum == pytest.approx(via_torch.sum, rel=1e-9, abs=1e-9)
    assert (via_log.min, via_log.max) == (via_torch.min, via_torch.max)
