"""The one adapter over a dependency's private API (rl_otel/_internal/exporters/otel_compat.py), and the rule that
no other module uses one. These fail loudly when an OpenTelemetry upgrade moves what the adapter reads - or adds the
public hook that makes it unnecessary."""

from __future__ import annotations

import ast
from pathlib import Path

from opentelemetry.sdk.metrics import Counter, Histogram, UpDownCounter
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    ConsoleMetricExporter,
    MetricExporter,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation

from rl_otel._internal.exporters.otel_compat import exporter_preferences
from rl_otel._internal.exporters.otel_env import signal_config
from rl_otel._internal.exporters.otlp import metric_exporter, temporality_map

PACKAGE = Path(__file__).resolve().parent.parent / "rl_otel"
DELTA, CUMULATIVE = AggregationTemporality.DELTA, AggregationTemporality.CUMULATIVE


def test_exporter_preferences_are_read_as_the_sdk_stores_them():
    aggregation = ExplicitBucketHistogramAggregation([0.0, 1.0])
    exporter = ConsoleMetricExporter(preferred_temporality={Counter: DELTA},
                                     preferred_aggregation={Histogram: aggregation})
    temporality, aggregations = exporter_preferences(exporter)
    assert temporality[Counter] is DELTA and aggregations[Histogram] is aggregation
    assert exporter_preferences(object()) == ({}, {})


def test_the_sdk_still_has_no_public_getter():
    """When this fails, the SDK grew a public way to read an exporter's preferences: use it in otlp.py and delete
    rl_otel/_internal/exporters/otel_compat.py."""
    public = {name for name in dir(MetricExporter) if not name.startswith("_")}
    assert public == {"export", "force_flush", "shutdown"}
    reader = PeriodicExportingMetricReader(ConsoleMetricExporter(), export_interval_millis=float("inf"))
    assert not [name for name in dir(reader) if "temporality" in name and not name.startswith("_")]
    reader.shutdown()


def test_the_otlp_exporters_resolve_the_spec_table_as_rl_otel_passes_it(monkeypatch):
    """rl_otel passes the temporality table explicitly; the exporters' own reading of the variable agrees."""
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

    for preference in ("cumulative", "delta", "lowmemory"):
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", preference)
        from_env, _ = exporter_preferences(OTLPMetricExporter())
        ours, _ = exporter_preferences(metric_exporter(signal_config("metrics", {}), preference))
        assert {cls: from_env[cls] for cls in ours} == ours
    assert temporality_map("lowmemory")[UpDownCounter] is CUMULATIVE


_PRIVATE_OK = {"_otel_compat.py"}


def _private_uses(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            root = node.module.split(".")[0]
            if root not in ("rl_otel", "__future__") and any(p.startswith("_") for p in node.module.split(".")):
                found.append(f"from {node.module} import ...")
            if root not in ("rl_otel", "__future__"):
                found += [f"from {node.module} import {a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
        elif isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names
                      if not a.name.startswith("rl_otel") and any(p.startswith("_") for p in a.name.split("."))]
        elif isinstance(node, ast.Attribute) and node.attr in (
                "_preferred_temporality", "_preferred_aggregation", "_active_span_processor", "_span_processors",
                "_is_enabled", "_instrument_class_temporality", "_tracer_config"):
            found.append(f".{node.attr}")
    return found


def test_no_module_but_the_adapter_uses_a_dependencys_private_api():
    offenders = {str(path.relative_to(PACKAGE)): uses for path in sorted(PACKAGE.rglob("*.py"))
                 if path.name not in _PRIVATE_OK and (uses := _private_uses(path))}
    assert offenders == {}
