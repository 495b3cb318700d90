"""The step log: what makes ``log()``, ``submit()`` and a finished phase into the recorder's batches, in order.

It owns the order of steps (:class:`~rl_otel._internal.pipeline.steps.Steps`: which step a ``log()`` writes at,
which step is history), the metrics worker (``submit()``'s jobs, and the ``log()`` s queued behind them while
jobs are pending, so steps land in call order), and the ROLL keys of the phases finished since the trackers' last
step (:class:`~rl_otel._internal.pipeline.steps.PhaseBuffer`). A step is routed key by key through the catalog
(:class:`~rl_otel._internal.pipeline.ingest.Ingest`), recorded as one batch (the values the routing refused
counted in it), and its trackers' view handed to ``mirror`` (the tracker bridge).

Everything it needs is given to its constructor; it holds the recorder, never what built it.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from functools import partial
from typing import Any

from rl_otel._internal.pipeline.diagnostics import Diagnostics
from rl_otel._internal.pipeline.ingest import Ingest, KeyValues, Routed
from rl_otel._internal.pipeline.recorder import Recorder
from rl_otel._internal.pipeline.records import Batch, Count, Labels, Measurement, PhaseEnd
from rl_otel._internal.pipeline.steps import PhaseBuffer, Steps
from rl_otel._internal.pipeline.values import flatten, owned
from rl_otel._internal.pipeline.worker import Worker, caller_streams, on_streams
from rl_otel.catalog import live, meta

_log = logging.getLogger("rl_otel")
_NEW = tuple.__new__  # a NamedTuple made from a tuple in C, all fields given: its own __new__ costs ~0.4 us a call
_DURATION_LABELS_LIMIT = 64  # (cluster, phase) pairs whose duration labels are kept (a job has a handful)
Mirror = Callable[[dict[str, Any], int, bool], None]  # (metrics as logged, step, wait): the trackers' bridge


def metrics_worker(diag: Diagnostics, queue_size: int, timeout_s: float) -> Worker:
    """The metrics worker: ``submit()``'s jobs and the ``log()`` s queued behind them (``submit_queue_size``,
    ``close_timeout_s``; producers wait for room: backpressure, not loss)."""
    return Worker(name="rl_otel-metrics", queue_size=queue_size, timeout_s=timeout_s, when_full="wait",
                  on_error=lambda reason: diag.count("submit", reason))


class StepLog:
    """Steps and finished phases into ``recorder``; ``worker``: the metrics worker (:func:`metrics_worker`);
    ``mirror``: the trackers' bridge (``None``: this process does not mirror to trackers). Thread-safe; nothing
    here raises to a caller (a job's exception goes to its ``Future``)."""

    def __init__(self, recorder: Recorder, ingest: Ingest, worker: Worker, *, mirror: Mirror | None) -> None:
        self._recorder = recorder
        self._ingest = ingest
        self._diag: Diagnostics = ingest.diagnostics
        self._mirror = mirror
        self.steps = Steps(self._diag)
        self._phases = PhaseBuffer()
        self.worker = worker
        self._duration_labels: dict[tuple[str, ...], list[Labels]] = {}  # (cluster, phase, parts...) -> labels

    # -- writers -----------------------------------------------------------------------------------------------

    def log(self, metrics: Mapping[str, object], step: object = None, wait: bool = False) -> None:
        """One step (``Telemetry.log``): recorded now, or queued behind pending submitted jobs (its tensors and
        arrays copied first, since the caller may reuse its buffers), so steps land in call order."""
        if not isinstance(metrics, Mapping):
            self._diag.bad("", f"log() takes a dict of metrics, got {type(metrics).__name__}")
            return
        at = self.steps.advance(step)
        if not self.worker.pending:
            self._record_step(flatten(metrics), at, time.time(), None, wait)
            return
        pairs = [(key, owned(value)) for key, value in flatten(metrics)]
        phases = self._phases.take() if self._mirror is not None else None
        self.worker.submit(partial(self._record_queued, caller_streams(v for _, v in pairs), pairs, at, time.time(),
                                   phases, wait))

    def submit(self, fn: Callable[..., Mapping[str, object]], args: Sequence[Any], kwargs: Mapping[str, Any],
               step: object, future: Future) -> None:
        """``fn(*args, **kwargs)`` on the metrics worker, its dict recorded at ``step`` (taken now, in call order
        with ``log()``); ``future`` gets the dict or the exception (counted, said once per function)."""
        at = self.steps.advance(step)
        phases = self._phases.take() if self._mirror is not None else None
        streams = caller_streams((*args, *kwargs.values()))
        job = partial(self._run_submitted, fn, args, kwargs, at, time.time(), phases, streams, future)
        if not self.worker.submit(job, on_drop=partial(_dropped_job, future)):
            future.set_exception(RuntimeError("rl_otel: submit() after close()"))

    def refuse(self, fn: object, future: Future, *, closed: bool) -> None:
        """A ``submit()`` the facade refuses (after ``close()``, or not a function): said, and the future fails."""
        if closed:
            self._diag.warn_once("closed", "submit", "rl_otel: submit() after close() is ignored")
            future.set_exception(RuntimeError("rl_otel: submit() after close()"))
            return
        self._diag.bad("", f"submit() takes a function returning a dict of metrics, got {type(fn).__name__}")
        future.set_exception(TypeError(f"rl_otel: submit() takes a function, got {type(fn).__name__}"))

    def record_phase(self, cluster: str, phase: str, metrics: dict[str, float], durations: dict[str, float]) -> None:
        """A finished phase, on the thread that ran it: its ROLL keys kept for the trackers' next step (when this
        process mirrors to trackers), and recorded now as current values, with ``rl_phase_duration_seconds`` per
        part. The phase guards the call (``runtime/phase.py``: a failure is the phase's, counted there)."""
        if self._mirror is not None:
            self._phases.add(metrics)
        routed = self._ingest.route(metrics.items())
        routed.measurements += map(Measurement, itertools.repeat(live.PHASE_DURATION),
                                   self._phase_labels(cluster, phase, durations), durations.values())
        self._recorder.record(_NEW(Batch, (routed.measurements, None, None, routed.gone, _refused(routed), (),
                                           _NEW(PhaseEnd, (cluster, phase, durations.get("total", 0.0))))))

    def record_phase_gpu(self, cluster: str, phase: str, durations: dict[str, float]) -> None:
        """A finished phase's GPU seconds per part (CUDA events, resolved after it ended, where the phase's thread
        or a flush finds them): ``rl_phase_gpu_duration_seconds`` per part, and, when this process mirrors to
        trackers, ``time/{cluster}/{phase}/gpu/{part}`` for the trackers' next step."""
        if self._mirror is not None:
            self._phases.add({f"time/{cluster}/{phase}/gpu/{part}": seconds for part, seconds in durations.items()})
        self._recorder.record(Batch(list(map(Measurement, itertools.repeat(live.PHASE_GPU_DURATION),
                                             self._phase_labels(cluster, phase, durations), durations.values()))))

    def internal_error(self, what: str) -> None:
        """A bug in ``log()``/``submit()`` itself: the step is dropped, counted and logged once with its traceback
        (call from an ``except`` block)."""
        if self._diag.warn_once("internal", what, f"rl_otel: {what}() failed internally; training goes on"):
            _log.exception("rl_otel: %s() failed", what)
        self._diag.count("input" if what == "log" else what, "internal")

    # -- waits -------------------------------------------------------------------------------------------------

    def flush(self, timeout_s: float | None) -> bool:
        """Wait until every job submitted before this call has run; True if they did within ``timeout_s``."""
        return self.worker.flush(timeout_s)

    def close(self) -> None:
        """Run what is queued (bounded by ``timeout_s``), then refuse later jobs."""
        self.worker.close()

    # -- internals ---------------------------------------------------------------------------------------------

    def _record_step(self, pairs: KeyValues, step: int, timestamp: float, phases: dict[str, float] | None,
                     wait: bool = False) -> None:
        """One step's pairs recorded, then handed to the trackers with the phases finished since the last step
        (``phases``: taken when the step was logged; ``None``: take them now). A step below the highest one
        recorded is history: it sets no series back and removes none."""
        mirror = self._mirror
        routed = self._ingest.route(pairs, mirror=mirror is not None)
        current = self.steps.store(step)
        # the store keeps, per series, the newest step's value: whatever order concurrent writes land in
        self._recorder.record(_NEW(Batch, (routed.measurements, step, timestamp, routed.gone if current else (),
                                           _refused(routed), (), None)))
        mirrored = routed.mirrored
        if mirror is not None and mirrored is not None:
            # the phases finished since the last step reach the trackers at this step, as in ROLL (a history
            # step takes none: they belong to the step being trained)
            if phases is None and current:
                phases = self._phases.take()
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
        except Exception:  # boundary: the metrics worker's job; a log() dropped is counted as log()'s own failure
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
                    self._diag.bad("", f"submit(): {name} returned {type(metrics).__name__}, not a dict of metrics")
                    future.set_exception(TypeError(f"{name} returned {type(metrics).__name__}, not a dict"))
                    return
                self._record_step(flatten(metrics), step, timestamp, phases)
        except Exception as exc:  # boundary: the user's function (its exception goes to its Future)
            self._diag.count("submit", "exception")
            if self._diag.warn_once("submit", name, f"rl_otel: submit(): {name} raised {type(exc).__name__}: "
                                                    f"{exc}; its step is not logged, training goes on"):
                _log.debug("rl_otel: submitted job failed", exc_info=True)
            future.set_exception(exc)
            return
        future.set_result(metrics)

    def _phase_labels(self, cluster: str, phase: str, durations: Mapping[str, float]) -> list[Labels]:
        key = (cluster, phase, *durations)
        labels = self._duration_labels.get(key)
        if labels is None:  # the labels of a phase's parts, made once
            if len(self._duration_labels) >= _DURATION_LABELS_LIMIT:
                self._duration_labels.clear()
            labels = self._duration_labels[key] = [
                (("cluster", cluster), ("phase", phase), ("part", part)) for part in durations]
        return labels


def _refused(routed: Routed) -> list[Count]:
    """The values the routing refused, counted in ``rl_telemetry_dropped_series_total{metric}``."""
    return [Count(meta.DROPPED_SERIES, (("metric", metric),)) for metric in routed.refused] if routed.refused else []


def _dropped_job(future: Future) -> None:
    """A job the metrics worker dropped (queue full for ``close_timeout_s``, or still queued at close)."""
    if future.set_running_or_notify_cancel():
        future.set_exception(RuntimeError("rl_otel: the metrics worker dropped this job (counted in "
                                          "rl_telemetry_errors_total{sink=\"submit\"})"))
