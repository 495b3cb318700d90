"""RL statistics from tensors: the PPO/critic/token family in one fused pass, bulk histograms, Trinity aggregation.

``ppo_stats`` and ``bucket`` need torch (imported when first used); the Trinity-RFT aggregation needs numpy only.
``import rl_otel`` never imports this package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rl_otel._internal.pipeline.histogram import BucketCounts
from rl_otel.stats.trinity import (
    bootstrap_best_worst,
    eval_step_metrics,
    rollout_step_metrics,
    run_metrics,
    task_metrics,
)

if TYPE_CHECKING:
    from rl_otel.stats.histogram import bucket
    from rl_otel.stats.ppo import kl_penalty_terms, ppo_stats

__all__ = ["BucketCounts", "bootstrap_best_worst", "bucket", "eval_step_metrics", "kl_penalty_terms", "ppo_stats",
           "rollout_step_metrics", "run_metrics", "task_metrics"]

_TORCH = {"ppo_stats": "rl_otel.stats.ppo", "kl_penalty_terms": "rl_otel.stats.ppo",
          "bucket": "rl_otel.stats.histogram"}


def __getattr__(name: str) -> Any:
    module = _TORCH.get(name)
    if module is None:
        raise AttributeError(f"module 'rl_otel.stats' has no attribute {name!r}")
    import importlib

    try:
        return getattr(importlib.import_module(module), name)
    except ImportError as exc:
        from rl_otel.errors import MissingExtraError, install_hint

        raise MissingExtraError(f"rl_otel.stats.{name} needs torch (rl_otel's extra [torch]): "
                                f"{install_hint('torch')}") from exc
