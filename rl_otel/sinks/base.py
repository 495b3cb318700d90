"""The sink protocol and the sink registry: see :mod:`rl_otel._internal.trackers.sinks` (public modules import the
internal ones, never the other way round)."""

from __future__ import annotations

from rl_otel._internal.trackers.sinks import (
    Metrics,
    Sink,
    SinkError,
    SinkFactory,
    missing_dependency,
    register_sink,
    registered_sinks,
    sink_factory,
    text_key,
    text_keys,
)

__all__ = ["Metrics", "Sink", "SinkError", "SinkFactory", "missing_dependency", "register_sink", "registered_sinks",
           "sink_factory", "text_key", "text_keys"]
