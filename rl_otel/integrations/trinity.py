"""Trinity-RFT: a ``monitor_type`` that serves the explorer's and trainer's metrics to Prometheus, no register().

Name the class by its import path in the config (``monitor_args`` are :func:`rl_otel.init` options)::

    monitor:
      monitor_type: rl_otel.integrations.trinity.RLOtelMonitor
      monitor_args: {trackers: {tensorboard: {log_dir: ./tb}}}      # optional

Trinity's ``MONITOR`` registry imports a dotted ``monitor_type`` by itself, in every process that asks for it:
the launcher when it validates the config, and the Explorer and Trainer Ray actors, which build their monitor as
``MONITOR.get(config.monitor.monitor_type)(project=..., group=..., name=..., role=..., config=config)``. So
nothing has to be registered beforehand, in the launcher or in the actors; rl_otel only has to be installed in
the Python environment the actors run in. It calls ``log(data, step)`` and ``close()`` (twice on shutdown: once
explicitly, once from ``__del__``; both safe).

The run label is ``config.name`` (Trinity's ``name``), ``role`` is ``explorer.name`` / ``trainer.name``. The
explorer and the trainer each serve their own endpoint: without a ``prometheus`` option the explorer serves on
9464 and the trainer on 9465 (colocated on one node they need two ports).

The short name ``monitor_type: rl_otel`` needs :func:`register` in each of those processes, e.g. from a file in a
Trinity plugin directory (``--plugin-dir`` / ``TRINITY_PLUGIN_DIRS``), which Trinity loads in the launcher, the
Explorer and the Trainer::

    # my_plugins/rl_otel_monitor.py
    from rl_otel.integrations.trinity import register
    register()                      # idempotent: a plugin loaded twice registers once
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rl_otel._internal.runtime.options import DEFAULT_PORT
from rl_otel.integrations import plain_options, telemetry_from_options

if TYPE_CHECKING:
    from rl_otel.telemetry import Telemetry

NAME = "rl_otel"
MONITOR_TYPE = f"{__name__}.RLOtelMonitor"  # the dotted monitor_type: "rl_otel.integrations.trinity.RLOtelMonitor"
DEFAULT_PORTS = {"explorer": DEFAULT_PORT, "trainer": DEFAULT_PORT + 1}  # colocated on one node: two ports
_log = logging.getLogger("rl_otel")


class RLOtelMonitor:
    """Trinity-RFT's ``Monitor`` interface over a :class:`rl_otel.Telemetry`; the run is named ``name``.

    Built as Trinity's own monitors are, ``(project, group, name, role, config)`` (positional or keywords, as the
    Explorer and the Trainer pass them); the base class's ``(project, name, role, config)`` - without ``group`` -
    works too. Trinity's ``eval/{taskset}/{metric}/{stat}@k`` keys (and ``detailed_stats``) become labeled series
    through the catalog; ``rl_otel.stats.trinity`` reproduces Trinity's aggregation when a loop logs its own.
    """

    # None until __init__ has built it (close() and __del__ of a half-built monitor do nothing)
    telemetry: Telemetry | None = None

    def __init__(self, project: str = "Trinity-RFT", group: str = "", name: str = "rft", role: str = "explorer",
                 config: Any = None) -> None:
        if config is None and role is not None and not isinstance(role, str):
            # Monitor's base signature used positionally: (project, name, role, config)
            group, name, role, config = "", group, name, role
        self.project, self.group, self.name, self.role, self.config = project, group, name, role, config
        options = {**self.default_args(), **_monitor_args(config)}
        options.setdefault("role", role)
        if "prometheus" not in options and role in DEFAULT_PORTS:
            options["prometheus"] = {"port": DEFAULT_PORTS[role]}
        self.telemetry = telemetry_from_options("Trinity-RFT's monitor_args", name, options)

    def log(self, data: dict, step: int, commit: bool = False) -> None:
        """One step's metrics (``commit`` has no meaning here: every call is exported). Never raises."""
        if self.telemetry is not None:  # always, but on a half-built monitor
            self.telemetry.log(data, step)

    def log_table(self, table_name: str, experiences_table: Any, step: int) -> None:
        """Tables (sample experiences) are not metrics; rl_otel leaves them to the other monitors."""
        _log.debug("rl_otel: log_table(%r) ignored: tables are not metrics", table_name)

    def close(self) -> None:
        """Flush the mirrored trackers and stop serving. Idempotent."""
        if self.telemetry is not None:
            self.telemetry.close()

    def __del__(self) -> None:  # as Trinity's Monitor.__del__; quiet at interpreter shutdown
        try:
            self.close()
        except Exception:  # boundary: a finalizer (interpreter shutdown): never raise from __del__
            pass

    @classmethod
    def default_args(cls) -> dict[str, Any]:
        """The ``monitor_args`` defaults: none - :func:`rl_otel.init`'s defaults apply (ports per role above)."""
        return {}


def _monitor_args(config: Any) -> dict[str, Any]:
    monitor = config.get("monitor") if isinstance(config, Mapping) else getattr(config, "monitor", None)
    args = monitor.get("monitor_args") if isinstance(monitor, Mapping) else getattr(monitor, "monitor_args", None)
    return plain_options(args) if args else {}


def register(registry: Any = None, name: str = NAME) -> type[RLOtelMonitor]:
    """Add :class:`RLOtelMonitor` to Trinity-RFT's ``MONITOR`` registry (default ``trinity.utils.monitor``)
    under ``name``, in this process. Idempotent: when ``name`` already holds RLOtelMonitor it does nothing
    (Trinity's registry raises KeyError on a second registration). Not needed with the dotted
    ``monitor_type`` (:data:`MONITOR_TYPE`)."""
    if registry is None:
        from trinity.utils.monitor import MONITOR

        registry = MONITOR
    modules = getattr(registry, "modules", None)
    if isinstance(modules, Mapping) and modules.get(name) is RLOtelMonitor:
        return RLOtelMonitor
    registry.register_module(name)(RLOtelMonitor)
    return RLOtelMonitor
