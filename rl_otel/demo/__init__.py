"""``rl-otel demo``: a real, small PPO run on CPU that exercises every metric family rl_otel serves.

:func:`run` trains it (with or without telemetry: see :mod:`rl_otel.demo.ppo`); :mod:`rl_otel.demo.cli` is the
command. Needs torch (``pip install -e '.[demo]'``), imported on first use of :func:`run` and friends, so the
``rl-otel`` command stays fast for its other subcommands.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

DEFAULT_STEPS = 200  # about a minute on two CPU cores, the reward rising from ~0.1 to ~0.7

if TYPE_CHECKING:
    from rl_otel.demo.ppo import DemoConfig, DemoResult, StepReport, run
    from rl_otel.demo.task import CountingTask

__all__ = ["DEFAULT_STEPS", "CountingTask", "DemoConfig", "DemoResult", "StepReport", "run"]
_LAZY = {"DemoConfig": "rl_otel.demo.ppo", "DemoResult": "rl_otel.demo.ppo", "StepReport": "rl_otel.demo.ppo",
         "run": "rl_otel.demo.ppo", "CountingTask": "rl_otel.demo.task"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'rl_otel.demo' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
