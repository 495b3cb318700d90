"""``rl-otel demo``: a real, small PPO run on CPU that exercises every metric family rl_otel serves.

:func:`run` trains it (with or without telemetry: see :mod:`rl_otel.demo.ppo`); :mod:`rl_otel.demo.cli` is the
command. Needs torch (``pip install 'rl-otel[demo]'``).
"""

from rl_otel.demo.ppo import DemoConfig, DemoResult, StepReport, run
from rl_otel.demo.task import CountingTask

__all__ = ["CountingTask", "DemoConfig", "DemoResult", "StepReport", "run"]
