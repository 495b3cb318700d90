"""W3C trace-context carriers between processes (the OTel API only: no SDK needed to pass a parent along)."""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry.context import Context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_PROPAGATOR = TraceContextTextMapPropagator()


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
