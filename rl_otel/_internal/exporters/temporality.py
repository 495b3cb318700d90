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
from collections.abc import Mapping
from dataclasses import replace
from typing import TypeVar, cast

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Histogram,
    HistogramDataPoint,
    Metric,
    NumberDataPoint,
    Sum,
)

_Key = tuple[str, tuple[tuple[str, object], ...]]
_Point = TypeVar("_Point", NumberDataPoint, HistogramDataPoint)
_Seen = dict[_Key, tuple[int, "NumberDataPoint | HistogramDataPoint"]]  # series -> (its export's time, the point)


class DeltaConverter:
    """Turns cumulative ``Sum`` (``counters``) and ``Histogram`` (``histograms``) metrics into delta ones."""

    def __init__(self, *, counters: bool, histograms: bool) -> None:
        self.counters, self.histograms = counters, histograms
        self._last: _Seen = {}  # series -> (time of its last export, cumulative point)
        self._last_export_ns: int | None = None

    def convert(self, metrics: list[Metric]) -> list[Metric]:
        seen: _Seen = {}
        out, export_ns = [], None
        first: NumberDataPoint | HistogramDataPoint | None  # a converted point: its time is this export's
        for metric in metrics:
            data = metric.data
            if self.counters and isinstance(data, Sum) and data.aggregation_temporality is \
                    AggregationTemporality.CUMULATIVE:
                sums = [self._sum_point(metric.name, p, seen) for p in data.data_points]
                metric = replace(metric, data=replace(data, data_points=sums,
                                                      aggregation_temporality=AggregationTemporality.DELTA))
                first = sums[0] if sums else None
            elif self.histograms and isinstance(data, Histogram) and data.aggregation_temporality is \
                    AggregationTemporality.CUMULATIVE:
                hists = [self._histogram_point(metric.name, p, seen) for p in data.data_points]
                metric = replace(metric, data=replace(data, data_points=hists,
                                                      aggregation_temporality=AggregationTemporality.DELTA))
                first = hists[0] if hists else None
            else:
                out.append(metric)
                continue
            out.append(metric)
            if first is not None:
                export_ns = first.time_unix_nano
        self._last = seen  # series not exported this time are forgotten: the state stays as large as the store
        if export_ns is not None:
            self._last_export_ns = export_ns
        return out

    def _start(self, key: _Key, point: _Point) -> tuple[int, _Point | None]:
        last = self._last.get(key)
        if last is not None:
            return cast("tuple[int, _Point]", last)  # the same series: a point of the same kind as ``point``
        return (point.start_time_unix_nano if self._last_export_ns is None else self._last_export_ns), None

    def _sum_point(self, name: str, point: NumberDataPoint, seen: _Seen) -> NumberDataPoint:
        key = (name, tuple(sorted(cast("Mapping[str, object]", point.attributes).items())))  # the store sets them
        start, previous = self._start(key, point)
        seen[key] = (point.time_unix_nano, point)
        value = point.value
        if previous is not None and math.isfinite(previous.value) and value >= previous.value:
            value = value - previous.value
        return replace(point, start_time_unix_nano=start, value=value)

    def _histogram_point(self, name: str, point: HistogramDataPoint, seen: _Seen) -> HistogramDataPoint:
        key = (name, tuple(sorted(cast("Mapping[str, object]", point.attributes).items())))  # the store sets them
        start, previous = self._start(key, point)
        seen[key] = (point.time_unix_nano, point)
        if previous is None or previous.count == 0 or point.count < previous.count or len(point.bucket_counts) != len(
                previous.bucket_counts) or any(n < p for n, p in zip(point.bucket_counts, previous.bucket_counts,
                                                                     strict=True)):
            return replace(point, start_time_unix_nano=start)  # nothing before, or a reset: all of it is new
        count = point.count - previous.count
        if count == 0:
            low = high = None
        else:
            low = point.min if point.min < previous.min else None  # exact only when the interval set it
            high = point.max if point.max > previous.max else None
        return replace(point, start_time_unix_nano=start, count=count, sum=point.sum - previous.sum,
                       bucket_counts=[n - p for n, p in zip(point.bucket_counts, previous.bucket_counts, strict=True)],
                       # the SDK's dataclass says float, but its OTLP encoder leaves a None min/max out of the point
                       min=low, max=high)  # type: ignore[arg-type]
