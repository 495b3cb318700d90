"""The resources of one Telemetry - the recorder and its step log, probes, the scrape endpoint, its targets file,
the OTLP push, the tracker bridge, signal handlers - built by one constructor, in order, each handed what it needs
(nothing is assigned to a part after it is made, and no part holds what built it: ``tests/test_no_back_references.py``),
and closed in reverse with one :class:`contextlib.ExitStack`.

A failure while building closes what was built so far (no port, file or thread left behind) and propagates to
``init()``. At close each step runs on its own: one that raises (the OTel SDK's ``shutdown`` can) is counted in
``rl_telemetry_errors_total{sink="close", reason=<step>}`` and logged once, and the steps after it still run.

Close order (the reverse of registration), with the signal handlers around it all: a SIGTERM or SIGINT during the
close is held until every part is closed, then delivered (see ``signals.py``); the stack dumps stop first; the
metrics worker drains before the trackers close (queued steps reach them) and before the endpoint stops (a last
scrape still sees the final step); a static target's last scrape sees ``rl_run_finished`` 1
(:func:`final_scrape`) before the endpoint stops; the OTLP meter provider's shutdown pushes once more;
rl_otel's own tracer provider ends last (phases may still end while the others close).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rl_otel._internal.exporters.file_sd import TargetsFile, targets_path
from rl_otel._internal.exporters.prometheus import ScrapeEndpoint, ScrapeRegistry
from rl_otel._internal.forks import reset_in_forked_child
from rl_otel._internal.pipeline.diagnostics import Diagnostics
from rl_otel._internal.pipeline.goodput import Goodput
from rl_otel._internal.pipeline.ingest import Ingest
from rl_otel._internal.pipeline.reads import SettledReads
from rl_otel._internal.pipeline.recorder import Collector, Recorder
from rl_otel._internal.pipeline.records import Batch, Info
from rl_otel._internal.pipeline.router import Router
from rl_otel._internal.pipeline.steplog import StepLog, metrics_worker
from rl_otel._internal.pipeline.store import SeriesStore
from rl_otel._internal.probes.hangs import HangWatch
from rl_otel._internal.probes.live import LiveGauges, process_start_time
from rl_otel._internal.probes.memory import CpuProbe, GpuProbe
from rl_otel._internal.probes.torch_collectives import CollectiveProbe
from rl_otel._internal.runtime.config import PrometheusConfig, TelemetryConfig
from rl_otel._internal.runtime.identity import info_batch, process_resource
from rl_otel._internal.runtime.serving import publish, scrape_registry
from rl_otel._internal.runtime.signals import SignalFlush
from rl_otel._internal.tracing.providers import TracerProviders
from rl_otel._internal.trackers.bridge import Bridge, NullBridge
from rl_otel._internal.trackers.config import command_line_secrets, process_command_line, scrub
from rl_otel._internal.trackers.sinks import SinkError
from rl_otel._version import __version__
from rl_otel.catalog import Catalog, meta

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource

    from rl_otel._internal.exporters.engines import EngineFamilies
    from rl_otel._internal.runtime.phase import PhaseRuntime
    from rl_otel._internal.tracing.steps import StepSpans


_NOTHING_HELD = contextlib.nullcontext()
# the longest close() waits for a last scrape of rl_run_finished (a scrape interval of Prometheus' default 15 s and
# more fits; a SIGTERM's grace period, Kubernetes' 30 s, is not spent on it)
FINAL_SCRAPE_MAX_S = 20.0


class Components:
    """What one Telemetry runs on, built by the constructor (``on_term``/``on_int``: what a SIGTERM/SIGINT runs,
    once the step being logged is); :meth:`close` once."""

    def __init__(self, config: TelemetryConfig, catalog: Catalog, *, on_term: Callable[[], object],
                 on_int: Callable[[], object]) -> None:
        self.config = config
        self._resource = process_resource(config)
        self.diagnostics = diag = Diagnostics()
        self._lazy_lock = threading.Lock()
        self._engine_targets: dict[str, TargetsFile] = {}  # tel.engine()'s targets files, by engine name
        self._phases: PhaseRuntime | None = None  # built at the first phase()
        self._user_meter_provider: Any = None
        self._providers: list[tuple[str, Any]] = []  # OTel meter providers rl_otel shuts down (with its tracer's)
        reset_in_forked_child(self)
        with contextlib.ExitStack() as stack:
            self._build(stack, catalog, diag, on_term, on_int)
            self._stack = stack.pop_all()

    def _after_fork(self) -> None:
        self._lazy_lock = threading.Lock()  # the parent's may have been held by another thread at the fork

    def _build(self, stack: contextlib.ExitStack, catalog: Catalog, diag: Diagnostics, on_term: Callable[[], object],
               on_int: Callable[[], object]) -> None:
        config = self.config
        # the OTel providers shut down last (phases may end while the rest closes), together: each may wait up to
        # its export timeout for an unreachable collector, so in sequence they would take a multiple of it
        stack.callback(self._shutdown_providers)
        exemplars = None
        if config.prometheus is not None:  # the phases' trace IDs, served as exemplars in OpenMetrics scrapes
            from rl_otel._internal.exporters.exemplars import Exemplars

            exemplars = Exemplars()
        self.tracers = tracers = TracerProviders(config.tracer_provider, config.tracing, self._resource.sdk,
                                                 lambda reason: diag.count("tracing", reason),
                                                 exemplars.note if exemplars is not None else None)
        if config.tracing is not None:  # spans exported from the start; else the provider is built when needed
            tracers.get()
        self.step_spans = _step_spans(config, tracers, diag)
        self.cpu = cpu = CpuProbe()
        _closing(stack, diag, "cpu_probe", cpu)
        # where the time goes, from the process's start (start-up) to its first phase or step, then fed by them
        self.goodput = goodput = Goodput(diag, started=process_start_time())
        serves = config.prometheus is not None or _pushes_metrics(config)
        collectors: list[Collector] = [goodput.collect]
        self.live = None
        if serves:
            self.live = LiveGauges(cpu, lambda reason: diag.count("live", reason))
            _closing(stack, diag, "live", self.live)
            collectors += self.live.collectors
        self.engines = _engine_families(config, diag) if serves and config.engines is not None else None
        if self.engines is not None:
            _closing(stack, diag, "engines", self.engines)
            collectors.append(self.engines.collect)
        # this rank's torch.distributed collectives, from torch's flight recorder (nothing until torch.distributed
        # is initialized): which collective it is in, in the series and in its dumps' headers
        collectives = CollectiveProbe(lambda reason: diag.count("hangs", reason))
        self.hangs = hangs = _hang_watch(config, diag, collectives.describe)  # threads: at listen(), first phase
        collectors += (hangs.collect, collectives.collect)
        store = SeriesStore(config.base_labels, max_series_per_metric=config.max_series_per_metric,
                            ttl_s=config.series_ttl_s)
        self.recorder = recorder = Recorder(store, diag, collectors=collectors,
                                            consumers=(goodput.recorded, hangs.recorded))
        router = Router(catalog, config.max_unknown_keys)
        worker = metrics_worker(diag, config.submit_queue_size, config.close_timeout_s)
        self.reads = SettledReads(recorder, router, worker)
        # build_info and target_info (the OTel resource, Prometheus' convention) are ordinary store families
        recorder.record(info_batch(self._resource))
        self.registry: ScrapeRegistry | None = None
        self.endpoint: ScrapeEndpoint | None = None
        self.targets: TargetsFile | None = None
        if config.prometheus is not None:
            self.registry = scrape_registry(self.reads.collect, lambda reason: diag.count("prometheus", reason),
                                            store.clock, routes=_debug_routes(config, hangs),
                                            exemplars=exemplars.current if exemplars is not None else None)
            self._serve(stack, self.registry, config.prometheus)
        if config.otlp is not None:
            self._otlp(config, tracers, diag)
        self.bridge = _start_bridge(config, diag)
        _closing(stack, diag, "trackers", self.bridge)
        self.steplog = StepLog(recorder, Ingest(router, diag), worker,
                               mirror=self.bridge.submit if self.bridge.active else None)
        _closing(stack, diag, "metrics_worker", self.steplog)  # drains before the trackers close
        # stack dumps: closed first, no dump starts while the rest closes; the watchdog starts with the first phase
        _closing(stack, diag, "hangs", hangs)
        if config.stack_dump_signal is not None:
            hangs.listen(config.stack_dump_signal)
        # a signal handler when a SIGTERM would leave something behind: steps buffered for the trackers, or a
        # file_sd target that would keep a "target down" alert firing after the rank is gone
        # (built last, so no failure follows it here; close() itself puts the previous handlers back, at its end)
        # (or spans not yet sent: a Ray worker gets a SIGTERM ~5 s before it is killed, with Ray's own handler)
        self.signals = None
        if config.handle_sigterm and (self.bridge.active or self.targets is not None or _spans_exported(config)):
            self.signals = SignalFlush(on_term=on_term, on_int=on_int, timeout_s=config.close_timeout_s)

    def logged(self) -> None:
        """A step was logged: the spans of phases that started before any step was known go to its trace, and
        the process that writes the step spans writes this one (``tracing/pending.py``, ``tracing/steps.py``)."""
        last = self.steplog.steps.last
        provider = self.tracers.provider
        if last is None or provider is None:
            return
        pending = getattr(provider, "pending", None)
        if pending is not None and pending.waiting:
            from rl_otel._internal.tracing.steps import step_ids

            pending.resolve(last, *step_ids(self.config.run, last))
        spans = self.step_spans
        if spans is not None:
            spans.logged(last)

    def engine_target(self, url: str, name: str) -> str | None:
        """Publish an engine server's ``url`` as a scrape target in the file_sd directory (``tel.engine``): the
        path of its targets file, or ``None`` (said once) without a file_sd directory to write it in."""
        from rl_otel._internal.exporters.engine_targets import engine_labels, parse_engine_url

        address, labels = parse_engine_url(url)  # ValueError naming a bad url
        if not isinstance(name, str) or not name:
            raise ValueError(f"tel.engine(name=...) must be a non-empty string, got {name!r}")
        config, prom = self.config, self.config.prometheus
        if prom is None or prom.file_sd is None or Path(prom.file_sd).expanduser().suffix in (".json", ".yml",
                                                                                            ".yaml"):
            self.diagnostics.warn_once("engine", "file_sd", "rl_otel: tel.engine() publishes an engine server in "
                                       "the file_sd directory (prometheus={'file_sd': DIR}); none is set, so "
                                       "Prometheus must be told of the engine's /metrics by hand")
            return None
        path = targets_path(prom.file_sd, config.run, config.rank, role=config.role, host=config.host_name,
                            target=f"engine:{name}:{url}")
        with self._lazy_lock:
            old = self._engine_targets.pop(name, None)
            if old is not None:
                old.close()
            targets = TargetsFile(path, address, {**config.base_labels, **engine_labels(name), **labels})
            self._engine_targets[name] = targets
        _closing(self._stack, self.diagnostics, f"engine_target_{name}", targets)
        return str(path)

    @property
    def resource(self) -> Resource:
        """The OTel SDK ``Resource``: what needs the SDK object (a provider, the OTLP push) reads it;
        ``target_info`` is written from the attributes alone."""
        return self._resource.sdk()

    def phase_runtime(self) -> PhaseRuntime:
        """What every phase shares (the tracer, the probes), built at the first ``phase()``; the TracerProvider
        only when something needs it."""
        runtime = self._phases
        if runtime is None:
            from rl_otel._internal.runtime.phase import PhaseRuntime
            from rl_otel._internal.tracing.contexts import PhaseTracer

            with self._lazy_lock:
                if self._phases is None:
                    config, diag, steplog, steps = self.config, self.diagnostics, self.steplog, self.steplog.steps
                    tracer = PhaseTracer(self.tracers.peek, self.tracers.get, "rl_otel", __version__, run=config.run,
                                         step_spans=self.step_spans,
                                         known_step=lambda: None if steps.last is None else steps.next())
                    self._phases = PhaseRuntime(
                        tracer=tracer, rank=config.rank, gpu=GpuProbe(), cpu=self.cpu, next_step=steps.next,
                        record=steplog.record_phase, fail=diag.phase_failed, record_gpu=steplog.record_phase_gpu,
                        count=lambda reason: diag.count("phase", reason), goodput=self.goodput,
                        memory=config.phase_memory, peaks=config.phase_peaks, gpu_time=config.phase_gpu_time)
                    # closed first (built after the others): the GPU times still pending are resolved (bounded)
                    # while the store and the tracer provider are open
                    _closing(self._stack, diag, "phases", self._phases)
                    self.hangs.watch(self._phases.running)  # type: ignore[arg-type]  # set by __post_init__
                runtime = self._phases
        return runtime

    @property
    def held(self) -> contextlib.AbstractContextManager:
        """``with components.held:`` a SIGTERM/SIGINT arriving in the block is handled once it ends (a step is
        logged whole); nothing to hold without rl_otel's signal handlers."""
        return self.signals if self.signals is not None else _NOTHING_HELD

    def flush(self, timeout_s: float | None) -> bool:
        """Wait until every submitted job has run, the phases' GPU times are known and the trackers have written
        every logged step; True if all of it finished within ``timeout_s`` (``None``: no limit)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s

        def left() -> float | None:
            return None if deadline is None else max(0.0, deadline - time.monotonic())

        ran = self.steplog.flush(timeout_s)
        timed = True if self._phases is None else self._phases.flush(left())
        written = self.bridge.flush(left())
        return _flush_spans(self.tracers, self.diagnostics, left()) and written and ran and timed

    def _otlp(self, config: TelemetryConfig, tracers: TracerProviders, diag: Diagnostics) -> None:
        """The OTLP push: a reader on an SDK MeterProvider exporting the store's families, and a span processor
        on rl_otel's own tracer provider (a user's provider exports its spans itself)."""
        assert config.otlp is not None
        from rl_otel._internal.exporters import otlp
        from rl_otel._internal.exporters.otlp_push import store_metrics

        recorder = self.recorder
        reader = otlp.metric_reader(config.otlp, lambda: store_metrics(recorder.collect()), self.resource,
                                    on_error=lambda reason: diag.count("otlp", reason))
        if config.otlp.traces is not None and not tracers.user:
            tracers.get().add_span_processor(
                otlp.span_processor(config.otlp, on_error=lambda reason: diag.count("otlp", reason)))
        if reader is None:
            return
        from opentelemetry.metrics import Observation
        from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, MeterProvider

        provider = MeterProvider(resource=self.resource, metric_readers=[reader],
                                 exemplar_filter=AlwaysOffExemplarFilter())
        self._providers.append(("meter_provider", provider))
        # An SDK instrument of our own keeps every collection flowing through the reader (the SDK skips readers
        # when it has no data of its own), and is OTLP's build-info series (the store's info families are the
        # scrape endpoint's).
        info = {**config.base_labels, "version": __version__}
        provider.get_meter("rl_otel", __version__).create_observable_gauge(
            meta.BUILD_INFO.name, callbacks=[lambda _options: [Observation(1, info)]],
            unit=meta.BUILD_INFO.unit, description=meta.BUILD_INFO.description)

    def _serve(self, stack: contextlib.ExitStack, registry: ScrapeRegistry, prom: PrometheusConfig) -> None:
        """Start the scrape endpoint and, when asked, publish it in a file_sd targets file."""
        config, diag = self.config, self.diagnostics
        self.endpoint = endpoint = ScrapeEndpoint(registry, prom.host, prom.port, web=prom.web,
                                                  port_search=prom.port_search)
        _closing(stack, diag, "endpoint", endpoint)
        self.targets = publish(prom, endpoint, host_name=config.host_name, run=config.run, rank=config.rank,
                               role=config.role, labels=config.base_labels)
        if self.targets is not None:
            _closing(stack, diag, "targets_file", self.targets)
        else:  # a static target stays listed after the run: its last scrape tells a finished run from a killed one
            self.recorder.record(Batch([], infos=(Info(meta.RUN_FINISHED, (), 0.0),)))
            stack.callback(final_scrape, self.recorder, registry, endpoint, diag)

    def user_meter_provider(self) -> Any:
        """A MeterProvider for the user's own instruments, built at the first call (see
        :mod:`rl_otel._internal.exporters.instruments`); shut down with the rest."""
        from rl_otel._internal.exporters.instruments import build_meter_provider

        with self._lazy_lock:
            if self._user_meter_provider is None:
                diag = self.diagnostics
                provider = build_meter_provider(self.resource, self.registry, self.config.otlp,
                                                on_error=lambda reason: diag.count("otlp", reason))
                if provider is None:  # neither a scrape endpoint nor an OTLP push to serve them on
                    return None
                _closing(self._stack, diag, "user_meter_provider", provider, "shutdown")
                self._user_meter_provider = provider
            return self._user_meter_provider

    def _shutdown_providers(self) -> None:
        """Shut rl_otel's OTel providers down at once, each on a thread, each under its deadline: the spans'
        ``close_timeout_s`` (the spans still queued are sent within it, or left to a daemon thread that dies with
        the process: a collector that never answers cannot hold the close), the metrics' last push its export
        timeout + 1 s (at least 2 s). A failure or a timeout is counted (``sink="close"``,
        ``reason=<provider>``)."""
        providers, self._providers = self._providers, []
        own = self.tracers.own()
        if own is not None:
            providers.append(("tracer_provider", own))
        if not providers:
            return
        diag, otlp_config = self.diagnostics, self.config.otlp
        push_limit = max((otlp_config.timeout_s if otlp_config is not None else 0.0) + 1.0, 2.0)
        started = time.monotonic()
        threads = []
        for name, provider in providers:
            def shut(name: str = name, provider: Any = provider) -> None:
                try:
                    provider.shutdown()
                except Exception as exc:  # boundary: the OTel SDK's shutdown (an exporter's network)
                    _close_failed(diag, name, exc)
            thread = threading.Thread(target=shut, name=f"rl_otel-close-{name}", daemon=True)
            thread.start()
            threads.append((name, thread))
        for name, thread in threads:
            limit = self.config.close_timeout_s if name == "tracer_provider" else push_limit
            thread.join(max(0.0, started + limit - time.monotonic()))
            if thread.is_alive():
                _close_failed(diag, name, TimeoutError(f"still shutting down after {limit:g} s"))

    def begin_close(self) -> None:
        """A SIGTERM/SIGINT arriving from now on waits for the end of the close."""
        if self.signals is not None:
            self.signals.begin_close()

    def close(self) -> None:
        """Close every part in the reverse of their creation; never raises, except to deliver a SIGINT that
        arrived during the close (``KeyboardInterrupt``, after everything is closed). A SIGTERM that arrived
        during the close is delivered at its end, when the process dies by it as it would have without rl_otel."""
        signals = self.signals
        if signals is not None:
            signals.begin_close()
        try:
            self._stack.close()
        finally:
            if signals is not None:
                try:
                    signals.uninstall()  # delivers the signals held during the close: the process may end here
                except Exception as exc:  # boundary: the OS's signal calls
                    _close_failed(self.diagnostics, "signals", exc)


# -- the builder's parts: functions handed what they need ---------------------------------------------------------


def _closing(stack: contextlib.ExitStack, diag: Diagnostics, step: str, part: Any, method: str = "close") -> None:
    """Register ``part.method()`` (looked up at close time) as the close step named ``step``."""
    def guarded() -> None:
        try:
            getattr(part, method)()
        except Exception as exc:  # boundary: a part's close (sinks, the OTel SDK, files, threads), counted
            _close_failed(diag, step, exc)
    stack.callback(guarded)


def _close_failed(diag: Diagnostics, step: str, exc: BaseException) -> None:
    diag.count("close", step)
    diag.warn_once("close", step, f"rl_otel: closing {step} failed ({type(exc).__name__}: {exc}); the other parts "
                                  "are closed")


def _spans_exported(config: TelemetryConfig) -> bool:
    """Whether rl_otel's own tracer provider exports spans (``tracing=``, or an OTLP span push)."""
    return config.tracer_provider is None and (
        config.tracing is not None or (config.otlp is not None and config.otlp.traces is not None))


def _pushes_metrics(config: TelemetryConfig) -> bool:
    """Whether the OTLP push sends metrics (a metrics endpoint or the user's exporter: ``otlp.metric_reader``)."""
    otlp = config.otlp
    return otlp is not None and (otlp.exporter is not None or otlp.metrics is not None)


def _step_spans(config: TelemetryConfig, tracers: TracerProviders, diag: Diagnostics) -> StepSpans | None:
    """The steps' root spans, written by one process of the run (``tracing/steps.py``), on rl_otel's own
    provider only: the step span's IDs are chosen by its ID generator."""
    from rl_otel._internal.tracing.steps import emits_step_spans

    if not (_spans_exported(config) and emits_step_spans(config.role, config.rank)):
        return None
    from rl_otel._internal.tracing.steps import StepSpans
    from rl_otel._internal.tracing.tracing import ChosenIdGenerator

    ids = tracers.get().id_generator
    if not isinstance(ids, ChosenIdGenerator):
        return None
    return StepSpans(lambda: tracers.get().get_tracer("rl_otel", __version__), ids.chosen, config.run,
                     {"rank": config.rank}, lambda reason: diag.count("tracing", reason))


def _engine_families(config: TelemetryConfig, diag: Diagnostics) -> EngineFamilies:
    """The rollout engine's families of this process (``exporters/engines.py``), a live collector: read at each
    collection, counted against the series cap, their misses counted as ``sink="live"``."""
    from rl_otel._internal.exporters.engines import EngineFamilies

    assert config.engines is not None
    return EngineFamilies(config.engines, rank=config.rank, max_series_per_metric=config.max_series_per_metric,
                          count=lambda reason: diag.count("live", reason))


def _hang_watch(config: TelemetryConfig, diag: Diagnostics, describe: Callable[[float], list[str]]) -> HangWatch:
    """Stack dumps (``probes/hangs.py``): the progress it consumes, its series, ``/debug/stacks``, the signal;
    ``describe``: more lines for a dump's header (the collectives probe's)."""
    return HangWatch(base=config.base_labels, factor=config.hang_factor, quantile=config.hang_quantile,
                     min_s=config.hang_min_s, directory=config.stack_dump_dir,
                     count=lambda reason: diag.count("hangs", reason), redact=_command_line_scrubber(),
                     describe=describe)


def _debug_routes(config: TelemetryConfig, hangs: HangWatch) -> dict[str, Callable[[], str]]:
    """``GET /debug/stacks``: a dump where only who may see the process reaches the endpoint, else a refusal
    saying why (else the path would answer the metrics)."""
    if not config.stack_dump_http or config.prometheus is None:
        return {}
    if _private(config.prometheus):
        return {"/debug/stacks": hangs.http_text}
    import logging

    off = (f"# rl_otel: GET /debug/stacks is off: the endpoint on {config.prometheus.host} has no authentication "
           "(a dump shows the process's code and paths); it is served where the web config sets basic auth or "
           "client certificates, or the endpoint is bound to loopback (docs/security.md). SIGUSR1 writes a dump "
           "to the dump directory.\n")
    logging.getLogger("rl_otel").info(off.strip("# \n"))
    return {"/debug/stacks": lambda: off}


def _start_bridge(config: TelemetryConfig, diag: Diagnostics) -> Bridge | NullBridge:
    from rl_otel._internal.runtime.ranks import mirrors_to_trackers
    from rl_otel._internal.trackers.bridge import build_bridge
    from rl_otel._internal.trackers.config import secret_values

    secrets = frozenset(s for t in config.trackers for s in secret_values(dict(t.kwargs)))

    def sink_error(sink: str, reason: str, exc: BaseException | None) -> None:
        diag.count(sink, reason, exc.steps if isinstance(exc, SinkError) else 1)
        detail = "" if exc is None else f": {type(exc).__name__}: {scrub(str(exc), secrets)}"
        diag.warn_once(f"sink_{reason}", sink, f"rl_otel: tracker {sink!r} failed ({reason}){detail}; training "
                                               "and the other trackers go on (counted in rl_telemetry_errors_total)")

    return build_bridge(config.trackers, run=config.run, mirror=mirrors_to_trackers(config.rank,
                                                                                      config.tracker_ranks),
                        on_error=sink_error, queue_size=config.sink_queue_size,
                        close_timeout_s=config.close_timeout_s)


def _flush_spans(tracers: TracerProviders, diag: Diagnostics, timeout_s: float | None) -> bool:
    """Send the spans ended so far (rl_otel's own provider, if built; a user's provider is the user's)."""
    provider = tracers.own()
    if provider is None:
        return True
    try:
        millis = 30_000 if timeout_s is None else max(1, int(timeout_s * 1000))
        return bool(provider.force_flush(millis))
    except Exception:  # boundary: the OTel SDK's exporters (the network)
        diag.count("tracing", "flush_failed")
        return False


def final_scrape(recorder: Recorder, registry: ScrapeRegistry, endpoint: ScrapeEndpoint, diag: Diagnostics) -> None:
    """At close, before the endpoint stops: serve ``rl_run_finished`` 1 and wait for one more scrape, until
    1.5 intervals (+0.25 s) after the last scrape and :data:`FINAL_SCRAPE_MAX_S` at most; no wait unless the
    endpoint is scraped regularly (its last three scrapes evenly spaced: a Prometheus watches).
    RLScrapeTargetDown stays quiet for a static target whose last scraped value is 1 (the run finished), and
    fires for one that went down at 0 (killed). A file_sd target needs none of it: its file is removed at
    close."""
    try:
        recorder.record(Batch([], infos=(Info(meta.RUN_FINISHED, (), 1.0),)))
        regular = registry.scrape_interval()
        if regular is None:
            return
        interval, last = regular
        wait = min(last + 1.5 * interval + 0.25 - time.monotonic(), FINAL_SCRAPE_MAX_S)  # the next one's due
        if wait > 0 and registry.wait_next_scrape(wait):
            deadline = time.monotonic() + 1.0  # its body handed to the kernel: closing then cuts nothing
            while endpoint.server.sending and time.monotonic() < deadline:
                time.sleep(0.005)
    except Exception as exc:  # boundary: the close must go on (the endpoint's server, the OS clock)
        _close_failed(diag, "final_scrape", exc)


def _command_line_scrubber() -> Callable[[str], str] | None:
    """Writes ``***`` over the secrets of this process's command line in a stack dump's text (py-spy prints it)."""
    secrets = frozenset(command_line_secrets(process_command_line()))
    return (lambda text: scrub(text, secrets)) if secrets else None


def _private(prometheus: PrometheusConfig) -> bool:
    """Whether only someone who may see the process can reach the endpoint: bound to loopback, or behind basic auth
    or client certificates (a web config). ``/debug/stacks`` is served only there."""
    import ipaddress
    import ssl

    web = prometheus.web
    if web is not None and (web.auth is not None
                            or (web.tls is not None and web.tls.verify_mode == ssl.CERT_REQUIRED)):
        return True
    host = prometheus.host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
