"""Tracing for phases: a TracerProvider owned by the Telemetry (never the global one), its exporter, random IDs.

``tracing=`` of :func:`rl_otel.init` is checked here, once: ``None`` (no span processor: phases build no SDK span,
only span contexts for carriers and parents - see :class:`PhaseTracer`),
``"console"`` (JSON lines on stderr), ``{"exporter": "jsonl", "path": ...}``, ``{"exporter": "otlp",
"endpoint": ..., "protocol": "http/protobuf" | "grpc"}`` (needs ``opentelemetry-exporter-otlp``; the endpoint is
the traces URL, and what is not given comes from the ``OTEL_EXPORTER_OTLP_*`` variables, see
:mod:`rl_otel._internal.exporters.otel_env`) or a ``SpanExporter`` instance.

``tracer_provider=`` of :func:`rl_otel.init` replaces rl_otel's provider with the user's: phases become spans of
the user's traces (a phase opened inside a user span is its child), exported by the user's processors.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any

from opentelemetry import trace as trace_api
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, Tracer, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import (
    INVALID_SPAN_ID,
    INVALID_TRACE_ID,
    NonRecordingSpan,
    Span,
    SpanContext,
    TraceFlags,
    get_current_span,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from rl_otel._internal.checks import check_known
from rl_otel._internal.exporters.otel_env import SignalConfig, signal_config
from rl_otel.errors import ConfigurationError

_EXPORTERS = ("console", "jsonl", "otlp")
_PROPAGATOR = TraceContextTextMapPropagator()


@dataclass(frozen=True)
class TracingConfig:
    exporter: str | SpanExporter
    path: str | None = None
    otlp: SignalConfig | None = None  # exporter "otlp": where the spans go, resolved with the OTEL_* variables


def tracing_config(value: object) -> TracingConfig | None:
    """Check ``init(tracing=...)``; raise :class:`ConfigurationError` naming the bad value."""
    if value is None or value is False:
        return None
    if isinstance(value, SpanExporter):
        return TracingConfig(exporter=value)
    if isinstance(value, str):
        value = {"exporter": value}
    if not isinstance(value, Mapping):
        raise ConfigurationError(f"tracing must be None, 'console', a dict like {{'exporter': 'jsonl', 'path': ...}}"
                                 f" or a SpanExporter; got {value!r}")
    check_known("tracing", value, ("endpoint", "exporter", "path", "protocol"))
    exporter = value.get("exporter")
    if isinstance(exporter, SpanExporter):
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


class UrandomIdGenerator(IdGenerator):
    """Trace and span IDs from ``os.urandom``: the SDK's default draws from ``random``, which training code seeds,
    so every seeded run (and every rank seeded alike) would repeat the same IDs."""

    def generate_span_id(self) -> int:
        while True:
            span_id = int.from_bytes(os.urandom(8), "big")
            if span_id != INVALID_SPAN_ID:
                return span_id

    def generate_trace_id(self) -> int:
        while True:
            trace_id = int.from_bytes(os.urandom(16), "big")
            if trace_id != INVALID_TRACE_ID:
                return trace_id


class JsonLinesSpanExporter(SpanExporter):
    """One JSON object per finished span, one per line, to a file or a stream (debugging; ``jq``-friendly)."""

    def __init__(self, stream: IO[str] | None = None, path: str | None = None) -> None:
        self._owned = path is not None
        self._stream = open(path, "a", encoding="utf-8") if path is not None else (stream or sys.stderr)
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(span.to_json(indent=None) + "\n" for span in spans)
        try:
            with self._lock:
                self._stream.write(lines)
                self._stream.flush()
        except (OSError, ValueError):
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        if self._owned:
            with self._lock:
                self._stream.close()


class OwnTracerProvider(TracerProvider):
    """rl_otel's TracerProvider: remembers whether a span processor was ever added to it, which the SDK offers
    no public way to ask, so that a phase can skip building spans nobody would receive."""

    has_span_processor = False

    def add_span_processor(self, span_processor: SpanProcessor) -> None:
        super().add_span_processor(span_processor)
        self.has_span_processor = True


def build_tracer_provider(config: TracingConfig | None, resource: Resource) -> OwnTracerProvider:
    """A TracerProvider with random IDs and the configured exporter (none for ``config=None``)."""
    provider = OwnTracerProvider(resource=resource, id_generator=UrandomIdGenerator())
    if config is None:
        return provider
    exporter = config.exporter
    if exporter == "console":
        provider.add_span_processor(SimpleSpanProcessor(JsonLinesSpanExporter()))
    elif exporter == "jsonl":
        provider.add_span_processor(BatchSpanProcessor(JsonLinesSpanExporter(path=config.path)))
    elif exporter == "otlp":
        from rl_otel._internal.exporters.otlp import span_exporter

        provider.add_span_processor(BatchSpanProcessor(span_exporter(config.otlp)))
    else:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def check_tracer_provider(value: object, tracing: object) -> Any:
    """Check ``init(tracer_provider=...)``: ``None`` (rl_otel's own) or an OpenTelemetry ``TracerProvider`` (the
    SDK's, or the global one from ``opentelemetry.trace.get_tracer_provider()``), given without ``tracing=``."""
    if value is None:
        return None
    if not isinstance(value, trace_api.TracerProvider):
        raise ConfigurationError(f"tracer_provider must be an opentelemetry TracerProvider, got {value!r}")
    if tracing is not None and tracing is not False:
        raise ConfigurationError("tracing= configures rl_otel's own TracerProvider; with tracer_provider= your "
                                 "provider's span processors export the phases (leave tracing= out)")
    return value


class PhaseTracer:
    """Starts a phase's spans, and skips the SDK's span objects when no span processor could receive them.

    Most runs configure no span exporter (``tracing=None``): there the SDK would still build, time and end four
    spans per phase only to hand them to nobody - most of a phase's cost. Without processors :meth:`context_only`
    makes just the span *context* (the trace and span IDs, flags and trace state ``start_span`` would have given),
    enough for ``Phase.carrier()`` and for user spans started inside the block to get their parent. Processors may
    be added to the provider at any time, so :meth:`recording` is asked at every phase.
    """

    __slots__ = ("_provider", "_sdk", "tracer")

    def __init__(self, provider: Any, tracer: Any) -> None:
        self._provider = provider
        self.tracer = tracer
        self._sdk = isinstance(tracer, Tracer)  # a no-op tracer (OTEL_SDK_DISABLED) keeps its own behaviour

    def recording(self) -> bool:
        """False when rl_otel's own provider has no span processor (spans would reach nobody). A user's provider
        (``tracer_provider=``) always gets its spans: whether it can receive them is its own business."""
        provider = self._provider
        return not self._sdk or not isinstance(provider, OwnTracerProvider) or provider.has_span_processor

    def context_only(self, name: str, context: Context | None) -> Span:
        """What ``tracer.start_span(name, context)`` would return, less the recording: a :class:`NonRecordingSpan`
        whose context has the same trace ID (the parent's or a new random one), a new random span ID, the
        sampler's flags and trace state."""
        tracer = self.tracer
        ids = tracer.id_generator
        parent = get_current_span(context).get_span_context()
        if parent.is_valid:
            trace_id, random_id = parent.trace_id, parent.trace_flags.random_trace_id
        else:
            trace_id, random_id = ids.generate_trace_id(), ids.is_trace_id_random()
        sampled = tracer.sampler.should_sample(context, trace_id, name)
        flags = TraceFlags.SAMPLED if sampled.decision.is_sampled() else TraceFlags.DEFAULT
        if random_id:
            flags |= TraceFlags.RANDOM_TRACE_ID
        return NonRecordingSpan(SpanContext(trace_id, ids.generate_span_id(), is_remote=False,
                                            trace_flags=TraceFlags(flags), trace_state=sampled.trace_state))


def inject(context: Context | None = None) -> dict[str, str]:
    """The W3C ``traceparent`` (and ``tracestate``) of ``context`` (default: the current one), as a dict to pass
    to another process - a Ray actor, a worker - which hands it to ``phase(..., parent=...)``."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=context)
    return carrier


def extract(carrier: Mapping[str, str] | None) -> Context | None:
    """The parent context in a carrier made by :func:`inject` (``None``: no carrier, or nothing valid in it)."""
    if not carrier:
        return None
    return _PROPAGATOR.extract(carrier)
