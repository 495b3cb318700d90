"""A phase's spans as the OTel API sees them, without the SDK until something needs it.

Most runs configure no span exporter (``tracing=None``). There the SDK would build, time and end four spans per
phase only to hand them to nobody - most of a phase's cost - and loading its trace package (and the resource
detectors and psutil it imports) would be most of the first phase's. So while rl_otel's own TracerProvider has
no span processor, a phase makes span *contexts* only (:class:`DeferredSpan`), made when first read, and while
nothing has asked for the provider (a ``tracing=`` exporter, an OTLP span push, a read of
``Telemetry.tracer_provider``, a span context read) it is not built at all. Imports: the OTel API only.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from time import time_ns
from typing import Any, cast

from opentelemetry.context import Context
from opentelemetry.trace import (
    INVALID_SPAN_CONTEXT,
    Link,
    NonRecordingSpan,
    Span,
    SpanContext,
    TraceFlags,
    get_current_span,
)

from rl_otel._internal.tracing.steps import StepSpans, step_parent, step_span_context


class PhaseTracer:
    """Starts a phase's spans, and skips the SDK's span objects when no span processor could receive them.

    ``peek()`` returns the TracerProvider if it was built (``None`` otherwise: then no processor can have been
    added to it, and no phase records), ``get()`` builds it. Without processors :meth:`context_only` makes just
    the span *context* (the trace and span IDs, flags and trace state ``start_span`` would have given), enough for
    ``Phase.carrier()`` and for user spans started inside the block to get their parent. Processors may be added
    to the provider at any time, so :meth:`recording` is asked at every phase.
    """

    __slots__ = ("_get", "_name_version", "_peek", "_recording", "_tracer", "known_step", "run", "step_spans")

    def __init__(self, peek: Callable[[], Any], get: Callable[[], Any], name: str, version: str, *,
                 run: str | None = None, known_step: Callable[[], int | None] | None = None,
                 step_spans: StepSpans | None = None) -> None:
        self._peek, self._get = peek, get
        self._tracer: Any = None
        self._recording: Callable[[], bool] | None = None
        self._name_version = (name, version)
        self.run = run  # None: phases are not put in their step's trace (no run to derive its IDs from)
        self.known_step = known_step  # the step a phase without step= is in; None when no step is known yet
        self.step_spans = step_spans  # this process writes the steps' root spans (``tracing/steps.py``)

    def start_root(self, name: str, parent: Context | None, step: int | None, attributes: dict[str, Any],
                   policy_step: int | None = None) -> tuple[Span, Context | None]:
        """Start a recorded phase's root span; return it and its parent context. The parent: the carrier's context
        if one was given; else the current one when a span is current (an enclosing phase, the user's span); else
        the ``step`` span of the phase's step (``step=``, else the step the next ``log()`` gets once one was
        logged), so that the phases of every process of the run share its trace (``tracing/steps.py``). A phase
        whose step is not known yet starts a provisional trace, moved into its step's at the next ``log()``
        (``tracing/pending.py``). ``policy_step``: the step whose policy made the phase's data (an async
        rollout): a link to that step's ``step`` span."""
        if step is None and self.known_step is not None:
            step = self.known_step()
        if step is not None:
            attributes["step"] = step
        links = None
        if policy_step is not None and self.run is not None:
            attributes["policy_step"] = policy_step
            links = [Link(step_span_context(self.run, policy_step), {"rl.link": "policy"})]
        if parent is None and self.run is not None and not get_current_span().get_span_context().is_valid:
            spans = self.step_spans
            if spans is not None:
                spans.phase_started(step, time_ns())
            if step is not None:
                parent = step_parent(self.run, step)
            else:
                root = self.tracer.start_span(name, context=None, attributes=attributes, links=links)
                pending = getattr(self._peek(), "pending", None)
                if pending is not None:
                    pending.hold(root.get_span_context().trace_id)
                return root, None
        return self.tracer.start_span(name, context=parent, attributes=attributes, links=links), parent

    @property
    def tracer(self) -> Any:
        """The provider's tracer (the provider is built now if it was not)."""
        if self._tracer is None:
            self._resolve(self._get())
        return self._tracer

    def recording(self) -> bool:
        """False when rl_otel's own provider has no span processor (spans would reach nobody), or was never
        built. A user's provider (``tracer_provider=``) always gets its spans: whether it can receive them is its
        own business; so does a no-op tracer (``OTEL_SDK_DISABLED``), which keeps its own behaviour."""
        recording = self._recording
        if recording is None:
            provider = self._peek()
            if provider is None:
                return False
            recording = self._resolve(provider)
        return recording()

    def _resolve(self, provider: Any) -> Callable[[], bool]:
        from opentelemetry.sdk.trace import Tracer  # loaded with the provider already

        from rl_otel._internal.tracing.tracing import OwnTracerProvider

        tracer = provider.get_tracer(*self._name_version)
        if isinstance(tracer, Tracer) and isinstance(provider, OwnTracerProvider):
            recording: Callable[[], bool] = lambda: provider.has_span_processor
        else:
            recording = lambda: True
        self._tracer, self._recording = tracer, recording
        return recording

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


def _new_making_lock() -> None:
    global _MAKING
    _MAKING = threading.RLock()  # the parent's may have been held by another thread at the fork


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_making_lock)


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
