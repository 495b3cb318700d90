"""The one definition of :func:`rl_otel.init`'s options: name, default, whether a YAML file may set it, and its
documentation.

Everything that lists options reads :data:`OPTIONS`: ``init()``'s docstring (built from it), the YAML loader
(:func:`load_config_file`), the framework integrations (:data:`INTEGRATION_OPTIONS`), ``rl-otel trackers``, and
``docs/options.md`` (:func:`options_markdown`). ``init()`` keeps an explicit keyword signature for editors and
type checkers; ``tests/test_options.py`` checks it names exactly these options, in this order. The values are
checked in :mod:`rl_otel._internal.runtime.config`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl_otel._internal.checks import read_yaml
from rl_otel.errors import ConfigurationError


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


@dataclass(frozen=True)
class Option:
    name: str
    default: Any
    doc: str
    in_file: bool = True  # a YAML config file may set it (not for objects such as a TracerProvider)


TRACKER_OPTIONS = ("track_with", "tracker_kwargs", "trackers")

OPTIONS: tuple[Option, ...] = (
    Option("run", None, "the run's name, a label on every series (default: ``$RL_OTEL_RUN``, else a timestamp)."),
    Option("rank", None, "the process's rank, a label on every series (default: ``$RANK``, else 0)."),
    Option("role", "trainer", "what this process does (trainer, actor, rollout, ...), on the OTel resource."),
    Option("prometheus", True,
           "``{'host': ..., 'port': ...}`` for the scrape endpoint (default ``0.0.0.0:9464``; port 0 picks a free "
           "port, see ``Telemetry.metrics_url``), ``True`` for the defaults, ``False`` for none. The port is a "
           "base: a process serves on port + ``$LOCAL_RANK`` (0 when unset), so the ranks torchrun starts on one "
           "host get distinct ports (port 0 is never offset). More keys: ``add_local_rank`` (``False``: serve on "
           "the port as given), ``port_search`` (on a taken port, try the next N), ``file_sd`` (a directory to "
           "publish the target in for Prometheus ``file_sd_configs``), ``advertise_host`` (the host written "
           "there), ``web_config_file`` (TLS, mTLS, basic auth in the exporter-toolkit web-config format)."),
    Option("max_series_per_metric", 10_000, "cap on label sets per metric; past it new series are dropped and "
                                            "counted."),
    Option("max_unknown_keys", 1_000, "cap on keys without a catalog entry exported through the fallback gauge "
                                      "(the trackers still get every key)."),
    Option("series_ttl_s", None, "forget a series not written for this many seconds (``None``: keep; liveness "
                                 "never expires)."),
    Option("track_with", None, "ROLL's option: a tracker name (``'tensorboard'``, ``'wandb'``, ``'swanlab'``, "
                               "``'stdout'`` or one added with :func:`rl_otel.register_sink`), or a list of names."),
    Option("tracker_kwargs", None, "with one tracker, its kwargs (flat, as in ROLL); with a list, kwargs keyed by "
                                   "tracker name."),
    Option("trackers", None, "instead of ``track_with``: ``{'tensorboard': {'log_dir': ...}, 'stdout': {}}`` or a "
                             "list of names / dicts with a ``name``."),
    Option("tracker_ranks", 0, "which ranks mirror to trackers: a rank (default 0), a list of ranks, or "
                               "``'all'``. Every rank exports to Prometheus."),
    Option("handle_sigterm", True, "with trackers, close them on SIGTERM and flush them on SIGINT (a signal "
                                   "arriving inside ``log()`` waits for that step), then run the previous handler "
                                   "(main thread only)."),
    Option("sink_queue_size", 64, "steps a tracker may fall behind before its oldest queued step is dropped "
                                  "(counted)."),
    Option("submit_queue_size", 4, "jobs ``Telemetry.submit`` may queue (each holds its tensors) before the "
                                   "caller waits for the metrics worker."),
    Option("close_timeout_s", 10.0, "how long ``close()`` (or a signal) waits for the trackers to write and "
                                    "close; a tracker call running longer is counted as hung."),
    Option("tracing", None,
           "where ``phase()`` spans go: ``None`` (nowhere), ``'console'`` (JSON lines on stderr), ``{'exporter': "
           "'jsonl', 'path': ...}``, ``{'exporter': 'otlp', 'endpoint': ..., 'protocol': 'http/protobuf' | "
           "'grpc'}`` (needs the ``otlp`` extra) or a ``SpanExporter``."),
    Option("otlp", None,
           "push metrics and phase spans to an OpenTelemetry Collector: its base URL, ``True`` (everything from the "
           "``OTEL_EXPORTER_OTLP_*`` variables), ``{'endpoint': ..., 'protocol': 'http/protobuf' | 'grpc', "
           "'interval_s': 10, 'timeout_s': 10, 'headers': {...}, 'traces': True, 'temporality': 'cumulative' | "
           "'delta' | 'lowmemory'}``, or your own ``MetricExporter`` (needs the ``otlp`` extra). Settings not "
           "given come from the standard ``OTEL_*`` variables; not given at all (``None``), "
           "``OTEL_METRICS_EXPORTER=otlp`` / ``OTEL_TRACES_EXPORTER=otlp`` turn the push on; ``False``: never."),
    Option("resource", None, "OTel resource attributes (``{'service.name': 'grpo-7b', ...}``), over "
                             "``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES``, which are over rl_otel's "
                             "defaults (``service.name='rl_otel'``)."),
    Option("tracer_provider", None, "your own OTel ``TracerProvider``: phases become spans of your traces (a phase "
                                    "opened inside your span is its child), exported by your provider's "
                                    "processors (not with ``tracing=``).", in_file=False),
    Option("hang_factor", 5.0, "a phase run longer than ``max(hang_factor x the hang_quantile of that phase's past "
                               "durations in this run, hang_min_s)`` is stuck: the process writes the stacks of all "
                               "its threads to a file, once per stuck run (``docs/hangs.md``)."),
    Option("hang_quantile", 0.9, "the quantile of a phase's past durations ``hang_factor`` multiplies (0 < q <= 1)."),
    Option("hang_min_s", 600.0, "a phase is never stuck before this many seconds (the whole threshold until a run of "
                                "it has finished); ``None``: no stack dumps for stuck phases."),
    Option("stack_dump_signal", "SIGUSR1", "a signal that makes the process write its stacks on demand (a name or "
                                           "number; ``None``: none). Taken only if nothing in the process handles "
                                           "it already."),
    Option("stack_dump_dir", None, "where stack dumps are written (default: ``$RL_OTEL_DUMP_DIR``, else the first "
                                   "tracker's log directory, else ``./rl_otel_dumps``)."),
    Option("stack_dump_http", True, "serve ``GET /debug/stacks`` on the scrape endpoint (behind its basic auth and "
                                    "TLS): writes a dump and answers with it."),
)

BY_NAME: dict[str, Option] = {o.name: o for o in OPTIONS}
FILE_KEYS: tuple[str, ...] = tuple(o.name for o in OPTIONS if o.in_file)
# what a framework integration passes through to init(): every option, and a config file
INTEGRATION_OPTIONS: tuple[str, ...] = (*(o.name for o in OPTIONS), "config")


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
            "Generated from `rl_otel/_internal/runtime/options.py` (`python3 -m rl_otel.ops`). Each is an argument of "
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
