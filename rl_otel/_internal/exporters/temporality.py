"""The store's cumulative series as delta points, for an exporter that prefers delta temporality.

The series store keeps cumulative values (a counter's total, a histogram's counts since the start), which is what
Prometheus wants. A backend that wants deltas (``OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE=delta``, or an
exporter constructed with ``preferred_temporality``) gets, per series, what changed since the previous export:
the point's start is the previous export's time, its end the time of this one. The first export of a series
covers everything since the series started (its start: the previous export's time when there was one, else the
family's start). A value below the previous one is a reset (a series that expired and came back): the new
value is the delta. A histogram's ``min``/``max`` are sent only when known for the interval (the cumulative
minimum fell, or maximum rose, in it); otherwise they are left out of the point, which OTLP allows.

One converter per exporter; not thread-safe (the SDK's periodic reader serializes its exports).
"""

from __future__ import annotations

import math
from dataclasses import replace

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Histogram,
    HistogramDataPoint,
    Metric,
    NumberDataPoint,
    Sum,
)

_Key = tuple[str, tuple[tuple[str, object], ...]]


class DeltaConverter:
    """Turns cumulative ``Sum`` (``counters``) and ``Histogram`` (``histograms``) metrics into delta ones."""

    def __init__(self, *, counters: bool, histograms: bool) -> None:
        self.counters, self.histograms = counters, histograms
        self._last: dict[_Key, tuple[int, object]] = {}  # series -> (time of its last export, cumulative point)
        self._last_export_ns: int | None = None

    def convert(self, metrics: list[Metric]) -> list[Metric]:
        seen: dict[_Key, tuple[int, object]] = {}
        out, export_ns = [], None
        for metric in metrics:
            data = metric.data
            if self.counters and isinstance(data, Sum) and data.aggregation_temporality is \
                    AggregationTemporality.CUMULATIVE:
                points = [self._sum_point(metric.name, p, seen) for p in data.data_points]
                metric = replace(metric, data=replace(data, data_points=points,
                                                      aggregation_temporality=AggregationTemporality.DELTA))
            elif self.histograms and isinstance(data, Histogram) and data.aggregation_temporality is \
                    AggregationTemporality.CUMULATIVE:
                points = [self._histogram_point(metric.name, p, seen) for p in data.data_points]
                metric = replace(metric, data=replace(data, data_points=points,
                                                      aggregation_temporality=AggregationTemporality.DELTA))
            else:
                out.append(metric)
                continue
            out.append(metric)
            if points:
                export_ns = points[0].time_unix_nano
        self._last = seen  # series not exported this time are forgotten: the state stays as large as the store
        if export_ns is not None:
            self._last_export_ns = export_ns
        return out

    def _start(self, key: _Key, point: NumberDataPoint | HistogramDataPoint) -> tuple[int, object | None]:
        last = self._last.get(key)
        if last is not None:
            return last
        return (point.start_time_unix_nano if self._last_export_ns is None else self._last_export_ns), None

    def _sum_point(self, name: str, point: NumberDataPoint, seen: dict) -> NumberDataPoint:
        key = (name, tuple(sorted(point.attributes.items())))
        start, previous = self._start(key, point)
        seen[key] = (point.time_unix_nano, point)
        value = point.value
        if previous is not None and math.isfinite(previous.value) and value >= previous.value:
            value = value - previous.value
        return replace(point, start_time_unix_nano=start, value=value)

    def _histogram_point(self, name: str, point: HistogramDataPoint, seen: dict) -> HistogramDataPoint:
        key = (name, tuple(sorted(point.attributes.items())))
        start, previous = self._start(key, point)
        seen[key] = (point.time_unix_nano, point)
        if previous is None or previous.count == 0 or point.count < previous.count or len(point.bucket_counts) != len(
                previous.bucket_counts) or any(n < p for n, p in zip(point.bucket_counts, previous.bucket_counts)):
            return replace(point, start_time_unix_nano=start)  # nothing before, or a reset: all of it is new
        count = point.count - previous.count
        if count == 0:
            low = high = None
        else:
            low = point.min if point.min < previous.min else None  # exact only when the interval set it
            high = point.max if point.max > previous.max else None
        return replace(point, start_time_unix_nano=start, count=count, sum=point.sum - previous.sum,
                       bucket_counts=[n - p for n, p in zip(point.bucket_counts, previous.bucket_counts)],
                       min=low, max=high)
