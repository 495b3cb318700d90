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
from collections.abc import Callable, Sequence
from typing import IO, Any, cast

from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, Tracer, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import (
    INVALID_SPAN_CONTEXT,
    INVALID_SPAN_ID,
    INVALID_TRACE_ID,
    NonRecordingSpan,
    Span,
    SpanContext,
    TraceFlags,
    get_current_span,
)

from rl_otel._internal.exporters.otel_env import SignalConfig
from rl_otel._internal.tracing.config import TracingConfig


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
        if path is not None:  # the exporter owns the file for its lifetime (shutdown closes it): no `with` fits
            self._stream: IO[str] = open(path, "a", encoding="utf-8")  # noqa: SIM115
        else:
            self._stream = stream or sys.stderr
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


def build_tracer_provider(config: TracingConfig | None, resource: Resource,
                          on_error: Callable[[str], None] | None = None) -> OwnTracerProvider:
    """A TracerProvider with random IDs and the configured exporter (none for ``config=None``); with
    ``on_error``, a failed span export is counted (``span_export_failed``)."""
    provider = OwnTracerProvider(resource=resource, id_generator=UrandomIdGenerator())
    if config is None:
        return provider
    from rl_otel._internal.exporters.otlp import counted_span_exporter, span_exporter

    exporter = config.exporter
    if isinstance(exporter, SpanExporter):
        chosen: SpanExporter = exporter
    elif exporter == "console":
        chosen = JsonLinesSpanExporter()
    elif exporter == "jsonl":
        chosen = JsonLinesSpanExporter(path=config.path)
    else:  # "otlp", the one name left (tracing_config checks it)
        chosen = span_exporter(cast("SignalConfig", config.otlp))  # tracing_config resolves where "otlp" goes
    if on_error is not None:
        chosen = counted_span_exporter(chosen, on_error)
    # the console's lines are written as each span ends; the others are batched on the SDK's export thread
    processor = SimpleSpanProcessor(chosen) if exporter == "console" else BatchSpanProcessor(chosen)
    provider.add_span_processor(processor)
    return provider


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

    def context_only(self, name: str, context: Context) -> Span:
        """What ``tracer.start_span(name, context)`` would return, less the recording: a :class:`NonRecordingSpan`
        whose context has the same trace ID (the parent's or a new random one), a new random span ID, the
        sampler's flags and trace state. The IDs are drawn and the sampler asked when the context is first read
        (:class:`DeferredSpan`): most phases' contexts are never read."""
        return DeferredSpan(self, name, context)

    def span_context(self, name: str, context: Context) -> SpanContext:
        """The span context ``tracer.start_span(name, context)`` would give its span."""
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
        return SpanContext(trace_id, ids.generate_span_id(), is_remote=False, trace_flags=TraceFlags(flags),
                           trace_state=sampled.trace_state)


_MAKING = threading.RLock()  # a child's context reads its parent's (another DeferredSpan) while making its own


class DeferredSpan(NonRecordingSpan):
    """A :class:`NonRecordingSpan` whose span context is made the first time something reads it: by
    ``Phase.carrier()``, by a span started inside the block (its parent), by ``get_current_span()`` in user code.
    A phase nobody reads (the common case without tracing) then costs no ID, no sampler call. The context it
    is made from (the parent) is the one given at creation, so it is the same whenever it is read; every reader,
    on any thread, gets the same IDs."""

    def __init__(self, tracer: PhaseTracer, name: str, context: Context) -> None:
        super().__init__(INVALID_SPAN_CONTEXT)
        self._made: SpanContext | None = None
        self._recipe: tuple[PhaseTracer, str, Context] | None = (tracer, name, context)

    def get_span_context(self) -> SpanContext:
        made = self._made
        if made is None:
            with _MAKING:  # two threads reading at once must not draw two different IDs
                made = self._made
                if made is None:
                    tracer, name, context = cast("tuple[PhaseTracer, str, Context]", self._recipe)
                    made = self._made = self._context = tracer.span_context(name, context)
                    self._recipe = None  # the parent context is not kept alive past this
        return made

    def __repr__(self) -> str:
        return f"NonRecordingSpan({self.get_span_context()!r})"
