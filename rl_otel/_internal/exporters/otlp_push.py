"""The OTLP metric push: an exporter wrapper that adds the series store's families to every export (as deltas for
a backend that prefers them) and counts failed exports, and :func:`store_metrics`, the recorder's snapshot as OTel
``Metric`` objects. Imported only by a process that pushes metrics: it loads the OTel SDK's metrics package
(``benchmarks/bench_lifecycle.py``), which a scrape-only process never needs."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, cast

from opentelemetry.sdk.metrics import Counter, Histogram
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    HistogramDataPoint,
    Metric,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.metrics.export import Histogram as HistogramData
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from rl_otel._internal.exporters.otel_compat import exporter_preferences
from rl_otel._internal.exporters.temporality import DeltaConverter
from rl_otel._internal.pipeline.records import Family, HistogramValue
from rl_otel._internal.pipeline.snapshot import Snapshot
from rl_otel.catalog import Kind

_log = logging.getLogger("rl_otel")
SCOPE = InstrumentationScope("rl_otel")


def merge(data: MetricsData | None, resource: Resource, extra: list[Metric]) -> MetricsData:
    """``data`` with ``extra`` as the first scope of the first resource: rl_otel's catalog-defined families
    come before any stray SDK instrument of the same name."""
    if not extra and data is not None:
        return data
    scope = ScopeMetrics(scope=SCOPE, metrics=extra, schema_url="")
    if data is None or not data.resource_metrics:
        return MetricsData(resource_metrics=[ResourceMetrics(resource=resource, scope_metrics=[scope],
                                                             schema_url="")])
    first, *rest = data.resource_metrics
    return MetricsData(resource_metrics=[replace(first, scope_metrics=[scope, *first.scope_metrics]), *rest])


def store_metrics(snapshot: Snapshot) -> list[Metric]:
    """Every family of a snapshot as an OTel ``Metric`` (cumulative), not the info families
    (``Info`` records of a ``Batch``), which are the scrape endpoint's."""
    now = time.time_ns()
    return [to_metric(fam, now) for fam in snapshot.families if not fam.scrape_only]


def to_metric(fam: Family, now: int) -> Metric:
    """One family as an OTel ``Metric`` (cumulative), its points stamped ``now``."""
    spec = fam.spec
    attrs = [(dict(fam.base + labels), value) for labels, value in fam.points]
    data: HistogramData | Sum | Gauge
    if spec.kind is Kind.HISTOGRAM:
        bounds = [float(b) for b in spec.buckets]
        hists = cast("list[tuple[dict[str, str], HistogramValue]]", attrs)  # a histogram family holds HistogramValues
        hist_points = [
            HistogramDataPoint(attributes=a, start_time_unix_nano=fam.start_ns, time_unix_nano=now, count=h.count,
                               sum=h.sum, bucket_counts=h.counts, explicit_bounds=bounds,
                               min=h.min if h.count else 0.0, max=h.max if h.count else 0.0)
            for a, h in hists
        ]
        data = HistogramData(data_points=hist_points, aggregation_temporality=AggregationTemporality.CUMULATIVE)
    else:
        numbers = cast("list[tuple[dict[str, str], float]]", attrs)  # the other families' points are floats
        points = [NumberDataPoint(attributes=a, start_time_unix_nano=fam.start_ns, time_unix_nano=now,
                                  value=float(v)) for a, v in numbers]
        if spec.kind is Kind.COUNTER:
            data = Sum(data_points=points, aggregation_temporality=AggregationTemporality.CUMULATIVE,
                       is_monotonic=True)
        else:
            data = Gauge(data_points=points)
    return Metric(name=spec.name, description=spec.description, unit=spec.unit, data=data)


class StoreExporter(MetricExporter):
    """Wraps a metric exporter: every export also carries rl_otel's series - as deltas for counters and
    histograms when the exporter prefers delta - and a failed one is counted."""

    def __init__(self, inner: MetricExporter, produce: Callable[[], list[Metric]], resource: Resource,
                 on_error: Callable[[str], None]) -> None:
        temporality, aggregation = exporter_preferences(inner)
        super().__init__(preferred_temporality=temporality or None, preferred_aggregation=aggregation or None)
        delta = AggregationTemporality.DELTA
        self._delta = DeltaConverter(counters=temporality.get(Counter) is delta,
                                     histograms=temporality.get(Histogram) is delta)
        self._inner = inner
        self._produce = produce
        self._resource = resource
        self._on_error = on_error

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        try:
            extra = self._produce()
            if self._delta.counters or self._delta.histograms:
                extra = self._delta.convert(extra)
        except Exception:  # boundary: the OTel SDK's export thread calls this: push what the SDK has
            _log.exception("rl_otel: collecting the series store for OTLP failed")
            self._on_error("collect")
            extra = []
        try:
            result = self._inner.export(merge(metrics_data, self._resource, extra), timeout_millis=timeout_millis)
        except Exception:  # boundary: the OTel SDK's exporter (network, serialisation)
            _log.warning("rl_otel: OTLP metric export raised", exc_info=True)
            result = MetricExportResult.FAILURE
        if result is not MetricExportResult.SUCCESS:
            self._on_error("export_failed")
        return result

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self._inner.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._inner.shutdown(timeout_millis=timeout_millis)
