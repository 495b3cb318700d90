"""A recorder with what writes into it and reads it, for what records without a ``Telemetry``: each run
``rl-otel watch`` serves, ``rl-otel backfill``, and tests. A ``Telemetry`` builds the same parts itself
(``runtime/components.py``), in the order its probes, endpoint and trackers need.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from rl_otel._internal.pipeline.diagnostics import Diagnostics
from rl_otel._internal.pipeline.goodput import Goodput
from rl_otel._internal.pipeline.ingest import Ingest
from rl_otel._internal.pipeline.reads import SettledReads
from rl_otel._internal.pipeline.recorder import Collector, Consumer, Recorder
from rl_otel._internal.pipeline.records import Batch, HistogramValue
from rl_otel._internal.pipeline.router import Router
from rl_otel._internal.pipeline.snapshot import Snapshot
from rl_otel._internal.pipeline.steplog import Mirror, StepLog, metrics_worker
from rl_otel._internal.pipeline.store import SeriesStore
from rl_otel._internal.runtime.options import default
from rl_otel.catalog import Catalog


class Pipeline(NamedTuple):
    """The parts of one recorder: ``steps`` writes steps into ``recorder``, ``reads`` reads single values after
    the submitted jobs, ``goodput`` accounts the steps' timing keys (a collector and consumer of ``recorder``)."""

    recorder: Recorder
    steps: StepLog
    reads: SettledReads
    goodput: Goodput
    ingest: Ingest

    @property
    def diagnostics(self) -> Diagnostics:
        return self.recorder.diagnostics

    @property
    def store(self) -> SeriesStore:
        return self.recorder.store

    def record(self, batch: Batch) -> None:
        """The recorder's write."""
        self.recorder.record(batch)

    def log(self, metrics: Mapping[str, object], step: object = None) -> None:
        """``Telemetry.log``'s write."""
        self.steps.log(metrics, step)

    def value(self, key: str, labels: Mapping[str, str] | None = None) -> float | HistogramValue | None:
        """``Telemetry.value``'s read."""
        return self.reads.value(key, labels or {})

    def collect(self, *, settle: bool = False, on_error: Callable[[str], None] | None = None) -> Snapshot:
        """A scrape's read (``settle``: after the jobs submitted before it)."""
        return self.reads.collect(settle=settle, on_error=on_error)


def pipeline(catalog: Catalog, base: Mapping[str, str], *, max_series_per_metric: int | None = None,
             max_unknown_keys: int | None = None, series_ttl_s: float | None = None,
             submit_queue_size: int | None = None, close_timeout_s: float | None = None,
             clock: Callable[[], int] | None = None, started: float | None = None,
             collectors: Sequence[Collector] = (), consumers: Sequence[Consumer] = (),
             mirror: Mirror | None = None, diagnostics: Diagnostics | None = None) -> Pipeline:
    """A recorder of ``catalog``'s metrics labelled ``base``, its options ``init()``'s (their defaults where not
    given: :data:`~rl_otel._internal.runtime.options.OPTIONS`); ``started``: the process's start (goodput's
    start-up; ``None``: not measured, as for a watched run); ``collectors``/``consumers``: more of the recorder's,
    after goodput's; ``mirror``: the trackers' bridge."""
    diag = diagnostics if diagnostics is not None else Diagnostics()
    goodput = Goodput(diag, started=started)
    store = SeriesStore(base, max_series_per_metric=_or_default(max_series_per_metric, "max_series_per_metric"),
                        ttl_s=series_ttl_s, clock=clock)
    recorder = Recorder(store, diag, collectors=(goodput.collect, *collectors),
                        consumers=(goodput.recorded, *consumers))
    router = Router(catalog, _or_default(max_unknown_keys, "max_unknown_keys"))
    ingest = Ingest(router, diag)
    worker = metrics_worker(diag, _or_default(submit_queue_size, "submit_queue_size"),
                            _or_default(close_timeout_s, "close_timeout_s"))
    steps = StepLog(recorder, ingest, worker, mirror=mirror)
    return Pipeline(recorder, steps, SettledReads(recorder, router, worker), goodput, ingest)


def _or_default(value: Any, option: str) -> Any:
    return default(option) if value is None else value
