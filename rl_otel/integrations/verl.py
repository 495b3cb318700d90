"""A backend for verl's ``Tracking``: the trainer's metrics served to Prometheus beside wandb/tensorboard/console.

verl's ``Tracking(project_name, experiment_name, default_backend=[...])`` keeps its backends in the dict
``tracking.logger`` and calls ``log(data=..., step=...)`` on each, then ``finish()`` when it goes away::

    from verl.utils.tracking import Tracking
    from rl_otel.integrations.verl import attach

    tracking = Tracking(project_name="p", experiment_name="e", default_backend=["console"])
    attach(tracking, prometheus={"port": 9464})        # tracking.logger["rl_otel"] = RLOtelBackend(...)
    tracking.log(data=metrics, step=global_step)       # as verl's trainer already does
"""

from __future__ import annotations

from typing import Any

from rl_otel.integrations import telemetry_from_options

NAME = "rl_otel"


class RLOtelBackend:
    """verl's backend interface (``log(data, step)``, ``finish()``) over a :class:`rl_otel.Telemetry`.

    The run is named ``experiment_name`` unless ``run`` is given; other keyword arguments are
    :func:`rl_otel.init` options.
    """

    def __init__(self, project_name: str | None = None, experiment_name: str | None = None,
                 config: Any = None, **options: Any) -> None:
        self.project_name = project_name
        self.telemetry = telemetry_from_options("the verl backend", experiment_name, options)

    def log(self, data: dict, step: int | None) -> None:
        """One step's metrics. Never raises."""
        self.telemetry.log(data, step)

    def finish(self) -> None:
        """Flush the mirrored trackers and stop serving. Idempotent."""
        self.telemetry.close()

    close = finish


def attach(tracking: Any, name: str = NAME, **options: Any) -> RLOtelBackend:
    """Create a backend named after ``tracking``'s project and experiment and add it to ``tracking.logger``."""
    logger = getattr(tracking, "logger", None)
    if not isinstance(logger, dict):
        raise TypeError(f"attach() needs verl's Tracking (with a .logger dict of backends), got {tracking!r}")
    backend = RLOtelBackend(getattr(tracking, "project_name", None), getattr(tracking, "experiment_name", None),
                            **options)
    logger[name] = backend
    return backend
