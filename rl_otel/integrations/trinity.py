"""A Trinity-RFT monitor: ``monitor_type: rl_otel`` serves the explorer's and trainer's metrics to Prometheus.

Trinity-RFT picks its monitor from the ``MONITOR`` registry by ``monitor.monitor_type`` and builds it as
``Monitor(project, group, name, role, config)``; it calls ``log(data, step, commit=False)`` and ``close()``, and
``default_args()`` gives the ``monitor.monitor_args`` it understands. Register once, before Trinity starts::

    from rl_otel.integrations.trinity import register
    register()                       # MONITOR.register_module("rl_otel") in trinity.utils.monitor

and in the config (``monitor_args`` are :func:`rl_otel.init` options)::

    monitor:
      monitor_type: rl_otel
      monitor_args: {trackers: {tensorboard: {log_dir: ./tb}}}

The explorer and the trainer each get a Telemetry of their own (``role`` on the OTel resource). Colocated on one
node they need two ports: without a ``prometheus`` option the explorer serves on 9464 and the trainer on 9465.
"""

from __future__ import annotations

import logging
from typing import Any

from rl_otel.integrations import telemetry_from_options

NAME = "rl_otel"
DEFAULT_PORTS = {"explorer": 9464, "trainer": 9465}
_log = logging.getLogger("rl_otel")


class RLOtelMonitor:
    """Trinity-RFT's ``Monitor`` interface over a :class:`rl_otel.Telemetry`; the run is named ``name``.

    Trinity's ``eval/{taskset}/{metric}/{stat}@k`` keys (and ``detailed_stats``) become labeled series through
    the catalog; ``rl_otel.stats.trinity`` reproduces Trinity's aggregation when a loop logs its own.
    """

    def __init__(self, project: str, group: str, name: str, role: str, config: Any = None) -> None:
        self.project, self.group, self.name, self.role = project, group, name, role
        options = {**self.default_args(), **_monitor_args(config)}
        options.setdefault("role", role)
        if "prometheus" not in options and role in DEFAULT_PORTS:
            options["prometheus"] = {"port": DEFAULT_PORTS[role]}
        self.telemetry = telemetry_from_options("Trinity-RFT's monitor_args", name, options)

    def log(self, data: dict, step: int, commit: bool = False) -> None:
        """One step's metrics (``commit`` has no meaning here: every call is exported). Never raises."""
        self.telemetry.log(data, step)

    def log_table(self, table_name: str, experiences_table: Any, step: int) -> None:
        """Tables (sample experiences) are not metrics; rl_otel leaves them to the other monitors."""
        _log.debug("rl_otel: log_table(%r) ignored: tables are not metrics", table_name)

    def close(self) -> None:
        """Flush the mirrored trackers and stop serving. Idempotent."""
        self.telemetry.close()

    @classmethod
    def default_args(cls) -> dict[str, Any]:
        """The ``monitor_args`` defaults: none - :func:`rl_otel.init`'s defaults apply (ports per role above)."""
        return {}


def _monitor_args(config: Any) -> dict[str, Any]:
    monitor = getattr(config, "monitor", None)
    args = getattr(monitor, "monitor_args", None)
    return dict(args) if args else {}


def register(registry: Any = None, name: str = NAME) -> None:
    """Add :class:`RLOtelMonitor` to Trinity-RFT's ``MONITOR`` registry (default ``trinity.utils.monitor``)."""
    if registry is None:
        from trinity.utils.monitor import MONITOR as registry  # type: ignore[import-not-found,no-redef]
    registry.register_module(name)(RLOtelMonitor)
