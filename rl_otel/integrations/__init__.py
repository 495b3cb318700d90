"""Drop-in integrations, one file per framework, each on the framework's own tracker interface.

``roll`` (a ROLL tracker for ``track_with``), ``verl`` (a backend for verl's ``Tracking``), ``trinity`` (a
Trinity-RFT ``Monitor``), ``accelerate`` (an accelerate ``GeneralTracker``), ``transformers`` (a
``TrainerCallback`` for TRL's and transformers' trainers). Each builds its :class:`rl_otel.Telemetry` with
:func:`telemetry_from_options`, so every integration takes the same options as :func:`rl_otel.init`.

verl and Trinity-RFT are selected from their own configs, with no code in the launcher and none in their Ray
actors: ``trainer.logger=[console,rl_otel]`` in verl (a ``verl.plugins`` entry point that ``import verl`` loads),
``monitor.monitor_type: rl_otel.integrations.trinity.RLOtelMonitor`` in Trinity-RFT (its registry imports a
dotted name by itself).
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import urlsplit

from rl_otel._internal.runtime.options import DEFAULT_PORT, INTEGRATION_OPTIONS, OPTIONS, load_config_file, merge
from rl_otel.errors import ConfigurationError

if TYPE_CHECKING:
    from rl_otel.telemetry import Telemetry

# On a taken port an integration serves on one of the next PORT_SEARCH ports (unless the options set port_search),
# in steps of LOCAL_WORLD_SIZE: telemetry is never the reason a training run dies
PORT_SEARCH = 100
_log = logging.getLogger("rl_otel")


def config_get(node: Any, key: str) -> Any:
    """``node[key]`` or ``node.key`` of a framework's config (a dict, an OmegaConf or dataclass config); ``None``
    when ``node`` is ``None`` or has no such key (a struct OmegaConf config raises for one)."""
    if node is None:
        return None
    try:
        return node.get(key) if isinstance(node, Mapping) else getattr(node, key, None)
    except Exception:  # boundary: the framework's config object (OmegaConf raises its own errors)
        return None


def options_section(config: Any, path: Sequence[str], where: str) -> dict[str, Any]:
    """The rl_otel options at ``path`` of a framework's config (``("trainer", "rl_otel")``) as plain data, ``{}``
    where absent. Raises ConfigurationError naming ``where`` when the section is not a mapping."""
    section = config
    for key in path:
        section = config_get(section, key)
    if section is None:
        return {}
    if not isinstance(section, Mapping):
        raise ConfigurationError(f"{where} must be a mapping of rl_otel.init options, got {type(section).__name__}")
    return plain_options(section)


def plain_options(value: Any) -> Any:
    """A framework's config node (OmegaConf, a dataclass-ish mapping) as plain dicts, lists and scalars."""
    if isinstance(value, Mapping):
        return {str(k): plain_options(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return [plain_options(v) for v in value]
    return value


def check_options(where: str, options: Mapping[str, Any], run: str | None = None) -> dict[str, Any]:
    """``options`` checked as :func:`rl_otel.init` checks them, starting nothing (an integration calls it when it
    is built, so a mistake is refused before the framework loads a model), with ``prometheus`` ``port_search``
    set to :data:`PORT_SEARCH` where the options (or their ``config`` file) do not set it. Returns the options to
    pass to :func:`telemetry_from_options`. Raises ConfigurationError naming a bad option or value."""
    return _checked(where, options, run)[0]


def _checked(where: str, options: Mapping[str, Any], run: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(:func:`check_options`' result, the options of the ``config`` file)."""
    from rl_otel._internal.runtime.options import build_config

    unknown = sorted(set(options) - set(INTEGRATION_OPTIONS))
    if unknown:
        raise ConfigurationError(f"unknown rl_otel option(s) {unknown} for {where}; known: {list(INTEGRATION_OPTIONS)}")
    options = dict(options)
    file = load_config_file(options["config"]) if options.get("config") is not None else {}
    prom = options.get("prometheus", file.get("prometheus", True))
    if prom is True:
        prom = {}
    if isinstance(prom, Mapping) and "port_search" not in prom:
        port, local_rank = prom.get("port", DEFAULT_PORT), os.environ.get("LOCAL_RANK", "")
        if isinstance(port, int) and not isinstance(port, bool) and 0 < port <= 65535:
            last = 65535 - port - (int(local_rank) if local_rank.isdigit() else 0)
            options["prometheus"] = {**prom, "port_search": max(0, min(PORT_SEARCH, last))}
    given = {o.name: options[o.name] for o in OPTIONS if o.name in options}
    if run is not None and given.get("run") is None:
        given["run"] = run
    build_config(**merge(given, file))
    return options, file


def launch_run_name(stem: str | None = None) -> str | None:
    """A run label every rank of one multi-process launch derives alike, for a framework that names no run:
    ``<stem>-<8 hex digits>`` from :func:`~rl_otel._internal.runtime.ranks.launch_identity` (the launcher's
    store, else the launcher process), never a rank's own clock, and never the same for two launches (a
    rendezvous address alone is: torchrun's default ``MASTER_PORT`` is the same every time). ``None`` outside
    such a launch, or when ``$RL_OTEL_RUN`` names the run: :func:`rl_otel.init`'s default applies."""
    from rl_otel._internal.runtime.ranks import launch_identity

    if os.environ.get("RL_OTEL_RUN"):
        return None
    launch = launch_identity()
    if launch is None:
        return None
    digest = hashlib.sha256(f"{stem}|{launch}".encode()).hexdigest()[:8]
    return f"{stem or 'run'}-{digest}"


def telemetry_from_options(where: str, run: str | None, options: Mapping[str, Any], *,
                           stem: str | None = None, framework: str | None = None) -> Telemetry:
    """``rl_otel.init(run=run, **options)`` for an integration: options checked by :func:`check_options` (an
    unknown one refused by name, ``port_search`` on by default, a warning naming the port served on when the
    configured one was taken). With several ranks on a host (``LOCAL_WORLD_SIZE`` > 1) the search keeps each
    rank to its own lane of ports, ``port + LOCAL_RANK + k * LOCAL_WORLD_SIZE``, so a taken port moves only the
    rank it belongs to (:func:`~rl_otel._internal.runtime.ranks.port_lane`). Without a run name (``run``
    option, ``run``, the config file, ``$RL_OTEL_RUN``), the ranks of one launch share :func:`launch_run_name`
    (``stem``: e.g. the framework's output directory name). ``framework`` (``"slime"``, ...): the run's keys
    resolve in that framework's catalog (:func:`rl_otel.catalog.default_catalog`) unless the options give a
    ``catalog``, and ``target_info`` says it (the resource attribute ``rl.framework``)."""
    from rl_otel.catalog import default_catalog

    options, file = _checked(where, options, run)
    if framework is not None:
        options.setdefault("catalog", default_catalog(framework))
        resource = options.get("resource")
        if resource is None or isinstance(resource, Mapping):
            options["resource"] = {"rl.framework": framework, **(resource or {})}
    run = options.pop("run", None) or run or (None if file.get("run") else launch_run_name(stem))
    lane = _lane(options.get("prometheus", file.get("prometheus")))
    tel = _init_in_lane(run, options, lane) if lane is not None else _init(run, options)
    _say_port(where, tel, lane)
    return tel


def _init(run: str | None, options: Mapping[str, Any]) -> Telemetry:
    import rl_otel

    return rl_otel.init(run, **options) if run is not None else rl_otel.init(**options)


class _Lane(NamedTuple):
    """A port search in steps of ``LOCAL_WORLD_SIZE`` (see :func:`~rl_otel._internal.runtime.ranks.port_lane`)."""

    port: int  # the configured base port (before LOCAL_RANK)
    local_rank: int
    local_world_size: int
    search: int  # port_search: how far past its own port a rank may serve
    prometheus: Mapping[str, Any]  # the prometheus option (given, or the config file's)


def _lane(prom: Any) -> _Lane | None:
    """The lane search for the checked ``prometheus`` option, or ``None`` where ``init()``'s own search (steps of
    1) is the same thing: one process per host, ``add_local_rank`` off, port 0, no search."""
    from rl_otel._internal.runtime.ranks import env_ranks, local_world_size

    if not isinstance(prom, Mapping) or prom.get("add_local_rank") is False:
        return None
    port, search, size = prom.get("port", DEFAULT_PORT), prom.get("port_search", 0), local_world_size()
    if not port or not search or size < 2:
        return None
    return _Lane(port, env_ranks().local_rank, size, search, prom)


def _init_in_lane(run: str | None, options: Mapping[str, Any], lane: _Lane) -> Telemetry:
    """``init()`` on this rank's lane: its own port, else the port ``LOCAL_WORLD_SIZE`` further, and so on."""
    from rl_otel._internal.runtime.ranks import port_lane
    from rl_otel.errors import PortInUseError

    bases = port_lane(lane.port, lane.local_rank, lane.local_world_size, lane.search)
    for base in bases:
        try:
            return _init(run, {**options, "prometheus": {**lane.prometheus, "port": base, "port_search": 0}})
        except PortInUseError as exc:
            cause = exc.__cause__
            if isinstance(cause, OSError) and cause.errno != errno.EADDRINUSE:
                raise  # not a taken port (a host that cannot be bound): the next port fails alike
    ports = ", ".join(str(b + lane.local_rank) for b in bases[:4]) + (", ..." if len(bases) > 4 else "")
    raise PortInUseError(f"prometheus ports {ports} (the lane of LOCAL_RANK {lane.local_rank}: {lane.port} + "
                         f"{lane.local_rank} + k*{lane.local_world_size}, up to port_search {lane.search} past its "
                         "own) are all in use; pass prometheus={'port': 0, 'file_sd': DIR}, another port, or a "
                         "larger port_search")


def _say_port(where: str, tel: Telemetry, lane: _Lane | None) -> None:
    prom = tel.config.prometheus
    url = tel.metrics_url
    served = urlsplit(url).port if url else None
    if prom is None or served is None:
        return
    asked = prom.port if lane is None else lane.port + lane.local_rank
    if asked and served != asked:
        where_to_scrape = ""
        if lane is not None:
            last = lane.port + lane.search + lane.local_world_size - 1
            where_to_scrape = (f"; the {lane.local_world_size} ranks of this host serve on port {lane.port} + "
                               f"LOCAL_RANK, a rank whose port is taken moving on in steps of "
                               f"{lane.local_world_size} (all within {lane.port}..{min(last, 65535)}): scrape "
                               "them through file_sd (prometheus file_sd: DIR), which names each rank's port")
        _log.warning("rl_otel: %s: prometheus port %d is taken; serving on port %d instead (%s)%s", where, asked,
                     served, url, where_to_scrape)
