"""Training phases as OTel spans with ROLL's timing and memory keys, and live memory gauges.

- ``phase.py``: the ``Telemetry.phase()`` context manager (spans onload / execute / offload, ROLL's keys);
- ``memory.py``: GPU (torch.cuda) and CPU (psutil) snapshot probes;
- ``live.py``: gauges read at scrape time (process memory, torch's allocator, NVML polled in the background);
- ``tracing.py``: the TracerProvider, its exporters, random IDs and W3C traceparent carriers;
- :func:`engine_headers`: the headers that put a rollout engine's request spans under the generation phase.
"""

from __future__ import annotations

from rl_otel._internal.runtime.phase import Phase
from rl_otel._internal.tracing.carriers import extract, inject

__all__ = ["Phase", "engine_headers", "extract", "inject"]


def engine_headers(phase: Phase | None = None) -> dict[str, str]:
    """The W3C trace headers (``traceparent``, ``tracestate``) that make a rollout engine's request spans children
    of the generation phase, in its step's trace: vLLM's ``trace_headers=`` (``LLM.generate``,
    ``AsyncLLM.generate``; HTTP headers of its OpenAI server), SGLang's ``external_trace_header=`` (its HTTP server
    reads the ``traceparent`` header). ``phase``: a running ``Telemetry.phase()`` (its ``execute`` span); ``None``:
    the span current on this thread - inside a ``tel.phase()`` block or a ROLL phase
    (``integrations.roll_phases``) that is the phase's ``execute``. ``{}`` where there is no span (the engine then
    starts its own trace). Never raises."""
    if phase is not None:
        return phase.carrier()
    try:
        return inject()
    except Exception:  # a header lost, never a request
        return {}
