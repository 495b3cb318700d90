"""Stand-in for ``slime.observability.rollout_metrics`` with the signatures and the hook contract rl_otel relies on:
``compute_metrics_from_samples(args, samples)``, ``compute_perf_metrics_from_samples(args, samples,
rollout_time)``, and ``log_rollout_data`` / ``log_eval_rollout_data``, which call the function named by
``args.custom_rollout_log_function_path`` / ``args.custom_eval_rollout_log_function_path`` first and skip the
default logging when it returns a true value. The metrics are simple ones of this stand-in's own."""

from __future__ import annotations

from typing import Any

from slime.observability import logging_utils
from slime.observability.metric_utils import compute_rollout_step
from slime.utils.misc import load_function


def compute_metrics_from_samples(args: Any, samples: list[Any]) -> dict[str, float]:
    rewards = [s.reward for s in samples]
    lengths = [s.response_length for s in samples]
    return {"raw_reward": sum(rewards) / len(rewards), "response_len/mean": sum(lengths) / len(lengths)}


def compute_perf_metrics_from_samples(args: Any, samples: list[Any], rollout_time: float) -> dict[str, float]:
    tokens = sum(s.response_length for s in samples)
    return {"rollout_time": rollout_time, "tokens_per_gpu_per_sec": tokens / rollout_time}


def log_eval_rollout_data(rollout_id: int, args: Any, data: dict[str, Any],
                          extra_metrics: dict[str, Any] | None = None) -> None:
    hook = args.custom_eval_rollout_log_function_path
    if hook is not None and load_function(hook)(rollout_id, args, data, extra_metrics):
        return
    log_dict = dict(extra_metrics or {})
    for key, result in data.items():
        log_dict[f"eval/{key}"] = sum(result["rewards"]) / len(result["rewards"])
    log_dict["eval/step"] = compute_rollout_step(args, rollout_id)
    logging_utils.log(args, log_dict, step_key="eval/step")


def log_rollout_data(rollout_id: int, args: Any, samples: list[Any], rollout_extra_metrics: dict[str, Any] | None,
                     rollout_time: float) -> None:
    hook = args.custom_rollout_log_function_path
    if hook is not None and load_function(hook)(rollout_id, args, samples, rollout_extra_metrics, rollout_time):
        return
    if args.load_debug_rollout_data:
        return
    log_dict = dict(rollout_extra_metrics or {})
    log_dict |= {f"rollout/{k}": v for k, v in compute_metrics_from_samples(args, samples).items()}
    log_dict |= {f"perf/{k}": v for k, v in compute_perf_metrics_from_samples(args, samples, rollout_time).items()}
    log_dict["rollout/step"] = compute_rollout_step(args, rollout_id)
    logging_utils.log(args, log_dict, step_key="rollout/step")
