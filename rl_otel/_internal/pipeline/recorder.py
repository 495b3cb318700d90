"""The recorder: one object owns every write and every read of a process's series, as the OTel SDK's
``SynchronousMeasurementConsumer`` owns ``consume_measurement`` and ``collect``.

Writes. :meth:`Recorder.record` of typed :class:`~rl_otel._internal.pipeline.records.Measurement` s is the one
write into the series store. Everything that writes goes through it: a step (:meth:`Recorder.log`, routed key by
key through the catalog, its trackers' view handed to ``mirror``), a submitted job (:meth:`Recorder.submit`, run
on the metrics worker), a finished phase (:meth:`Recorder.record_phase`, on the thread that ran it), ``rl-otel
watch`` (through ``log``) and ``rl-otel backfill``. The recorder also owns the order of ``log()`` against
``submit()``: while submitted jobs are pending, a step queues behind them, so steps land in call order.

Reads. :meth:`Recorder.collect` is the one read: a :class:`~rl_otel._internal.pipeline.snapshot.Snapshot` of
the stored families and the live ones (the collectors, computed now, and rl_otel's own error counts). The scrape
endpoint, the OTLP push, ``tel.value()`` and backfill's file read it and never write: an error a reader absorbs is
counted in :class:`~rl_otel._internal.pipeline.diagnostics.Diagnostics`, outside the store, and read by the next
``collect()``. The one place a read waits for writes is ``collect(settle=True)`` (a scrape, ``tel.value()``): it
waits, bounded, for the jobs submitted before it, so no step is served half-computed.

Goodput. The recorder holds the process's :class:`~rl_otel._internal.pipeline.goodput.Goodput`: a recorded step
hands it its measurements (the timing keys of a process without phases), the phases and ``tel.collective()``
blocks open and close frames in it, and it is the recorder's first live collector (``rl_goodput_*``,
``rl_collective_wait_seconds_total``, ``rl_rank_compute_seconds_total``).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from functools import partial
from typing import Any

from rl_otel._internal.pipeline.diagnostics import Diagnostics
from rl_otel._internal.pipeline.goodput import Goodput
from rl_otel._internal.pipeline.ingest import Ingest, KeyValues
from rl_otel._internal.pipeline.records import Family, HistogramValue, Labels, Mark, Measurement, Point
from rl_otel._internal.pipeline.router import Router
from rl_otel._internal.pipeline.snapshot import Snapshot
from rl_otel._internal.pipeline.steps import PhaseBuffer, Steps
from rl_otel._internal.pipeline.store import SeriesStore, StoreSnapshot
from rl_otel._internal.pipeline.timing_keys import DURATIONS
from rl_otel._internal.pipeline.values import flatten, owned
from rl_otel._internal.pipeline.worker import Worker, caller_streams, on_streams
from rl_otel.catalog import Catalog, MetricSpec, live, meta

_log = logging.getLogger("rl_otel")
SETTLE_S = 2.0  # how long collect(settle=True) waits for the jobs submitted before it
_DURATION_LABELS_LIMIT = 64  # (cluster, phase) pairs whose duration labels are kept (a job has a handful)
_ORIGINS = itertools.count(1)
_EMPTY = StoreSnapshot(-1, None, families=())
Mirror = Callable[[dict[str, Any], int, bool], None]  # (metrics as logged, step, wait): the trackers' bridge
# a live collector's series: a float, or a histogram's value (an engine's histograms, exporters/engines.py)
Collector = Callable[[], Iterable[tuple[MetricSpec, Labels, float | HistogramValue]]]


class Recorder:
    """The series of one process (or, in ``rl-otel watch``, of one watched run and rank).

    ``base``: the labels of every series (run, role, rank). The caps and the TTL are ``init()``'s options of the
    same names. Thread-safe; nothing here raises to a writer (a job's exception goes to its ``Future``).
    """

    def __init__(self, catalog: Catalog, base: Mapping[str, str], *, max_series_per_metric: int = 10_000,
                 max_unknown_keys: int = 1_000, series_ttl_s: float | None = None, submit_queue_size: int = 4,
                 close_timeout_s: float = 10.0, clock: Callable[[], int] | None = None) -> None:
        self.diagnostics = diag = Diagnostics()
        self._max_series = max_series_per_metric
        self.store = SeriesStore(base, max_series_per_metric=max_series_per_metric, ttl_s=series_ttl_s,
                                 dropped_spec=meta.DROPPED_SERIES, on_drop=self._warn_capped, clock=clock)
        self.router = Router(catalog, max_unknown_keys)
        self.ingest = Ingest(self.router, diag, self.store.note_dropped, watched=DURATIONS)
        self.steps = Steps(diag)
        self.phases = PhaseBuffer()
        # submit()'s jobs, and the log()s queued behind them (recorded on the worker's thread)
        self.worker: Worker = Worker(name="rl_otel-metrics", queue_size=submit_queue_size, timeout_s=close_timeout_s,
                                     when_full="wait", on_error=lambda reason: diag.count("submit", reason))
        self.mirror: Mirror | None = None  # set when this process mirrors to trackers
        # told of every step recorded ("", "", 0.0) and finished phase (cluster, phase, total seconds): the hang
        # watch's progress time and phase history (probes/hangs.py)
        self.on_progress: Callable[[str, str, float], None] | None = None
        self.origin = next(_ORIGINS)
        # where the time goes: fed by the steps recorded here and by the phases (their runtime holds it), served
        # live (the time running now is in it at every collection)
        self.goodput = Goodput(diag)
        self._collectors: tuple[Collector, ...] = (self.goodput.collect,)  # copy-on-write: iterated unlocked
        self._last: StoreSnapshot | None = None  # the readers' memo: the store's last snapshot
        self._duration_labels: dict[tuple[str, ...], list[Labels]] = {}  # (cluster, phase, parts...) -> labels

    # -- the one write --------------------------------------------------------------------------------------

    def record(self, measurements: Iterable[Measurement], *, step: int | None = None,
               timestamp: float | None = None, gone: Iterable[tuple[MetricSpec, Labels]] = ()) -> None:
        """Write ``measurements`` into the store at once (a reader sees all of them or none). With ``step``, a
        series holding a newer step's value keeps it, and ``rl_step`` / ``rl_last_step_timestamp_seconds`` are
        set (``timestamp``: the step's Unix time, default now); ``gone``: gauge series a ``None`` removed."""
        marks: tuple[Mark, ...] = ()
        if step is not None:
            marks = (Mark(meta.STEP, float(step), True),
                     Mark(meta.LAST_STEP_TIMESTAMP, time.time() if timestamp is None else timestamp, False))
            if self.on_progress is not None:
                self.on_progress("", "", 0.0)
        left_out = self.store.write(measurements, step=step, gone=gone, marks=marks)
        for spec, n in left_out:
            self.diagnostics.count("input", "non_finite_in_distribution", n)
            self.diagnostics.warn_once("non_finite", spec.name, f"rl_otel: {n} NaN/Inf values left out of the "
                                                                f"histogram {spec.name} (Prometheus buckets cannot "
                                                                "hold them)")

    # -- writers --------------------------------------------------------------------------------------------

    def log(self, metrics: Mapping[str, object], step: object = None, wait: bool = False) -> None:
        """One step (``Telemetry.log``): recorded now, or queued behind pending submitted jobs (its tensors and
        arrays copied first, since the caller may reuse its buffers), so steps land in call order."""
        if not isinstance(metrics, Mapping):
            self.diagnostics.bad("", f"log() takes a dict of metrics, got {type(metrics).__name__}")
            return
        at = self.steps.advance(step)
        if not self.worker.pending:
            self._record_step(flatten(metrics), at, time.time(), None, wait)
            return
        pairs = [(key, owned(value)) for key, value in flatten(metrics)]
        phases = self.phases.take() if self.mirror is not None else None
        self.worker.submit(partial(self._record_queued, caller_streams(v for _, v in pairs), pairs, at, time.time(),
                                   phases, wait))

    def submit(self, fn: Callable[..., Mapping[str, object]], args: Sequence[Any], kwargs: Mapping[str, Any],
               step: object, future: Future) -> None:
        """``fn(*args, **kwargs)`` on the metrics worker, its dict recorded at ``step`` (taken now, in call order
        with ``log()``); ``future`` gets the dict or the exception (counted, said once per function)."""
        at = self.steps.advance(step)
        phases = self.phases.take() if self.mirror is not None else None
        streams = caller_streams((*args, *kwargs.values()))
        job = partial(self._run_submitted, fn, args, kwargs, at, time.time(), phases, streams, future)
        if not self.worker.submit(job, on_drop=partial(_dropped_job, future)):
            future.set_exception(RuntimeError("rl_otel: submit() after close()"))

    def record_phase(self, cluster: str, phase: str, metrics: dict[str, float], durations: dict[str, float]) -> None:
        """A finished phase, on the thread that ran it: its ROLL keys kept for the trackers' next step (when this
        process mirrors to trackers), and recorded now as current values, with ``rl_phase_duration_seconds`` per
        part (never raises)."""
        try:
            if self.mirror is not None:
                self.phases.add(metrics)
            if self.on_progress is not None:
                self.on_progress(cluster, phase, durations.get("total", 0.0))
            routed = self.ingest.route(metrics.items())
            routed.measurements += map(Measurement, itertools.repeat(live.PHASE_DURATION),
                                       self._phase_labels(cluster, phase, durations), durations.values())
            self.record(routed.measurements, gone=routed.gone)
        except Exception:
            self._phase_failed()

    def record_phase_gpu(self, cluster: str, phase: str, durations: dict[str, float]) -> None:
        """A finished phase's GPU seconds per part (CUDA events, resolved after it ended, on the GPU timer's
        thread): ``rl_phase_gpu_duration_seconds`` per part, and, when this process mirrors to trackers,
        ``time/{cluster}/{phase}/gpu/{part}`` for the trackers' next step (never raises)."""
        try:
            if self.mirror is not None:
                self.phases.add({f"time/{cluster}/{phase}/gpu/{part}": seconds for part, seconds in durations.items()})
            self.record(list(map(Measurement, itertools.repeat(live.PHASE_GPU_DURATION),
                                 self._phase_labels(cluster, phase, durations), durations.values())))
        except Exception:
            self._phase_failed()

    def _phase_failed(self) -> None:
        """One phase's failure is counted (and logged once); training goes on."""
        self.diagnostics.count("phase", "internal")
        if self.diagnostics.warn_once("phase", "store", "rl_otel: recording a phase's metrics failed; "
                                      "training goes on"):
            _log.debug("rl_otel: phase record failure", exc_info=True)

    def _phase_labels(self, cluster: str, phase: str, durations: Mapping[str, float]) -> list[Labels]:
        key = (cluster, phase, *durations)
        labels = self._duration_labels.get(key)
        if labels is None:  # the labels of a phase's parts, made once
            if len(self._duration_labels) >= _DURATION_LABELS_LIMIT:
                self._duration_labels.clear()
            labels = self._duration_labels[key] = [
                (("cluster", cluster), ("phase", phase), ("part", part)) for part in durations]
        return labels

    # -- the one read ---------------------------------------------------------------------------------------

    def add_collector(self, collector: Collector) -> None:
        """Call ``collector()`` at every :meth:`collect` for live ``(spec, labels, value)`` gauge series: never
        stored, a series it stops returning is gone from the next collection. It runs on the reader's thread and
        must be fast and never raise (anything slow, NVML, belongs in a poller thread with a cached value)."""
        self._collectors = (*self._collectors, collector)

    def collect(self, *, settle: bool = False, on_error: Callable[[str], None] | None = None) -> Snapshot:
        """Every family now: the store's snapshot (the same object while nothing was written) and the live
        families. ``settle``: first wait (up to :data:`SETTLE_S`) for the jobs submitted before this call, the one
        place a read waits for writes (a scrape, ``tel.value()``; the OTLP push does not, its next push has them).
        Writes nothing. A store that cannot be read leaves the live families served, and the reader's
        ``on_error("collect")`` counts it."""
        if settle and self.worker.pending:
            self.worker.flush(SETTLE_S)
        try:
            stored = self._last = self.store.freeze(self._last)
        except Exception:
            if on_error is None:
                raise
            _log.exception("rl_otel: reading the series store failed")
            on_error("collect")
            stored = _EMPTY
        base = self.store.base
        live: dict[str, Family] = {}
        for collector in self._collectors:
            try:
                items = list(collector())
            except Exception:  # a collector is meant never to raise; one that does costs only its own series
                self.diagnostics.count("live", "collector")
                self.diagnostics.warn_once("live", repr(collector), "rl_otel: a live gauge collector raised; its "
                                           "series are left out of this collection")
                continue
            for spec, labels, value in items:
                fam = live.get(spec.name)
                if fam is None:
                    fam = live[spec.name] = Family(spec, base, self.store.start_ns, [])
                fam.points.append(Point(labels, value))
        errors = self.diagnostics.family(base)
        if errors is not None:
            live[errors.spec.name] = errors
        return Snapshot(stored, tuple(live.values()), self.origin)

    def value(self, key: str, labels: Mapping[str, str]) -> float | HistogramValue | None:
        """What a scrape serves now for one series (``Telemetry.value``): ``key`` as logged (its labels from the
        key), or a family's name with the series' labels besides the base ones."""
        name, series = key, labels
        if not labels:
            route = self.router.existing(key)
            if route is not None:
                name, series = route.spec.name, dict(route.labels)
        return self.collect(settle=True).value(name, series)

    # -- internals ------------------------------------------------------------------------------------------

    def _record_step(self, pairs: KeyValues, step: int, timestamp: float, phases: dict[str, float] | None,
                     wait: bool = False) -> None:
        """One step's pairs recorded, then handed to the trackers with the phases finished since the last step
        (``phases``: taken when the step was logged; ``None``: take them now). A step below the highest one
        recorded is history: it sets no series back and removes none."""
        mirror = self.mirror
        routed = self.ingest.route(pairs, mirror=mirror is not None)
        current = self.steps.store(step)
        # the store keeps, per series, the newest step's value: whatever order concurrent writes land in
        self.record(routed.measurements, step=step, timestamp=timestamp, gone=routed.gone if current else ())
        goodput = self.goodput
        if not goodput.phased:  # a process with phases is accounted by them: its steps cost nothing more here
            goodput.step(routed.watched, step, timestamp)
        mirrored = routed.mirrored
        if mirror is not None and mirrored is not None:
            # the phases finished since the last step reach the trackers at this step, as in ROLL (a history
            # step takes none: they belong to the step being trained)
            if phases is None and current:
                phases = self.phases.take()
            if phases:
                mirrored = {**phases, **mirrored}
            if mirrored:
                mirror(mirrored, step, wait)

    def _record_queued(self, streams: tuple[object, ...], pairs: list[tuple[str, object]], step: int,
                       timestamp: float, phases: dict[str, float] | None, wait: bool) -> None:
        """A ``log()`` queued behind submitted jobs, run by the metrics worker (never raises)."""
        try:
            with on_streams(streams):
                self._record_step(pairs, step, timestamp, phases, wait)
        except Exception:
            self.internal_error("log")

    def _run_submitted(self, fn: Callable[..., Mapping[str, object]], args: Sequence[Any],
                       kwargs: Mapping[str, Any], step: int, timestamp: float, phases: dict[str, float] | None,
                       streams: tuple[object, ...], future: Future) -> None:
        """One submitted job, on the metrics worker: call ``fn``, record what it returns (never raises)."""
        if not future.set_running_or_notify_cancel():
            return
        name = getattr(fn, "__qualname__", None) or repr(fn)
        try:
            with on_streams(streams):
                metrics = fn(*args, **kwargs)
                if not isinstance(metrics, Mapping):
                    self.diagnostics.bad("", f"submit(): {name} returned {type(metrics).__name__}, not a dict of "
                                             "metrics")
                    future.set_exception(TypeError(f"{name} returned {type(metrics).__name__}, not a dict"))
                    return
                self._record_step(flatten(metrics), step, timestamp, phases)
        except Exception as exc:
            self.diagnostics.count("submit", "exception")
            if self.diagnostics.warn_once("submit", name, f"rl_otel: submit(): {name} raised "
                                                          f"{type(exc).__name__}: {exc}; its step is not logged, "
                                                          "training goes on"):
                _log.debug("rl_otel: submitted job failed", exc_info=True)
            future.set_exception(exc)
            return
        future.set_result(metrics)

    def refuse(self, fn: object, future: Future, *, closed: bool) -> None:
        """A ``submit()`` the facade refuses (after ``close()``, or not a function): said, and the future fails."""
        if closed:
            self.diagnostics.warn_once("closed", "submit", "rl_otel: submit() after close() is ignored")
            future.set_exception(RuntimeError("rl_otel: submit() after close()"))
            return
        self.diagnostics.bad("", f"submit() takes a function returning a dict of metrics, got {type(fn).__name__}")
        future.set_exception(TypeError(f"rl_otel: submit() takes a function, got {type(fn).__name__}"))

    def segment(self, name: object) -> str:
        """A phase or cluster name as one key segment: "/" replaced (said once)."""
        text = str(name)
        if "/" in text or not text:
            fixed = text.replace("/", "_") or "unnamed"
            self.diagnostics.warn_once("phase_name", text, f"rl_otel: phase names are one key segment; {text!r} is "
                                                           f"used as {fixed!r}")
            return fixed
        return text

    def internal_error(self, what: str) -> None:
        """A bug in ``log()``/``submit()`` itself: the step is dropped, counted and logged once with its traceback
        (call from an ``except`` block)."""
        if self.diagnostics.warn_once("internal", what, f"rl_otel: {what}() failed internally; training goes on"):
            _log.exception("rl_otel: %s() failed", what)
        self.diagnostics.count("input" if what == "log" else what, "internal")

    def _warn_capped(self, metric_name: str) -> None:
        self.diagnostics.warn_once("series_cap", metric_name,
                                   f"rl_otel: {metric_name} reached max_series_per_metric={self._max_series}; new "
                                   "label sets are dropped (counted in rl_telemetry_dropped_series_total)")


def _dropped_job(future: Future) -> None:
    """A job the metrics worker dropped (queue full for ``close_timeout_s``, or still queued at close)."""
    if future.set_running_or_notify_cancel():
        future.set_exception(RuntimeError("rl_otel: the metrics worker dropped this job (counted in "
                                          "rl_telemetry_errors_total{sink=\"submit\"})"))
