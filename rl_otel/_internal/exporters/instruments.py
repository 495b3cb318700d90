"""The user's own OpenTelemetry instruments, served beside rl_otel's series: ``Telemetry.meter_provider``.

rl_otel's series do not go through the SDK's instruments (see :mod:`rl_otel._internal.pipeline.store`), so the
endpoint has no SDK meter provider behind it until a user asks for one: the first read of ``tel.meter_provider``
builds a ``MeterProvider`` (the Telemetry's resource, exemplars off) whose instruments are

- rendered at every scrape of the endpoint, after the store's families, by a ``PrometheusMetricReader``
  registered on the scrape registry (no ``target_info`` of its own - the store serves it - and no
  ``otel_scope_*`` labels); a family whose name the store already serves is dropped and counted
  (``rl_telemetry_errors_total{sink="prometheus",reason="duplicate_family"}``);
- pushed over OTLP, beside rl_otel's series, when rl_otel pushes to a collector (same endpoint, protocol,
  headers, interval and temporality preference; failures counted under ``sink="otlp"``). With the user's own
  ``MetricExporter`` (``otlp=exporter``) they are not: an exporter instance serves one reader.

They follow the SDK's rules: NaN/Inf measurements dropped, ~6 us per attributed record, a histogram's default
buckets are for milliseconds (give ``explicit_bucket_boundaries_advisory``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def build_meter_provider(resource: Any, registry: Any | None, otlp_config: Any | None,
                         on_error: Callable[[str], None]) -> Any:
    """A MeterProvider whose instruments the scrape ``registry`` renders (when there is one) and rl_otel's OTLP
    push sends (when ``otlp_config`` pushes metrics through an OTLP exporter rl_otel built); ``None`` when
    neither applies."""
    from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, MeterProvider

    readers = []
    if registry is not None:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader

        readers.append(PrometheusMetricReader(disable_target_info=True, scope_info_enabled=False,
                                              registry=registry))
    if otlp_config is not None and otlp_config.metrics is not None and otlp_config.exporter is None:
        from rl_otel._internal.exporters.otlp import metric_reader

        readers.append(metric_reader(otlp_config, list, resource, on_error))  # produce=list: no store series
    if not readers:
        return None
    return MeterProvider(resource=resource, metric_readers=readers, exemplar_filter=AlwaysOffExemplarFilter())
