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
rather than raising on the training path: halved values for an overflowing range, repeated edges for a tiny one
(a constant array too large for +-0.5 to widen lands in the last bin).
"""

from __future__ import annotations

import functools
import math
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
    if not (math.isfinite(lo) and math.isfinite(hi)):  # a NaN or an infinity somewhere: drop the non-finite values
        a = a[np.isfinite(a)]
        if a.size == 0:
            return None
        lo, hi = a.min(), a.max()
    if lo == hi:  # np.histogram's range for a constant array
        first, last = lo - 0.5, hi + 0.5
    else:
        first, last = lo, hi
    if a.dtype == np.float64:  # Python floats are float64: the same arithmetic, without np.errstate's ~1.5 us
        wide = math.isinf(float(last) - float(first))
        m = max(-float(lo), float(hi))
        big = m * m * a.size >= 1e300  # (Python's ** raises OverflowError where * gives inf)
    else:
        with np.errstate(over="ignore", invalid="ignore"):
            wide = not np.isfinite(last - first)
        big = True
    if wide:  # last - first overflows the dtype: bin the halved values (exact for such magnitudes), then unhalve
        counts, edges = _bin(a * 0.5, first * 0.5, last * 0.5, bins)
        edges = edges * 2
    else:
        counts, edges = _bin(a, first, last, bins)
    if big:  # the sums may overflow: inf (or NaN for a sum meeting +inf and -inf), without a RuntimeWarning
        with np.errstate(over="ignore", invalid="ignore"):
            total, squares = float(a.sum()), float(np.dot(a, a))
    else:
        total, squares = float(a.sum()), float(np.dot(a, a))
    return UniformHistogram(counts=counts, edges=edges, num=int(a.size), sum=total, sum_squares=squares,
                            min=float(lo), max=float(hi))


def _linspace(first, last, bins: int, dtype: np.dtype) -> np.ndarray:
    """``np.linspace(first, last, bins + 1, dtype=dtype)`` for scalars of ``dtype``, bit for bit (numpy 2's
    ``_core/function_base.py``), without its ~8 us of argument handling."""
    ramp = _ramp(bins, dtype)[:-1]  # the last edge is `last` itself: bins * step may round past the dtype's max
    delta = last - first
    step = delta / bins
    y = np.empty(bins + 1, dtype=dtype)
    inner = y[:-1]
    if step == 0:  # a subnormal range: numpy divides first
        np.divide(ramp, bins, out=inner)
        inner *= delta
    else:
        np.multiply(ramp, step, out=inner)
    inner += first
    y[-1] = last
    return y


@functools.lru_cache(maxsize=64)
def _ramp(bins: int, dtype: np.dtype) -> np.ndarray:
    ramp = np.arange(0, bins + 1, dtype=dtype)
    ramp.flags.writeable = False
    return ramp


def _bin(a: np.ndarray, first, last, bins: int) -> tuple[np.ndarray, np.ndarray]:
    """numpy's uniform-bin fast path (``numpy/lib/_histograms_impl.py``), for values all within [first, last]."""
    edges = _linspace(first, last, bins, a.dtype)
    np.minimum(edges, last, out=edges)  # subnormal ranges round an inner edge past the last: keep them sorted
    if not last > first:  # a constant too large for +-0.5 to move it: every edge is that value; last bin holds it
        counts = np.zeros(bins, dtype=np.intp)
        counts[-1] = a.size
        return counts, edges
    f = np.subtract(a, first)
    f /= last - first
    f *= bins
    idx = f.astype(np.intp)
    np.minimum(idx, bins - 1, out=idx)  # the maximum lies on the last edge: it belongs to the last bin
    idx -= a < edges[idx]  # the estimate can be one bin off near an edge: correct against the edges themselves
    upper = edges[1:].copy()
    upper[-1] = np.inf  # numpy's "and not in the last bin": the last bin includes its right edge
    idx += a >= upper[idx]
    return np.bincount(idx, minlength=bins), edges
