"""The resources of one Telemetry - providers, probes, the scrape endpoint, its targets file, the OTLP push, the
tracker bridge, signal handlers - built in order and closed in reverse with one :class:`contextlib.ExitStack`.

A failure while building closes what was built so far (no port, file or thread left behind) and propagates to
``init()``. At close each step runs on its own: one that raises (the OTel SDK's ``shutdown`` can) is counted in
``rl_telemetry_errors_total{sink="close", reason=<step>}`` and logged once, and the steps after it still run.

Close order (the reverse of registration), with the signal handlers around it all: a SIGTERM or SIGINT during the
close is held until every part is closed, then delivered (see ``signals.py``); the metrics worker drains before
the trackers close (queued steps reach them); the trackers close before the endpoint stops (a last scrape still
sees the final step); a static target's last scrape sees ``rl_run_finished`` 1 (:meth:`Components._final_scrape`)
before the endpoint stops; the OTLP meter provider's shutdown pushes once more; rl_otel's own tracer provider ends
last (phases may still end while the others close).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rl_otel._internal.exporters.file_sd import TargetsFile, targets_path
from rl_otel._internal.exporters.otel_env import resolve_resource
from rl_otel._internal.exporters.prometheus import ScrapeEndpoint, ScrapeRegistry
from rl_otel._internal.exporters.textformat import target_info_labels
from rl_otel._internal.pipeline.diagnostics import Diagnostics
from rl_otel._internal.pipeline.recorder import Recorder
from rl_otel._internal.pipeline.worker import reset_in_forked_child
from rl_otel._internal.probes.hangs import HangWatch
from rl_otel._internal.probes.live import LiveGauges, process_start_time
from rl_otel._internal.probes.memory import CpuProbe, GpuProbe
from rl_otel._internal.probes.torch_collectives import CollectiveProbe
from rl_otel._internal.runtime.config import PrometheusConfig, TelemetryConfig
from rl_otel._internal.runtime.serving import publish, scrape_registry
from rl_otel._internal.runtime.signals import SignalFlush
from rl_otel._internal.trackers.bridge import Bridge, NullBridge
from rl_otel._internal.trackers.config import command_line_secrets, process_command_line, scrub
from rl_otel._internal.trackers.sinks import SinkError
from rl_otel._version import __version__
from rl_otel.catalog import Catalog, meta

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource

    from rl_otel._internal.exporters.exemplars import Exemplars
    from rl_otel._internal.tracing.phase import PhaseRuntime
    from rl_otel._internal.tracing.steps import StepSpans


_NOTHING_HELD = contextlib.nullcontext()
# the longest close() waits for a last scrape of rl_run_finished (a scrape interval of Prometheus' default 15 s and
# more fits; a SIGTERM's grace period, Kubernetes' 30 s, is not spent on it)
FINAL_SCRAPE_MAX_S = 20.0


class Components:
    """What one Telemetry runs on. Build it with :meth:`build`; :meth:`close` once."""

    def __init__(self, config: TelemetryConfig, catalog: Catalog) -> None:
        self.config = config
        # explicit (init's resource=) > OTEL_SERVICE_NAME > OTEL_RESOURCE_ATTRIBUTES > rl_otel's defaults (the SDK
        # Resource object itself is built when something needs it: see the resource property)
        self._resource = resolve_resource(
            {"service.name": "rl_otel", "service.version": __version__, "service.instance.id":
                f"{config.host_name}/{config.run}/{config.role}/{config.rank}", "host.name": config.host_name},
            {"rl.run": config.run, "rl.rank": config.rank, "rl.role": config.role,
             "rl.local_rank": config.local_rank, "rl.world_size": config.world_size},
            dict(config.resource))
        self.recorder = recorder = Recorder(
            catalog, config.base_labels, max_series_per_metric=config.max_series_per_metric,
            max_unknown_keys=config.max_unknown_keys, series_ttl_s=config.series_ttl_s,
            submit_queue_size=config.submit_queue_size, close_timeout_s=config.close_timeout_s)
        self.diagnostics: Diagnostics = recorder.diagnostics
        self._tracer_provider: Any = config.tracer_provider  # the user's, or rl_otel's own (built when needed)
        self._lazy_lock = threading.Lock()
        self.registry: ScrapeRegistry | None = None
        self.endpoint: ScrapeEndpoint | None = None
        self.targets: TargetsFile | None = None
        self.bridge: Bridge | NullBridge = NullBridge()
        self.signals: SignalFlush | None = None
        self.live: LiveGauges | None = None
        self.engines: Any = None  # exporters.engines.EngineFamilies, when engines= serves some
        self._engine_targets: dict[str, TargetsFile] = {}  # tel.engine()'s targets files, by engine name
        self.hangs: HangWatch | None = None
        self.cpu: CpuProbe | None = None
        self._phases: PhaseRuntime | None = None
        self.exemplars: Exemplars | None = None  # the phases' trace IDs for OpenMetrics scrapes
        self.step_spans: StepSpans | None = None  # this process writes the steps' root spans (tracing/steps.py)
        self._user_meter_provider: Any = None
        self._providers: list[tuple[str, Any]] = []  # OTel providers rl_otel shuts down (see _shutdown_providers)
        self._user_meter_lock = threading.Lock()
        self._stack = contextlib.ExitStack()
        reset_in_forked_child(self)

    def _after_fork(self) -> None:
        self._lazy_lock = threading.Lock()  # the parent's may have been held by another thread at the fork
        self._user_meter_lock = threading.Lock()

    def build(self, *, on_term: Callable[[], object], on_int: Callable[[], object]) -> None:
        """Create every resource the config asks for, in order; on a failure, close those made and re-raise."""
        with contextlib.ExitStack() as stack:
            self._build(stack, on_term, on_int)
            self._stack = stack.pop_all()

    def _closing(self, stack: contextlib.ExitStack, step: str, part: Any, method: str = "close") -> None:
        """Register ``part.method()`` (looked up at close time) as the close step named ``step``."""
        def guarded() -> None:
            try:
                getattr(part, method)()
            except Exception as exc:
                self._close_failed(step, exc)
        stack.callback(guarded)

    def _build(self, stack: contextlib.ExitStack, on_term: Callable[[], object], on_int: Callable[[], object]) -> None:
        config, recorder, diag = self.config, self.recorder, self.diagnostics
        # the OTel providers shut down last (phases may end while the rest closes), together: each may wait up to
        # its export timeout for an unreachable collector, so in sequence they would take a multiple of it
        stack.callback(self._shutdown_providers)
        if config.tracing is not None:  # spans exported from the start; else the provider is built when needed
            self.tracer_provider  # noqa: B018 (builds it)
        self._step_spans()
        self.cpu = cpu = CpuProbe()
        self._closing(stack, "cpu_probe", cpu)
        recorder.goodput.begin(process_start_time())  # start-up: from the process's start to its first phase/step
        # build_info and target_info (the OTel resource, Prometheus' convention) are ordinary store families
        recorder.store.write_info(meta.BUILD_INFO, (("version", __version__),))
        recorder.store.write_info(meta.TARGET_INFO, target_info_labels(self._resource.attributes), base_labels=False)
        if config.prometheus is not None:
            self.registry = scrape_registry(recorder.collect, lambda reason: diag.count("prometheus", reason),
                                            recorder.store.clock)
            pending = getattr(self._tracer_provider, "pending", None)  # rl_otel's own provider, built for tracing=
            if pending is not None:
                pending.on_root = self._exemplars().note
        pushes = config.otlp is not None and self._otlp(stack, config)
        if self.registry is not None or pushes:
            self.live = LiveGauges(recorder.add_collector, cpu, lambda reason: diag.count("live", reason))
        if self.registry is not None and config.prometheus is not None:
            self._serve(stack, self.registry, config.prometheus)
        if self.live is not None:
            self._closing(stack, "live", self.live)
        if self.live is not None and config.engines is not None:
            self._serve_engines(stack, config)
        self.bridge = self._start_bridge()
        self._closing(stack, "trackers", self.bridge)
        if self.bridge.active:
            recorder.mirror = self.bridge.submit
        self._closing(stack, "metrics_worker", recorder.worker)  # drains before the trackers close
        self._watch_hangs(stack)
        # a signal handler when a SIGTERM would leave something behind: steps buffered for the trackers, or a
        # file_sd target that would keep a "target down" alert firing after the rank is gone
        # (built last, so no failure follows it here; close() itself puts the previous handlers back, at its end)
        # (or spans not yet sent: a Ray worker gets a SIGTERM ~5 s before it is killed, with Ray's own handler)
        if config.handle_sigterm and (self.bridge.active or self.targets is not None or self._spans_exported()):
            self.signals = SignalFlush(on_term=on_term, on_int=on_int, timeout_s=config.close_timeout_s)

    def _spans_exported(self) -> bool:
        """Whether rl_otel's own tracer provider exports spans (``tracing=``, or an OTLP span push)."""
        config = self.config
        return config.tracer_provider is None and (
            config.tracing is not None or (config.otlp is not None and config.otlp.traces is not None))

    def _step_spans(self) -> None:
        """The steps' root spans, written by one process of the run (``tracing/steps.py``), on rl_otel's own
        provider only: the step span's IDs are chosen by its ID generator."""
        config = self.config
        from rl_otel._internal.tracing.steps import emits_step_spans

        if not (self._spans_exported() and emits_step_spans(config.role, config.rank)):
            return
        from rl_otel._internal.tracing.steps import StepSpans
        from rl_otel._internal.tracing.tracing import ChosenIdGenerator

        ids = self.tracer_provider.id_generator
        if not isinstance(ids, ChosenIdGenerator):
            return
        self.step_spans = StepSpans(lambda: self.tracer_provider.get_tracer("rl_otel", __version__), ids.chosen,
                                    config.run, {"rank": config.rank},
                                    lambda reason: self.diagnostics.count("tracing", reason))

    def logged(self) -> None:
        """A step was logged: the spans of phases that started before any step was known go to its trace, and
        the process that writes the step spans writes this one (``tracing/pending.py``, ``tracing/steps.py``)."""
        last = self.recorder.steps.last
        if last is None or self._tracer_provider is None:
            return
        pending = getattr(self._tracer_provider, "pending", None)
        if pending is not None and pending.waiting:
            from rl_otel._internal.tracing.steps import step_ids

            pending.resolve(last, *step_ids(self.config.run, last))
        spans = self.step_spans
        if spans is not None:
            spans.logged(last)
    def _serve_engines(self, stack: contextlib.ExitStack, config: TelemetryConfig) -> None:
        """The rollout engine's families of this process (``exporters/engines.py``), a live collector: read at
        each collection, counted against the series cap, their misses counted as ``sink="live"``."""
        from rl_otel._internal.exporters.engines import EngineFamilies

        assert config.engines is not None
        diag = self.diagnostics
        self.engines = engines = EngineFamilies(config.engines, rank=config.rank,
                                                max_series_per_metric=config.max_series_per_metric,
                                                count=lambda reason: diag.count("live", reason))
        self.recorder.add_collector(engines.collect)
        self._closing(stack, "engines", engines)

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
        self._closing(self._stack, f"engine_target_{name}", targets)
        return str(path)

    def _watch_hangs(self, stack: contextlib.ExitStack) -> None:
        """Stack dumps (``probes/hangs.py``): the progress hook, the series, ``/debug/stacks``, the signal; the
        watchdog starts with the first phase (:meth:`phase_runtime`). Closed first: no dump starts while the rest
        closes."""
        config, recorder = self.config, self.recorder
        self.hangs = hangs = HangWatch(base=config.base_labels, factor=config.hang_factor,
                                       quantile=config.hang_quantile, min_s=config.hang_min_s,
                                       directory=config.stack_dump_dir,
                                       count=lambda reason: self.diagnostics.count("hangs", reason),
                                       redact=_command_line_scrubber())
        self._closing(stack, "hangs", hangs)
        recorder.on_progress = hangs.progressed
        recorder.add_collector(hangs.collect)
        # this rank's torch.distributed collectives, from torch's flight recorder (nothing until torch.distributed
        # is initialized): which collective it is in, in the series and in its dumps' headers
        collectives = CollectiveProbe(lambda reason: self.diagnostics.count("hangs", reason))
        recorder.add_collector(collectives.collect)
        hangs.describe = collectives.describe
        if self.registry is not None and config.stack_dump_http and config.prometheus is not None:
            if _private(config.prometheus):
                self.registry.routes["/debug/stacks"] = hangs.http_text
            else:
                import logging

                off = (f"# rl_otel: GET /debug/stacks is off: the endpoint on {config.prometheus.host} has no "
                       "authentication (a dump shows the process's code and paths); it is served where the web config "
                       "sets basic auth or client certificates, or the endpoint is bound to loopback "
                       "(docs/security.md). SIGUSR1 writes a dump to the dump directory.\n")
                self.registry.routes["/debug/stacks"] = lambda: off  # (else the path would answer the metrics)
                logging.getLogger("rl_otel").info(off.strip("# \n"))
        if config.stack_dump_signal is not None:
            hangs.listen(config.stack_dump_signal)

    @property
    def resource(self) -> Resource:
        """The OTel SDK ``Resource``, built at the first read: by what needs the SDK object (a provider, the OTLP
        push); ``target_info`` is written from the attributes alone."""
        return self._resource.sdk()

    @property
    def tracer_provider(self) -> Any:
        """The user's TracerProvider, or rl_otel's own, built at the first need (a phase, an OTLP span push, a
        read of ``Telemetry.tracer_provider``): a process that never records a span never loads the SDK's trace
        package (~15 ms of ``init()``)."""
        if self._tracer_provider is None:
            with self._lazy_lock:
                if self._tracer_provider is None:
                    from rl_otel._internal.tracing.tracing import build_tracer_provider

                    diag = self.diagnostics
                    provider = build_tracer_provider(self.config.tracing, self.resource,
                                                     on_error=lambda reason: diag.count("tracing", reason))
                    if self.registry is not None:  # the phases' trace IDs as exemplars on the endpoint
                        provider.pending.on_root = self._exemplars().note
                    self._providers.append(("tracer_provider", provider))
                    self._tracer_provider = provider
        return self._tracer_provider

    def _exemplars(self) -> Exemplars:
        """The phases' latest exemplars, served by the scrape registry in OpenMetrics renderings."""
        from rl_otel._internal.exporters.exemplars import Exemplars

        if self.exemplars is None:
            self.exemplars = Exemplars()
        if self.registry is not None:
            self.registry.exemplars = self.exemplars.current
        return self.exemplars

    def built_tracer_provider(self) -> Any:
        """The TracerProvider if it exists (the user's, or rl_otel's once built), else ``None``: then no span
        processor can have been added to it, and a phase records no span (see ``tracing/contexts.py``)."""
        return self._tracer_provider

    def phase_runtime(self) -> PhaseRuntime:
        """What every phase shares (the tracer, the probes), built at the first ``phase()``; the TracerProvider
        only when something needs it."""
        runtime = self._phases
        if runtime is None:
            from rl_otel._internal.tracing.contexts import PhaseTracer
            from rl_otel._internal.tracing.phase import PhaseRuntime

            with self._lazy_lock:
                if self._phases is None:
                    assert self.cpu is not None  # built by build()
                    steps = self.recorder.steps
                    tracer = PhaseTracer(self.built_tracer_provider, lambda: self.tracer_provider, "rl_otel",
                                         __version__, run=self.config.run, step_spans=self.step_spans,
                                         known_step=lambda: None if steps.last is None else steps.next())
                    self._phases = PhaseRuntime(
                        tracer=tracer, rank=self.config.rank, gpu=GpuProbe(), cpu=self.cpu,
                        next_step=self.recorder.steps.next, record=self.recorder.record_phase,
                        fail=self._phase_failed, record_gpu=self.recorder.record_phase_gpu,
                        count=lambda reason: self.diagnostics.count("phase", reason),
                        goodput=self.recorder.goodput, memory=self.config.phase_memory,
                        peaks=self.config.phase_peaks, gpu_time=self.config.phase_gpu_time)
                    # closed first (built after the others): the GPU times still pending are resolved (bounded)
                    # while the store and the tracer provider are open
                    self._closing(self._stack, "phases", self._phases)
                    if self.hangs is not None:  # the watchdog reads the running phases from now on
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

        ran = self.recorder.worker.flush(timeout_s)
        timed = True if self._phases is None else self._phases.flush(left())
        written = self.bridge.flush(left())
        return self._flush_spans(left()) and written and ran and timed

    def _flush_spans(self, timeout_s: float | None) -> bool:
        """Send the spans ended so far (rl_otel's own provider, if built; a user's provider is the user's)."""
        provider = self._tracer_provider
        if provider is None or self.config.tracer_provider is not None:
            return True
        try:
            millis = 30_000 if timeout_s is None else max(1, int(timeout_s * 1000))
            return bool(provider.force_flush(millis))
        except Exception:
            self.diagnostics.count("tracing", "flush_failed")
            return False

    def _otlp(self, stack: contextlib.ExitStack, config: TelemetryConfig) -> bool:
        """The OTLP push: a reader on an SDK MeterProvider exporting the store's families, and a span processor
        on rl_otel's own tracer provider (a user's provider exports its spans itself). True if metrics are
        pushed."""
        assert config.otlp is not None
        from rl_otel._internal.exporters import otlp
        from rl_otel._internal.exporters.otlp_push import store_metrics

        diag, recorder = self.diagnostics, self.recorder
        reader = otlp.metric_reader(config.otlp, lambda: store_metrics(recorder.collect()), self.resource,
                                    on_error=lambda reason: diag.count("otlp", reason))
        if config.otlp.traces is not None and config.tracer_provider is None:
            self.tracer_provider.add_span_processor(
                otlp.span_processor(config.otlp, on_error=lambda reason: diag.count("otlp", reason)))
        if reader is None:
            return False
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
        return True

    def _serve(self, stack: contextlib.ExitStack, registry: ScrapeRegistry, prom: PrometheusConfig) -> None:
        """Start the scrape endpoint and, when asked, publish it in a file_sd targets file."""
        config = self.config
        self.endpoint = endpoint = ScrapeEndpoint(registry, prom.host, prom.port, web=prom.web,
                                                  port_search=prom.port_search)
        self._closing(stack, "endpoint", endpoint)
        self.targets = publish(prom, endpoint, host_name=config.host_name, run=config.run, rank=config.rank,
                               role=config.role, labels=config.base_labels)
        if self.targets is not None:
            self._closing(stack, "targets_file", self.targets)
        else:  # a static target stays listed after the run: its last scrape tells a finished run from a killed one
            self.recorder.store.write_info(meta.RUN_FINISHED, (), value=0.0)
            stack.callback(self._final_scrape)

    def _final_scrape(self) -> None:
        """At close, before the endpoint stops: serve ``rl_run_finished`` 1 and wait for one more scrape, until
        1.5 intervals (+0.25 s) after the last scrape and :data:`FINAL_SCRAPE_MAX_S` at most; no wait unless the
        endpoint is scraped regularly (its last three scrapes evenly spaced: a Prometheus watches).
        RLScrapeTargetDown stays quiet for a static target whose last scraped value is 1 (the run finished), and
        fires for one that went down at 0 (killed). A file_sd target needs none of it: its file is removed at
        close."""
        registry = self.registry
        if registry is None:
            return
        try:
            self.recorder.store.write_info(meta.RUN_FINISHED, (), value=1.0)
            regular = registry.scrape_interval()
            if regular is None:
                return
            interval, last = regular
            wait = min(last + 1.5 * interval + 0.25 - time.monotonic(), FINAL_SCRAPE_MAX_S)  # the next one's due
            if wait > 0 and registry.wait_next_scrape(wait):
                deadline = time.monotonic() + 1.0  # its body handed to the kernel: closing then cuts nothing
                while self.endpoint is not None and self.endpoint.server.sending and time.monotonic() < deadline:
                    time.sleep(0.005)
        except Exception as exc:
            self._close_failed("final_scrape", exc)

    def _start_bridge(self) -> Bridge | NullBridge:
        from rl_otel._internal.runtime.ranks import mirrors_to_trackers
        from rl_otel._internal.trackers.bridge import build_bridge
        from rl_otel._internal.trackers.config import scrub, secret_values

        cfg, diag = self.config, self.diagnostics
        secrets = frozenset(s for t in cfg.trackers for s in secret_values(dict(t.kwargs)))

        def sink_error(sink: str, reason: str, exc: BaseException | None) -> None:
            diag.count(sink, reason, exc.steps if isinstance(exc, SinkError) else 1)
            detail = "" if exc is None else f": {type(exc).__name__}: {scrub(str(exc), secrets)}"
            diag.warn_once(f"sink_{reason}", sink, f"rl_otel: tracker {sink!r} failed ({reason}){detail}; "
                                                   "training and the other trackers go on (counted in "
                                                   "rl_telemetry_errors_total)")

        return build_bridge(cfg.trackers, run=cfg.run, mirror=mirrors_to_trackers(cfg.rank, cfg.tracker_ranks),
                            on_error=sink_error, queue_size=cfg.sink_queue_size, close_timeout_s=cfg.close_timeout_s)

    def _phase_failed(self, what: str) -> None:
        import logging

        self.diagnostics.count("phase", "internal")
        if self.diagnostics.warn_once("phase", what, f"rl_otel: a phase's telemetry ({what}) failed; training "
                                                     "goes on"):
            logging.getLogger("rl_otel").debug("rl_otel: phase telemetry failure", exc_info=True)

    def user_meter_provider(self) -> Any:
        """A MeterProvider for the user's own instruments, built at the first call (see
        :mod:`rl_otel._internal.exporters.instruments`); shut down with the rest."""
        from rl_otel._internal.exporters.instruments import build_meter_provider

        with self._user_meter_lock:
            if self._user_meter_provider is None:
                provider = build_meter_provider(self.resource, self.registry, self.config.otlp,
                                                on_error=lambda reason: self.diagnostics.count("otlp", reason))
                if provider is None:  # neither a scrape endpoint nor an OTLP push to serve them on
                    return None
                self._closing(self._stack, "user_meter_provider", provider, "shutdown")
                self._user_meter_provider = provider
            return self._user_meter_provider

    def _shutdown_providers(self) -> None:
        """Shut rl_otel's OTel providers down at once, each on a thread, each under its deadline: the spans'
        ``close_timeout_s`` (the spans still queued are sent within it, or left to a daemon thread that dies with
        the process: a collector that never answers cannot hold the close), the metrics' last push its export
        timeout + 1 s (at least 2 s). A failure or a timeout is counted (``sink="close"``,
        ``reason=<provider>``)."""
        providers, self._providers = self._providers, []
        if not providers:
            return
        otlp_config = self.config.otlp
        push_limit = max((otlp_config.timeout_s if otlp_config is not None else 0.0) + 1.0, 2.0)
        started = time.monotonic()
        threads = []
        for name, provider in providers:
            def shut(name: str = name, provider: Any = provider) -> None:
                try:
                    provider.shutdown()
                except Exception as exc:
                    self._close_failed(name, exc)
            thread = threading.Thread(target=shut, name=f"rl_otel-close-{name}", daemon=True)
            thread.start()
            threads.append((name, thread))
        for name, thread in threads:
            limit = self.config.close_timeout_s if name == "tracer_provider" else push_limit
            thread.join(max(0.0, started + limit - time.monotonic()))
            if thread.is_alive():
                self._close_failed(name, TimeoutError(f"still shutting down after {limit:g} s"))

    def _close_failed(self, step: str, exc: BaseException) -> None:
        self.diagnostics.count("close", step)
        self.diagnostics.warn_once("close", step, f"rl_otel: closing {step} failed ({type(exc).__name__}: {exc}); "
                                                  "the other parts are closed")

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
                except Exception as exc:
                    self._close_failed("signals", exc)


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
