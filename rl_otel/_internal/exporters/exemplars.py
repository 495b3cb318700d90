"""OpenMetrics exemplars on ``rl_phase_duration_seconds``: from a slow phase on a dashboard to its trace.

The last recorded root span of each phase (``cluster``, ``phase``) is kept (:class:`Exemplars`, fed by the span
processor in front of rl_otel's own provider, ``tracing/pending.py``, once the span is in its step's trace), and a
scrape that asks for OpenMetrics (``Accept: application/openmetrics-text``, as Prometheus does with
``--enable-feature=exemplar-storage``) gets it on the bucket line of the phase's ``part="total"`` series that
holds its duration (:func:`with_exemplars`)::

    rl_phase_duration_seconds_bucket{...,cluster="actor_train",le="2.5",part="total",phase="train_step",...} 7 \
# {trace_id="5f0c...",span_id="a1b2..."} 1.93 1732800000.123

The text format has no exemplars: a text scrape is unchanged. The rendering is cached per store version, and a
phase's end writes the store, so this runs about once per step and only for OpenMetrics scrapes.
"""

from __future__ import annotations

import threading
from typing import Any, NamedTuple

FAMILY = "rl_phase_duration_seconds_bucket{"


class Exemplar(NamedTuple):
    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits
    value: float  # seconds
    timestamp: float  # Unix seconds, the span's end


class Exemplars:
    """The latest exemplar per (cluster, phase). Thread-safe: written by the span processor, read by scrapes."""

    def __init__(self, max_phases: int = 1024) -> None:
        self._lock = threading.Lock()
        self._latest: dict[tuple[str, str], Exemplar] = {}
        self._max = max_phases

    def note(self, span: Any) -> None:
        """A phase's root span ended (an SDK ``ReadableSpan`` with ``cluster`` and ``phase`` attributes)."""
        attributes = span.attributes or {}
        key = (str(attributes.get("cluster")), str(attributes.get("phase")))
        context = span.context
        if span.start_time is None or span.end_time is None or context is None:
            return
        exemplar = Exemplar(f"{context.trace_id:032x}", f"{context.span_id:016x}",
                            (span.end_time - span.start_time) / 1e9, span.end_time / 1e9)
        with self._lock:
            if key in self._latest or len(self._latest) < self._max:
                self._latest[key] = exemplar

    def current(self) -> dict[tuple[str, str], Exemplar]:
        with self._lock:
            return dict(self._latest)


def with_exemplars(text: str, exemplars: dict[tuple[str, str], Exemplar]) -> str:
    """``text`` (OpenMetrics) with each exemplar on the first bucket line of its phase's ``part="total"`` series
    whose bound holds its value."""
    if not exemplars or FAMILY not in text:
        return text
    wanted = {(f'cluster="{c}"', f'phase="{p}"'): e for (c, p), e in exemplars.items()}
    lines = text.split("\n")
    done: set[tuple[str, str]] = set()
    for i, line in enumerate(lines):
        if not line.startswith(FAMILY) or 'part="total"' not in line:
            continue
        for key, exemplar in wanted.items():
            if key in done or key[0] not in line or key[1] not in line:
                continue
            le = line[line.index('le="') + 4:]
            bound = float(le[:le.index('"')])
            if exemplar.value <= bound:
                lines[i] = (f'{line} # {{trace_id="{exemplar.trace_id}",span_id="{exemplar.span_id}"}} '
                            f"{exemplar.value!r} {exemplar.timestamp:.3f}")
                done.add(key)
            break
    return "\n".join(lines)
