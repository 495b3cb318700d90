"""The facade: one :class:`Telemetry` per process, what a training loop logs through (create it with
:func:`rl_otel.init`).

It holds no logic of its own beyond the per-call guards (closed? a signal held while a step is logged? never
raise): a step goes through :class:`~rl_otel._internal.pipeline.ingest.Pipeline` (trackers, then router → store),
the resources live in :class:`~rl_otel._internal.runtime.components.Components`. See ``docs/architecture.md``.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from functools import partial
from typing import TYPE_CHECKING, Any

from rl_otel._internal.exporters.otel_env import resolve_resource
from rl_otel._internal.pipeline.diagnostics import Diagnostics
from rl_otel._internal.pipeline.ingest import Pipeline
from rl_otel._internal.pipeline.router import Router
from rl_otel._internal.pipeline.store import HistogramValue, SeriesStore
from rl_otel._internal.pipeline.values import flatten, owned
from rl_otel._internal.pipeline.worker import Worker, caller_streams, on_streams, reset_in_forked_child
from rl_otel._internal.runtime.components import Components
from rl_otel._internal.runtime.config import TelemetryConfig
from rl_otel._version import __version__
from rl_otel.catalog import Catalog, meta

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource

    from rl_otel._internal.tracing.phase import Phase

__all__ = ["HistogramValue", "Telemetry"]

_log = logging.getLogger("rl_otel")
_READ_WAIT_S = 2.0  # how long value() and a scrape wait for submitted jobs before reading what is stored


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
        store = SeriesStore({"run": config.run, "rank": str(config.rank)},
                            max_series_per_metric=config.max_series_per_metric, ttl_s=config.series_ttl_s,
                            dropped_spec=meta.DROPPED_SERIES, on_drop=self._warn_capped)
        self._diag = Diagnostics(store)
        self._pipeline = Pipeline(store, Router(catalog, config.max_unknown_keys), self._diag)
        # submit()'s jobs, and log()s queued behind them (written to the store on the worker's thread)
        self._worker: Worker = Worker(name="rl_otel-metrics", queue_size=config.submit_queue_size,
                              timeout_s=config.close_timeout_s, when_full="wait",
                              on_error=lambda reason: self._diag.count("submit", reason))
        # explicit (init's resource=) > OTEL_SERVICE_NAME > OTEL_RESOURCE_ATTRIBUTES > rl_otel's defaults
        # (the SDK Resource object itself is built when something needs it: see the resource property)
        resource = resolve_resource(
            {"service.name": "rl_otel", "service.version": __version__, "service.instance.id":
                f"{config.host_name}/{config.run}/{config.rank}", "host.name": config.host_name},
            {"rl.run": config.run, "rl.rank": config.rank, "rl.role": config.role,
             "rl.local_rank": config.local_rank, "rl.world_size": config.world_size},
            dict(config.resource))
        self._components = Components(config, resource, self._pipeline, self._worker)
        self._components.build(on_term=self.close, on_int=self._flush_on_signal)  # closes what it made if a step fails
        # closed at interpreter exit unless closed before (frameworks that never call finish(), like ROLL): the
        # metrics worker drains, the trackers write what is queued, the endpoint and file_sd target go away
        self._pid = os.getpid()
        atexit.register(self._close_at_exit)

    @property
    def resource(self) -> Resource:
        """The OTel ``Resource`` of this process's telemetry (what ``target_info`` serves, what OTLP pushes):
        rl_otel's defaults, under ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_SERVICE_NAME``, init()'s own ``rl.*``
        attributes and ``init(resource=...)``. The attributes are resolved at ``init()``; the SDK object is built
        at the first read (or by the first provider that needs it)."""
        return self._components.resource

    # -- reading --------------------------------------------------------------------------------------------

    @property
    def metrics_url(self) -> str | None:
        """``http://host:port/metrics`` of the scrape endpoint (``None`` without one)."""
        endpoint = self._components.endpoint
        return endpoint.url if endpoint else None

    @property
    def step(self) -> int | None:
        """The highest step logged so far (``None`` before the first ``log()``); ``step=None`` continues from it."""
        return self._pipeline.steps.last

    @property
    def trackers(self) -> tuple[str, ...]:
        """Names of the tracker sinks this process mirrors to (empty on ranks that do not mirror)."""
        return self._components.bridge.sink_names

    @property
    def tracer_provider(self) -> Any:
        """The ``TracerProvider`` phases use: the one given as ``init(tracer_provider=...)``, else this
        Telemetry's own (never the global one unless given), to which span processors may be added."""
        return self._components.tracer_provider

    @property
    def meter_provider(self) -> Any:
        """An OTel ``MeterProvider`` for the user's own instruments (``None`` with neither a scrape endpoint nor an
        OTLP push): they are served on ``/metrics`` beside rl_otel's series::

            meter = tel.meter_provider.get_meter("my_trainer")
            meter.create_counter("my_restarts", unit="1").add(1)    # -> my_restarts_total on /metrics

        Built at the first read (no SDK pipeline behind the endpoint until then); also pushed over OTLP when
        rl_otel pushes to a collector through its own OTLP exporter. They follow the OTel SDK's rules (NaN/Inf
        dropped, a histogram's default buckets are for milliseconds); a name rl_otel already serves is dropped
        from the scrape and counted (``duplicate_family``). See :mod:`rl_otel._internal.exporters.instruments`."""
        return None if self._closed else self._components.user_meter_provider()

    def value(self, key: str, /, **labels: str) -> float | HistogramValue | None:
        """What the scrape endpoint serves now for one series, in base units (bytes, seconds); ``None`` when it
        serves none (never logged, refused by the catalog routing, removed by a ``None``, expired)::

            tel.log({"critic/score/mean": 0.41, "memory/cpu/actor_train/train_step/start/rss": 1.5}, step=3)
            tel.value("critic/score/mean")                           # 0.41
            tel.value("memory/cpu/actor_train/train_step/start/rss")  # 1610612736.0: bytes, the tracker got GiB
            tel.value("rl_step")                                      # 3.0
            tel.value("rl_telemetry_errors_total", sink="input", reason="bad_value")

        ``key`` is a key as logged (its labels come from the key), or the name of a family the endpoint serves
        (``rl_step``, a counter's ``..._total``) with the series' labels besides ``run`` and ``rank`` as keyword
        arguments; given labels, ``key`` is a family name. A gauge or counter gives a float; a histogram a
        :class:`~rl_otel.HistogramValue` (``counts`` per bucket, the last one above the highest bound, then
        ``sum``, ``count``, ``min`` and ``max`` of the finite values). Like a scrape, it waits for the
        :meth:`submit` jobs submitted before it (a bounded wait; a job reading it does not wait for itself).
        Works with or without a scrape endpoint; meant for tests, checks and tools, not the per-step path.
        """
        if self._worker.pending:  # the jobs submitted before this read land first (on the worker's thread)
            self._worker.flush(_READ_WAIT_S)
        name, series = key, labels
        if not labels:
            route = self._pipeline.router.existing(key)
            if route is not None:
                name, series = route.spec.name, dict(route.labels)
        value = self._pipeline.store.snapshot().value(name, series)
        if value is None:
            for view in self._pipeline.store.live():
                if name in (view.spec.name, view.spec.prometheus_name):
                    value = next((v for k, v in view.points if dict(k) == series), None)
        return value

    # -- writing --------------------------------------------------------------------------------------------

    def log(self, metrics: Mapping[str, object], step: int | None = None, *, wait_for_trackers: bool = False) -> None:
        """Record one step's metrics. ``step=None`` means the highest step so far + 1 (0 for the first call).

        Accepts int/float/bool, numpy scalars, 0-d tensors, 1-d tensors/arrays/lists for distribution keys, and
        nested dicts (keys joined with "/"). NaN and ±Inf pass through. ``None`` means "no value this step" (TRL
        logs it for a window whose values were all NaN): the key's gauge series is removed from the endpoint, so
        its previous value does not look current (Prometheus marks it stale; the next real value brings it back);
        a counter or histogram keeps its total, and trackers get nothing for the key. A 1-d tensor for a
        histogram key is bucketed on its device (only the counts reach the host), and ``BucketCounts`` from
        ``rl_otel.stats`` (``ppo_stats(distributions=True)``) are merged as they are. The trackers get every key
        as logged, before any Prometheus rule: a key the endpoint refuses (a name collision, past
        ``max_unknown_keys``) is still mirrored; :meth:`value` reads back what the endpoint serves.

        Steps never go back on the endpoint. A step below the highest one logged is history (ROLL's
        ``resume_metrics`` replaying the run from a thread after a restart, possibly while new steps are logged):
        the trackers get all of it, since they keep a point per step; on the Prometheus side, where a scrape can
        only show a value as current, a series keeps a newer step's value - ``rl_step`` stays at the highest
        step, a gauge is not set back to an old value, a counter does not decrease (Prometheus would read a
        reset), a histogram does not take the old step's values - and a ``None`` removes nothing. A series that
        no newer step has written (a key only the old step has) takes the value. Equal steps are current
        (several ``log()`` calls per step, an evaluation logged at the last training step). A new training that
        counts from 0 again belongs in a new Telemetry: until it passes the old highest step, its values would
        not replace the old ones.

        Stored before it returns - unless :meth:`submit` jobs are still running: then the step queues behind
        them (its tensors and arrays copied first), so steps reach Prometheus and the trackers in call order.
        Never waits for the trackers: one ``sink_queue_size`` steps behind loses its oldest step (counted). With
        ``wait_for_trackers=True`` the call waits while a tracker is half that far behind (``close_timeout_s`` at
        most; not for a hung tracker), so a burst loses no step and leaves room for the calls that never wait:
        for a thread that can wait, such as a replay of history.
        """
        if self._closed:
            self._diag.warn_once("closed", "", "rl_otel: log() after close() is ignored")
            return
        signals = self._components.signals
        if signals is not None:
            signals.hold()  # a SIGTERM/SIGINT now is handled once this step is fully logged
        try:
            self._log(metrics, step, wait_for_trackers)
        except Exception:  # the training step must go on
            self._internal_error("log")
        finally:
            if signals is not None:
                signals.release()

    def submit(self, fn: Callable[..., Mapping[str, object]], /, *args: Any, step: int | None = None,
               **kwargs: Any) -> Future:
        """Compute a step's metrics off the training thread: ``fn(*args, **kwargs)`` runs on the Telemetry's
        metrics worker and the dict it returns is logged at ``step`` (``None``: the previous step + 1, taken now,
        in call order with ``log()``)::

            tel.submit(ppo_stats, log_probs=lp, old_log_probs=old_lp, response_mask=mask, advantages=adv,
                       catalog=tel.catalog, step=step)

        The training thread pays for the hand-off (microseconds) instead of the statistics' tensor ops and their
        host sync. The tensors are read when the job runs: do not modify them in place afterwards (a new batch
        each step is fine). CUDA work is queued on the caller's current stream, behind what produced the tensors.
        Jobs run one at a time, in order; ``log()`` calls made while jobs are pending queue behind them (their
        tensors and arrays copied), so the store and the trackers see steps in call order. Scrapes, OTLP exports,
        :meth:`flush` and :meth:`close` wait for the jobs submitted before them.

        Never raises: the returned ``Future`` holds the dict, or the exception of ``fn`` - counted in
        ``rl_telemetry_errors_total{sink="submit",reason="exception"}`` and logged once per function.
        """
        future: Future = Future()
        if self._closed:
            self._diag.warn_once("closed", "submit", "rl_otel: submit() after close() is ignored")
            future.set_exception(RuntimeError("rl_otel: submit() after close()"))
            return future
        if not callable(fn):
            self._diag.bad("", f"submit() takes a function returning a dict of metrics, got {type(fn).__name__}")
            future.set_exception(TypeError(f"submit() takes a function, got {type(fn).__name__}"))
            return future
        signals = self._components.signals
        if signals is not None:
            signals.hold()
        try:
            at = self._pipeline.steps.advance(step)
            phases = self._pipeline.phases.take() if self._pipeline.mirror is not None else None
            streams = caller_streams((*args, *kwargs.values()))
            job = partial(self._run_submitted, fn, args, kwargs, at, time.time(), phases, streams, future)
            if not self._worker.submit(job, on_drop=partial(_dropped_job, future)):
                future.set_exception(RuntimeError("rl_otel: submit() after close()"))
        except Exception as exc:  # the training step must go on
            self._internal_error("submit")
            if not future.done():
                future.set_exception(exc)
        finally:
            if signals is not None:
                signals.release()
        return future

    def phase(self, cluster: str, phase: str, *, onload: Callable[[], Any] | None = None,
              offload: Callable[[], Any] | None = None, step: int | None = None,
              parent: Mapping[str, str] | None = None) -> Phase:
        """Time and trace one phase of a cluster, as ROLL's ``state_offload_manager`` does, always on::

            with tel.phase("actor_train", "train_step", onload=strategy.load_states,
                           offload=strategy.offload_states):
                train()

        Makes the span ``{cluster}/{phase}`` with children ``onload``, ``execute``, ``offload`` (attributes
        cluster, phase, rank, step; ``step`` defaults to the step the next ``log()`` gets by default), records
        ROLL's ``time/...`` and ``memory/...`` keys through the catalog (Prometheus gets seconds and bytes, plus
        ``rl_phase_duration_seconds``) when the block ends, and hands them to the trackers with the next
        ``log()``, as ROLL does (``Phase.metrics`` holds them too). While
        :attr:`tracer_provider` has no span processor (no ``tracing=``, no OTLP traces), no span is recorded:
        the root and ``execute`` are span contexts only (``Phase.carrier()`` and user spans inside the block
        parent under them all the same); a processor added later records the next phase's spans. ``parent`` is a
        carrier from ``Phase.carrier()`` / :func:`rl_otel.phases.inject` in another process. The ``onload`` /
        ``offload`` callables and the body are the caller's code: their exceptions propagate; telemetry never
        raises.
        """
        cluster, phase = self._phase_name(cluster), self._phase_name(phase)
        return self._components.phase_runtime().open(cluster, phase, onload=onload, offload=offload, step=step,
                                                parent=parent)

    # -- lifecycle ------------------------------------------------------------------------------------------

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every submitted job has run and the trackers have written every logged step. True if all
        of it finished within the timeout."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        ran = self._worker.flush(timeout_s)
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        return self._components.bridge.flush(left) and ran

    def close(self) -> None:
        """Flush and close the trackers (bounded by ``close_timeout_s``), stop serving. Idempotent; never raises.
        A SIGTERM or SIGINT arriving meanwhile is delivered once the close is over, to the handler it would have
        met without rl_otel (by default the process then dies by SIGTERM; a SIGINT raises ``KeyboardInterrupt``).

        Each step runs on its own (the OTel SDK's ``shutdown`` can raise): a step that fails is counted in
        ``rl_telemetry_errors_total{sink="close",reason=<step>}`` and logged once, and the later steps still run,
        so one failure leaves no port, file or thread behind. Tolerates a partially built object (``__init__``
        calls it when a later step fails)."""
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

    def _flush_on_signal(self) -> None:  # SIGINT: write what is buffered, the application's handler decides
        self.flush()

    def _close_at_exit(self) -> None:
        if os.getpid() == self._pid:  # a forked child's copy is not ours to close (its threads are the parent's)
            self.close()

    def __enter__(self) -> Telemetry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ------------------------------------------------------------------------------------------

    def _log(self, metrics: Mapping[str, object], step: object, wait: bool) -> None:
        if not isinstance(metrics, Mapping):
            self._diag.bad("", f"log() takes a dict of metrics, got {type(metrics).__name__}")
            return
        at = self._pipeline.steps.advance(step)
        if not self._worker.pending:
            self._pipeline.log(flatten(metrics), at, time.time(), None, wait)
            return
        # submitted jobs are still running: queue behind them, so steps land in call order; the values are
        # copied now (the caller may reuse its buffers once log() returns)
        pairs = [(key, owned(value)) for key, value in flatten(metrics)]
        phases = self._pipeline.phases.take() if self._pipeline.mirror is not None else None
        self._worker.submit(partial(self._ingest_queued, caller_streams(v for _, v in pairs), pairs, at,
                                    time.time(), phases, wait))

    def _ingest_queued(self, streams: tuple[object, ...], pairs: list[tuple[str, object]], step: int,
                       timestamp: float, phases: dict[str, float] | None, wait: bool) -> None:
        """A ``log()`` queued behind submitted jobs, run by the metrics worker (never raises)."""
        try:
            with on_streams(streams):
                self._pipeline.log(pairs, step, timestamp, phases, wait)
        except Exception:
            self._internal_error("log")

    def _run_submitted(self, fn: Callable[..., Mapping[str, object]], args: tuple, kwargs: dict, step: int,
                       timestamp: float, phases: dict[str, float] | None, streams: tuple[object, ...],
                       future: Future) -> None:
        """One :meth:`submit` job, on the metrics worker: call ``fn``, store what it returns (never raises)."""
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
                self._pipeline.log(flatten(metrics), step, timestamp, phases)
        except Exception as exc:
            self._diag.count("submit", "exception")
            if self._diag.warn_once("submit", name, f"rl_otel: submit(): {name} raised {type(exc).__name__}: "
                                                    f"{exc}; its step is not logged, training goes on"):
                _log.debug("rl_otel: submitted job failed", exc_info=True)
            future.set_exception(exc)
            return
        future.set_result(metrics)

    def _internal_error(self, what: str) -> None:
        """A bug in ``log()``/``submit()`` itself: the step is dropped, counted and logged once with its
        traceback (call from an ``except`` block)."""
        if self._diag.warn_once("internal", what, f"rl_otel: {what}() failed internally; training goes on"):
            _log.exception("rl_otel: %s() failed", what)
        self._diag.count("input" if what == "log" else what, "internal")

    def _phase_name(self, name: object) -> str:
        text = str(name)
        if "/" in text or not text:
            fixed = text.replace("/", "_") or "unnamed"
            self._diag.warn_once("phase_name", text, f"rl_otel: phase names are one key segment; {text!r} is used "
                                                     f"as {fixed!r}")
            return fixed
        return text

    def _warn_capped(self, metric_name: str) -> None:
        self._diag.warn_once("series_cap", metric_name,
                             f"rl_otel: {metric_name} reached max_series_per_metric="
                             f"{self.config.max_series_per_metric}; new label sets are dropped (counted in "
                             "rl_telemetry_dropped_series_total)")


def _dropped_job(future: Future) -> None:
    """A job the metrics worker dropped (queue full for ``close_timeout_s``, or still queued at close)."""
    if future.set_running_or_notify_cancel():
        future.set_exception(RuntimeError("rl_otel: the metrics worker dropped this job (counted in "
                                          "rl_telemetry_errors_total{sink=\"submit\"})"))
