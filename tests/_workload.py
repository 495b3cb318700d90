"""A full-catalog training step whose every value encodes its step, shared by the load and memory tests and their
benchmarks: a scrape can then be decoded back to the step each series came from, so a torn or lost write shows.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rl_otel.catalog import Catalog, Kind, default_catalog

SEED_KEYS = Path(__file__).parent / "data" / "seed_keys.txt"
DIST_SIZE = 4  # values per distribution key per step


def seed_keys() -> list[str]:
    """The 438 concrete keys of the seeds (ROLL, TRL, Trinity-RFT): every catalog entry, templates filled in."""
    lines = SEED_KEYS.read_text().splitlines()
    return [line for line in lines if line and not line.startswith("#")]


class FullStep:
    """``step(n)`` is one step of every seed key: scalar ``n + i/1000`` for the i-th key (monotonic, so counters
    stay counters), ``DIST_SIZE`` values for a distribution key. ``decode`` maps a scrape back to steps."""

    def __init__(self, keys: list[str] | None = None, catalog: Catalog | None = None) -> None:
        self.keys = keys if keys is not None else seed_keys()
        catalog = catalog or default_catalog()
        # (+Inf bucket sample, labels) -> key: histograms with a negative bound have no _count (see README)
        self.histograms: dict[tuple[str, tuple], str] = {}
        self.scalars: dict[tuple[str, tuple], tuple[int, float]] = {}  # (sample, labels) -> (key index, scale)
        for i, key in enumerate(self.keys):
            res = catalog.resolve(key)
            labels = tuple(sorted(res.labels))
            if res.spec.kind is Kind.HISTOGRAM:
                self.histograms[(res.spec.name + "_bucket", tuple(sorted((*labels, ("le", "+Inf")))))] = key
            else:  # a later key with the same series overwrites an earlier one, as in the store
                self.scalars[(res.spec.prometheus_name, labels)] = (i, res.spec.scale)
        self._is_hist = [catalog.resolve(k).spec.kind is Kind.HISTOGRAM for k in self.keys]
        self._dist = np.linspace(0.0, 1.0, DIST_SIZE)

    def step(self, n: int) -> dict[str, object]:
        return {key: (self._dist + n if hist else n + i / 1000) for i, (key, hist) in
                enumerate(zip(self.keys, self._is_hist, strict=True))}

    def decode(self, series: dict[tuple[str, tuple], float]) -> dict[tuple[str, tuple], int]:
        """``{series: step}`` for every seed series in ``series`` (``{(sample, labels): value}``, labels without
        run/rank); a value that is not exactly what some step wrote raises ``AssertionError``."""
        steps = {}
        for sid, value in series.items():
            if sid in self.scalars:
                i, scale = self.scalars[sid]
                n = round(value / scale - i / 1000)
                assert value == (n + i / 1000) * scale, (sid, value)
                steps[sid] = n
            elif sid in self.histograms:
                assert value % DIST_SIZE == 0, (sid, value)
                steps[sid] = int(value) // DIST_SIZE - 1
        return steps
