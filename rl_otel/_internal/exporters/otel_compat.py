"""The one place rl_otel reaches past a dependency's public API (opentelemetry-sdk is pinned to 1.45.x).

- :func:`exporter_preferences`: a ``MetricExporter``'s temporality and aggregation preferences. The SDK takes
  them as constructor arguments (``preferred_temporality=``, ``preferred_aggregation=``) and stores them in
  private attributes with no public getter; its own ``PeriodicExportingMetricReader`` reads them the same way.
  rl_otel needs them to wrap an exporter (its series ride along in each export) without changing what the
  exporter asked for, and to send its own series as deltas to an exporter that prefers them.

``tests/test_otel_compat.py`` fails loudly when an SDK upgrade renames or removes what this module reads.
"""

from __future__ import annotations

from typing import Any


def exporter_preferences(exporter: Any) -> tuple[dict[type, Any], dict[type, Any]]:
    """``(preferred_temporality, preferred_aggregation)`` of a ``MetricExporter``, as its constructor resolved
    them (instrument class -> ``AggregationTemporality`` / ``Aggregation``). Empty dicts for an exporter that
    does not have them (a duck-typed one): the SDK's defaults (cumulative, default aggregation) apply."""
    temporality = getattr(exporter, "_preferred_temporality", None)
    aggregation = getattr(exporter, "_preferred_aggregation", None)
    return dict(temporality or {}), dict(aggregation or {})
