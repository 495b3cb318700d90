"""rl_otel: RL training observable like a production service - OpenTelemetry data, a Prometheus endpoint.

``import rl_otel`` is light: the OTel SDK, the exporter and numpy load on first use of ``init``/``Telemetry``;
torch, tensorboard, wandb, swanlab and pynvml only when a feature needs them. The public names are
``__all__`` (what ``dir(rl_otel)`` lists); ``Telemetry``, ``HistogramValue``, ``Catalog`` and ``default_catalog``
are resolved on first access.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from rl_otel._version import __version__
from rl_otel.errors import ConfigurationError, PortInUseError
from rl_otel.sinks.base import Sink, register_sink

if TYPE_CHECKING:
    from rl_otel._internal.pipeline.store import HistogramValue
    from rl_otel.catalog import Catalog, default_catalog
    from rl_otel.telemetry import Telemetry

__all__ = ["Catalog", "ConfigurationError", "HistogramValue", "PortInUseError", "Sink", "Telemetry", "__version__",
           "default_catalog", "init", "register_sink"]

# public names whose modules load the OTel SDK or numpy: imported on first access (module __getattr__)
_LAZY = {"Telemetry": "rl_otel.telemetry", "HistogramValue": "rl_otel._internal.pipeline.store", "Catalog": "rl_otel.catalog",
         "default_catalog": "rl_otel.catalog"}


class _Default:
    """Marks an init() argument the caller did not give, so a config file's value can fill it."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __repr__(self) -> str:
        return repr(self.value)


def init(
    run: str | None = _Default(None),  # type: ignore[assignment]
    *,
    config: str | os.PathLike | None = None,
    rank: int | None = _Default(None),  # type: ignore[assignment]
    role: str = _Default("trainer"),  # type: ignore[assignment]
    prometheus: dict[str, Any] | bool | None = _Default(True),  # type: ignore[assignment]
    catalog: Catalog | None = None,
    max_series_per_metric: int = _Default(10_000),  # type: ignore[assignment]
    max_unknown_keys: int = _Default(1_000),  # type: ignore[assignment]
    series_ttl_s: float | None = _Default(None),  # type: ignore[assignment]
    track_with: str | list[str] | None = _Default(None),  # type: ignore[assignment]
    tracker_kwargs: dict[str, Any] | None = _Default(None),  # type: ignore[assignment]
    trackers: dict[str, dict[str, Any]] | list[Any] | None = _Default(None),  # type: ignore[assignment]
    tracker_ranks: int | list[int] | str = _Default(0),  # type: ignore[assignment]
    handle_sigterm: bool = _Default(True),  # type: ignore[assignment]
    sink_queue_size: int = _Default(64),  # type: ignore[assignment]
    submit_queue_size: int = _Default(4),  # type: ignore[assignment]
    close_timeout_s: float = _Default(10.0),  # type: ignore[assignment]
    tracing: Any = _Default(None),  # type: ignore[assignment]
    otlp: str | dict[str, Any] | None = _Default(None),  # type: ignore[assignment]
    resource: dict[str, Any] | None = _Default(None),  # type: ignore[assignment]
    tracer_provider: Any = _Default(None),  # type: ignore[assignment]
) -> Telemetry:
    """Create the process's :class:`Telemetry`, start its scrape endpoint and its tracker sinks.

    Args:
        run: the run's name, a label on every series (default: ``$RL_OTEL_RUN``, else a timestamp).
        config: a YAML file with any of these options (top level, or under an ``rl_otel:`` section; a ROLL
            pipeline YAML works as it is). Keyword arguments given here override the file.
        rank: the process's rank, a label on every series (default: ``$RANK``, else 0).
        role: what this process does (trainer, actor, rollout, ...), recorded on the OTel resource.
        prometheus: ``{"host": ..., "port": ...}`` for the scrape endpoint (default ``0.0.0.0:9464``; port 0
            picks a free port, see ``Telemetry.metrics_url``), ``True`` for the defaults, ``False`` for none.
            The port is a base: a process serves on port + ``$LOCAL_RANK`` (0 when unset), so the ranks torchrun
            starts on one host get distinct ports (port 0 is never offset).
            More keys: ``add_local_rank`` (``False``: serve on the port as given, for one network namespace per
            process), ``port_search`` (on a taken port, try
            the next N), ``file_sd`` (a directory to publish the target in for Prometheus ``file_sd_configs``),
            ``advertise_host`` (the host written there), ``web_config_file`` (TLS, mTLS, basic auth in the
            exporter-toolkit web-config format node_exporter uses).
        catalog: the metric catalog (default: :func:`default_catalog`).
        max_series_per_metric: cap on label sets per metric; past it new series are dropped and counted.
        max_unknown_keys: cap on keys without a catalog entry exported through the fallback gauge.
        series_ttl_s: forget a series not written for this many seconds (``None``: keep; liveness never expires).
        tracing: where ``phase()`` spans go: ``None`` (nowhere), ``"console"`` (JSON lines on stderr),
            ``{"exporter": "jsonl", "path": ...}``, ``{"exporter": "otlp", "endpoint": ..., "protocol":
            "http/protobuf" | "grpc"}`` (needs ``pip install 'rl-otel[otlp]'``) or a ``SpanExporter``.
        otlp: push metrics and phase spans to an OpenTelemetry Collector: its base URL, ``True`` (everything
            from the ``OTEL_EXPORTER_OTLP_*`` variables), ``{"endpoint": ..., "protocol": "http/protobuf" | "grpc",
            "interval_s": 10, "timeout_s": 10, "headers": {...}, "traces": True, "temporality": "cumulative" |
            "delta" | "lowmemory"}``, or your own ``MetricExporter`` (needs ``pip install 'rl-otel[otlp]'``).
            Settings not given come from the standard ``OTEL_*`` variables; not given at all (``None``),
            ``OTEL_METRICS_EXPORTER=otlp`` / ``OTEL_TRACES_EXPORTER=otlp`` turn the push on; ``False``: never.
        resource: OTel resource attributes (``{"service.name": "grpo-7b", ...}``), over ``OTEL_SERVICE_NAME`` and
            ``OTEL_RESOURCE_ATTRIBUTES``, which are over rl_otel's defaults (``service.name="rl_otel"``).
        tracer_provider: your own OTel ``TracerProvider``: phases become spans of your traces (a phase opened
            inside your span is its child), exported by your provider's processors (not with ``tracing=``).
        track_with: ROLL's option: a tracker name (``"tensorboard"``, ``"wandb"``, ``"swanlab"``, ``"stdout"``
            or one added with :func:`register_sink`), or a list of names.
        tracker_kwargs: with one tracker, its kwargs (flat, as in ROLL); with a list, kwargs keyed by name.
        trackers: instead of track_with: ``{"tensorboard": {"log_dir": ...}, "stdout": {}}`` or a list.
        tracker_ranks: which ranks mirror to trackers: a rank (default 0), a list of ranks, or ``"all"``.
            Every rank exports to Prometheus.
        handle_sigterm: with trackers, close them on SIGTERM and flush them on SIGINT (a signal arriving inside
            ``log()`` waits for that step), then run the previous handler (main thread only).
        sink_queue_size: steps a tracker may fall behind before its oldest queued step is dropped (counted).
        submit_queue_size: jobs :meth:`Telemetry.submit` may queue (each holds its tensors) before the caller
            waits for the metrics worker.
        close_timeout_s: how long ``close()`` (or a signal) waits for the trackers to write and close; a tracker
            call running longer is counted as hung (``rl_telemetry_errors_total{reason="timeout"}``).

    Raises:
        ConfigurationError: a bad argument (the message names it); PortInUseError when the port is taken;
        ImportError when a tracker's package is missing (the message says what to install).
    """
    from rl_otel._internal.runtime.config import build_config
    from rl_otel._internal.trackers.config import load_config_file
    from rl_otel.catalog import default_catalog as _default_catalog
    from rl_otel.telemetry import Telemetry as _Telemetry

    given = dict(run=run, rank=rank, role=role, prometheus=prometheus, max_series_per_metric=max_series_per_metric,
                 max_unknown_keys=max_unknown_keys, series_ttl_s=series_ttl_s, track_with=track_with,
                 tracker_kwargs=tracker_kwargs, trackers=trackers, tracker_ranks=tracker_ranks,
                 handle_sigterm=handle_sigterm, sink_queue_size=sink_queue_size,
                 submit_queue_size=submit_queue_size, close_timeout_s=close_timeout_s,
                 tracing=tracing, otlp=otlp, resource=resource, tracer_provider=tracer_provider)
    options = {k: v.value for k, v in given.items() if isinstance(v, _Default)}
    from_file = load_config_file(config) if config is not None else {}
    if any(not isinstance(given[k], _Default) for k in ("track_with", "tracker_kwargs", "trackers")):
        for k in ("track_with", "tracker_kwargs", "trackers"):  # the caller's tracker choice replaces the file's
            from_file.pop(k, None)
    options.update(from_file)
    options.update({k: v for k, v in given.items() if not isinstance(v, _Default)})
    cfg = build_config(**options)
    return _Telemetry(cfg, catalog if catalog is not None else _default_catalog())


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'rl_otel' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # found directly from now on
    return value


def __dir__() -> list[str]:
    return list(__all__)
