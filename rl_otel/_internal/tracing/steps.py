"""One RL step, one trace: IDs derived from the run and the step, so every process finds them with nothing passed.

Every process of a run knows two things about a step without talking to the others: the run's name (``run=``, the
``run`` label) and the step's number. The step's trace ID and the ID of its ``step`` span are hashes of those two
(:func:`step_ids`), so the phases of step N of every rank, actor and driver take the same *remote* parent
(:func:`step_parent`) and land in one trace, under one span. One process - rank 0 of the ``trainer`` role, see
:func:`emits_step_spans` - writes that ``step`` span itself, with the agreed IDs, when it logs the step
(:class:`StepSpans`): a span's IDs cannot be chosen through the OTel API, so the one place that does it is
:class:`~rl_otel._internal.tracing.tracing.ChosenIdGenerator`. Why hashes and not a carrier passed along:
``docs/tracing.md``. Imports: the OTel API only (the SDK's tracer is handed in).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import INVALID_SPAN_ID, INVALID_TRACE_ID, NonRecordingSpan, SpanContext, TraceFlags

STEP_SPAN = "step"  # the name of the root span of a step's trace
STEP_ROLE = "trainer"  # the role whose rank 0 writes the step spans (rl_otel's default role)
_MAX_PENDING = 64  # steps whose first phase start is remembered (the emitter's own phases only)


def step_ids(run: str, step: int) -> tuple[int, int]:
    """The trace ID (128 bits) and the ``step`` span's ID (64 bits) of ``step`` of ``run``: the same in every
    process, different for another run or step (BLAKE2b of both; a zero ID, invalid in OTel, is never made)."""
    digest = hashlib.blake2b(f"rl_otel\x1f{run}\x1f{int(step)}".encode(), digest_size=24).digest()
    trace_id = int.from_bytes(digest[:16], "big") or 1
    span_id = int.from_bytes(digest[16:], "big") or 1
    assert trace_id != INVALID_TRACE_ID and span_id != INVALID_SPAN_ID
    return trace_id, span_id


def step_span_context(run: str, step: int) -> SpanContext:
    """The ``step`` span's context as another process sees it: remote, sampled (the step's trace is kept whole:
    a parent-based sampler keeps every phase under it)."""
    trace_id, span_id = step_ids(run, step)
    return SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))


def step_parent(run: str, step: int) -> Context:
    """A context whose current span is the ``step`` span of ``step``: the parent of a phase that has no other."""
    return trace.set_span_in_context(NonRecordingSpan(step_span_context(run, step)), Context())


def emits_step_spans(role: str, rank: int) -> bool:
    """Whether this process writes the ``step`` spans: rank 0 of the ``trainer`` role (a torchrun job's rank 0, the
    driver of a Ray job); exactly one process of a run must, or the step's trace has no root (Tempo then shows
    its phases under a "missing" parent)."""
    return role == STEP_ROLE and rank == 0


class StepSpans:
    """The ``step`` spans of the process that writes them: step N's span starts where step N-1 was logged (the
    first one at its first phase) and ends when N is logged; its IDs are :func:`step_ids`. Thread-safe; never
    raises (a failure is counted by ``fail``)."""

    def __init__(self, tracer: Callable[[], Any], choose: Callable[[int, int], Any], run: str,
                 attributes: Mapping[str, Any], fail: Callable[[str], None]) -> None:
        self._tracer, self._choose, self._run = tracer, choose, run
        self._attributes = dict(attributes)
        self._fail = fail
        self._lock = threading.Lock()
        self._started: dict[int, int] = {}  # step -> its first phase's start (ns), until the step is logged
        self._last_logged: int | None = None
        self._last_end_ns: int | None = None
        self._first_unknown_ns: int | None = None  # the first phase that started before any step was known

    def phase_started(self, step: int | None, start_ns: int) -> None:
        """A phase of this process starts in ``step`` (``None``: the step the next ``log()`` names): the step
        began no later."""
        with self._lock:
            if step is None:
                if self._first_unknown_ns is None:
                    self._first_unknown_ns = start_ns
                return
            if step not in self._started:
                if len(self._started) >= _MAX_PENDING:  # steps never logged: forget the oldest
                    self._started.pop(min(self._started))
                self._started[step] = start_ns

    def logged(self, step: int, end_ns: int | None = None) -> None:
        """``step`` is logged: write its ``step`` span (once per step; a step below the last one is history and
        gets none)."""
        end_ns = time.time_ns() if end_ns is None else end_ns
        with self._lock:
            if self._last_logged is not None and step <= self._last_logged:
                return
            first_phase = self._started.pop(step, None)
            if self._first_unknown_ns is not None:
                first_phase = min(first_phase or self._first_unknown_ns, self._first_unknown_ns)
                self._first_unknown_ns = None
            for older in [s for s in self._started if s < step]:
                del self._started[older]
            start_ns = self._last_end_ns if self._last_end_ns is not None else first_phase
            if first_phase is not None and start_ns is not None:
                start_ns = min(start_ns, first_phase)
            self._last_logged, self._last_end_ns = step, end_ns
        try:
            self._emit(step, end_ns if start_ns is None else start_ns, end_ns)
        except Exception:  # boundary: the OTel SDK and its span processors
            self._fail("step_span")

    def _emit(self, step: int, start_ns: int, end_ns: int) -> None:
        trace_id, span_id = step_ids(self._run, step)
        with self._choose(trace_id, span_id):
            span = self._tracer().start_span(STEP_SPAN, context=Context(), start_time=start_ns,
                                             attributes={**self._attributes, "step": step})
        span.end(end_time=end_ns)
