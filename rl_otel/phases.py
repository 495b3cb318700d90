"""Training phases as OTel spans with ROLL's timing and memory keys, and live memory gauges.

- ``phase.py``: the ``Telemetry.phase()`` context manager (spans onload / execute / offload, ROLL's keys);
- ``memory.py``: GPU (torch.cuda) and CPU (psutil) snapshot probes;
- ``live.py``: gauges read at scrape time (process memory, torch's allocator, NVML polled in the background);
- ``tracing.py``: the TracerProvider, its exporters, random IDs and W3C traceparent carriers.
"""

from __future__ import annotations

from rl_otel._internal.tracing.carriers import extract, inject
from rl_otel._internal.tracing.phase import Phase

__all__ = ["Phase", "extract", "inject"]
