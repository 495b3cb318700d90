"""The one definition of :func:`rl_otel.init`'s options: name, default, documentation, whether a YAML file may set
it, and its check. :func:`build_config` checks them once, against the environment, into the typed
:class:`~rl_otel._internal.runtime.config.TelemetryConfig` a Telemetry runs with (each option fills the field of its
name; a bad value raises ConfigurationError naming it).

Everything that lists options reads :data:`OPTIONS`: ``init()``'s docstring (built from it), the YAML loader
(:func:`load_config_file`), the framework integrations (:data:`INTEGRATION_OPTIONS`), ``rl-otel trackers``, and
``docs/options.md`` (:func:`options_markdown`). An option's default is written here and nowhere else (the
``prometheus`` option's settings: :data:`PROMETHEUS_DEFAULTS`): ``init()``'s parameters default to :data:`UNSET`,
``TelemetryConfig``'s fields and ``PrometheusConfig``'s tunable ones have no defaults (:func:`build_config` fills
them), and whatever else needs a default (``rl-otel watch``'s arguments, the integrations' port, the budget) reads
it from here. ``init()`` keeps an explicit keyword signature for editors and type checkers;
``tests/test_architecture.py`` checks it names exactly these options, in this order, that every option has a field
of ``TelemetryConfig``, and that no default of an option is written a second time in rl_otel. Adding an option:
one :class:`Option` here with its check, its field in ``TelemetryConfig``, its parameter in ``init()``.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NamedTuple

from rl_otel._internal.checks import boolean, check_known, positive_seconds, read_yaml
from rl_otel._internal.exporters.otel_env import resource_attributes, selected
from rl_otel._internal.runtime.config import PrometheusConfig, TelemetryConfig
from rl_otel._internal.runtime.ranks import ProcessRanks, serving_port
from rl_otel.errors import ConfigurationError

if TYPE_CHECKING:
    # imported by build_config only when an option asks for them: a process with neither tracing, OTLP nor a
    # web-config file loads none of these modules (their checks, dataclasses and imports: ~4 ms of init())
    from rl_otel._internal.exporters.otlp import OtlpConfig
    from rl_otel._internal.tracing.config import TracingConfig

# the settings of the prometheus option (a dict, or True for all of these) and their defaults; None: not given
PROMETHEUS_DEFAULTS: Mapping[str, Any] = MappingProxyType({
    "host": "0.0.0.0",  # every interface: Prometheus scrapes a pod or node from outside
    "port": 9464,  # a base: a process serves on port + LOCAL_RANK (rl_otel._internal.runtime.ranks.serving_port)
    "add_local_rank": None,  # None: add LOCAL_RANK unless the port is 0
    "port_search": 0,  # on a taken port, try the next port_search ports
    "file_sd": None,
    "advertise_host": None,
    "web_config_file": None,
})
DEFAULT_HOST: str = PROMETHEUS_DEFAULTS["host"]
DEFAULT_PORT: int = PROMETHEUS_DEFAULTS["port"]


class Unset:
    """An ``init()`` argument the caller did not give: a config file's value, else the option's default, fills it.
    Typed ``Any`` (:data:`UNSET`) so that the signature needs no ``type: ignore``."""

    _instance: Unset | None = None

    def __new__(cls) -> Unset:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "<default>"


UNSET: Any = Unset()


class Given(NamedTuple):
    """What an option's check sees besides its own value: every option's value (given > file > default) and the
    process's ranks from the environment."""

    options: Mapping[str, Any]
    env: ProcessRanks


@dataclass(frozen=True)
class Option:
    """One option of ``init()``: ``check(value, given)`` returns the value ``TelemetryConfig`` gets in the field
    ``field`` (the option's name; ``None``: another option's check reads it) or raises ConfigurationError."""

    name: str
    default: Any
    doc: str
    check: Callable[[Any, Given], Any] | None = None
    in_file: bool = True  # a YAML config file may set it (not for objects such as a TracerProvider)
    field: str | None = ""  # "" : the option's own name


def _positive_int(name: str) -> Callable[[Any, Given], int]:
    def check(value: object, given: Given) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigurationError(f"{name} must be a positive int, got {value!r}")
        return value
    return check


def _run(value: object, given: Given) -> str:
    run = value if value is not None else os.environ.get("RL_OTEL_RUN") or time.strftime("run-%Y%m%d-%H%M%S")
    if not isinstance(run, str) or not run.strip():
        raise ConfigurationError(f"run must be a non-empty str, got {run!r}")
    return run


def _role(value: object, given: Given) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigurationError(f"role must be a non-empty str, got {value!r}")
    return value


def _ttl(value: object, given: Given) -> float | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
        raise ConfigurationError(f"series_ttl_s must be a positive number of seconds or None, got {value!r}")
    return None if value is None else float(value)


def _trackers(value: object, given: Given) -> tuple:
    """``track_with``, ``tracker_kwargs`` and ``trackers`` together: the trackers' specs."""
    from rl_otel._internal.trackers.config import normalize_trackers

    o = given.options
    return normalize_trackers(o["track_with"], o["tracker_kwargs"], o["trackers"])


def _tracker_ranks(value: object, given: Given) -> int | str | frozenset[int]:
    from rl_otel._internal.runtime.ranks import check_tracker_ranks

    return check_tracker_ranks(value)


def _boolean(name: str) -> Callable[[Any, Given], bool]:
    return lambda value, given: boolean(name, value)


def _seconds(name: str) -> Callable[[Any, Given], float]:
    return lambda value, given: positive_seconds(name, value)


def _resource(value: object, given: Given) -> tuple[tuple[str, object], ...]:
    return resource_attributes("resource", value)


def _prometheus(value: object, given: Given) -> PrometheusConfig | None:
    local_rank = given.env.local_rank
    if value is None or value is False:
        return None
    if value is True:
        value = {}  # every setting's default
    if not isinstance(value, Mapping):
        raise ConfigurationError(f"prometheus must be a dict like {{'host': ..., 'port': ...}}, True or False; "
                                 f"got {value!r}")
    check_known("prometheus", value, tuple(PROMETHEUS_DEFAULTS))
    value = {**PROMETHEUS_DEFAULTS, **value}
    host, port = value["host"], value["port"]
    if not isinstance(host, str):
        raise ConfigurationError(f"prometheus host must be a str, got {host!r}")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ConfigurationError(f"prometheus port must be an int in 0..65535 (0 = a free port), got {port!r}")
    add_local_rank = value["add_local_rank"]
    port = serving_port(port, local_rank,
                        None if add_local_rank is None else boolean("prometheus add_local_rank", add_local_rank))
    search = value["port_search"]
    if isinstance(search, bool) or not isinstance(search, int) or search < 0 or port + search > 65535:
        raise ConfigurationError(f"prometheus port_search must be an int >= 0 (how many next ports to try) with "
                                 f"port + port_search <= 65535, got {search!r}")
    file_sd, advertise = value["file_sd"], value["advertise_host"]
    if file_sd is not None and (not isinstance(file_sd, (str, os.PathLike)) or not os.fspath(file_sd)):
        raise ConfigurationError(f"prometheus file_sd must be a directory or a .json/.yml file name, got {file_sd!r}")
    if advertise is not None and (not isinstance(advertise, str) or not advertise):
        raise ConfigurationError(f"prometheus advertise_host must be a host name, got {advertise!r}")
    web = value["web_config_file"]
    if web is not None and (not isinstance(web, (str, os.PathLike)) or not os.fspath(web)):
        raise ConfigurationError(f"prometheus web_config_file must be a file name, got {web!r}")
    loaded = None
    if web is not None:
        from rl_otel._internal.exporters.webconfig import load_web_config

        loaded = load_web_config(web)
    return PrometheusConfig(host=host, port=port, port_search=search,
                            file_sd=None if file_sd is None else os.fspath(file_sd), advertise_host=advertise,
                            web=loaded)


def _rank(value: object, given: Given) -> int:
    if value is None:
        value = given.env.rank
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigurationError(f"rank must be an int >= 0, got {value!r}")
    return value


def _tracing(tracing: object, given: Given) -> TracingConfig | None:
    """``tracing=`` checked (:mod:`rl_otel._internal.tracing.config`, loaded when it or ``tracer_provider=`` is
    given; the two are checked against each other)."""
    if (tracing is None or tracing is False) and given.options["tracer_provider"] is None:
        return None
    from rl_otel._internal.tracing.config import tracing_config

    _tracer_provider(given.options["tracer_provider"], given)
    return tracing_config(tracing)


def _tracer_provider(provider: object, given: Given) -> Any:
    """The user's TracerProvider, checked against ``tracing=`` (which exports spans of rl_otel's own provider)."""
    if provider is None:
        return None
    from rl_otel._internal.tracing.config import check_tracer_provider

    return check_tracer_provider(provider, given.options["tracing"])


def _otlp(value: object, given: Given) -> OtlpConfig | None:
    """``otlp=`` checked (:func:`rl_otel._internal.exporters.otlp.otlp_config`, loaded unless nothing can ask
    for a push: ``otlp=False``, or ``None`` with neither ``OTEL_METRICS_EXPORTER`` nor ``OTEL_TRACES_EXPORTER``
    selecting otlp)."""
    if value is False or (value is None and not any(selected(os.environ, s) for s in ("metrics", "traces"))):
        return None
    from rl_otel._internal.exporters.otlp import otlp_config

    return otlp_config(value, tracer_provider_given=given.options["tracer_provider"] is not None)



# signals a stack dump may not take: the process's lifecycle (SignalFlush's, the user's) and faulthandler's fatal ones
_RESERVED_SIGNALS = frozenset({"SIGINT", "SIGTERM", "SIGKILL", "SIGSTOP", "SIGSEGV", "SIGFPE", "SIGABRT", "SIGBUS",
                               "SIGILL"})


def _dump_signal(value: object, given: Given) -> int | None:
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


def _tracker_dirs(trackers: tuple, run: str) -> list[str]:
    """The trackers' log directories, in order (a TensorBoard tracker's default: ``runs/<run>``)."""
    dirs = []
    for spec in trackers:
        given = next((spec.kwargs[k] for k in ("log_dir", "logdir", "dir") if spec.kwargs.get(k)), None)
        if given is None and spec.name == "tensorboard":
            given = os.path.join("runs", run)
        if isinstance(given, (str, os.PathLike)):
            dirs.append(os.fspath(given))
    return dirs




def _engines(value: object, given: Given) -> Any:
    """``engines=``: True (vLLM's and SGLang's families), False/None (none), a list of family name prefixes, or a
    dict of ``prefixes``, ``replica`` and ``multiprocess_dir`` (``docs/engines.md``)."""
    from rl_otel._internal.exporters.engines import DEFAULT_PREFIXES, EnginesConfig

    if value is None or value is False:
        return None
    if value is True:
        return EnginesConfig()
    if isinstance(value, (list, tuple)):
        value = {"prefixes": value}
    if not isinstance(value, Mapping):
        raise ConfigurationError(f"engines must be True, False, a list of metric name prefixes or a dict, got "
                                 f"{value!r}")
    check_known("engines", value, ("prefixes", "replica", "multiprocess_dir"))
    prefixes = value.get("prefixes", DEFAULT_PREFIXES)
    if isinstance(prefixes, str) or not isinstance(prefixes, (list, tuple)) or not prefixes or not all(
            isinstance(p, str) and p and not p.startswith("rl_") for p in prefixes):
        raise ConfigurationError(f"engines.prefixes must be a non-empty list of metric name prefixes (such as "
                                 f"'vllm:'), none of rl_otel's own 'rl_', got {prefixes!r}")
    replica = value.get("replica")
    if replica is not None and (not isinstance(replica, (str, int)) or isinstance(replica, bool) or
                                str(replica) == ""):
        raise ConfigurationError(f"engines.replica must be a non-empty string or an integer, got {replica!r}")
    directory = value.get("multiprocess_dir")
    if directory is not None and not isinstance(directory, (str, os.PathLike)):
        raise ConfigurationError(f"engines.multiprocess_dir must be a path, got {directory!r}")
    return EnginesConfig(tuple(prefixes), None if replica is None else str(replica),
                         None if directory is None else os.fspath(directory))


def _dump_dir(value: object, given: Given) -> str:
    """``stack_dump_dir`` checked and resolved: the option, ``$RL_OTEL_DUMP_DIR``, the first tracker's log
    directory, ``./rl_otel_dumps``."""
    from rl_otel._internal.probes.hangs import dump_dir

    if value is not None and (not isinstance(value, (str, os.PathLike)) or not os.fspath(value)):
        raise ConfigurationError(f"stack_dump_dir must be a directory name or None, got {value!r}")
    return dump_dir(value, _tracker_dirs(_trackers(None, given), _run(given.options["run"], given)), os.environ)


def _hang_min_s(value: object, given: Given) -> float | None:
    return None if value is None else positive_seconds("hang_min_s", value)


TRACKER_OPTIONS = ("track_with", "tracker_kwargs", "trackers")

OPTIONS: tuple[Option, ...] = (
    Option("run", None, "the run's name, a label on every series (default: ``$RL_OTEL_RUN``, else a timestamp).",
           check=_run),
    Option("rank", None, "the process's rank, a label on every series (default: ``$RANK``, else 0).", check=_rank),
    Option("role", "trainer", "what this process does (trainer, actor, rollout, ...), on the OTel resource.",
           check=_role),
    Option("prometheus", True,
           f"``{{'host': ..., 'port': ...}}`` for the scrape endpoint (default ``{DEFAULT_HOST}:{DEFAULT_PORT}``; "
           "port 0 picks a free port, see ``Telemetry.metrics_url``), ``True`` for the defaults, ``False`` for "
           "none. The port is a base: a process serves on port + ``$LOCAL_RANK`` (0 when unset), so the ranks "
           "torchrun starts on one host get distinct ports (port 0 is never offset). More keys: "
           "``add_local_rank`` (``False``: serve on the port as given), ``port_search`` (on a taken port, try the "
           "next N), ``file_sd`` (a directory to publish the target in for Prometheus ``file_sd_configs``), "
           "``advertise_host`` (the host written there), ``web_config_file`` (TLS, mTLS, basic auth in the "
           "exporter-toolkit web-config format).",
           check=_prometheus),
    Option("max_series_per_metric", 10_000, "cap on label sets per metric; past it new series are dropped and "
                                            "counted.", check=_positive_int("max_series_per_metric")),
    Option("max_unknown_keys", 1_000, "cap on keys without a catalog entry exported through the fallback gauge "
                                      "(the trackers still get every key).", check=_positive_int("max_unknown_keys")),
    Option("series_ttl_s", None, "forget a series not written for this many seconds (``None``: keep; liveness "
                                 "never expires).", check=_ttl),
    Option("track_with", None, "ROLL's option: a tracker name (``'tensorboard'``, ``'wandb'``, ``'swanlab'``, "
                               "``'stdout'`` or one added with :func:`rl_otel.register_sink`), or a list of names.",
                               check=_trackers, field="trackers"),
    Option("tracker_kwargs", None, "with one tracker, its kwargs (flat, as in ROLL); with a list, kwargs keyed by "
                                   "tracker name.", check=None, field=None),
    Option("trackers", None, "instead of ``track_with``: ``{'tensorboard': {'log_dir': ...}, 'stdout': {}}`` or a "
                             "list of names / dicts with a ``name``.", check=None, field=None),
    Option("tracker_ranks", 0, "which ranks mirror to trackers: a rank (default 0), a list of ranks, or "
                               "``'all'``. Every rank exports to Prometheus.", check=_tracker_ranks),
    Option("handle_sigterm", True, "with trackers, close them on SIGTERM and flush them on SIGINT (a signal "
                                   "arriving inside ``log()`` waits for that step), then run the previous handler "
                                   "(main thread only).", check=_boolean("handle_sigterm")),
    Option("sink_queue_size", 64, "steps a tracker may fall behind before its oldest queued step is dropped "
                                  "(counted).", check=_positive_int("sink_queue_size")),
    Option("submit_queue_size", 4, "jobs ``Telemetry.submit`` may queue (each holds its tensors) before the "
                                   "caller waits for the metrics worker.", check=_positive_int("submit_queue_size")),
    Option("close_timeout_s", 10.0, "how long ``close()`` (or a signal) waits for the trackers to write and "
                                    "close, and for the spans still queued to be sent; a tracker call running "
                                    "longer is counted as hung.",
                                    check=_seconds("close_timeout_s")),
    Option("tracing", None,
           "where ``phase()`` spans go: ``None`` (nowhere), ``'console'`` (JSON lines on stderr), ``{'exporter': "
           "'jsonl', 'path': ...}``, ``{'exporter': 'otlp', 'endpoint': ..., 'protocol': 'http/protobuf' | "
           "'grpc'}`` (needs the ``otlp`` extra) or a ``SpanExporter``.", check=_tracing),
    Option("otlp", None,
           "push metrics and phase spans to an OpenTelemetry Collector: its base URL, ``True`` (everything from the "
           "``OTEL_EXPORTER_OTLP_*`` variables), ``{'endpoint': ..., 'protocol': 'http/protobuf' | 'grpc', "
           "'interval_s': 10, 'timeout_s': 10, 'headers': {...}, 'traces': True, 'temporality': 'cumulative' | "
           "'delta' | 'lowmemory'}``, or your own ``MetricExporter`` (needs the ``otlp`` extra). Settings not "
           "given come from the standard ``OTEL_*`` variables; not given at all (``None``), "
           "``OTEL_METRICS_EXPORTER=otlp`` / ``OTEL_TRACES_EXPORTER=otlp`` turn the push on; ``False``: never.",
           check=_otlp),
    Option("resource", None, "OTel resource attributes (``{'service.name': 'grpo-7b', ...}``), over "
                             "``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES``, which are over rl_otel's "
                             "defaults (``service.name='rl_otel'``).", check=_resource),
    Option("tracer_provider", None, "your own OTel ``TracerProvider``: phases become spans of your traces (a phase "
                                    "opened inside your span is its child), exported by your provider's "
                                    "processors (not with ``tracing=``).", in_file=False, check=_tracer_provider),
    Option("hang_factor", 5.0, "a phase run longer than ``max(hang_factor x the hang_quantile of that phase's past "
                               "durations in this run, hang_min_s)`` is stuck: the process writes the stacks of all "
                               "its threads to a file, once per stuck run (``docs/hangs.md``).",
           check=lambda v, g: _number("hang_factor", v, 0.0)),
    Option("hang_quantile", 0.9, "the quantile of a phase's past durations ``hang_factor`` multiplies (0 < q <= 1).",
           check=lambda v, g: _number("hang_quantile", v, 0.0, 1.0)),
    Option("hang_min_s", 600.0, "a phase is never stuck before this many seconds (the whole threshold until a run of "
                                "it has finished); ``None``: no stack dumps for stuck phases.",
           check=_hang_min_s),
    Option("stack_dump_signal", "SIGUSR1", "a signal that makes the process write its stacks on demand (a name or "
                                           "number; ``None``: none). Taken only if nothing in the process handles "
                                           "it already.", check=_dump_signal),
    Option("stack_dump_dir", None, "where stack dumps are written (default: ``$RL_OTEL_DUMP_DIR``, else the first "
                                   "tracker's log directory, else ``./rl_otel_dumps``).", check=_dump_dir),
    Option("stack_dump_http", True, "serve ``GET /debug/stacks`` on the scrape endpoint (behind its basic auth and "
                                    "TLS): writes a dump and answers with it.",
           check=_boolean("stack_dump_http")),
    Option("phase_memory", True, "phases take ROLL's memory snapshots (``memory/...`` keys; one allocator read per "
                                 "edge on a GPU); ``False``: times and GPU events only, unless a ``phase(..., "
                                 "memory=True)`` asks (``docs/gpu.md``).", check=_boolean("phase_memory")),
    Option("phase_peaks", True, "the outermost running phase resets torch's peak memory statistics, so its "
                                "``max_*`` keys are its own peak (ROLL's); ``False``: never reset, so "
                                "``torch.cuda.max_memory_allocated()`` stays the process's (verl's "
                                "``perf/max_memory_allocated_gb``), and a phase's ``max_*`` keys read the peak since "
                                "the last reset (``docs/gpu.md``).", check=_boolean("phase_peaks")),
    Option("phase_gpu_time", True, "phases record CUDA events at their edges for their GPU time (in a process that "
                                   "initialized CUDA); ``False``: none, e.g. where another thread captures CUDA graphs "
                                   "in global capture mode (``docs/gpu.md``).", check=_boolean("phase_gpu_time")),
    Option("engines", True, "serve the rollout engine's own metric families (vLLM's ``vllm:*``, SGLang's "
                            "``sglang:*``) from this process's prometheus_client registry or "
                            "``PROMETHEUS_MULTIPROC_DIR`` on the endpoint, with the run's labels and ``replica``: "
                            "True, False, a list of name prefixes, or ``{'prefixes': [...], 'replica': ..., "
                            "'multiprocess_dir': ...}`` (``docs/engines.md``).", check=_engines),
)

BY_NAME: dict[str, Option] = {o.name: o for o in OPTIONS}
FILE_KEYS: tuple[str, ...] = tuple(o.name for o in OPTIONS if o.in_file)
# what a framework integration passes through to init(): every option, and a config file
INTEGRATION_OPTIONS: tuple[str, ...] = (*(o.name for o in OPTIONS), "config")


def default(name: str) -> Any:
    """Option ``name``'s default, as :data:`OPTIONS` defines it (for what runs without ``init()``: ``rl-otel
    watch``'s recorders)."""
    for option in OPTIONS:
        if option.name == name:
            return option.default
    raise KeyError(name)


def merge(given: Mapping[str, Any], from_file: Mapping[str, Any]) -> dict[str, Any]:
    """Every option's value: given (not :data:`UNSET`) > the config file > the default. A tracker choice given
    in code replaces the file's as a whole (``track_with`` given drops the file's ``trackers``)."""
    unknown = sorted(set(given) - set(BY_NAME))
    if unknown:
        raise ConfigurationError(f"unknown rl_otel option(s) {unknown}; known: {list(BY_NAME)}")
    explicit = {k: v for k, v in given.items() if v is not UNSET}
    file = dict(from_file)
    if any(k in explicit for k in TRACKER_OPTIONS):
        for k in TRACKER_OPTIONS:
            file.pop(k, None)
    return {o.name: explicit.get(o.name, file.get(o.name, o.default)) for o in OPTIONS}


def build_config(**given: Any) -> TelemetryConfig:
    """Check every option of :data:`OPTIONS` (one not given takes its default) and resolve it against the
    environment (``RL_OTEL_RUN``, ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``OTEL_*``): the one
    :class:`TelemetryConfig` a Telemetry runs with. Raises ConfigurationError naming a bad value."""
    from rl_otel._internal.runtime.ranks import env_ranks

    options = merge(given, {})
    env = env_ranks()
    context = Given(options, env)
    fields = {o.field or o.name: o.check(options[o.name], context) for o in OPTIONS
              if o.check is not None and o.field is not None}
    return TelemetryConfig(**fields, host_name=socket.gethostname(), local_rank=env.local_rank,
                           world_size=env.world_size)


def load_config_file(path: str | os.PathLike) -> dict[str, Any]:
    """Options from a YAML file.

    A file with an ``rl_otel:`` section is read from that section, and unknown keys there are an error. Otherwise
    the known keys are picked from the top level and the rest is ignored, so a ROLL pipeline YAML works as it is
    (its ``exp_name`` names the run when ``run`` is absent).
    """
    file = Path(os.fspath(path))
    data = read_yaml("config file", file)
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ConfigurationError(f"config file {str(file)!r} must hold a mapping, got {type(data).__name__}")
    section = data.get("rl_otel")
    if section is not None:
        if not isinstance(section, Mapping):
            raise ConfigurationError(f"the rl_otel section of {str(file)!r} must be a mapping")
        unknown = sorted(set(section) - set(FILE_KEYS))
        if unknown:
            raise ConfigurationError(f"unknown option(s) {unknown} in the rl_otel section of {str(file)!r}; "
                                     f"known: {list(FILE_KEYS)}")
        return dict(section)
    picked = {k: data[k] for k in FILE_KEYS if k in data}
    if "run" not in picked and isinstance(data.get("exp_name"), str):
        picked["run"] = data["exp_name"]
    return picked


def _wrapped(text: str, indent: str, width: int = 116) -> str:
    lines, line = [], indent
    for word in text.split():
        if len(line) + len(word) + 1 > width and line.strip():
            lines.append(line.rstrip())
            line = indent + "    "
        line += word + " "
    lines.append(line.rstrip())
    return "\n".join(lines)


def args_doc() -> str:
    """The ``Args:`` section of ``init()``'s docstring."""
    extra = (Option("config", None, "a YAML file with any of these options (top level, or under an ``rl_otel:`` "
                                    "section; a ROLL pipeline YAML works as it is). Arguments given override it."),
             Option("catalog", None, "the metric catalog (default: :func:`rl_otel.default_catalog`)."))
    return "\n".join(_wrapped(f"{o.name}: {o.doc}", "        ") for o in (*OPTIONS[:1], *extra, *OPTIONS[1:]))


def options_markdown() -> str:
    """``docs/options.md``: every option with its default and whether a config file may set it."""
    rows = ["# rl_otel options", "",
            "**Reference** (look an option up). Generated from `rl_otel/_internal/runtime/options.py` "
            "(`python3 -m rl_otel.ops`). Each is an argument of "
            "`rl_otel.init()`, a key of a YAML config file (top level or under `rl_otel:`) unless marked, and an "
            "option every framework integration passes through (verl's `trainer.rl_otel.*`, Trinity-RFT's "
            "`monitor.monitor_args`, TRL's `RLOtelCallback(**options)`, ROLL's `tracker_kwargs`).", "",
            "Precedence: an argument given > the config file > the environment (`RL_OTEL_RUN`, `RANK`, `LOCAL_RANK`, "
            "`OTEL_*`) > the default.", "",
            "| option | default | in a file | meaning |", "|---|---|---|---|"]
    for o in OPTIONS:
        doc = o.doc.replace("``", "`").replace("|", "\\|").replace(":func:", "").replace(":meth:", "")
        rows.append(f"| `{o.name}` | `{o.default!r}` | {'yes' if o.in_file else 'no'} | {doc} |")
    return "\n".join(rows) + "\n"
