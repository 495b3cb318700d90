"""Spans of phases that started before their step was known, held until it is, then put in the step's trace.

A span's trace ID is fixed when it starts, but a process often learns the step only at its first ``log()``: the
first step of a run, and the first of a run resumed at step k. Those phases start in a provisional trace of their
own (:meth:`PendingSteps.hold`); their spans (and the user's spans under them, on the same provider) are kept here
when they end, and the next ``log()`` (:meth:`PendingSteps.resolve`) sends them on with the step's trace ID, the
phase's root under the ``step`` span, and the ``step`` attribute - the same span IDs, times, events and status
(a new ``ReadableSpan``, the SDK's public record of a finished span). Nothing is held for ever: a flush, a close
or a SIGTERM sends them as they are (a trace of their own, with the run's resource), so does a process that
logs no step within :data:`HOLD_S`, or one that holds :data:`MAX_HELD` spans.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.trace import SpanContext

from rl_otel._internal.forks import reset_in_forked_child

HOLD_S = 60.0  # a process that logs no step (a worker) sends its held spans this long after the first one ended
MAX_HELD = 4096  # spans held at most (then sent as they are)
FLUSH_TIMEOUT_MS = 10_000  # one flush of the spans of a phase that ended
_MAX_RESOLVED = 256  # provisional traces remembered once resolved (a span ending late, e.g. after its GPU time)


class PendingSteps(SpanProcessor):
    """A span processor in front of the provider's processors: holds the spans of provisional traces until their
    step is known. Thread-safe; the processors behind it get spans as they would have, only later."""

    def __init__(self, on_root: Callable[[ReadableSpan], None] | None = None) -> None:
        self._processors: tuple[SpanProcessor, ...] = ()
        self._wake = threading.Event()  # a phase ended: its spans are sent now (on the flusher thread)
        self._flusher: threading.Thread | None = None
        self._flusher_pid = 0
        self.on_root = on_root  # told of a phase's root span, in its final trace (the endpoint's exemplars)
        self._lock = threading.Lock()
        self._pending: set[int] = set()  # provisional trace IDs whose step is not known yet
        self._resolved: OrderedDict[int, tuple[int, int, int]] = OrderedDict()  # provisional -> (step, ids)
        self._held: list[ReadableSpan] = []
        self._held_since: float | None = None
        reset_in_forked_child(self)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()  # the parent's may have been held by another thread at the fork
        self._wake = threading.Event()  # the flusher is the parent's: a new one starts at the child's first phase

    def add(self, processor: SpanProcessor) -> None:
        self._processors = (*self._processors, processor)

    @property
    def waiting(self) -> bool:
        """Whether spans wait for a step (read without the lock: a hint for the per-step path)."""
        return bool(self._pending)

    def hold(self, trace_id: int) -> None:
        """Spans of ``trace_id`` wait for :meth:`resolve` (a phase started before any step was known)."""
        with self._lock:
            self._pending.add(trace_id)

    def resolve(self, step: int, trace_id: int, span_id: int) -> None:
        """The step is known: the held spans go to the step's trace (``trace_id``, under the span ``span_id``)."""
        with self._lock:
            if not self._pending:
                return
            for provisional in self._pending:
                self._resolved[provisional] = (step, trace_id, span_id)
            while len(self._resolved) > _MAX_RESOLVED:
                self._resolved.popitem(last=False)
            self._pending.clear()
            held, self._held, self._held_since = self._held, [], None
            spans = [_moved(span, *self._resolved[span.context.trace_id]) for span in held]
        self._send(spans)

    def on_start(self, span: Any, parent_context: Context | None = None) -> None:
        for processor in self._processors:
            processor.on_start(span, parent_context=parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        trace_id = span.context.trace_id if span.context is not None else 0
        spans = [span]
        with self._lock:
            if trace_id in self._pending:
                if self._held_since is None:
                    self._held_since = time.monotonic()
                self._held.append(span)
                if len(self._held) < MAX_HELD and time.monotonic() - self._held_since < HOLD_S:
                    return
                spans = self._release()  # too many, or too long: a process that logs no step
            elif trace_id in self._resolved:
                spans = [_moved(span, *self._resolved[trace_id])]
        self._send(spans)

    def _sent_now(self) -> None:
        """A phase's root ended: wake the flusher thread, which flushes the processors behind (the SDK's batch
        processor would wait for its schedule delay). A Ray worker is killed seconds after its driver exits."""
        if self._flusher is None or self._flusher_pid != os.getpid():  # none yet, or the parent's before a fork
            self._flusher_pid = os.getpid()
            self._flusher = threading.Thread(target=self._flush_loop, name="rl_otel-span-flush", daemon=True)
            self._flusher.start()
        self._wake.set()

    def _flush_loop(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            for processor in self._processors:
                try:
                    processor.force_flush(FLUSH_TIMEOUT_MS)
                except Exception:  # the exporter's failure is counted by the exporter itself
                    pass

    def _release(self) -> list[ReadableSpan]:
        """Under the lock: the held spans, to send as they are; their traces are no longer held."""
        held, self._held, self._held_since = self._held, [], None
        self._pending.clear()
        return held

    def _send(self, spans: list[ReadableSpan]) -> None:
        root = False
        for span in spans:
            for processor in self._processors:
                processor.on_end(span)
            if _phase_root(span):
                root = True
                on_root = self.on_root
                if on_root is not None and span.name != "step":
                    try:
                        on_root(span)
                    except Exception:  # boundary: the on_root callback: an exemplar lost, never a span
                        pass
        if root:
            self._sent_now()

    def shutdown(self) -> None:
        with self._lock:
            spans = self._release()
        self._send(spans)
        for processor in self._processors:
            processor.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Send the held spans as they are (a flush, a close, a SIGTERM: the step may never come), then flush."""
        with self._lock:
            spans = self._release()
        self._send(spans)
        deadline = time.monotonic() + timeout_millis / 1000
        flushed = True
        for processor in self._processors:
            left = max(1, int((deadline - time.monotonic()) * 1000))
            flushed = processor.force_flush(left) and flushed
        return flushed


def _phase_root(span: ReadableSpan) -> bool:
    """A phase's root span (``cluster/phase``, which ends last of the phase's spans) or a step span."""
    attributes = span.attributes or {}
    return (("cluster" in attributes and span.name == f"{attributes.get('cluster')}/{attributes.get('phase')}")
            or span.name == "step")


def _moved(span: ReadableSpan, step: int, trace_id: int, step_span_id: int) -> ReadableSpan:
    """``span`` in the step's trace: the same span ID; a root goes under the ``step`` span, a child keeps its
    parent (now in the step's trace); the ``step`` attribute is set on the phase's spans."""
    context = span.context
    assert context is not None
    parent = span.parent
    if parent is None:
        parent = SpanContext(trace_id, step_span_id, is_remote=True, trace_flags=context.trace_flags)
    elif parent.trace_id == context.trace_id:
        parent = SpanContext(trace_id, parent.span_id, is_remote=parent.is_remote, trace_flags=parent.trace_flags,
                             trace_state=parent.trace_state)
    attributes = dict(span.attributes or {})
    if "cluster" in attributes and "phase" in attributes:  # a phase's span (not a user's span under it)
        attributes["step"] = step
    return ReadableSpan(
        name=span.name,
        context=SpanContext(trace_id, context.span_id, is_remote=False, trace_flags=context.trace_flags,
                            trace_state=context.trace_state),
        parent=parent, resource=span.resource, attributes=attributes, events=span.events, links=span.links,
        kind=span.kind, status=span.status, start_time=span.start_time, end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope)
