"""SwanLab: ``swanlab.init(**kwargs)`` as in ROLL, one ``run.log(..., step=step)`` per step.

``login_kwargs`` (ROLL's form: ``{"api_key": ...}``) are passed to ``swanlab.login(save=False)`` for cloud mode
only - local, offline and disabled runs need no login - and never reach a file, a log line or the uploaded
``config``. SwanLab 0.10 has no histogram type: distributions are left out of SwanLab (warned once); the
other sinks and Prometheus still get them.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from rl_otel._internal.trackers.config import redact
from rl_otel.sinks.base import Metrics, missing_dependency

_log = logging.getLogger("rl_otel")


class SwanLabSink:
    """Starts a SwanLab run; ``experiment_name`` defaults to the rl_otel run."""

    def __init__(self, *, run: str, login_kwargs: dict[str, Any] | None = None, **init_kwargs: Any) -> None:
        try:
            import swanlab
        except ImportError as e:
            raise missing_dependency("swanlab", "swanlab") from e
        if login_kwargs is not None and not isinstance(login_kwargs, dict):
            raise ValueError("login_kwargs must be a dict like {'api_key': ...}")
        if "name" not in init_kwargs:
            init_kwargs.setdefault("experiment_name", run)
        if "config" in init_kwargs:
            init_kwargs["config"] = redact(init_kwargs["config"])
        if login_kwargs and init_kwargs.get("mode") not in ("local", "offline", "disabled"):
            swanlab.login(**{"save": False, **login_kwargs})
        self._run = swanlab.init(**init_kwargs)
        self._warned_dist = False

    def log(self, metrics: Metrics, step: int) -> None:
        row = {k: v for k, v in metrics.items() if not isinstance(v, np.ndarray)}
        if len(row) < len(metrics) and not self._warned_dist:
            self._warned_dist = True
            _log.warning("rl_otel: SwanLab has no histogram type; distributions are not mirrored to SwanLab")
        if row:
            self._run.log(row, step=step)

    def close(self) -> None:
        self._run.finish()
