"""OTLP push to a Collector: the scale-out path when one Prometheus should not scrape every rank.

``init(otlp={"endpoint": "http://collector:4318", "interval_s": 10, "headers": {...}, "timeout_s": 10,
"traces": True})`` pushes, every ``interval_s`` and once more at ``close()``, the same data the scrape endpoint
serves (rl_otel's series store - NaN included, which the SDK's instruments would drop - plus the SDK's own
instruments) over OTLP/HTTP protobuf to ``<endpoint>/v1/metrics``, and the phase spans to
``<endpoint>/v1/traces`` through a BatchSpanProcessor. Export runs on the SDK's background threads: a collector
that is down or slow costs a warning and ``rl_telemetry_errors_total{sink="otlp"}``, never an exception in the
training loop; ``close()`` waits for the final push at most ``timeout_s``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from opentelemetry.sdk.metrics.export import (Metric, MetricExporter, MetricExportResult, MetricsData,
                                              ResourceMetrics, ScopeMetrics)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from rl_otel.core.options import boolean, check_known, positive_seconds
from rl_otel.errors import ConfigurationError

_log = logging.getLogger("rl_otel")
_KEYS = ("endpoint", "interval_s", "timeout_s", "headers", "traces")
SCOPE = InstrumentationScope("rl_otel")


def merge(data: MetricsData | None, resource: Resource, extra: list[Metric]) -> MetricsData:
    """``data`` with ``extra`` as the first scope of the first resource: rl_otel's catalog-defined families
    come before any stray SDK instrument of the same name."""
    scope = ScopeMetrics(scope=SCOPE, metrics=extra, schema_url="")
    if data is None or not data.resource_metrics:
        return MetricsData(resource_metrics=[ResourceMetrics(resource=resource, scope_metrics=[scope],
                                                             schema_url="")])
    first, *rest = data.resource_metrics
    return MetricsData(resource_metrics=[replace(first, scope_metrics=[scope, *first.scope_metrics]), *rest])


@dataclass(frozen=True)
class OtlpConfig:
    endpoint: str
    interval_s: float = 10.0
    timeout_s: float = 10.0
    headers: tuple[tuple[str, str], ...] = ()
    traces: bool = True

    def url(self, signal: str) -> str:
        return f"{self.endpoint.rstrip('/')}/v1/{signal}"


def otlp_config(value: object) -> OtlpConfig | None:
    """Check ``init(otlp=...)``: ``None``/``False`` (no push), an endpoint str, or a dict of options."""
    if value is None or value is False:
        return None
    if isinstance(value, str):
        value = {"endpoint": value}
    if not isinstance(value, Mapping):
        raise ConfigurationError(f"otlp must be None, an endpoint like 'http://collector:4318' or a dict like "
                                 f"{{'endpoint': ..., 'interval_s': 10}}; got {value!r}")
    check_known("otlp", value, _KEYS)
    endpoint = value.get("endpoint")
    if not isinstance(endpoint, str) or not endpoint.startswith(("http://", "https://")):
        raise ConfigurationError(f"otlp endpoint must be the collector's OTLP/HTTP base URL like "
                                 f"'http://collector:4318', got {endpoint!r}")
    headers = value.get("headers") or {}
    if not isinstance(headers, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                   for k, v in headers.items()):
        raise ConfigurationError(f"otlp headers must be a dict of str to str, got {headers!r}")
    traces = boolean("otlp traces", value.get("traces", True))
    try:
        import opentelemetry.exporter.otlp.proto.http  # noqa: F401
    except ImportError as exc:
        raise ConfigurationError("otlp needs the OTLP exporter: pip install 'rl-otel[otlp]' "
                                 "(opentelemetry-exporter-otlp-proto-http)") from exc
    return OtlpConfig(endpoint=endpoint,
                      interval_s=positive_seconds("otlp interval_s", value.get("interval_s", 10.0)),
                      timeout_s=positive_seconds("otlp timeout_s", value.get("timeout_s", 10.0)),
                      headers=tuple(headers.items()), traces=traces)


class StoreExporter(MetricExporter):
    """Wraps an OTLP metric exporter: every export also carries rl_otel's series, and a failed one is counted."""

    def __init__(self, inner: MetricExporter, produce: Callable[[], list[Metric]], resource: Resource,
                 on_error: Callable[[str], None]) -> None:
        super().__init__(preferred_temporality=inner._preferred_temporality,
                         preferred_aggregation=inner._preferred_aggregation)
        self._inner = inner
        self._produce = produce
        self._resource = resource
        self._on_error = on_error

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        try:
            extra = self._produce()
        except Exception:  # push what the SDK has
            _log.exception("rl_otel: collecting the series store for OTLP failed")
            self._on_error("collect")
            extra = []
        try:
            result = self._inner.export(merge(metrics_data, self._resource, extra), timeout_millis=timeout_millis)
        except Exception:
            _log.warning("rl_otel: OTLP metric export raised", exc_info=True)
            result = MetricExportResult.FAILURE
        if result is not MetricExportResult.SUCCESS:
            self._on_error("export_failed")
        return result

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self._inner.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._inner.shutdown(timeout_millis=timeout_millis)


def metric_reader(config: OtlpConfig, produce: Callable[[], list[Metric]], resource: Resource,
                  on_error: Callable[[str], None]) -> Any:
    """A PeriodicExportingMetricReader pushing the store and the SDK's instruments to ``config.endpoint``."""
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    inner = OTLPMetricExporter(endpoint=config.url("metrics"), headers=dict(config.headers),
                               timeout=config.timeout_s)
    return PeriodicExportingMetricReader(StoreExporter(inner, produce, resource, on_error),
                                         export_interval_millis=config.interval_s * 1000,
                                         export_timeout_millis=config.timeout_s * 1000)


def span_processor(config: OtlpConfig) -> Any:
    """A BatchSpanProcessor sending spans to ``<endpoint>/v1/traces``."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    return BatchSpanProcessor(OTLPSpanExporter(endpoint=config.url("traces"), headers=dict(config.headers),
                                               timeout=config.timeout_s),
                              export_timeout_millis=config.timeout_s * 1000)
