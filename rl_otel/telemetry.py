"""The facade: one :class:`Telemetry` per process, what a training loop logs through (create it with
:func:`rl_otel.init`).

It only guards and forwards, as the OTel SDK's instruments do: closed? a signal held while a step is logged?
never raise. The series go through the :class:`~rl_otel._internal.pipeline.recorder.Recorder` (the one write and
the one read), the resources live in :class:`~rl_otel._internal.runtime.components.Components`. What ``log()``,
``submit()`` and ``phase()`` promise in detail: ``docs/logging.md``.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from rl_otel._internal.pipeline.recorder import Recorder
from rl_otel._internal.pipeline.records import HistogramValue
from rl_otel._internal.pipeline.worker import reset_in_forked_child
from rl_otel._internal.runtime.components import Components
from rl_otel._internal.runtime.config import TelemetryConfig
from rl_otel.catalog import Catalog

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource

    from rl_otel._internal.pipeline.goodput import Collective
    from rl_otel._internal.tracing.phase import Phase

__all__ = ["HistogramValue", "Telemetry"]


class Telemetry:
    """The handle a training loop logs through; create it with :func:`rl_otel.init`.

    Thread-safe: ``log()`` may be called from several threads. ``close()`` runs once; the object is also a
    context manager. Nothing on the per-step path raises: bad values are skipped with one warning per key and
    counted in ``rl_telemetry_errors_total{sink="input"}``.
    """

    def __init__(self, config: TelemetryConfig, catalog: Catalog) -> None:
        self.config = config
        self.catalog = catalog
        self._closed = False
        self._close_lock = threading.Lock()
        reset_in_forked_child(self)  # every lock on the log() path is made again in a forked child (_after_fork)
        self._recorder = Recorder(catalog, config.base_labels, max_series_per_metric=config.max_series_per_metric,
                                  max_unknown_keys=config.max_unknown_keys, series_ttl_s=config.series_ttl_s,
                                  submit_queue_size=config.submit_queue_size, close_timeout_s=config.close_timeout_s)
        self._components = Components(config, self._recorder)
        self._components.build(on_term=self.close, on_int=self.flush)  # closes what it made if a step fails
        # closed at interpreter exit unless closed before (frameworks that never call finish(), like ROLL)
        self._pid = os.getpid()
        atexit.register(self._close_at_exit)

    @property
    def resource(self) -> Resource:
        """The OTel ``Resource`` of this process (what ``target_info`` serves and OTLP pushes): rl_otel's defaults,
        under ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_SERVICE_NAME``, the ``rl.*`` attributes and ``init(resource=)``."""
        return self._components.resource

    @property
    def metrics_url(self) -> str | None:
        """``http://host:port/metrics`` of the scrape endpoint (``None`` without one)."""
        endpoint = self._components.endpoint
        return endpoint.url if endpoint else None

    @property
    def step(self) -> int | None:
        """The highest step logged so far (``None`` before the first ``log()``); ``step=None`` continues from it."""
        return self._recorder.steps.last

    @property
    def trackers(self) -> tuple[str, ...]:
        """Names of the tracker sinks this process mirrors to (empty on ranks that do not mirror)."""
        return self._components.bridge.sink_names

    @property
    def tracer_provider(self) -> Any:
        """The ``TracerProvider`` phases use: ``init(tracer_provider=...)``'s, else this Telemetry's own (never the
        global one unless given), to which span processors may be added."""
        return self._components.tracer_provider

    @property
    def meter_provider(self) -> Any:
        """An OTel ``MeterProvider`` for your own instruments, served on ``/metrics`` (and pushed over OTLP) beside
        rl_otel's series; ``None`` with neither an endpoint nor an OTLP push. Built at the first read. A name
        rl_otel already serves is dropped from the scrape and counted (``duplicate_family``)."""
        return None if self._closed else self._components.user_meter_provider()

    def value(self, key: str, /, **labels: str) -> float | HistogramValue | None:
        """What the scrape endpoint serves now for one series, in base units (bytes, seconds); ``None`` when it
        serves none::

            tel.value("critic/score/mean")                  # a key as logged: 0.41
            tel.value("rl_telemetry_errors_total", sink="input", reason="bad_value")   # a family and its labels

        Waits (bounded) for the :meth:`submit` jobs submitted before it, as a scrape does. A histogram gives a
        :class:`~rl_otel.HistogramValue`. For tests, checks and tools, not the per-step path."""
        return self._recorder.value(key, labels)

    def log(self, metrics: Mapping[str, object], step: int | None = None, *, wait_for_trackers: bool = False) -> None:
        """Record one step's metrics; ``step=None`` is the highest step so far + 1 (0 at first).

        Takes numbers, numpy scalars, tensors (a 1-d one for a distribution key, bucketed on its device), nested
        dicts (keys joined with "/"); NaN and ±Inf pass; ``None`` removes a gauge's series until its next value.
        The trackers get every key as logged. A step below the highest one is history: the trackers get it, the
        endpoint keeps newer values. Stored before it returns, unless :meth:`submit` jobs are pending (then it
        queues behind them). Never waits for the trackers, unless ``wait_for_trackers`` (a replay of history).
        Details: ``docs/logging.md``."""
        if self._closed:
            self._recorder.diagnostics.warn_once("closed", "", "rl_otel: log() after close() is ignored")
            return
        signals = self._components.signals
        if signals is not None:
            signals.hold()  # a SIGTERM/SIGINT now is handled once this step is fully logged
        try:
            self._recorder.log(metrics, step, wait_for_trackers)
        except Exception:  # the training step must go on
            self._recorder.internal_error("log")
        finally:
            if signals is not None:
                signals.release()

    def submit(self, fn: Callable[..., Mapping[str, object]], /, *args: Any, step: int | None = None,
               **kwargs: Any) -> Future:
        """Compute a step's metrics off the training thread: ``fn(*args, **kwargs)`` runs on the metrics worker
        and its dict is logged at ``step`` (``None``: taken now, in call order with ``log()``)::

            tel.submit(ppo_stats, log_probs=lp, old_log_probs=old_lp, response_mask=mask, advantages=adv,
                       catalog=tel.catalog, step=step)

        Do not modify the tensors in place afterwards; CUDA work queues on the caller's current stream. Never
        raises: the ``Future`` holds the dict, or ``fn``'s exception (counted, logged once per function)."""
        future: Future = Future()
        if self._closed:
            self._recorder.diagnostics.warn_once("closed", "submit", "rl_otel: submit() after close() is ignored")
            future.set_exception(RuntimeError("rl_otel: submit() after close()"))
            return future
        if not callable(fn):
            self._recorder.diagnostics.bad("", f"submit() takes a function returning a dict of metrics, got "
                                               f"{type(fn).__name__}")
            future.set_exception(TypeError(f"rl_otel: submit() takes a function, got {type(fn).__name__}"))
            return future
        signals = self._components.signals
        if signals is not None:
            signals.hold()
        try:
            self._recorder.submit(fn, args, kwargs, step, future)
        except Exception as exc:  # the training step must go on
            self._recorder.internal_error("submit")
            if not future.done():
                future.set_exception(exc)
        finally:
            if signals is not None:
                signals.release()
        return future

    def phase(self, cluster: str, phase: str, *, onload: Callable[[], Any] | None = None,
              offload: Callable[[], Any] | None = None, step: int | None = None,
              parent: Mapping[str, str] | None = None, bucket: str | None = None) -> Phase:
        """Time and trace one phase of a cluster, as ROLL's ``state_offload_manager`` does, always on::

            with tel.phase("actor_train", "train_step", onload=strategy.load_states,
                           offload=strategy.offload_states):
                train()

        The span ``{cluster}/{phase}`` with children ``onload``, ``execute``, ``offload``; ROLL's ``time/...`` and
        ``memory/...`` keys (to the trackers with the next ``log()``), ``rl_phase_duration_seconds`` and, on a GPU,
        the phase's GPU time. ``parent``: a carrier from ``Phase.carrier()`` in another process. ``bucket``: the
        goodput bucket of its ``execute`` part (``"training"``, ...; default: its name's, ``docs/goodput.md``). The
        callables' and the body's exceptions propagate; telemetry never raises. Details: ``docs/logging.md``."""
        return self._components.phase_runtime().open(
            _one_segment(cluster, self._recorder), _one_segment(phase, self._recorder), onload=onload,
            offload=offload, step=step, parent=parent,
            bucket=None if bucket is None else self._recorder.goodput.known_bucket(bucket))

    def collective(self, point: str) -> Collective:
        """Time a blocking wait where ranks meet, around a collective or a barrier::

            with tel.collective("allreduce"):
                dist.all_reduce(grads)

        Counted in ``rl_collective_wait_seconds_total{point}`` and the ``waiting`` goodput bucket, never in
        ``rl_rank_compute_seconds_total``, even inside a phase: the rank the others wait for is the one that
        computes longest. Never raises; the body's exceptions propagate. Details: ``docs/goodput.md``."""
        return self._recorder.goodput.collective(str(point))

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every submitted job has run, the phases' GPU times are known and the trackers have written
        every logged step. True if all of it finished within the timeout."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s

        def left() -> float | None:
            return None if deadline is None else max(0.0, deadline - time.monotonic())

        ran = self._recorder.worker.flush(timeout_s)
        timed = self._components.flush_phases(left())  # the GPU times of the phases ended so far
        return self._components.bridge.flush(left()) and ran and timed

    def close(self) -> None:
        """Flush and close the trackers (bounded by ``close_timeout_s``), stop serving. Idempotent; never raises.
        A SIGTERM or SIGINT arriving meanwhile is delivered once the close is over, to the handler it would have
        met without rl_otel. A failing step is counted in ``rl_telemetry_errors_total{sink="close"}`` and the
        later steps still run."""
        with self._close_lock:
            if self._closed:
                return
            signals = self._components.signals
            if signals is not None:  # from now on a SIGTERM/SIGINT waits for the end of this close
                signals.begin_close()
            self._closed = True
        atexit.unregister(self._close_at_exit)
        self._components.close()

    def _after_fork(self) -> None:
        self._close_lock = threading.Lock()  # the parent's may have been held by another thread at the fork

    def _close_at_exit(self) -> None:
        if os.getpid() == self._pid:  # a forked child's copy is not ours to close (its threads are the parent's)
            self.close()

    def __enter__(self) -> Telemetry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _one_segment(name: object, recorder: Recorder) -> str:
    """A phase or cluster name as one key segment ("/" replaced, said once)."""
    text = str(name)
    if "/" in text or not text:
        fixed = text.replace("/", "_") or "unnamed"
        recorder.diagnostics.warn_once("phase_name", text, f"rl_otel: phase names are one key segment; {text!r} is "
                                                           f"used as {fixed!r}")
        return fixed
    return text
