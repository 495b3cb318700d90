"""Equal-width bins over a value array's own range, counted exactly as ``np.histogram(values, bins=n)`` counts.

The TensorBoard sink draws a histogram per distribution key every step. ``np.histogram`` costs ~70 us for a few
hundred values, nearly all of it Python-level checks and dispatch (range validation, weights handling, block
loop); the sink then needed separate passes for the finite filter, min, max, sum and sum of squares. This does
only the array passes the result needs, and reuses the min/max it computes anyway as the range and as the
finite check (``min``/``max`` are NaN or infinite exactly when some value is).

The bin of each value follows numpy's uniform-bin algorithm step for step, so the counts are identical: an
estimated index ``(x - lo) / (hi - lo) * n``, the maximum moved into the last bin, then a one-bin correction
against the edges (``np.linspace``), whose rounding can disagree with the estimate by one ulp. A constant array
gets numpy's range ``lo - 0.5 .. hi + 0.5``. Where numpy refuses (a range too wide for the dtype, or too narrow
for ``n`` distinct edges: "Too many bins for data range"), this still returns a valid histogram of every value
rather than raising on the training path: halved values for an overflowing range, repeated edges for a tiny one (a constant array too large for +-0.5 to widen lands in the last bin).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class UniformHistogram:
    """``counts[i]`` finite values in ``[edges[i], edges[i+1])`` (the last bin includes its right edge), and the
    count, sum, sum of squares, min and max of those finite values."""

    counts: np.ndarray  # int64, one per bin
    edges: np.ndarray  # bins + 1 edges, in the values' float dtype
    num: int
    sum: float
    sum_squares: float
    min: float
    max: float


def uniform_histogram(values: np.ndarray, bins: int) -> UniformHistogram | None:
    """The histogram of the finite values of ``values`` in ``bins`` equal bins; ``None`` if none is finite."""
    a = np.asarray(values).ravel()
    if a.dtype.kind != "f":  # ints and bools: np.histogram bins them as float64
        a = a.astype(np.float64)
    if a.size == 0:
        return None
    lo, hi = a.min(), a.max()
    if not (np.isfinite(lo) and np.isfinite(hi)):  # a NaN or an infinity somewhere: drop the non-finite values
        a = a[np.isfinite(a)]
        if a.size == 0:
            return None
        lo, hi = a.min(), a.max()
    if lo == hi:  # np.histogram's range for a constant array
        first, last = lo - 0.5, hi + 0.5
    else:
        first, last = lo, hi
    with np.errstate(over="ignore", invalid="ignore"):
        wide = not np.isfinite(last - first)
    if wide:  # last - first overflows the dtype: bin the halved values (exact for such magnitudes), then unhalve
        counts, edges = _bin(a * 0.5, first * 0.5, last * 0.5, bins)
        edges = edges * 2
    else:
        counts, edges = _bin(a, first, last, bins)
    with np.errstate(over="ignore"):  # huge values: an infinite sum of squares, as np.dot gives, without a warning
        total, squares = float(a.sum()), float(np.dot(a, a))
    return UniformHistogram(counts=counts, edges=edges, num=int(a.size), sum=total, sum_squares=squares,
                            min=float(lo), max=float(hi))


def _bin(a: np.ndarray, first, last, bins: int) -> tuple[np.ndarray, np.ndarray]:
    """numpy's uniform-bin fast path (``numpy/lib/_histograms_impl.py``), for values all within [first, last]."""
    edges = np.linspace(first, last, bins + 1, endpoint=True, dtype=a.dtype)
    np.minimum(edges, last, out=edges)  # subnormal ranges round an inner edge past the last: keep them sorted
    if not last > first:  # a constant too large for +-0.5 to move it: every edge is that value; last bin holds it
        counts = np.zeros(bins, dtype=np.intp)
        counts[-1] = a.size
        return counts, edges
    f = np.subtract(a, first)
    f /= last - first
    f *= bins
    idx = f.astype(np.intp)
    idx[idx == bins] = bins - 1  # the maximum lies on the last edge: it belongs to the last bin
    idx -= a < edges[idx]  # the estimate can be one bin off near an edge: correct against the edges themselves
    idx += (a >= edges[idx + 1]) & (idx != bins - 1)
    return np.bincount(idx, minlength=bins), edges
