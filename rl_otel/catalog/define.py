"""Short constructors for catalog entries, and the bucket layouts histograms share."""

from __future__ import annotations

from rl_otel.catalog.spec import Kind, MetricSpec

GIB = float(2**30)
MIN_MAX_MEAN = "{stat:mean|max|min}"

# Explicit histogram bounds (the exporter's default buckets are for milliseconds).
DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                    120.0, 300.0, 600.0, 1800.0, 3600.0)
IMPORTANCE_RATIO_BUCKETS = (0.0, 0.5, 0.8, 0.9, 0.95, 0.98, 1.0, 1.02, 1.05, 1.1, 1.2, 1.5, 2.0, 5.0, 10.0, 100.0)
SIGNED_BUCKETS = (-10.0, -5.0, -2.0, -1.0, -0.5, -0.2, -0.1, -0.05, -0.01, 0.0, 0.01, 0.05, 0.1, 0.2, 0.5, 1.0,
                  2.0, 5.0, 10.0)
KL_BUCKETS = (-1.0, -0.1, -0.01, -0.001, 0.0, 0.001, 0.01, 0.1, 1.0, 10.0)
LOGPROB_BUCKETS = (-20.0, -10.0, -5.0, -3.0, -2.0, -1.0, -0.5, -0.2, -0.1, -0.05, -0.01, 0.0)
LENGTH_BUCKETS = tuple(float(2**i) for i in range(18))  # 1 .. 131072 tokens


def gauge(key: str, name: str, description: str, source: str, *, unit: str = "1", scale: float = 1.0,
          tracker_unit: str = "") -> MetricSpec:
    return MetricSpec(key=key, name=name, kind=Kind.GAUGE, unit=unit, description=description, source=source,
                      scale=scale, tracker_unit=tracker_unit)


def counter(key: str, name: str, description: str, source: str, *, unit: str = "1", scale: float = 1.0,
            tracker_unit: str = "") -> MetricSpec:
    return MetricSpec(key=key, name=name, kind=Kind.COUNTER, unit=unit, description=description, source=source,
                      scale=scale, tracker_unit=tracker_unit)


def histogram(key: str, name: str, description: str, source: str, buckets: tuple[float, ...], *,
              unit: str = "1") -> MetricSpec:
    return MetricSpec(key=key, name=name, kind=Kind.HISTOGRAM, unit=unit, description=description, source=source,
                      buckets=buckets)
