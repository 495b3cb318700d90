"""Cumulative explicit-bucket histograms filled in bulk: one numpy pass per array, exact counts and sum."""

from __future__ import annotations

import math

import numpy as np


class BulkHistogram:
    """Bucket counts, sum, count, min and max of every finite value observed (Prometheus ``le`` semantics).

    Not thread-safe on its own: the series store calls it under its lock.
    """

    __slots__ = ("bounds", "counts", "sum", "count", "min", "max")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = np.asarray(bounds, dtype=np.float64)
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
