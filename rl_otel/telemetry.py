"""The facade: one :class:`Telemetry` per process, what a training loop logs through (create it with
:func:`rl_otel.init`).

It only guards and forwards, as the OTel SDK's instruments do: closed? a signal held while a step is logged?
never raise. Steps go to the :class:`~rl_otel._internal.pipeline.steplog.StepLog`, which records them through the
:class:`~rl_otel._internal.pipeline.recorder.Recorder` (the one write and the one read); every part is built by
:class:`~rl_otel._internal.runtime.components.Components`. What ``log()``, ``submit()`` and ``phase()`` promise in
detail: ``docs/logging.md``.
"""

from __future__ import annotations

import atexit
import os
import threading
import weakref
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from rl_otel._internal.forks import reset_in_forked_child
from rl_otel._internal.pipeline.records import HistogramValue
from rl_otel._internal.runtime.components import Components
from rl_otel._internal.runtime.config import TelemetryConfig
from rl_otel.catalog import Catalog

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource

    from rl_otel._internal.pipeline.goodput import Collective
    from rl_otel._internal.runtime.phase import Phase

__all__ = ["HistogramValue", "Telemetry"]


class Telemetry:
    """The handle a training loop logs through; create it with :func:`rl_otel.init`. Thread-safe; a context
    manager; nothing on the per-step path raises (a bad value is skipped, said once and counted)."""

    def __init__(self, config: TelemetryConfig, catalog: Catalog) -> None:
        self.config = config
        self.catalog = catalog
        self._closed = False
        self._close_lock = threading.Lock()
        reset_in_forked_child(self)  # every lock on the log() path is made again in a forked child (_after_fork)
        # the signal handlers reach back to close()/flush() weakly: nothing below the facade holds it
        self._components = Components(config, catalog, on_term=_weakly(self.close), on_int=_weakly(self.flush))
        self._steps = self._components.steplog
        self._diag = self._components.diagnostics
        # closed at interpreter exit unless closed before (frameworks that never call finish(), like ROLL)
        self._pid = os.getpid()
        atexit.register(self._close_at_exit)

    @property
    def resource(self) -> Resource:
        """The OTel ``Resource`` of this process: what ``target_info`` serves and OTLP pushes."""
        return self._components.resource

    @property
    def metrics_url(self) -> str | None:
        """``http://host:port/metrics`` of the scrape endpoint (``None`` without one)."""
        endpoint = self._components.endpoint
        return endpoint.url if endpoint else None

    @property
    def step(self) -> int | None:
        """The highest step logged so far (``None`` before the first ``log()``); ``step=None`` continues from it."""
        return self._steps.steps.last

    @property
    def trackers(self) -> tuple[str, ...]:
        """Names of the tracker sinks this process mirrors to (empty on ranks that do not mirror)."""
        return self._components.bridge.sink_names

    @property
    def tracer_provider(self) -> Any:
        """The ``TracerProvider`` phases use: ``init(tracer_provider=...)``'s, else this Telemetry's own."""
        return self._components.tracers.get()

    @property
    def meter_provider(self) -> Any:
        """An OTel ``MeterProvider`` for your own instruments, served on ``/metrics`` (and pushed over OTLP) beside
        rl_otel's series; ``None`` with neither an endpoint nor an OTLP push. Built at the first read. A name
        rl_otel already serves is dropped from the scrape and counted (``duplicate_family``)."""
        return None if self._closed else self._components.user_meter_provider()

    def value(self, key: str, /, **labels: str) -> float | HistogramValue | None:
        """What the scrape endpoint serves now for one series (base units; ``None``: none), for a key as logged
        (``tel.value("critic/score/mean")``) or a family and its labels (``tel.value("rl_telemetry_errors_total",
        sink="input", reason="bad_value")``). Waits (bounded) for earlier :meth:`submit` jobs, as a scrape does."""
        return self._components.reads.value(key, labels)

    def log(self, metrics: Mapping[str, object], step: int | None = None, *, wait_for_trackers: bool = False) -> None:
        """Record one step's metrics; ``step=None`` is the highest step so far + 1 (0 at first).

        Takes numbers, numpy scalars, tensors (a 1-d one for a distribution key, bucketed on its device), nested
        dicts (keys joined with "/"); NaN and ±Inf pass; ``None`` removes a gauge's series until its next value.
        The trackers get every key as logged. A step below the highest one is history: the trackers get it, the
        endpoint keeps newer values. Stored before it returns, unless :meth:`submit` jobs are pending (then it
        queues behind them). Never waits for the trackers, unless ``wait_for_trackers`` (a replay of history).
        Details: ``docs/logging.md``."""
        if self._closed:
            self._diag.warn_once("closed", "", "rl_otel: log() after close() is ignored")
            return
        with self._components.held:  # a SIGTERM/SIGINT now is handled once this step is fully logged
            try:
                self._steps.log(metrics, step, wait_for_trackers)
                self._components.logged()  # the step's root span, in the one process that writes them
            except Exception:  # boundary: the training step must go on (a bug of rl_otel's, counted and said)
                self._steps.internal_error("log")

    def submit(self, fn: Callable[..., Mapping[str, object]], /, *args: Any, step: int | None = None,
               **kwargs: Any) -> Future:
        """Compute a step's metrics off the training thread: ``fn(*args, **kwargs)`` runs on the metrics worker
        and its dict is logged at ``step`` (``None``: taken now, in call order with ``log()``)::

            tel.submit(ppo_stats, log_probs=lp, old_log_probs=old_lp, response_mask=mask, advantages=adv,
                       catalog=tel.catalog, step=step)

        Do not modify the tensors in place afterwards; CUDA work queues on the caller's current stream. Never
        raises: the ``Future`` holds the dict, or ``fn``'s exception (counted, logged once per function)."""
        future: Future = Future()
        if self._closed or not callable(fn):
            self._steps.refuse(fn, future, closed=self._closed)
            return future
        with self._components.held:
            try:
                self._steps.submit(fn, args, kwargs, step, future)
                self._components.logged()  # the step is taken now: its trace as with log()
            except Exception as exc:  # boundary: the training step must go on (a bug of rl_otel's, counted)
                self._steps.internal_error("submit")
                if not future.done():
                    future.set_exception(exc)
        return future

    def phase(self, cluster: str, phase: str, *, onload: Callable[[], Any] | None = None,
              offload: Callable[[], Any] | None = None, step: int | None = None,
              parent: Mapping[str, str] | None = None, bucket: str | None = None,
              memory: bool | None = None, policy_step: int | None = None) -> Phase:
        """Time and trace one phase of a cluster, as ROLL's ``state_offload_manager`` does, always on::

            with tel.phase("actor_train", "train_step", onload=strategy.load_states,
                           offload=strategy.offload_states):
                train()

        Spans, ROLL's ``time/`` and ``memory/`` keys, ``rl_phase_duration_seconds`` (and the GPU time on a GPU).
        ``parent``: a carrier from ``Phase.carrier()`` in another process; ``bucket``: the goodput bucket of its
        ``execute`` part (default: its name's); ``memory=False``: no memory snapshot (times and GPU events only,
        for phases run per micro-batch; default: ``init(phase_memory=...)``); ``policy_step``: the step whose policy
        made this phase's data (an async rollout), linked from its span (``docs/tracing.md``). Your code's
        exceptions propagate. Details: ``docs/logging.md``, on a GPU ``docs/gpu.md``, traces ``docs/tracing.md``."""
        return self._components.phase_runtime().open(
            _segment(cluster, self._diag), _segment(phase, self._diag), onload=onload, offload=offload, step=step,
            parent=parent, bucket=None if bucket is None else self._components.goodput.known_bucket(bucket),
            memory=None if memory is None else bool(memory),
            policy_step=policy_step if type(policy_step) is int else None)

    def collective(self, point: str) -> Collective:
        """Time a blocking wait where ranks meet, around a collective or a barrier::

            with tel.collective("allreduce"):
                dist.all_reduce(grads)

        Counted in ``rl_collective_wait_seconds_total{point}`` and the ``waiting`` bucket, never as the rank's
        compute time (the rank the others wait for computes longest). Details: ``docs/goodput.md``."""
        return self._components.goodput.collective(str(point))

    def engine(self, url: str, *, name: str) -> str | None:
        """Publish a rollout engine server (vLLM, SGLang) as a Prometheus scrape target, with this run's labels::

            tel.engine("http://10.0.0.5:8000", name="rollout-0")

        Writes a file_sd targets file beside this process's (``prometheus={'file_sd': DIR}``) naming the engine's
        ``/metrics`` (the URL's path, default ``/metrics``), labelled ``run``, ``role``, ``rank``,
        ``replica=name`` and ``rl_target="engine"``; Prometheus scrapes the engine itself. Calling it again with
        the same ``name`` replaces the target; ``close()`` removes it. Returns the file's path, or ``None`` (said
        once) when no file_sd directory is set. Raises ``ValueError`` for a URL without a host and port.
        Details: ``docs/engines.md``."""
        if self._closed:  # its file would outlive the process: nothing removes it any more
            self._diag.warn_once("closed", "engine", "rl_otel: engine() after close() is ignored")
            return None
        return self._components.engine_target(url, name)

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every submitted job has run, the phases' GPU times are known and the trackers have written
        every logged step. True if all of it finished within the timeout."""
        return self._components.flush(timeout_s)

    def close(self) -> None:
        """Flush and close the trackers (bounded by ``close_timeout_s``), stop serving. Idempotent; never raises;
        a SIGTERM or SIGINT arriving meanwhile is delivered once the close is over (``docs/failure-behaviour.md``)."""
        with self._close_lock:
            if self._closed:
                return
            self._components.begin_close()  # from now on a SIGTERM/SIGINT waits for the end of this close
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


def _weakly(method: Callable[[], object]) -> Callable[[], object]:
    """``method`` called through a weak reference to its object (nothing, once the object is gone)."""
    ref = weakref.WeakMethod(method)

    def call() -> object:
        bound = ref()
        return None if bound is None else bound()

    return call


def _segment(name: object, diag: Any) -> str:
    """A phase or cluster name as one key segment: "/" replaced (said once)."""
    text = str(name)
    if "/" in text or not text:
        fixed = text.replace("/", "_") or "unnamed"
        diag.warn_once("phase_name", text, f"rl_otel: phase names are one key segment; {text!r} is used as {fixed!r}")
        return fixed
    return text
