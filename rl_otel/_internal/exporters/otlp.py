"""OTLP push to a Collector: the scale-out path when one Prometheus should not scrape every rank.

``init(otlp={"endpoint": "http://collector:4318", "protocol": "http/protobuf" | "grpc", "interval_s": 10,
"headers": {...}, "timeout_s": 10, "traces": True, "temporality": "cumulative" | "delta" | "lowmemory"})``
pushes, every ``interval_s`` and once more at ``close()``, the same data the scrape endpoint serves (rl_otel's
series store - NaN included, which the SDK's instruments would drop - plus the SDK's own instruments and the
user's, see ``Telemetry.meter_provider``) over OTLP to the collector, and the phase spans through a
BatchSpanProcessor. Each setting not given is read from the standard ``OTEL_*`` variables
(:mod:`rl_otel._internal.exporters.otel_env`), and with no ``otlp=`` at all, ``OTEL_METRICS_EXPORTER=otlp`` /
``OTEL_TRACES_EXPORTER=otlp`` turn the push on. ``otlp=`` also takes the user's own ``MetricExporter`` (or
``{"exporter": ..., "interval_s": ...}``): it gets the same data, and its temporality preference is honoured.

Export runs on the SDK's background threads: a collector that is down or slow costs a warning and
``rl_telemetry_errors_total{sink="otlp"}``, never an exception in the training loop; ``close()`` waits for the
final push at most ``timeout_s``.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from rl_otel._internal.checks import boolean, check_known, positive_seconds
from rl_otel._internal.exporters import otel_env
from rl_otel._internal.exporters.otel_env import SignalConfig
from rl_otel.errors import ConfigurationError, install_hint

if TYPE_CHECKING:  # the SDK's metrics package costs ~100 ms to import: only a process that pushes loads it
    from opentelemetry.sdk.metrics.export import AggregationTemporality, Metric, MetricExporter
    from opentelemetry.sdk.resources import Resource

_log = logging.getLogger("rl_otel")
_KEYS = ("endpoint", "protocol", "interval_s", "timeout_s", "headers", "traces", "temporality", "exporter")
_DEFAULT_INTERVAL_S = 10.0


@dataclass(frozen=True)
class OtlpConfig:
    """What ``otlp=`` and the ``OTEL_*`` variables resolved to. ``metrics``/``traces``: where each signal goes
    (``None``: not pushed); ``exporter``: the user's own MetricExporter, used instead of an OTLP one."""

    metrics: SignalConfig | None
    traces: SignalConfig | None = None
    interval_s: float = _DEFAULT_INTERVAL_S
    temporality: str = "cumulative"
    exporter: MetricExporter | None = None
    timeout_s: float = otel_env.DEFAULT_TIMEOUT_S  # how long one metric export (and the last, at close) may take

    @property
    def pushes_metrics(self) -> bool:
        return self.metrics is not None or self.exporter is not None


def _is_metric_exporter(value: object) -> bool:
    from opentelemetry.sdk.metrics.export import MetricExporter

    return isinstance(value, MetricExporter)


def otlp_config(value: object, *, tracer_provider_given: bool = False,
                env: Mapping[str, str] | None = None) -> OtlpConfig | None:
    """Check ``init(otlp=...)``: ``None`` (the default: push what ``OTEL_METRICS_EXPORTER`` /
    ``OTEL_TRACES_EXPORTER`` select, nothing when they are unset), ``False`` (no push, whatever the environment
    says), ``True`` (push, every setting from the environment or its default), an endpoint str, a
    ``MetricExporter``, or a dict of options. With ``tracer_provider_given`` the spans are the user's provider's
    business: rl_otel adds no span processor to it (an explicit ``traces: True`` is an error)."""
    env = os.environ if env is None else env
    if value is False:
        return None
    if value is None:
        return _from_environment(env, tracer_provider_given)
    if value is True:
        value = {}
    elif isinstance(value, str):
        value = {"endpoint": value}
    elif not isinstance(value, Mapping) and _is_metric_exporter(value):
        value = {"exporter": value}
    if not isinstance(value, Mapping):
        raise ConfigurationError(f"otlp must be None, True, False, an endpoint like 'http://collector:4318', a "
                                 f"MetricExporter or a dict like {{'endpoint': ..., 'interval_s': 10}}; "
                                 f"got {value!r}")
    check_known("otlp", value, _KEYS)
    exporter = value.get("exporter")
    if exporter is not None:
        if not _is_metric_exporter(exporter):
            raise ConfigurationError(f"otlp exporter must be an opentelemetry MetricExporter, got {exporter!r}")
        given = sorted(k for k in ("endpoint", "protocol", "headers", "temporality") if k in value)
        if given:
            raise ConfigurationError(f"otlp option(s) {given} configure rl_otel's OTLP exporter: with your own "
                                     "'exporter', construct it with them")
    traces = value.get("traces")
    if traces is not None:
        traces = boolean("otlp traces", traces)
        if traces and tracer_provider_given:
            raise ConfigurationError("otlp traces=True adds a span processor to rl_otel's TracerProvider; with "
                                     "tracer_provider= your provider exports the spans (add processors to it)")
    elif tracer_provider_given:
        traces = False
    else:
        traces = otel_env.selected(env, "traces")  # OTEL_TRACES_EXPORTER, when set, decides
        traces = (exporter is None) if traces is None else traces
    headers = value.get("headers")
    headers = None if headers is None else otel_env.check_headers("otlp headers", headers)
    timeout = value.get("timeout_s")
    timeout = None if timeout is None else positive_seconds("otlp timeout_s", timeout)
    signal_config = partial(otel_env.signal_config, env=env, base=value.get("endpoint"),
                            protocol=value.get("protocol"), headers=headers, timeout_s=timeout)
    metrics = None if exporter is not None else signal_config("metrics")
    spans = signal_config("traces") if traces else None
    interval = value.get("interval_s")
    interval = (otel_env.export_interval_s(env, _DEFAULT_INTERVAL_S) if interval is None
                else positive_seconds("otlp interval_s", interval))
    config = OtlpConfig(metrics=metrics, traces=spans, interval_s=interval,
                        temporality=otel_env.temporality(env, value.get("temporality")), exporter=exporter,
                        timeout_s=timeout if timeout is not None else
                        metrics.timeout_s if metrics is not None else otel_env.DEFAULT_TIMEOUT_S)
    _check_installed(config)
    return config


def _from_environment(env: Mapping[str, str], tracer_provider_given: bool) -> OtlpConfig | None:
    metrics = otel_env.selected(env, "metrics") is True
    traces = otel_env.selected(env, "traces") is True and not tracer_provider_given
    if not (metrics or traces):
        return None
    signal = otel_env.signal_config("metrics", env, what="OTEL_METRICS_EXPORTER=otlp") if metrics else None
    config = OtlpConfig(metrics=signal,
                        traces=otel_env.signal_config("traces", env, what="OTEL_TRACES_EXPORTER=otlp")
                        if traces else None,
                        interval_s=otel_env.export_interval_s(env, _DEFAULT_INTERVAL_S),
                        temporality=otel_env.temporality(env) if metrics else "cumulative",
                        timeout_s=signal.timeout_s if signal is not None else otel_env.DEFAULT_TIMEOUT_S)
    _check_installed(config)
    return config


def _check_installed(config: OtlpConfig) -> None:
    """Fail at init, not at the first export, when the exporter package of a configured protocol is missing."""
    for signal in (config.metrics, config.traces):
        if signal is not None:
            exporter_class(signal)


def exporter_class(signal: SignalConfig) -> Any:
    """The OTLP exporter class for ``signal``'s protocol; ConfigurationError with the install hint if absent."""
    grpc = signal.protocol == "grpc"
    package = "opentelemetry-exporter-otlp-proto-grpc" if grpc else "opentelemetry-exporter-otlp-proto-http"
    cls: Any  # one of four exporter classes
    try:
        if signal.signal == "metrics":
            if grpc:
                from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as cls
            else:
                from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as cls
        elif grpc:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as cls
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as cls
    except ImportError as exc:
        raise ConfigurationError(f"OTLP over {signal.protocol} needs its exporter: {install_hint('otlp')} "
                                 f"({package})") from exc
    return cls


def temporality_map(preference: str) -> dict[type, AggregationTemporality]:
    """The spec's ``OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE`` table for the SDK's instrument classes
    (what the OTLP exporters build from the variable): ``delta`` for counters and histograms (and observable
    counters), ``lowmemory`` for the synchronous ones only; up-down counters and gauges stay cumulative."""
    from opentelemetry.sdk.metrics import (
        Counter,
        Histogram,
        ObservableCounter,
        ObservableGauge,
        ObservableUpDownCounter,
        UpDownCounter,
    )
    from opentelemetry.sdk.metrics.export import AggregationTemporality

    delta, cumulative = AggregationTemporality.DELTA, AggregationTemporality.CUMULATIVE
    sync = delta if preference in ("delta", "lowmemory") else cumulative
    return {Counter: sync, Histogram: sync, ObservableCounter: delta if preference == "delta" else cumulative,
            UpDownCounter: cumulative, ObservableUpDownCounter: cumulative, ObservableGauge: cumulative}


class _OncePerWindow(logging.Filter):
    """Lets one record per logger through per ``window_s``: the OTLP exporters log every retry and every failed
    export (a line per interval while a collector is down); rl_otel counts each failure in
    ``rl_telemetry_errors_total{sink="otlp"}``, so one line per window says it is still happening."""

    def __init__(self, window_s: float = 300.0) -> None:
        super().__init__()
        self._window_s = window_s
        self._last: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        now = time.monotonic()
        last = self._last.get(record.name)
        if last is not None and now - last < self._window_s:
            return False
        self._last[record.name] = now
        return True


_SDK_EXPORT_LOGGERS = ("opentelemetry.exporter.otlp.proto.http.metric_exporter",
                       "opentelemetry.exporter.otlp.proto.http.trace_exporter",
                       "opentelemetry.exporter.otlp.proto.grpc.exporter",
                       "opentelemetry.sdk.metrics._internal.export")
_quieted = False


def _quiet_sdk_export_logs() -> None:
    """Install :class:`_OncePerWindow` on the SDK's exporter loggers (once per process, by logger name: public
    logging API, nothing of the SDK's internals)."""
    global _quieted
    if not _quieted:
        _quieted = True
        once = _OncePerWindow()
        for name in _SDK_EXPORT_LOGGERS:
            logging.getLogger(name).addFilter(once)


def metric_exporter(signal: SignalConfig, temporality: str) -> MetricExporter:
    """rl_otel's OTLP metric exporter for ``signal`` (http/protobuf or grpc), everything passed explicitly."""
    _quiet_sdk_export_logs()
    cls = exporter_class(signal)
    return cls(endpoint=signal.endpoint, headers=dict(signal.headers), timeout=signal.timeout_s,
               preferred_temporality=temporality_map(temporality))


def metric_reader(config: OtlpConfig, produce: Callable[[], list[Metric]], resource: Resource,
                  on_error: Callable[[str], None]) -> Any:
    """A PeriodicExportingMetricReader pushing the store and the SDK's instruments through the user's exporter
    or an OTLP one; ``None`` when ``config`` pushes no metrics."""
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    from rl_otel._internal.exporters.otlp_push import StoreExporter

    if config.exporter is not None:
        inner = config.exporter
    elif config.metrics is not None:
        inner = metric_exporter(config.metrics, config.temporality)
    else:  # pushes no metrics
        return None
    return PeriodicExportingMetricReader(StoreExporter(inner, produce, resource, on_error),
                                         export_interval_millis=config.interval_s * 1000,
                                         export_timeout_millis=config.timeout_s * 1000)


def span_exporter(signal: SignalConfig) -> Any:
    """An OTLP span exporter for ``signal`` (http/protobuf or grpc), everything passed explicitly."""
    _quiet_sdk_export_logs()
    cls = exporter_class(signal)
    return cls(endpoint=signal.endpoint, headers=dict(signal.headers), timeout=signal.timeout_s)


def span_processor(config: OtlpConfig, on_error: Callable[[str], None] | None = None) -> Any:
    """A BatchSpanProcessor sending the phase spans to ``config.traces`` as they end; ``None`` when spans are not
    pushed."""
    from rl_otel._internal.tracing.tracing import prompt_processor

    if config.traces is None:
        return None
    exporter = span_exporter(config.traces)
    if on_error is not None:
        exporter = counted_span_exporter(exporter, on_error)
    return prompt_processor(exporter, export_timeout_millis=config.traces.timeout_s * 1000)


def counted_span_exporter(inner: Any, on_error: Callable[[str], None]) -> Any:
    """``inner`` (a ``SpanExporter``) with every failed export counted as ``span_export_failed`` (the SDK only
    logs it): spans lost to a collector that is down show in ``rl_telemetry_errors_total``."""
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    class CountedSpanExporter(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            try:
                result = inner.export(spans)
            except Exception:  # boundary: the OTel SDK's exporter (network, serialisation)
                _log.warning("rl_otel: span export raised", exc_info=True)
                result = SpanExportResult.FAILURE
            if result is not SpanExportResult.SUCCESS:
                on_error("span_export_failed")
            return result

        def shutdown(self) -> None:
            inner.shutdown()

        def force_flush(self, timeout_millis: int = 30_000) -> bool:
            return bool(inner.force_flush(timeout_millis))

    return CountedSpanExporter()
