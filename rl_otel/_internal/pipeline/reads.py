"""The reads that wait: a scrape and ``tel.value()`` serve no step half-computed.

A step handed to ``submit()`` is taken when ``submit()`` returns but recorded when its job has run on the metrics
worker. A scrape, and ``tel.value()``, first wait for the jobs submitted before them, up to :data:`SETTLE_S`
(the promise ``docs/logging.md`` makes), then read the recorder's :meth:`~rl_otel._internal.pipeline.recorder.
Recorder.collect`. This is the one place a read waits for writes: the recorder's ``collect()`` itself never
waits, and the OTLP push reads it directly (its next push has what is still running).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from rl_otel._internal.pipeline.recorder import Recorder
from rl_otel._internal.pipeline.records import HistogramValue
from rl_otel._internal.pipeline.router import Router
from rl_otel._internal.pipeline.snapshot import Snapshot
from rl_otel._internal.pipeline.worker import Worker

SETTLE_S = 2.0  # how long a settled read waits for the jobs submitted before it


class SettledReads:
    """``recorder``'s reads after the jobs submitted to ``worker`` (the metrics worker) before them; ``router``
    finds a logged key's family and labels for :meth:`value`."""

    def __init__(self, recorder: Recorder, router: Router, worker: Worker) -> None:
        self._recorder = recorder
        self._router = router
        self._worker = worker

    def collect(self, *, settle: bool = True, on_error: Callable[[str], None] | None = None) -> Snapshot:
        """The recorder's collection, after the jobs submitted before this call (``settle=False``: at once, for a
        scrape that shares the rendering of one that waited)."""
        if settle and self._worker.pending:  # a hint read without the lock: no wait at all when none is pending
            self._worker.flush(SETTLE_S)
        return self._recorder.collect(on_error=on_error)

    def value(self, key: str, labels: Mapping[str, str]) -> float | HistogramValue | None:
        """What a scrape serves now for one series (``Telemetry.value``): ``key`` as logged (its labels from the
        key), or a family's name with the series' labels besides the base ones."""
        name, series = key, labels
        if not labels:
            route = self._router.existing(key)
            if route is not None:
                name, series = route.spec.name, dict(route.labels)
        found = self.collect().value(name, series)
        if isinstance(found, HistogramValue):  # the caller's own list (the public type's): the snapshot keeps its tuple
            return found._replace(counts=list(found.counts))
        return found
