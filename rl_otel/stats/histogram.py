"""Bucket a tensor on its own device: exact Prometheus ``le`` counts, sum, min and max; one small vector crosses.

The per-value path (``Histogram.record`` in a loop) costs microseconds a value; here a 262,144-value tensor is
one ``torch.bucketize`` plus a ``bincount`` and three reductions, and only ``len(bounds) + 5`` numbers reach the
host. The counts are exact: for float32 inputs the bounds are rounded *down* to float32, so ``v <= bound``
holds in float32 exactly when it holds in float64 (what :class:`~rl_otel._internal.pipeline.histogram.BulkHistogram`
computes from the same values).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

import torch

from rl_otel._internal.pipeline.histogram import BucketCounts

_HALF = (torch.float16, torch.bfloat16)


@lru_cache(maxsize=256)
def _bounds(bounds: tuple[float, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    exact = torch.tensor(bounds, dtype=torch.float64)
    if dtype == torch.float64:
        return exact.to(device)
    rounded = exact.to(dtype)
    # The largest representable value <= each bound: then `v <= rounded` iff `v <= exact` for every v of dtype.
    above = rounded.double() > exact
    rounded = torch.where(above, torch.nextafter(rounded, torch.tensor(-torch.inf, dtype=dtype)), rounded)
    return rounded.to(device)


def as_float(x: torch.Tensor) -> torch.Tensor:
    """float16/bfloat16 -> float32 (accumulate in float32), integers/bools -> float64 (exact), else unchanged."""
    if x.dtype in _HALF:
        return x.float()
    if not x.is_floating_point():
        return x.double()
    return x


def _count(idx: torch.Tensor, size: int, *, scatter: bool | None = None) -> torch.Tensor:
    """Occurrences of each index in ``[0, size)``: ``bincount`` on the CPU; elsewhere ``scatter_add_``, because
    ``bincount`` sizes its output from the data, which is a device sync."""
    if scatter is None:
        scatter = idx.device.type != "cpu"
    if scatter:
        return torch.zeros(size, dtype=torch.int64, device=idx.device).scatter_add_(0, idx, torch.ones_like(idx))
    return torch.bincount(idx, minlength=size)


def bucket_vector(values: torch.Tensor, bounds: Sequence[float], mask: torch.Tensor | None = None) -> torch.Tensor:
    """The float64 vector ``[count_0 .. count_n, non_finite, sum, min, max]`` of ``values`` on their device.

    ``mask`` (same number of elements, any dtype; nonzero = counted) selects the values without a boolean
    index, which would synchronize with a GPU. Nothing here leaves the device: concatenate several vectors and
    move them to the host at once, then read each with :meth:`BucketCounts.from_vector`.
    """
    x = as_float(values.detach().reshape(-1))
    nb = len(bounds) + 1
    device = x.device
    if x.numel() == 0:
        tail = torch.tensor([0.0, 0.0, torch.inf, -torch.inf], dtype=torch.float64, device=device)
        return torch.cat([torch.zeros(nb, dtype=torch.float64, device=device), tail])
    finite = torch.isfinite(x)
    if mask is not None:
        selected = mask.detach().reshape(-1).bool()
        valid = finite & selected
        non_finite = (selected & ~finite).sum()
    else:
        valid = finite
        non_finite = x.numel() - finite.sum()
    idx = torch.bucketize(x, _bounds(tuple(float(b) for b in bounds), x.dtype, device))
    idx = torch.where(valid, idx, nb)  # one extra bin for what is not counted
    counts = _count(idx, nb + 1)
    total = torch.where(valid, x, 0.0).sum(dtype=torch.float64)
    lo = torch.where(valid, x, torch.inf).min().double()
    hi = torch.where(valid, x, -torch.inf).max().double()
    return torch.cat([counts[:nb].double(), torch.stack([non_finite.double(), total, lo, hi])])


def _optimistic_vector(x: torch.Tensor, bounds: tuple[float, ...]) -> torch.Tensor:
    """``bucket_vector`` assuming every value is finite: no masks, so no full-size temporaries but the indices."""
    nb = len(bounds) + 1
    counts = _count(torch.bucketize(x, _bounds(bounds, x.dtype, x.device)), nb)
    lo, hi = torch.aminmax(x)
    zero = torch.zeros((), dtype=torch.float64, device=x.device)
    return torch.cat([counts.double(), torch.stack([zero, x.sum(dtype=torch.float64), lo.double(), hi.double()])])


def bucket(values: torch.Tensor, bounds: Sequence[float], mask: torch.Tensor | None = None) -> BucketCounts:
    """Bucket ``values`` (any shape, any device) against ``bounds``: exact counts, sum, count, min and max.

    NaN/±Inf are left out of the buckets and counted in ``non_finite``. One device-to-host transfer of
    ``len(bounds) + 5`` numbers (two when there are non-finite values: the common all-finite case is computed
    without masks, and a NaN or Inf shows up in its min/max, which sends the tensor down the masked path).
    ``log()`` takes the result for a histogram key with the same bounds.
    """
    bounds = tuple(float(b) for b in bounds)
    x = as_float(values.detach().reshape(-1))
    if mask is None and x.numel():
        vector = _optimistic_vector(x, bounds).tolist()
        if math.isfinite(vector[-2]) and math.isfinite(vector[-1]):
            return BucketCounts.from_vector(bounds, vector)
    return BucketCounts.from_vector(bounds, bucket_vector(x, bounds, mask).tolist())
