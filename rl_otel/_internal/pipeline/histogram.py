"""Cumulative explicit-bucket histograms filled in bulk: one numpy pass per array, exact counts and sum."""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class BucketCounts:
    """Values already bucketed against ``bounds`` (on a GPU, say): what a histogram needs, without the values.

    ``counts[i]`` counts the finite values ``v`` with ``bounds[i-1] < v <= bounds[i]`` (``counts[-1]``: above the
    last bound), as Prometheus ``le`` buckets do; ``sum``, ``count``, ``min`` and ``max`` are over the same finite
    values (``min``/``max`` are ``inf``/``-inf`` when there are none); ``non_finite`` counts the NaN/±Inf values
    left out. Build one with :func:`rl_otel.stats.bucket` or :meth:`from_vector`.
    """

    bounds: tuple[float, ...]
    counts: np.ndarray
    sum: float
    count: int
    min: float
    max: float
    non_finite: int = 0

    def __post_init__(self) -> None:
        if len(self.counts) != len(self.bounds) + 1:
            raise ValueError(f"{len(self.bounds)} bounds need {len(self.bounds) + 1} bucket counts, "
                             f"got {len(self.counts)}")

    @classmethod
    def from_vector(cls, bounds: Sequence[float], vector: Sequence[float]) -> BucketCounts:
        """From the flat layout ``[count_0 .. count_n, non_finite, sum, min, max]`` (floats holding integers)."""
        n = len(bounds) + 1
        if len(vector) != n + 4:
            raise ValueError(f"a bucket vector for {len(bounds)} bounds has {n + 4} entries, got {len(vector)}")
        counts = np.asarray(vector[:n], dtype=np.float64).round().astype(np.int64)
        return cls(bounds=tuple(float(b) for b in bounds), counts=counts, sum=float(vector[n + 1]),
                   count=int(counts.sum()), min=float(vector[n + 2]), max=float(vector[n + 3]),
                   non_finite=round(vector[n]))


class BulkHistogram:
    """Bucket counts, sum, count, min and max of every finite value observed (Prometheus ``le`` semantics).

    Not thread-safe on its own: the series store calls it under its lock.
    """

    __slots__ = ("_bound_list", "bounds", "count", "counts", "max", "min", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = np.asarray(bounds, dtype=np.float64)
        self._bound_list = self.bounds.tolist()
        self.counts = np.zeros(len(bounds) + 1, dtype=np.int64)
        self.sum = 0.0
        self.count = 0
        self.min = math.inf
        self.max = -math.inf

    def observe(self, values: np.ndarray) -> int:
        """Add every finite value of ``values``; return how many non-finite values were left out."""
        values = np.asarray(values, dtype=np.float64).ravel()
        finite = values[np.isfinite(values)]
        if finite.size:
            # searchsorted(side="left") gives the first bound >= v, i.e. the bucket `le` that counts v.
            self.counts += np.bincount(np.searchsorted(self.bounds, finite, side="left"),
                                       minlength=self.counts.size)
            self.sum += float(finite.sum())
            self.count += int(finite.size)
            self.min = min(self.min, float(finite.min()))
            self.max = max(self.max, float(finite.max()))
        return int(values.size - finite.size)

    def observe_one(self, value: float) -> int:
        """Add one value (a phase's duration): ``bisect`` instead of numpy, whose per-call overhead is ~7 us
        for an array of one; returns 1 if the value was non-finite and left out."""
        if not math.isfinite(value):
            return 1
        self.counts[bisect_left(self._bound_list, value)] += 1  # bisect_left: searchsorted(side="left")
        self.sum += value
        self.count += 1
        if value < self.min:  # comparisons, not min()/max(): this runs four times per phase
            self.min = value
        if value > self.max:
            self.max = value
        return 0

    def merge(self, bucketed: BucketCounts) -> int:
        """Add counts bucketed elsewhere against the same bounds; return its number of non-finite values.

        Raises ``ValueError`` when the bounds differ (merging them would silently misplace every value).
        """
        if len(bucketed.bounds) != self.bounds.size or not np.array_equal(self.bounds, bucketed.bounds):
            raise ValueError(f"bucket bounds {list(bucketed.bounds)} differ from this histogram's "
                             f"{self.bounds.tolist()}")
        if bucketed.count:
            self.counts += np.asarray(bucketed.counts, dtype=np.int64)
            self.sum += bucketed.sum
            self.count += bucketed.count
            self.min = min(self.min, bucketed.min)
            self.max = max(self.max, bucketed.max)
        return bucketed.non_finite

    def add(self, value: float | np.ndarray | BucketCounts) -> int:
        """:meth:`observe_one` a float, :meth:`observe` an array or :meth:`merge` pre-bucketed counts; return the
        non-finite values left out."""
        if isinstance(value, float):
            return self.observe_one(value)
        return self.merge(value) if isinstance(value, BucketCounts) else self.observe(value)
