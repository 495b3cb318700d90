"""The recorder: :meth:`Recorder.record` and :meth:`Recorder.collect`, and nothing else, as the OTel SDK's
``SynchronousMeasurementConsumer`` owns ``consume_measurement`` and ``collect``.

The one write. :meth:`Recorder.record` of a :class:`~rl_otel._internal.pipeline.records.Batch` stores it in the
series store at once, then hands it to the recorder's consumers (the goodput accounting's timing keys, the hang
watch's progress), on the writer's thread. Everything that writes a series goes through it: a step
(:class:`~rl_otel._internal.pipeline.steplog.StepLog`, for ``log()`` and ``submit()``), a finished phase, the
process's info series (``rl_otel_build_info``, ``target_info``, ``rl_run_finished``), the values the routing
refused (``rl_telemetry_dropped_series_total``), ``rl-otel watch`` and ``rl-otel backfill``.

The one read. :meth:`Recorder.collect` is a :class:`~rl_otel._internal.pipeline.snapshot.Snapshot` of the stored
families and the live ones: its collectors (each a function computing its series now: goodput, memory, the
running phases, engines, hangs, collectives) and rl_otel's own error counts. It never writes and never waits: an
error a reader absorbs is counted in :class:`~rl_otel._internal.pipeline.diagnostics.Diagnostics`, outside the
store, and read by the next ``collect()``. The wait of a scrape and ``tel.value()`` for earlier ``submit()`` jobs
is :class:`~rl_otel._internal.pipeline.reads.SettledReads`'.

Collectors and consumers are given to the constructor, like the store and the diagnostics: nothing is assigned
after, and nothing here knows who built it.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence

from rl_otel._internal.pipeline.diagnostics import Diagnostics
from rl_otel._internal.pipeline.records import Batch, Family, HistogramValue, Labels, Point
from rl_otel._internal.pipeline.snapshot import Snapshot
from rl_otel._internal.pipeline.store import SeriesStore, StoreSnapshot
from rl_otel.catalog import MetricSpec

_log = logging.getLogger("rl_otel")
_ORIGINS = itertools.count(1)
_EMPTY = StoreSnapshot(-1, None, families=())
# a live collector's series: a float, or a histogram's value (an engine's histograms, exporters/engines.py)
Collector = Callable[[], Iterable[tuple[MetricSpec, Labels, float | HistogramValue]]]
Consumer = Callable[[Batch], None]  # told of every batch recorded, after the store has it


class Recorder:
    """The series of one process (or, in ``rl-otel watch``, of one watched run and rank): ``store`` holds them,
    ``collectors`` compute the live ones at each collection (in this order; each must be fast and never raise:
    anything slow, NVML, belongs in a poller thread with a cached value), ``consumers`` are told of each batch
    recorded. Thread-safe; nothing here raises to a writer but a consumer's own bug."""

    def __init__(self, store: SeriesStore, diagnostics: Diagnostics, *, collectors: Sequence[Collector] = (),
                 consumers: Sequence[Consumer] = ()) -> None:
        self.store = store
        self.diagnostics = diagnostics
        self._collectors = tuple(collectors)
        self._consumers = tuple(consumers)
        self.origin = next(_ORIGINS)  # tells the recorders of one process apart (snapshot.merged keys by it)

    def record(self, batch: Batch) -> None:
        """Store ``batch`` at once (a reader sees all of it or none), then hand it to the consumers. A histogram's
        NaN/Inf values (Prometheus buckets cannot hold them) and a series past the cap are counted and said once."""
        non_finite, capped = self.store.write(batch)
        diag = self.diagnostics
        for spec, n in non_finite:
            diag.count("input", "non_finite_in_distribution", n)
            diag.warn_once("non_finite", spec.name, f"rl_otel: {n} NaN/Inf values left out of the histogram "
                                                    f"{spec.name} (Prometheus buckets cannot hold them)")
        for name in capped:
            diag.warn_once("series_cap", name, f"rl_otel: {name} reached max_series_per_metric="
                                               f"{self.store.max_series_per_metric}; new label sets are dropped "
                                               "(counted in rl_telemetry_dropped_series_total)")
        for consumer in self._consumers:
            consumer(batch)

    def collect(self, *, on_error: Callable[[str], None] | None = None,
                only: Mapping[str, Collection[Labels]] | None = None) -> Snapshot:
        """Every family now: the store's snapshot (the same object while nothing was written) and the live
        families. Writes nothing, waits for nothing. A store that cannot be read leaves the live families served,
        and the reader's ``on_error("collect")`` counts it. ``only``: just these stored series, by family name, and
        no live family (``rl-otel backfill``: what one point wrote)."""
        if only is not None:
            return Snapshot(self.store.freeze(only), (), self.origin)
        try:
            stored = self.store.freeze()
        except Exception:  # boundary: a reader's thread (a scrape, a push) must outlive a broken store, counted
            if on_error is None:
                raise
            _log.exception("rl_otel: reading the series store failed")
            on_error("collect")
            stored = _EMPTY
        base = self.store.base
        live: dict[str, list[Point]] = {}
        specs: dict[str, MetricSpec] = {}
        for collector in self._collectors:
            try:
                items = list(collector())
            except Exception:  # boundary: a collector reads torch, NVML, the OS; one that raises costs its series
                self.diagnostics.count("live", "collector")
                self.diagnostics.warn_once("live", repr(collector), "rl_otel: a live gauge collector raised; its "
                                           "series are left out of this collection")
                continue
            for spec, labels, value in items:
                points = live.get(spec.name)
                if points is None:
                    points = live[spec.name] = []
                    specs[spec.name] = spec
                points.append(Point(labels, value))
        start_ns = self.store.start_ns
        families = [Family(specs[name], base, start_ns, tuple(points)) for name, points in live.items()]
        errors = self.diagnostics.family(base)
        if errors is not None:
            families.append(errors)
        return Snapshot(stored, tuple(families), self.origin)
