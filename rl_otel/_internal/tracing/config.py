"""``init(tracing=...)`` and ``init(tracer_provider=...)`` checked, without loading the OTel SDK's trace package:
a process that records no spans never imports it (see :mod:`rl_otel._internal.runtime.components`). The OTel trace API
is imported only to check a given ``tracer_provider``."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeGuard

from rl_otel._internal.checks import check_known
from rl_otel._internal.exporters.otel_env import SignalConfig, signal_config
from rl_otel.errors import ConfigurationError

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

_EXPORTERS = ("console", "jsonl", "otlp")


def _is_span_exporter(value: object) -> TypeGuard[SpanExporter]:
    if value is None or isinstance(value, (str, bool, Mapping)):
        return False
    from opentelemetry.sdk.trace.export import SpanExporter

    return isinstance(value, SpanExporter)


@dataclass(frozen=True)
class TracingConfig:
    exporter: str | SpanExporter
    path: str | None = None
    otlp: SignalConfig | None = None  # exporter "otlp": where the spans go, resolved with the OTEL_* variables


def tracing_config(value: object) -> TracingConfig | None:
    """Check ``init(tracing=...)``; raise :class:`ConfigurationError` naming the bad value."""
    if value is None or value is False:
        return None
    if _is_span_exporter(value):
        return TracingConfig(exporter=value)
    if isinstance(value, str):
        value = {"exporter": value}
    if not isinstance(value, Mapping):
        raise ConfigurationError(f"tracing must be None, 'console', a dict like {{'exporter': 'jsonl', 'path': ...}}"
                                 f" or a SpanExporter; got {value!r}")
    check_known("tracing", value, ("endpoint", "exporter", "path", "protocol"))
    exporter = value.get("exporter")
    if _is_span_exporter(exporter):
        return TracingConfig(exporter=exporter)
    if exporter not in _EXPORTERS:
        raise ConfigurationError(f"tracing exporter must be one of {list(_EXPORTERS)} or a SpanExporter, "
                                 f"got {exporter!r}")
    path, endpoint, protocol = value.get("path"), value.get("endpoint"), value.get("protocol")
    if exporter == "jsonl" and (not isinstance(path, (str, os.PathLike)) or not str(path)):
        raise ConfigurationError(f"tracing exporter 'jsonl' needs a 'path' (a file name), got {path!r}")
    if endpoint is not None and not isinstance(endpoint, str):
        raise ConfigurationError(f"tracing endpoint must be a str like 'http://collector:4318/v1/traces', got "
                                 f"{endpoint!r}")
    signal = None
    if exporter == "otlp":
        from rl_otel._internal.exporters.otlp import exporter_class

        signal = signal_config("traces", url=endpoint, protocol=protocol, what="tracing")
        exporter_class(signal)  # fail at init, not at the first span
    return TracingConfig(exporter=exporter, path=None if path is None else os.fspath(path), otlp=signal)


def check_tracer_provider(value: object, tracing: object) -> Any:
    """Check ``init(tracer_provider=...)``: ``None`` (rl_otel's own) or an OpenTelemetry ``TracerProvider`` (the
    SDK's, or the global one from ``opentelemetry.trace.get_tracer_provider()``), given without ``tracing=``."""
    if value is None:
        return None
    from opentelemetry import trace as trace_api

    if not isinstance(value, trace_api.TracerProvider):
        raise ConfigurationError(f"tracer_provider must be an opentelemetry TracerProvider, got {value!r}")
    if tracing is not None and tracing is not False:
        raise ConfigurationError("tracing= configures rl_otel's own TracerProvider; with tracer_provider= your "
                                 "provider's span processors export the phases (leave tracing= out)")
    return value
