"""init()'s options checked once and resolved against the environment into the :class:`TelemetryConfig` a
Telemetry runs with; a bad value raises ConfigurationError naming it. The options themselves (names, defaults,
docs) are defined in :mod:`rl_otel._internal.runtime.options`."""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rl_otel._internal.checks import boolean, check_known, positive_seconds
from rl_otel._internal.exporters.otel_env import resource_attributes, selected
from rl_otel._internal.probes.hangs import dump_dir
from rl_otel._internal.runtime.options import merge
from rl_otel._internal.runtime.ranks import serving_port
from rl_otel.errors import ConfigurationError

if TYPE_CHECKING:
    # imported by build_config only when an option asks for them: a process with neither tracing, OTLP nor a
    # web-config file loads none of these modules (their checks, dataclasses and imports: ~4 ms of init())
    from rl_otel._internal.exporters.otlp import OtlpConfig
    from rl_otel._internal.exporters.webconfig import WebConfig
    from rl_otel._internal.tracing.config import TracingConfig
    from rl_otel._internal.trackers.config import TrackerSpec

DEFAULT_PORT = 9464
DEFAULT_HOST = "0.0.0.0"


_PROMETHEUS_KEYS = ("host", "port", "add_local_rank", "port_search", "file_sd", "advertise_host", "web_config_file")


@dataclass(frozen=True)
class PrometheusConfig:
    """Where and how the scrape endpoint serves; ``port`` already includes the local rank (see
    :func:`rl_otel._internal.runtime.ranks.serving_port`)."""

    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    port_search: int = 0  # on a taken port, try the next ``port_search`` ports
    file_sd: str | None = None  # a directory (or .json/.yml file) to publish the target in
    advertise_host: str | None = None  # the host name written in the targets file
    web: WebConfig | None = None  # TLS / mTLS / basic auth, from an exporter-toolkit web-config file


@dataclass(frozen=True)
class TelemetryConfig:
    """Every option of :data:`~rl_otel._internal.runtime.options.OPTIONS` in its checked form (``prometheus``,
    ``tracing``, ``otlp``: their resolved configs; ``trackers``: the specs of ``track_with``/``tracker_kwargs``/
    ``trackers``), plus what the environment says (host, local rank, world size)."""

    run: str
    rank: int
    role: str
    host_name: str
    prometheus: PrometheusConfig | None
    max_series_per_metric: int
    max_unknown_keys: int
    series_ttl_s: float | None
    tracing: TracingConfig | None = None
    trackers: tuple[TrackerSpec, ...] = ()
    tracker_ranks: int | str | frozenset[int] = 0
    handle_sigterm: bool = True
    sink_queue_size: int = 64
    submit_queue_size: int = 4
    close_timeout_s: float = 10.0
    otlp: OtlpConfig | None = None
    local_rank: int = 0  # from LOCAL_RANK (see rl_otel._internal.runtime.ranks); on the OTel resource, not a label
    world_size: int = 1
    resource: tuple[tuple[str, object], ...] = ()  # init(resource=...): OTel resource attributes, over OTEL_*
    tracer_provider: Any = None  # init(tracer_provider=...): the user's, used instead of rl_otel's own
    hang_factor: float = 5.0  # a phase is stuck past max(hang_factor x its hang_quantile, hang_min_s)
    hang_quantile: float = 0.9
    hang_min_s: float | None = 600.0  # None: no dumps for stuck phases
    stack_dump_signal: int | None = None  # the signal number of on-demand dumps (None: none)
    stack_dump_dir: str = "rl_otel_dumps"  # absolute once resolved by build_config
    stack_dump_http: bool = True  # GET /debug/stacks on the scrape endpoint

    @property
    def base_labels(self) -> dict[str, str]:
        """The labels of every series this process serves: run, role and rank (two roles of one run, such as
        Trinity's explorer and trainer, are told apart on every series)."""
        return {"run": self.run, "role": self.role, "rank": str(self.rank)}


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"{name} must be a positive int, got {value!r}")
    return value


def _prometheus(value: object, local_rank: int) -> PrometheusConfig | None:
    if value is None or value is False:
        return None
    if value is True:
        return PrometheusConfig(port=serving_port(DEFAULT_PORT, local_rank))
    if not isinstance(value, Mapping):
        raise ConfigurationError(f"prometheus must be a dict like {{'host': ..., 'port': ...}}, True or False; "
                                 f"got {value!r}")
    check_known("prometheus", value, _PROMETHEUS_KEYS)
    host = value.get("host", DEFAULT_HOST)
    port = value.get("port", DEFAULT_PORT)
    if not isinstance(host, str):
        raise ConfigurationError(f"prometheus host must be a str, got {host!r}")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ConfigurationError(f"prometheus port must be an int in 0..65535 (0 = a free port), got {port!r}")
    add_local_rank = value.get("add_local_rank")
    port = serving_port(port, local_rank,
                        None if add_local_rank is None else boolean("prometheus add_local_rank", add_local_rank))
    search = value.get("port_search", 0)
    if isinstance(search, bool) or not isinstance(search, int) or search < 0 or port + search > 65535:
        raise ConfigurationError(f"prometheus port_search must be an int >= 0 (how many next ports to try) with "
                                 f"port + port_search <= 65535, got {search!r}")
    file_sd, advertise = value.get("file_sd"), value.get("advertise_host")
    if file_sd is not None and (not isinstance(file_sd, (str, os.PathLike)) or not os.fspath(file_sd)):
        raise ConfigurationError(f"prometheus file_sd must be a directory or a .json/.yml file name, got {file_sd!r}")
    if advertise is not None and (not isinstance(advertise, str) or not advertise):
        raise ConfigurationError(f"prometheus advertise_host must be a host name, got {advertise!r}")
    web = value.get("web_config_file")
    if web is not None and (not isinstance(web, (str, os.PathLike)) or not os.fspath(web)):
        raise ConfigurationError(f"prometheus web_config_file must be a file name, got {web!r}")
    loaded = None
    if web is not None:
        from rl_otel._internal.exporters.webconfig import load_web_config

        loaded = load_web_config(web)
    return PrometheusConfig(host=host, port=port, port_search=search,
                            file_sd=None if file_sd is None else os.fspath(file_sd), advertise_host=advertise,
                            web=loaded)


# signals a stack dump may not take: the process's lifecycle (SignalFlush's, the user's) and faulthandler's fatal ones
_RESERVED_SIGNALS = frozenset({"SIGINT", "SIGTERM", "SIGKILL", "SIGSTOP", "SIGSEGV", "SIGFPE", "SIGABRT", "SIGBUS",
                               "SIGILL"})


def _dump_signal(value: object) -> int | None:
    """``stack_dump_signal``: a name (``'SIGUSR1'``, ``'USR2'``) or a number, checked; ``None``/``False``: none.
    The default on a platform without SIGUSR1 (Windows) is none."""
    if value is None or value is False:
        return None
    if value == "SIGUSR1" and not hasattr(signal, "SIGUSR1"):
        return None
    try:
        if isinstance(value, str):
            name = value.strip().upper()
            found = signal.Signals[name if name.startswith("SIG") else f"SIG{name}"]
        elif isinstance(value, int) and not isinstance(value, bool):
            found = signal.Signals(value)
        else:
            raise KeyError(value)
    except (KeyError, ValueError):
        raise ConfigurationError(f"stack_dump_signal must be a signal name or number of this platform (e.g. "
                                 f"'SIGUSR1') or None, got {value!r}") from None
    if found.name in _RESERVED_SIGNALS:
        raise ConfigurationError(f"stack_dump_signal cannot be {found.name} (the process's own lifecycle or a fatal "
                                 f"signal); use e.g. 'SIGUSR1' or 'SIGUSR2', got {value!r}")
    return int(found)


def _number(name: str, value: object, low: float, high: float = float("inf")) -> float:
    """A number in ``(low, high]``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low < value <= high:
        bounds = f"> {low:g}" if high == float("inf") else f"in ({low:g}, {high:g}]"
        raise ConfigurationError(f"{name} must be a number {bounds}, got {value!r}")
    return float(value)


def _tracker_dirs(trackers: tuple[TrackerSpec, ...], run: str) -> list[str]:
    """The trackers' log directories, in order (a TensorBoard tracker's default: ``runs/<run>``)."""
    dirs = []
    for spec in trackers:
        given = next((spec.kwargs[k] for k in ("log_dir", "logdir", "dir") if spec.kwargs.get(k)), None)
        if given is None and spec.name == "tensorboard":
            given = os.path.join("runs", run)
        if isinstance(given, (str, os.PathLike)):
            dirs.append(os.fspath(given))
    return dirs


def _rank(value: object, env_rank: int) -> int:
    if value is None:
        value = env_rank
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigurationError(f"rank must be an int >= 0, got {value!r}")
    return value


def _tracing(tracing: object, tracer_provider: object) -> tuple[TracingConfig | None, Any]:
    """``tracing=`` and ``tracer_provider=`` checked (:mod:`rl_otel._internal.tracing.config`, loaded when either
    is given): ``(tracing config, the user's provider)``."""
    if (tracing is None or tracing is False) and tracer_provider is None:
        return None, None
    from rl_otel._internal.tracing.config import check_tracer_provider, tracing_config

    provider = check_tracer_provider(tracer_provider, tracing)
    return tracing_config(tracing), provider


def _otlp(value: object, tracer_provider_given: bool) -> OtlpConfig | None:
    """``otlp=`` checked (:func:`rl_otel._internal.exporters.otlp.otlp_config`, loaded unless nothing can ask
    for a push: ``otlp=False``, or ``None`` with neither ``OTEL_METRICS_EXPORTER`` nor ``OTEL_TRACES_EXPORTER``
    selecting otlp)."""
    if value is False or (value is None and not any(selected(os.environ, s) for s in ("metrics", "traces"))):
        return None
    from rl_otel._internal.exporters.otlp import otlp_config

    return otlp_config(value, tracer_provider_given=tracer_provider_given)


def build_config(**given: Any) -> TelemetryConfig:
    """Check every option of :data:`~rl_otel._internal.runtime.options.OPTIONS` (one not given takes its default)
    and resolve it against the environment (``RL_OTEL_RUN``, ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``OTEL_*``):
    the one :class:`TelemetryConfig` a Telemetry runs with. Raises ConfigurationError naming a bad value."""
    from rl_otel._internal.runtime.ranks import check_tracker_ranks, env_ranks
    from rl_otel._internal.trackers.config import normalize_trackers

    o = merge(given, {})
    run, role, ttl = o["run"], o["role"], o["series_ttl_s"]
    if run is None:
        run = os.environ.get("RL_OTEL_RUN") or time.strftime("run-%Y%m%d-%H%M%S")
    if not isinstance(run, str) or not run.strip():
        raise ConfigurationError(f"run must be a non-empty str, got {run!r}")
    if not isinstance(role, str) or not role:
        raise ConfigurationError(f"role must be a non-empty str, got {role!r}")
    if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or ttl <= 0):
        raise ConfigurationError(f"series_ttl_s must be a positive number of seconds or None, got {ttl!r}")
    env = env_ranks()
    tracing, tracer_provider = _tracing(o["tracing"], o["tracer_provider"])
    trackers = normalize_trackers(o["track_with"], o["tracker_kwargs"], o["trackers"])
    hang_min_s, directory = o["hang_min_s"], o["stack_dump_dir"]
    if directory is not None and (not isinstance(directory, (str, os.PathLike)) or not os.fspath(directory)):
        raise ConfigurationError(f"stack_dump_dir must be a directory name or None, got {directory!r}")
    return TelemetryConfig(
        run=run,
        rank=_rank(o["rank"], env.rank),
        role=role,
        host_name=socket.gethostname(),
        prometheus=_prometheus(o["prometheus"], env.local_rank),
        max_series_per_metric=_positive_int("max_series_per_metric", o["max_series_per_metric"]),
        max_unknown_keys=_positive_int("max_unknown_keys", o["max_unknown_keys"]),
        series_ttl_s=None if ttl is None else float(ttl),
        tracing=tracing,
        trackers=trackers,
        tracker_ranks=check_tracker_ranks(o["tracker_ranks"]),
        handle_sigterm=boolean("handle_sigterm", o["handle_sigterm"]),
        sink_queue_size=_positive_int("sink_queue_size", o["sink_queue_size"]),
        submit_queue_size=_positive_int("submit_queue_size", o["submit_queue_size"]),
        close_timeout_s=positive_seconds("close_timeout_s", o["close_timeout_s"]),
        otlp=_otlp(o["otlp"], tracer_provider is not None),
        local_rank=env.local_rank,
        world_size=env.world_size,
        resource=resource_attributes("resource", o["resource"]),
        tracer_provider=tracer_provider,
        hang_factor=_number("hang_factor", o["hang_factor"], 0.0),
        hang_quantile=_number("hang_quantile", o["hang_quantile"], 0.0, 1.0),
        hang_min_s=None if hang_min_s is None else positive_seconds("hang_min_s", hang_min_s),
        stack_dump_signal=_dump_signal(o["stack_dump_signal"]),
        stack_dump_dir=dump_dir(directory, _tracker_dirs(trackers, run), os.environ),
        stack_dump_http=boolean("stack_dump_http", o["stack_dump_http"]),
    )
