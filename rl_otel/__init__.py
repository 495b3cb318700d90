"""rl_otel: RL training observable like a production service - OpenTelemetry data, a Prometheus endpoint.

``import rl_otel`` is light: the catalog, the exporter and numpy load on first use of ``init``/``Telemetry``; the
OTel SDK when something needs it (a phase, tracing, an OTLP push, ``Telemetry.resource``/``meter_provider``);
torch, tensorboard, wandb, swanlab and pynvml only when a feature needs them. The public names are
``__all__`` (what ``dir(rl_otel)`` lists); ``Telemetry``, ``HistogramValue``, ``Catalog`` and ``default_catalog``
are resolved on first access.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from rl_otel._internal.runtime.options import UNSET, args_doc
from rl_otel._version import __version__
from rl_otel.errors import ConfigurationError, PortInUseError
from rl_otel.errors import MissingExtraError as _MissingExtraError
from rl_otel.sinks.base import Sink, register_sink

if TYPE_CHECKING:
    from rl_otel._internal.pipeline.store import HistogramValue
    from rl_otel.catalog import Catalog, default_catalog
    from rl_otel.telemetry import Telemetry

__all__ = ["Catalog", "ConfigurationError", "HistogramValue", "PortInUseError", "Sink", "Telemetry", "__version__",
           "default_catalog", "init", "register_sink"]

# public names whose modules load the OTel SDK or numpy: imported on first access (module __getattr__)
_LAZY = {"Telemetry": "rl_otel.telemetry", "HistogramValue": "rl_otel._internal.pipeline.records",
         "Catalog": "rl_otel.catalog",
         "default_catalog": "rl_otel.catalog"}


def init(
    run: str | None = UNSET,
    *,
    config: str | os.PathLike | None = None,
    catalog: Catalog | None = None,
    rank: int | None = UNSET,
    role: str = UNSET,
    prometheus: dict[str, Any] | bool | None = UNSET,
    max_series_per_metric: int = UNSET,
    max_unknown_keys: int = UNSET,
    series_ttl_s: float | None = UNSET,
    track_with: str | list[str] | None = UNSET,
    tracker_kwargs: dict[str, Any] | None = UNSET,
    trackers: dict[str, dict[str, Any]] | list[Any] | None = UNSET,
    tracker_ranks: int | list[int] | str = UNSET,
    handle_sigterm: bool = UNSET,
    sink_queue_size: int = UNSET,
    submit_queue_size: int = UNSET,
    close_timeout_s: float = UNSET,
    tracing: Any = UNSET,
    otlp: str | dict[str, Any] | bool | None = UNSET,
    resource: dict[str, Any] | None = UNSET,
    tracer_provider: Any = UNSET,
    hang_factor: float = UNSET,
    hang_quantile: float = UNSET,
    hang_min_s: float | None = UNSET,
    stack_dump_signal: str | int | None = UNSET,
    stack_dump_dir: str | os.PathLike | None = UNSET,
    stack_dump_http: bool = UNSET,
    phase_memory: bool = UNSET,
    phase_peaks: bool = UNSET,
    phase_gpu_time: bool = UNSET,
    engines: bool | list[str] | dict[str, Any] | None = UNSET,
) -> Telemetry:
    """Create the process's :class:`Telemetry`, start its scrape endpoint and its tracker sinks.

    Args:
{args}

    Raises:
        ConfigurationError: a bad argument (the message names it); PortInUseError when the port is taken;
        ImportError when a tracker's package is missing (the message says what to install).
    """
    import gc

    # init() imports rl_otel's modules and builds the catalog: tens of thousands of objects, which in a process
    # that holds torch's millions set off full garbage collections of ~80 ms each. They wait until init() returns.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _init(locals())
    except _MissingExtraError as exc:  # one line saying what to install, not the frames that found it missing
        raise _MissingExtraError(str(exc)) from None
    finally:
        if collecting:
            gc.enable()


def _init(args: dict[str, Any]) -> Telemetry:
    from rl_otel._internal.runtime.options import OPTIONS, build_config, load_config_file, merge
    from rl_otel.catalog import default_catalog as _default_catalog
    from rl_otel.telemetry import Telemetry as _Telemetry

    given = {o.name: args[o.name] for o in OPTIONS}
    config, catalog = args["config"], args["catalog"]
    cfg = build_config(**merge(given, load_config_file(config) if config is not None else {}))
    return _Telemetry(cfg, catalog if catalog is not None else _default_catalog())


if init.__doc__:  # the options' documentation is defined once, with the options (not under python -OO)
    init.__doc__ = init.__doc__.replace("{args}", args_doc())


# Telemetry's methods, which a user coming from wandb (``wandb.log``) may look for on the module
_TELEMETRY_METHODS = frozenset({"log", "phase", "submit", "flush", "close", "value", "metrics_url", "step",
                                "catalog", "trackers", "meter_provider", "engine"})


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        if name in _TELEMETRY_METHODS:
            raise AttributeError(f"rl_otel.{name} does not exist: {name} belongs to the Telemetry that init() returns;"
                                 f" call tel = rl_otel.init(run=...) once, then tel.{name}(...)")
        raise AttributeError(f"module 'rl_otel' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # found directly from now on
    return value


def __dir__() -> list[str]:
    return list(__all__)
