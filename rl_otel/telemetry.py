"""Telemetry: one per process. log() turns a training loop's metrics into OTel data served to Prometheus."""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from functools import partial
from typing import Any

import numpy as np
from opentelemetry.metrics import Observation
from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, MeterProvider
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider

from rl_otel._internal.exporters import otlp
from rl_otel._internal.exporters.exposition import target_info_labels
from rl_otel._internal.exporters.file_sd import TargetsFile, targets_path
from rl_otel._internal.exporters.otel_env import build_resource
from rl_otel._internal.exporters.prometheus import ScrapeEndpoint, ScrapeRegistry
from rl_otel._internal.pipeline.router import Refusal, Router
from rl_otel._internal.pipeline.store import HistogramValue, SeriesStore
from rl_otel._internal.pipeline.values import BadValue, as_histogram, coerce, flatten, owned, to_tracker_array
from rl_otel._internal.pipeline.worker import Worker, caller_streams, on_streams
from rl_otel._internal.probes.live import LiveGauges
from rl_otel._internal.probes.memory import CpuProbe, GpuProbe
from rl_otel._internal.runtime.config import PrometheusConfig, TelemetryConfig
from rl_otel._internal.runtime.signals import SignalFlush
from rl_otel._internal.tracing.phase import Phase, PhaseRuntime
from rl_otel._internal.tracing.tracing import PhaseTracer, build_tracer_provider
from rl_otel._internal.trackers.bridge import Bridge, NullBridge
from rl_otel._version import __version__
from rl_otel.catalog import Catalog, Kind, live, meta

_log = logging.getLogger("rl_otel")
_WARN_LIMIT = 10_000  # distinct (what, key) pairs remembered for warn-once
_WARN_CHARS = 500
_SETTLE_S = 2.0  # how long a scrape or an OTLP export waits for submitted jobs before serving what is stored
# close() in this order: (step, attribute, method); the step names the reason label of a failed step
_CLOSE_STEPS = (("signals", "_signals", "uninstall"), ("live", "_live", "close"), ("metrics_worker", "_worker", "close"),
                ("cpu_probe", "_cpu", "close"), ("trackers", "_bridge", "close"),
                ("targets_file", "_targets", "close"), ("endpoint", "_endpoint", "close"),
                ("meter_provider", "_meter_provider", "shutdown"), ("tracer_provider", "_tracer_provider", "shutdown"),
                ("user_meter_provider", "_user_meter_provider", "shutdown"))


class Telemetry:
    """The handle a training loop logs through; create it with :func:`rl_otel.init`.

    Thread-safe: ``log()`` may be called from several threads. ``close()`` runs once; the object is also a
    context manager. Nothing on the per-step path raises: bad values are skipped with one warning per key and
    counted in ``rl_telemetry_errors_total{sink="input"}``.
    """

    def __init__(self, config: TelemetryConfig, catalog: Catalog) -> None:
        self.config = config
        self.catalog = catalog
        self._warned: set[tuple[str, str]] = set()
        self._warn_lock = threading.Lock()
        self._step_lock = threading.Lock()
        self._step: int | None = None  # the highest step handed out (log/submit), what step=None continues from
        self._stored_lock = threading.Lock()
        self._stored: int | None = None  # the highest step stored: a step below it is history (see log())
        self._history_noted = False
        self._closed = False
        self._close_lock = threading.Lock()
        self._store = SeriesStore({"run": config.run, "rank": str(config.rank)},
                                  max_series_per_metric=config.max_series_per_metric, ttl_s=config.series_ttl_s,
                                  dropped_spec=meta.DROPPED_SERIES, on_drop=self._warn_dropped)
        self._router = Router(catalog, config.max_unknown_keys)
        # submit()'s jobs, and log()s queued behind them; every store read waits for those submitted before it
        self._worker: Worker = Worker(name="rl_otel-metrics", queue_size=config.submit_queue_size,
                                      timeout_s=config.close_timeout_s, when_full="wait",
                                      on_error=lambda reason: self._count_error("submit", reason))
        self._store.set_settle(self._settle)
        # explicit (init's resource=) > OTEL_SERVICE_NAME > OTEL_RESOURCE_ATTRIBUTES > rl_otel's defaults
        self.resource: Resource = build_resource(  # type: ignore[assignment]
            {"service.name": "rl_otel", "service.version": __version__, "service.instance.id":
                f"{config.host_name}/{config.run}/{config.rank}", "host.name": config.host_name},
            {"rl.run": config.run, "rl.rank": config.rank, "rl.role": config.role,
             "rl.local_rank": config.local_rank, "rl.world_size": config.world_size},
            dict(config.resource))
        # every resource close() looks at exists (None) before the first is created, so that a failure in any
        # later step can close what was built so far: no jsonl file, span thread, endpoint or reader left behind
        self._endpoint: ScrapeEndpoint | None = None
        self._meter_provider: MeterProvider | None = None
        self._tracer_provider: TracerProvider | None = None  # rl_otel's own (closed by close())
        self._user_tracer_provider: Any = config.tracer_provider  # init(tracer_provider=...): never closed here
        self._user_meter_provider: Any = None  # built at the first read of meter_provider
        self._user_meter_lock = threading.Lock()
        self._phase_lock = threading.Lock()
        self._phase_metrics: dict[str, float] = {}
        self._live: LiveGauges | None = None
        self._cpu: CpuProbe | None = None
        self._targets: TargetsFile | None = None
        self._bridge: Bridge | NullBridge = NullBridge()
        self._signals: SignalFlush | None = None
        self._scrape_registry: ScrapeRegistry | None = None  # what /metrics renders (benchmarks render it directly)
        try:
            self._start(config)
        except BaseException:
            self.close()
            raise
        # closed at interpreter exit unless closed before (frameworks that never call finish(), like ROLL): the
        # metrics worker drains, the trackers write what is queued, the endpoint and file_sd target go away
        self._pid = os.getpid()
        atexit.register(self._close_at_exit)

    # -- public surface -------------------------------------------------------------------------------------

    @property
    def metrics_url(self) -> str | None:
        """``http://host:port/metrics`` of the scrape endpoint (``None`` without one)."""
        return self._endpoint.url if self._endpoint else None

    @property
    def step(self) -> int | None:
        """The highest step logged so far (``None`` before the first ``log()``); ``step=None`` continues from it."""
        return self._step

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
        if not labels:
            route = self._router.existing(key)
            if route is not None:
                return self._store.value(route.spec.name, route.labels)
        return self._store.value(key, labels)

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
            self._warn_once("closed", "", "log() after close() is ignored")
            return
        signals = self._signals
        if signals is not None:
            signals.hold()  # a SIGTERM/SIGINT now is handled once this step is fully logged
        try:
            self._log(metrics, step, wait_for_trackers)
        except Exception:  # the training step must go on
            self._log_failed()
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
            self._warn_once("closed", "submit", "rl_otel: submit() after close() is ignored")
            future.set_exception(RuntimeError("rl_otel: submit() after close()"))
            return future
        if not callable(fn):
            self._bad("", f"submit() takes a function returning a dict of metrics, got {type(fn).__name__}")
            future.set_exception(TypeError(f"submit() takes a function, got {type(fn).__name__}"))
            return future
        signals = self._signals
        if signals is not None:
            signals.hold()
        try:
            step = self._advance(step)
            phases = self.take_phase_metrics() if self._bridge.active else None
            streams = caller_streams((*args, *kwargs.values()))
            job = partial(self._run_submitted, fn, args, kwargs, step, time.time(), phases, streams, future)
            if not self._worker.submit(job, on_drop=partial(self._dropped_job, future)):
                future.set_exception(RuntimeError("rl_otel: submit() after close()"))
        except Exception as exc:  # the training step must go on
            if self._warn_once("internal", "submit", "rl_otel: submit() failed internally; training goes on"):
                _log.exception("rl_otel: submit() failed")
            self._count_error("submit", "internal")
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
        ``rl_phase_duration_seconds``), and keeps those keys for :meth:`take_phase_metrics`. While
        :attr:`tracer_provider` has no span processor (no ``tracing=``, no OTLP traces), no span is recorded:
        the root and ``execute`` are span contexts only (``Phase.carrier()`` and user spans inside the block
        parent under them all the same); a processor added later records the next phase's spans. ``parent`` is a
        carrier from ``Phase.carrier()`` / :func:`rl_otel.phases.inject` in another process. The ``onload`` /
        ``offload`` callables and the body are the caller's code: their exceptions propagate; telemetry never
        raises.
        """
        cluster, phase = self._phase_name(cluster), self._phase_name(phase)
        return Phase(self._phases, cluster, phase, onload=onload, offload=offload, step=step, parent=parent)

    def pending_phase_metrics(self) -> dict[str, float]:
        """ROLL-keyed values (seconds, GiB) of the phases finished since the last :meth:`take_phase_metrics`
        (later phases overwrite equal keys, as ROLL's ``metrics.update`` does). A copy; nothing is cleared."""
        with self._phase_lock:
            return dict(self._phase_metrics)

    def take_phase_metrics(self) -> dict[str, float]:
        """Like :meth:`pending_phase_metrics`, and clear them: the tracker bridge merges these into the dict it
        mirrors at its next ``log()`` (Prometheus already has them; ``log()`` does not write them again)."""
        if not self._phase_metrics:  # most steps: no lock, no copy (a phase ending now is taken next step)
            return {}
        with self._phase_lock:
            taken, self._phase_metrics = self._phase_metrics, {}
        return taken

    @property
    def tracer_provider(self) -> Any:
        """The ``TracerProvider`` phases use: the one given as ``init(tracer_provider=...)``, else this
        Telemetry's own (never the global one unless given), to which span processors may be added."""
        return self._user_tracer_provider if self._user_tracer_provider is not None else self._tracer_provider

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
        if self._user_meter_provider is None:
            from rl_otel._internal.exporters.instruments import build_meter_provider

            with self._user_meter_lock:
                if self._user_meter_provider is None and not self._closed:
                    self._user_meter_provider = build_meter_provider(
                        self.resource, self._scrape_registry, self.config.otlp,
                        on_error=lambda reason: self._count_error("otlp", reason))
        return self._user_meter_provider

    @property
    def trackers(self) -> tuple[str, ...]:
        """Names of the tracker sinks this process mirrors to (empty on ranks that do not mirror)."""
        return self._bridge.sink_names

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every submitted job has run and the trackers have written every logged step. True if all
        of it finished within the timeout."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        ran = self._worker.flush(timeout_s)
        return self._bridge.flush(None if deadline is None else max(0.0, deadline - time.monotonic())) and ran

    def close(self) -> None:
        """Flush and close the trackers (bounded by ``close_timeout_s``), stop serving. Idempotent; never raises.

        Each step runs on its own (the OTel SDK's ``shutdown`` can raise): a step that fails is counted in
        ``rl_telemetry_errors_total{sink="close",reason=<step>}`` and logged once, and the later steps still run,
        so one failure leaves no port, file or thread behind. Tolerates a partially built object (``__init__``
        calls it when a later step fails)."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        atexit.unregister(self._close_at_exit)
        for step, attr, method in _CLOSE_STEPS:
            resource = getattr(self, attr, None)
            if resource is None:
                continue
            try:
                getattr(resource, method)()
            except Exception as exc:
                self._count_error("close", step)
                self._warn_once("close", step, f"rl_otel: closing {step} failed ({type(exc).__name__}: {exc}); "
                                               "the other parts are closed")

    def _close_at_exit(self) -> None:
        if os.getpid() == self._pid:  # a forked child's copy is not ours to close (its threads are the parent's)
            self.close()

    def __enter__(self) -> Telemetry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ------------------------------------------------------------------------------------------

    def _start(self, config: TelemetryConfig) -> None:
        """The steps of ``__init__`` that create resources (threads, files, sockets), in order."""
        if config.tracer_provider is None:
            self._tracer_provider = build_tracer_provider(config.tracing, self.resource)
        tracer_provider = self.tracer_provider
        self._cpu = cpu = CpuProbe()
        self._phases = PhaseRuntime(
            tracer=PhaseTracer(tracer_provider, tracer_provider.get_tracer("rl_otel", __version__)),
            rank=config.rank, gpu=GpuProbe(),
            cpu=cpu, next_step=lambda: 0 if self._step is None else self._step + 1, record=self._record_phase,
            fail=self._phase_failed)
        # build_info and target_info (the OTel resource, Prometheus' convention) are ordinary store families
        self._store.write_info(meta.BUILD_INFO, (("version", __version__),))
        self._store.write_info(meta.TARGET_INFO, target_info_labels(self.resource.attributes), base_labels=False)
        readers = []
        registry = None
        if config.prometheus is not None:
            registry = ScrapeRegistry(on_duplicate=lambda name: self._count_error("prometheus", "duplicate_family"),
                                      store=self._store,
                                      on_error=lambda reason: self._count_error("prometheus", reason))
            self._scrape_registry = registry
        if config.otlp is not None:
            reader = otlp.metric_reader(config.otlp, self._store.collect, self.resource,
                                        on_error=lambda reason: self._count_error("otlp", reason))
            if reader is not None:
                readers.append(reader)
            if config.otlp.traces is not None and self._tracer_provider is not None:
                self._tracer_provider.add_span_processor(otlp.span_processor(config.otlp))
        if readers:
            self._meter_provider = MeterProvider(resource=self.resource, metric_readers=readers,
                                                 exemplar_filter=AlwaysOffExemplarFilter())
            # An SDK instrument of our own keeps every collection flowing through the readers (the SDK skips
            # readers when it has no data of its own), and is OTLP's build-info series (the store's info families
            # are the scrape endpoint's).
            info_attrs = {"run": config.run, "rank": str(config.rank), "version": __version__}
            self._meter_provider.get_meter("rl_otel", __version__).create_observable_gauge(
                meta.BUILD_INFO.name, callbacks=[lambda _options: [Observation(1, info_attrs)]],
                unit=meta.BUILD_INFO.unit, description=meta.BUILD_INFO.description)
        if readers or registry is not None:
            self._live = LiveGauges(self._store.add_collector, cpu, lambda reason: self._count_error("live", reason))
        if registry is not None and config.prometheus is not None:
            self._serve(registry, config.prometheus)
        self._bridge = self._start_bridge()
        if config.handle_sigterm and self._bridge.active:  # with nothing buffered there is nothing to write
            self._signals = SignalFlush(on_term=self.close, on_int=self.flush, timeout_s=config.close_timeout_s)

    def _serve(self, registry: ScrapeRegistry, prom: PrometheusConfig) -> None:
        """Start the scrape endpoint and, when asked, publish it in a file_sd targets file."""
        self._endpoint = ScrapeEndpoint(registry, prom.host, prom.port, web=prom.web, port_search=prom.port_search)
        if prom.file_sd is not None:
            host = prom.advertise_host or (self.config.host_name if prom.host in ("", "0.0.0.0", "::") else prom.host)
            host = f"[{host}]" if ":" in host else host
            self._targets = TargetsFile(targets_path(prom.file_sd, self.config.run, self.config.rank),
                                        f"{host}:{self._endpoint.port}",
                                        {"run": self.config.run, "rank": str(self.config.rank)})

    def _log(self, metrics: Mapping[str, object], step: int | None, wait: bool = False) -> None:
        if not isinstance(metrics, Mapping):
            self._bad("", f"log() takes a dict of metrics, got {type(metrics).__name__}")
            return
        step = self._advance(step)
        if not self._worker.pending:
            self._ingest(flatten(metrics), step, time.time(), None, wait)
            return
        # submitted jobs are still running: queue behind them, so steps land in call order; the values are
        # copied now (the caller may reuse its buffers once log() returns)
        pairs = [(key, owned(value)) for key, value in flatten(metrics)]
        phases = self.take_phase_metrics() if self._bridge.active else None
        job = partial(self._ingest_on_streams, caller_streams(v for _, v in pairs), pairs, step, time.time(), phases,
                      wait)
        self._worker.submit(job)

    def _ingest(self, pairs: Iterable[tuple[str, object]], step: int, timestamp: float,
                phases: dict[str, float] | None, wait: bool = False) -> None:
        """Store one step's ``(key, value)`` pairs and hand them to the trackers with the phases finished since
        the last step (``phases``: taken when the step was logged; ``None``: take them now). A step below the
        highest one stored is history: it sets no series back and removes none (see :meth:`log`)."""
        items, gone, mirrored = self._prepare(pairs, mirror=self._bridge.active)
        with self._stored_lock:
            current = self._stored is None or step >= self._stored
            if current:
                self._stored = step
        # the store keeps, per series, the newest step's value: whatever order concurrent writes land in
        self._store_items(items, gone if current else (), step)
        self._store.write([(meta.STEP, (), float(step))], expires=False, step=step)
        self._store.write([(meta.LAST_STEP_TIMESTAMP, (), timestamp)], expires=False)
        if not current:
            self._note_history(step)
        if mirrored is not None:
            # the phases finished since the last step reach the trackers at this step, as in ROLL (a history
            # step takes none: they belong to the step being trained)
            if phases is None and current:
                phases = self.take_phase_metrics()
            mirrored = {**phases, **mirrored} if phases else mirrored
            if mirrored:
                self._bridge.submit(mirrored, step, wait)

    def _note_history(self, step: int) -> None:
        if not self._history_noted:
            self._history_noted = True
            _log.info("rl_otel: step %d is below the highest step logged (%s): the trackers get it; on the endpoint "
                      "series keep the newer steps' values (said once)", step, self._stored)

    def _ingest_on_streams(self, streams: tuple[object, ...], pairs: list[tuple[str, object]], step: int,
                           timestamp: float, phases: dict[str, float] | None, wait: bool = False) -> None:
        """A ``log()`` queued behind submitted jobs, run by the metrics worker (never raises)."""
        try:
            with on_streams(streams):
                self._ingest(pairs, step, timestamp, phases, wait)
        except Exception:
            self._log_failed()

    def _log_failed(self) -> None:
        """A bug in ``log()`` itself (inline or queued behind submitted jobs): the step is dropped, counted and
        logged once with its traceback (call from an ``except`` block)."""
        if self._warn_once("internal", "", "rl_otel: log() failed internally; training goes on"):
            _log.exception("rl_otel: log() failed")
        self._count_error("input", "internal")

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
                    self._bad("", f"submit(): {name} returned {type(metrics).__name__}, not a dict of metrics")
                    future.set_exception(TypeError(f"{name} returned {type(metrics).__name__}, not a dict"))
                    return
                self._ingest(flatten(metrics), step, timestamp, phases)
        except Exception as exc:
            self._count_error("submit", "exception")
            if self._warn_once("submit", name, f"rl_otel: submit(): {name} raised {type(exc).__name__}: {exc}; "
                                               "its step is not logged, training goes on"):
                _log.debug("rl_otel: submitted job failed", exc_info=True)
            future.set_exception(exc)
            return
        future.set_result(metrics)

    def _dropped_job(self, future: Future) -> None:
        """A job the metrics worker dropped (queue full for ``close_timeout_s``, or still queued at close)."""
        if future.set_running_or_notify_cancel():
            future.set_exception(RuntimeError("rl_otel: the metrics worker dropped this job (counted in "
                                              "rl_telemetry_errors_total{sink=\"submit\"})"))

    def _settle(self) -> None:
        if self._worker.pending:
            self._worker.flush(_SETTLE_S)

    def _write_metrics(self, pairs: Iterable[tuple[str, object]]) -> None:
        """Route ``(key, value)`` pairs through the catalog into the store (phase metrics: current, no mirror)."""
        items, gone, _ = self._prepare(pairs)
        self._store_items(items, gone, None)

    def _prepare(self, pairs: Iterable[tuple[str, object]], *, mirror: bool = False,
                 ) -> tuple[list, list, dict[str, float | np.ndarray] | None]:
        """Split ``(key, value)`` pairs into the two views of a step: the one path of user metrics and phase
        metrics. With ``mirror``, what the trackers get: every key as logged (flattened), in the user's units,
        taken before any Prometheus rule - a key the catalog routing refuses (a name collision, past
        ``max_unknown_keys``) or a distribution logged for a gauge still reaches them. Then the Prometheus view,
        routed through the catalog: the store's items (scaled to base units) and the gauge series a ``None``
        removes."""
        items: list = []
        gone: list = []
        append, route_of = items.append, self._router.route  # locals: this loop runs once per key and step
        mirrored: dict[str, float | np.ndarray] | None = {} if mirror else None
        for key, raw in pairs:
            try:
                value = raw if type(raw) is float else coerce(raw, keep_tensors=True)
            except BadValue as exc:
                self._bad(key, str(exc))
                continue
            if value is None:  # no value this step: the gauge's last one must not look current
                known = self._router.existing(key)
                if known is not None and known.spec.kind is Kind.GAUGE:
                    gone.append((known.spec, known.labels))
                continue
            scalar = value.__class__ is float or isinstance(value, float)
            if mirrored is not None:  # the trackers' view: the key as logged, whatever Prometheus makes of it
                if scalar:
                    mirrored[key] = value
                else:
                    # trackers draw their own histograms from the values: a tensor's values cross once more (only
                    # when trackers are on); BucketCounts have no values left and stay Prometheus-only
                    tracked = to_tracker_array(value)
                    if tracked is not None:
                        mirrored[key] = tracked
            route = route_of(key)
            if route.__class__ is Refusal:
                self._store.note_dropped(route.metric)
                self._warn_once(route.reason, key, f"rl_otel: {route.detail}; it is not exported to Prometheus")
                continue
            spec = route.spec
            if spec.kind is Kind.HISTOGRAM:
                try:
                    append((spec, route.labels, as_histogram(value, spec.buckets, spec.scale)))
                except BadValue as exc:
                    self._bad(key, str(exc))
                if scalar and mirrored is not None:  # one value of a distribution: a histogram for the trackers too
                    mirrored[key] = to_tracker_array(value)
                continue
            if not scalar:
                self._bad(key, f"a distribution, but {spec.prometheus_name} is a {spec.kind.value}: log its "
                               "mean/max/min, or a *_dist key")
                continue
            append((spec, route.labels, value * spec.scale if spec.scale != 1.0 else value))
        return items, gone, mirrored

    def _store_items(self, items: list, gone: Iterable, step: int | None) -> None:
        for spec, n in self._store.write(items, step=step):
            self._count_error("input", "non_finite_in_distribution", n)
            self._warn_once("non_finite", spec.name, f"rl_otel: {n} NaN/Inf values left out of the histogram "
                                                     f"{spec.name} (Prometheus buckets cannot hold them)")
        for spec, labels in gone:
            self._store.delete(spec, labels)

    def _record_phase(self, cluster: str, phase: str, metrics: dict[str, float], durations: dict[str, float]) -> None:
        self._write_metrics(metrics.items())
        self._store.write([(live.PHASE_DURATION, (("cluster", cluster), ("phase", phase), ("part", part)),
                            seconds) for part, seconds in durations.items()])
        with self._phase_lock:
            self._phase_metrics.update(metrics)

    def _phase_failed(self, what: str) -> None:
        self._count_error("phase", "internal")
        if self._warn_once("phase", what, f"rl_otel: a phase's telemetry ({what}) failed; training goes on"):
            _log.debug("rl_otel: phase telemetry failure", exc_info=True)

    def _phase_name(self, name: object) -> str:
        text = str(name)
        if "/" in text or not text:
            fixed = text.replace("/", "_") or "unnamed"
            self._warn_once("phase_name", text, f"rl_otel: phase names are one key segment; {text!r} is used as "
                                                f"{fixed!r}")
            return fixed
        return text

    def _advance(self, step: object) -> int:
        with self._step_lock:
            if step is not None:
                if isinstance(step, bool) or not isinstance(step, (int, np.integer)):
                    try:
                        step = int(step)  # 0-d tensors, floats like 3.0
                    except (TypeError, ValueError, OverflowError):
                        self._bad("", f"step must be an int, got {step!r}; using the previous step + 1")
                        step = None
            if step is None:
                step = 0 if self._step is None else self._step + 1
            step = int(step)
            if self._step is None or step > self._step:
                self._step = step
            return step

    def _start_bridge(self) -> Bridge | NullBridge:
        from rl_otel._internal.runtime.ranks import mirrors_to_trackers
        from rl_otel._internal.trackers.bridge import build_bridge
        from rl_otel._internal.trackers.config import secret_values

        cfg = self.config
        self._secrets = frozenset(s for t in cfg.trackers for s in secret_values(dict(t.kwargs)))
        return build_bridge(cfg.trackers, run=cfg.run, mirror=mirrors_to_trackers(cfg.rank, cfg.tracker_ranks),
                            on_error=self._sink_error, queue_size=cfg.sink_queue_size,
                            close_timeout_s=cfg.close_timeout_s)

    def _sink_error(self, sink: str, reason: str, exc: BaseException | None) -> None:
        from rl_otel._internal.trackers.config import scrub

        self._count_error(sink, reason)
        detail = "" if exc is None else f": {type(exc).__name__}: {scrub(str(exc), self._secrets)}"
        self._warn_once(f"sink_{reason}", sink, f"rl_otel: tracker {sink!r} failed ({reason}){detail}; training "
                        "and the other trackers go on (counted in rl_telemetry_errors_total)")

    def _bad(self, key: str, why: str) -> None:
        self._count_error("input", "bad_value")
        self._warn_once("bad_value", key, f"rl_otel: skipping {key!r}: {why}")

    def _count_error(self, sink: str, reason: str, amount: float = 1.0) -> None:
        self._store.increment(meta.ERRORS, (("sink", sink), ("reason", reason)), amount)

    def _warn_dropped(self, metric_name: str) -> None:
        self._warn_once("series_cap", metric_name,
                        f"rl_otel: {metric_name} reached max_series_per_metric={self.config.max_series_per_metric}; "
                        "new label sets are dropped (counted in rl_telemetry_dropped_series_total)")

    def _warn_once(self, what: str, key: str, message: str) -> bool:
        with self._warn_lock:
            if (what, key) in self._warned or len(self._warned) >= _WARN_LIMIT:
                return False
            self._warned.add((what, key))
        if len(message) > _WARN_CHARS:  # a hostile 100 kB key must not become a 100 kB log line
            message = f"{message[:_WARN_CHARS]}... ({len(message) - _WARN_CHARS} more characters)"
        _log.warning(message)
        return True
