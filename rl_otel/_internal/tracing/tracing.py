"""Tracing for phases: a TracerProvider owned by the Telemetry (never the global one), its exporter, random IDs.

``tracing=`` of :func:`rl_otel.init` is checked here, once: ``None`` (no span processor: phases build no SDK span,
only span contexts for carriers and parents - see :class:`~rl_otel._internal.tracing.contexts.PhaseTracer`),
``"console"`` (JSON lines on stderr), ``{"exporter": "jsonl", "path": ...}``, ``{"exporter": "otlp",
"endpoint": ..., "protocol": "http/protobuf" | "grpc"}`` (needs ``opentelemetry-exporter-otlp``; the endpoint is
the traces URL, and what is not given comes from the ``OTEL_EXPORTER_OTLP_*`` variables, see
:mod:`rl_otel._internal.exporters.otel_env`) or a ``SpanExporter`` instance.

``tracer_provider=`` of :func:`rl_otel.init` replaces rl_otel's provider with the user's: phases become spans of
the user's traces (a phase opened inside a user span is its child), exported by the user's processors.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import IO, cast

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import INVALID_SPAN_ID, INVALID_TRACE_ID

from rl_otel._internal.exporters.otel_env import SignalConfig
from rl_otel._internal.tracing.config import TracingConfig
from rl_otel._internal.tracing.pending import PendingSteps


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


class ChosenIdGenerator(UrandomIdGenerator):
    """Random IDs, except inside :meth:`chosen` on this thread: the next span started gets the given IDs.

    The adapter for the ``step`` span (``tracing/steps.py``): its IDs are derived from the run and the step, and
    OTel's API lets no caller choose a span's IDs (``IdGenerator`` takes no arguments, ``start_span`` no ID). The
    SDK's ``Tracer.start_span`` asks its provider's generator for a trace ID when the span has no parent and for
    one span ID, on the calling thread: that is what this relies on, and ``tests/test_tracing_steps.py`` fails
    if an SDK release changes it.
    """

    def __init__(self) -> None:
        self._local = threading.local()

    @contextlib.contextmanager
    def chosen(self, trace_id: int, span_id: int) -> Iterator[None]:
        """The next span started on this thread in the block, if a root, gets ``trace_id`` and ``span_id``."""
        self._local.ids = (trace_id, span_id)
        try:
            yield
        finally:
            self._local.ids = None

    def generate_span_id(self) -> int:
        ids = getattr(self._local, "ids", None)
        if ids is not None:
            self._local.ids = None  # one span only
            return cast("int", ids[1])
        return super().generate_span_id()

    def generate_trace_id(self) -> int:
        ids = getattr(self._local, "ids", None)
        return cast("int", ids[0]) if ids is not None else super().generate_trace_id()


SCHEDULE_DELAY_MS = 100  # a span is sent this soon after it ends: a Ray worker is killed ~5 s after its SIGTERM


def prompt_processor(exporter: SpanExporter, **kwargs: object) -> BatchSpanProcessor:
    """A BatchSpanProcessor that sends spans about when they end (the SDK's default waits 5 s: the spans of a Ray
    worker whose driver ended were lost within that window), batching only what ends together, on its thread."""
    delay = SCHEDULE_DELAY_MS if "OTEL_BSP_SCHEDULE_DELAY" not in os.environ else None
    return BatchSpanProcessor(exporter, schedule_delay_millis=delay, **kwargs)  # type: ignore[arg-type]


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
    no public way to ask, so that a phase can skip building spans nobody would receive; its processors sit
    behind :attr:`pending`, which holds the spans of phases whose step is not known yet (``tracing/pending.py``)."""

    has_span_processor = False

    def __init__(self, on_root: Callable[[ReadableSpan], None] | None = None, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.pending = PendingSteps(on_root)

    def add_span_processor(self, span_processor: SpanProcessor) -> None:
        first = not self.has_span_processor
        self.pending.add(span_processor)
        if first:
            super().add_span_processor(self.pending)
        self.has_span_processor = True


def build_tracer_provider(config: TracingConfig | None, resource: Resource,
                          on_error: Callable[[str], None] | None = None,
                          on_root: Callable[[ReadableSpan], None] | None = None) -> OwnTracerProvider:
    """A TracerProvider with random IDs (a step span's chosen ones, :class:`ChosenIdGenerator`) and the configured
    exporter (none for ``config=None``); with ``on_error``, a failed span export is counted
    (``span_export_failed``); ``on_root`` is told of each phase's root span in its final trace (``pending.py``)."""
    provider = OwnTracerProvider(on_root, resource=resource, id_generator=ChosenIdGenerator())
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
    # the console's lines are written as each span ends; the others are sent as they end, on the SDK's thread
    processor = SimpleSpanProcessor(chosen) if exporter == "console" else prompt_processor(chosen)
    provider.add_span_processor(processor)
    return provider
