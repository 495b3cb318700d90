"""rl_otel's own troubles, made visible without ever stopping a training step.

Every problem is counted in ``rl_telemetry_errors_total{sink, reason}`` and logged once per ``(what, key)``. The
counts are kept here, not in the series store: a reader (a scrape, the OTLP push, a live gauge) counts what it
absorbed without writing the store, and the recorder's ``collect()`` reads the counts as one more family
(:meth:`Diagnostics.family`). The memory of what was said is bounded per kind of warning, so a
burst of one kind (10,000 distinct bad keys) cannot use up the budget of the others: past ``per_kind`` keys of
one kind, one line says that further ones of that kind are only counted. Keys are remembered by a bounded prefix
and messages are truncated, so a hostile 1 MB key costs neither memory nor a 1 MB log line.
"""

from __future__ import annotations

import logging
import threading
import time

from rl_otel._internal.forks import reset_in_forked_child
from rl_otel._internal.pipeline.records import Family, Labels, Point
from rl_otel.catalog import meta

_log = logging.getLogger("rl_otel")
PER_KIND = 1_000  # distinct keys remembered per kind of warning
_KEY_CHARS = 200  # of a key, what the warn-once memory keeps
_MESSAGE_CHARS = 500


class Diagnostics:
    """Counts and warn-once logging of one Telemetry; thread-safe, never raises."""

    def __init__(self, *, per_kind: int = PER_KIND) -> None:
        self._counts: dict[Labels, float] = {}
        self._start_ns = time.time_ns()
        self._per_kind = per_kind
        self._seen: dict[str, set[str]] = {}
        self._full: set[str] = set()
        self._lock = threading.Lock()
        reset_in_forked_child(self)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()  # the parent's may have been held by another thread at the fork

    def count(self, where: str, reason: str, amount: float = 1.0) -> None:
        """Add to ``rl_telemetry_errors_total{sink=where, reason=...}``: ``where`` is a tracker sink's name or one of
        rl_otel's own places (``input``, ``submit``, ``phase``, ``prometheus``, ``otlp``, ...; the label keeps its
        name, which rules and dashboards read: see the glossary in ``docs/architecture.md``)."""
        labels = (("sink", where), ("reason", reason))
        with self._lock:
            self._counts[labels] = self._counts.get(labels, 0.0) + amount

    def family(self, base: Labels) -> Family | None:
        """``rl_telemetry_errors_total`` now (``None`` before the first error): what ``collect()`` serves."""
        if not self._counts:
            return None
        with self._lock:
            points = tuple(map(Point, self._counts, self._counts.values()))
        return Family(meta.ERRORS, base, self._start_ns, points)

    def warn_once(self, what: str, key: str, message: str) -> bool:
        """Log ``message`` as a warning the first time ``(what, key)`` is seen; True if it was logged."""
        key = key[:_KEY_CHARS]
        with self._lock:
            seen = self._seen.setdefault(what, set())
            if key in seen:
                return False
            if len(seen) >= self._per_kind:
                if what in self._full:
                    return False
                self._full.add(what)  # said once: this kind's budget is used up
                message = (f"rl_otel: {self._per_kind} distinct {what!r} warnings logged; further ones are only "
                           "counted in rl_telemetry_errors_total")
            else:
                seen.add(key)
        if len(message) > _MESSAGE_CHARS:
            message = f"{message[:_MESSAGE_CHARS]}... ({len(message) - _MESSAGE_CHARS} more characters)"
        _log.warning(message)
        return True

    def phase_failed(self, what: str) -> None:
        """A phase's telemetry (``what``: its span, snapshot, record...) failed: counted as ``sink="phase",
        reason="internal"``, said once per ``what``, its traceback at debug level (call from an ``except`` block).
        The phase and the training go on."""
        self.count("phase", "internal")
        if self.warn_once("phase", what, f"rl_otel: a phase's telemetry ({what}) failed; training goes on"):
            _log.debug("rl_otel: phase telemetry failure", exc_info=True)

    def bad(self, key: str, why: str, reason: str = "bad_value") -> None:
        """A key (or value, or step) ``log()`` skips: counted under ``sink="input"`` with ``reason``, said once."""
        self.count("input", reason)
        self.warn_once(reason, key, f"rl_otel: skipping {key!r}: {why}" if key else f"rl_otel: {why}")
