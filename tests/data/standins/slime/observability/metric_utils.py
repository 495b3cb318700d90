"""Stand-in for ``slime.observability.metric_utils.compute_rollout_step(args, rollout_id)``: the rollout id, or
the train step it corresponds to under ``wandb_always_use_train_step``."""

from __future__ import annotations

from typing import Any


def compute_rollout_step(args: Any, rollout_id: int) -> int:
    if args.wandb_always_use_train_step:
        return rollout_id * args.rollout_batch_size * args.n_samples_per_prompt // args.global_batch_size
    return rollout_id
