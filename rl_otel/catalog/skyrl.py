"""SkyRL's metrics (NovaSky-AI/SkyRL @ a9564572, package ``skyrl`` 0.3.0 in the repository, and the released
``skyrl`` 0.3.0 of PyPI, tag skyrl-v0.3.0), as its trainers pass them to ``skyrl.train.utils.tracking.Tracking.log``.

Read off SkyRL's code (tests/data/frameworks/skyrl.tsv): the sync ``RayPPOTrainer`` and the fully async trainer,
with their evaluation, vLLM-scraper and Ray GPU-monitor keys. Worker keys (``policy/*``, ``critic/*``) are
micro-batch values reduced in the worker, all-reduced over DP, then averaged over mini-batches and update epochs
(``*_max`` take the max, ``*_min`` the min). The tracker lives in the driver.

A key resolves here only in a SkyRL run's catalog (``default_catalog("skyrl")``): ``timing/*``, ``eval/*``,
``critic/*`` and ``ray/*`` are spelled like other frameworks' keys with other meanings. ``critic/grad_norm``, which
veRL's module defines literally, is written with an anonymous placeholder (``critic/{_:grad_norm}``): a key is
defined literally once in the union of all catalogs, and default_catalog(framework) leaves out the shared entry of a
key the framework's own entries cover.
"""

from __future__ import annotations

from rl_otel.catalog.define import GIB, counter, gauge
from rl_otel.catalog.spec import MetricSpec

_S = "skyrl"
_P = "rl_skyrl_"
_STATS = "{stat:mean|std|max|min}"
# get_rollout_metrics' keys: over the training batch (generate/), over the groups a full-batch sampler kept or
# dropped (generate_kept/, generate_dropped/), and over all eval trajectories (eval/all/generate/)
_ROLLOUT = "{split:generate|generate_kept|generate_dropped|eval/all/generate}"
# the vLLM scraper's window: the sync trainer's train rollouts (vllm/train/) or eval (vllm/eval/), the fully async
# trainer's whole interval (vllm/)
_VLLM = "{split:vllm/train|vllm/eval|vllm}"
# the Ray node index of the GPU monitor's keys: no `node` label exists yet (asked for), `part` carries it
_NODE = "{part}"


def _g(key: str, name: str, description: str, *, unit: str = "1", scale: float = 1.0,
       tracker_unit: str = "") -> MetricSpec:
    return gauge(key, _P + name, description, _S, unit=unit, scale=scale, tracker_unit=tracker_unit)


def _pct(key: str, name: str, description: str) -> MetricSpec:
    """A fraction SkyRL logs in percent (0-100), served as a 0-1 ratio."""
    return _g(key, name, description, scale=0.01, tracker_unit="%")


def _gib(key: str, name: str, description: str) -> MetricSpec:
    return _g(key, name, description, unit="By", scale=GIB, tracker_unit="GiBy")


_PROGRESS = (
    counter("trainer/global_step", _P + "trainer_steps",
            "Training step just finished (1-based; the step passed to Tracking.log).", _S, unit="{step}"),
    _g("trainer/epoch", "trainer_epoch", "0-based dataloader epoch of the step.", unit="{epoch}"),
    _g("trainer/tokens_per_second_per_gpu", "trainer_tokens_per_gpu_per_second",
       "Sync trainer: prompt + response tokens of the training batch over the train_critic_and_policy seconds and "
       "the training GPUs.", unit="{token}/s"),
)

_REWARD = (
    _g("{split:reward|reward_dropped}/avg_raw_reward", "reward_avg_raw_reward",
       "Mean over trajectories of the raw reward (token-level rewards summed per trajectory), over the training "
       "batch (split=reward) or, fully async with sample_full_batch, over the dropped zero-variance groups "
       "(split=reward_dropped)."),
    _g("{split:reward|reward_dropped}/avg_pass_at_{k:[0-9]+}", "reward_pass_at_k_ratio",
       "Fraction of prompts with at least one of their k trajectories rewarded > 0, over the training batch "
       "(split=reward) or the dropped groups (split=reward_dropped)."),
    _g("{split:reward|reward_dropped}/mean_positive_reward", "reward_mean_positive_reward",
       "Mean over trajectories of max(reward, 0), over the training batch (split=reward) or the dropped groups "
       "(split=reward_dropped)."),
    _g("reward/num_zero_variance_filtered", "reward_zero_variance_filtered_groups",
       "zero_variance_filter only: prompt groups whose rewards had zero variance and were loss-masked.",
       unit="{group}"),
)

_LOSS = (
    _g("loss/avg_final_rewards", "loss_avg_final_rewards",
       "Mean over trajectories of the final return: token-level rewards summed over the sequence, after the "
       "reward KL penalty when enabled."),
    _g("loss/avg_raw_advantages", "loss_avg_raw_advantages",
       "Mean of the advantages over response tokens, before mini-batch normalisation."),
    _g("loss/avg_raw_advantages_abs", "loss_avg_raw_advantages_abs", "Mean of |advantage| over response tokens."),
    _g("loss/avg_kl", "loss_avg_kl",
       "use_kl_in_reward only: mean over sequences of the per-sequence token-mean KL(policy || reference) used as "
       "the reward penalty."),
    _g("loss/avg_kl_max", "loss_avg_kl_max",
       "use_kl_in_reward only: mean over sequences of the per-sequence max |KL| token."),
    _g("loss/kl_loss_coef", "loss_kl_coef",
       "use_kl_in_reward only: KL coefficient applied (adaptive controller value or kl_loss_coef)."),
)

_POLICY = (
    _g("policy/final_loss", "policy_final_loss",
       "Total policy loss: PG loss + kl_loss_coef * policy_kl - entropy_loss_coef * entropy, mean over "
       "mini-batches."),
    _g("policy/policy_loss", "policy_loss",
       "Policy-gradient surrogate loss of the mini-batch (loss_reduction, default token_mean), mean over "
       "mini-batches and epochs."),
    _g("policy/policy_entropy", "policy_entropy",
       "Token-mean entropy (nats) of the current policy over loss-masked response tokens, mean over micro- and "
       "mini-batches."),
    _g("policy/policy_kl", "policy_kl",
       "use_kl_loss only: KL(policy || reference), mean over sequences of per-sequence token-means, averaged over "
       "micro-batches."),
    _g("policy/policy_lr", "policy_learning_rate", "Learning rate of the policy scheduler (last value)."),
    _g("policy/grad_norm", "policy_grad_norm",
       "Policy gradient norm (after clipping) per optimizer step, mean over mini-batches and epochs."),
    _g("policy/response_length", "policy_padded_response_length",
       "Padded response length (num_actions) of the micro-batches, mean.", unit="{token}"),
    _g("policy/loss_metrics/clip_ratio", "policy_clip_ratio",
       "Fraction of loss-masked tokens where the clipped surrogate was active (PPO clip fraction), token-mean per "
       "micro-batch, averaged."),
    _g(f"policy/minibatch_rollout_logprobs_abs_diff_{_STATS}", "policy_minibatch_rollout_logprobs_abs_diff",
       "|train-step logprob - rollout (inference) logprob| over loss-masked tokens: token-mean, std, max or min "
       "(masked tokens count as 0), over micro- and mini-batches; only when rollout logprobs are returned."),
    _g(f"policy/rollout_train_logprobs_abs_diff_{_STATS}", "policy_rollout_train_logprobs_abs_diff",
       "|rollout (inference) logprob - forward-pass logprob of the pre-update policy| over response tokens: mean, "
       "std, max or min (training-inference mismatch)."),
    # off-policy correction
    _g(f"policy/loss_metrics/is_ratio_{_STATS}", "policy_is_ratio",
       "Importance ratio exp(old logprob - rollout logprob) over loss-masked tokens: token-mean, or std, max or min "
       "of is_ratio * loss_mask over all positions."),
    _g("policy/loss_metrics/tis_{kind:token|seq}_clip_high_ratio", "policy_tis_clip_high_ratio",
       "Truncated importance sampling: fraction of valid tokens (token) or sequences (seq) whose ratio was "
       "capped."),
    _g("policy/loss_metrics/outlier_seq_{kind:masked|over_high|under_low}_ratio", "policy_outlier_seq_ratio",
       "Fraction of sequences masked for an outlier-ratio token (masked), with a token ratio above the high "
       "threshold (over_high) or below the low one (under_low)."),
    _g("policy/loss_metrics/token_mask_ratio", "policy_token_mask_ratio",
       "Fraction of valid tokens hard-masked by the token IS-ratio bounds."),
    _g("policy/loss_metrics/{kind:geo|product}_sequence_mask_masked_ratio", "policy_sequence_mask_masked_ratio",
       "Fraction of sequences masked by the geometric-mean (geo) or product (product) ratio bounds."),
    _g("policy/loss_metrics/cispo/ratio_{stat:mean|clamped_mean|max|min}", "policy_cispo_ratio",
       "CISPO loss only: importance ratio, mean, mean after clamping (clamped_mean), max or min."),
    _g("policy/loss_metrics/importance_ratio", "policy_importance_sampling_ratio",
       "importance_sampling loss only: mean importance ratio."),
)

_CRITIC = (
    # keys veRL's module defines literally, written with an anonymous placeholder: a key is defined literally once
    # in the union of all catalogs (default_catalog(framework) leaves veRL's entries out)
    _g("critic/{_:grad_norm}", "critic_grad_norm", "Critic gradient norm per optimizer step, mean over mini-batches."),
    _g("critic/critic_loss", "critic_loss",
       "Clipped value (MSE) loss per micro-batch, summed within the mini-batch, mean over mini-batches."),
    _g("critic/values_mean", "critic_values_mean",
       "Token-mean of the critic's value predictions over loss-masked tokens."),
    _g("critic/values_clipfrac", "critic_values_clip_ratio", "Fraction of tokens where the value clip was active."),
    _g("critic/critic_lr", "critic_learning_rate", "Critic learning rate."),
)

_GENERATE = (
    _g(f"{_ROLLOUT}/{{stat:min|max|avg|std}}_num_tokens", "generate_num_tokens",
       "Response length in tokens, min, max, mean (avg) or population std over the trajectories of the batch "
       "(split: the training batch, the kept or dropped groups, or all eval trajectories).", unit="{token}"),
    _g(f"{_ROLLOUT}/avg_tokens_{{kind:non_zero_rewards|zero_rewards}}", "generate_avg_tokens_by_reward",
       "Mean response length of the trajectories with reward > 0 (non_zero_rewards) or reward == 0 "
       "(zero_rewards).", unit="{token}"),
    _g(f"{_ROLLOUT}/{{stat:avg|min|max|std}}_assistant_tokens", "generate_assistant_tokens",
       "Loss-masked (assistant) tokens per trajectory, mean (avg), min, max or std over trajectories.",
       unit="{token}"),
    _g(f"{_ROLLOUT}/tokens_per_turn_{{stat:mean|std|max}}", "generate_tokens_per_turn",
       "Tokens per assistant turn (runs of the loss mask), mean, std or max.", unit="{token}"),
    _g(f"{_ROLLOUT}/trajectory_time_{{operation:completion|llm|env|other}}_{{stat:mean|p90|max}}",
       "generate_trajectory_time_seconds",
       "Per-trajectory time split (completion: end-to-end generation; llm, env, other: its parts), mean, 90th "
       "percentile or max over trajectories.", unit="s"),
    # the released skyrl 0.3.0 (tag skyrl-v0.3.0) logs only the end-to-end time, under the name #1900 changed to
    # trajectory_time_completion_* after the release: one more family, as a key of two spellings cannot give one
    # family the same labels
    _g(f"{_ROLLOUT}/trajectory_completion_time_{{stat:mean|p90|max}}", "generate_trajectory_completion_time_seconds",
       "skyrl 0.3.0 (later releases: generate/trajectory_time_completion_*): per-trajectory end-to-end generation "
       "seconds (the agent loop's e2e_time, from its start to its output), mean, 90th percentile or max over the "
       "trajectories of the batch (split: the training batch, the kept or dropped groups, or all eval "
       "trajectories).", unit="s"),
    _g("generate/batch_num_seq", "generate_batch_sequences",
       "Sequences in the training batch (before DP padding).", unit="{sample}"),
    _g("generate/batch_padded_seq_len", "generate_batch_padded_sequence_length",
       "Padded sequence length (prompt + response) of the training batch tensor.", unit="{token}"),
    _g("generate/num_seq_{kind:before|after}_merge", "generate_merge_sequences",
       "merge_stepwise_output only: step-wise sequences before, or sequences after, prefix merging.",
       unit="{sample}"),
    _g("generate/group_completion_time_{stat:mean|p90|max}", "generate_group_completion_time_seconds",
       "Fully async: the group's generation wall time, mean, 90th percentile or max over the step's groups.",
       unit="s"),
    _g("generate/intra_group_completion_time_std_mean", "generate_intra_group_completion_time_std_seconds",
       "Fully async: mean over groups of the std of trajectory completion times within the group.", unit="s"),
    _g("generate/intra_group_completion_time_cv_mean", "generate_intra_group_completion_time_cv",
       "Fully async: mean over groups of the coefficient of variation of trajectory completion times."),
    _g("{split:environment|eval/all/environment}/{metric:.+}", "environment_metric",
       "An environment aggregate (default: the mean of a numeric per-trajectory env metric) over the training "
       "batch (split=environment) or all eval trajectories."),
)

_ASYNC = (
    _g("async/staleness_{stat:mean|max|min}", "async_staleness",
       "Fully async: (global step - global step when the group was scheduled), mean, max or min over the "
       "mini-batch's groups: off-policy staleness.", unit="{step}"),
    _g("async/staleness_ratio", "async_stale_groups_ratio", "Fully async: fraction of groups with staleness > 0."),
    _g("async/staleness_violation_count", "async_staleness_violation_groups",
       "Fully async: groups whose staleness exceeded max_staleness_steps.", unit="{group}"),
    _g("async/num_groups_dropped", "async_dropped_groups",
       "Fully async with sample_full_batch: zero-variance groups dropped while collecting the mini-batch.",
       unit="{group}"),
    _g("async/keep_rate", "async_keep_ratio",
       "Fully async with sample_full_batch: mini_batch_size / (mini_batch_size + dropped groups)."),
    _g("async/gen_buffer_qsize_at_wait_start", "async_generation_buffer_groups",
       "Fully async: generated groups waiting in the buffer when the step started waiting.", unit="{group}"),
)

_EVAL = (
    _g("eval/{data_source:.+?}/avg_score", "eval_avg_score",
       "Mean eval reward over the trajectories of one data source (data_source=all: every eval trajectory)."),
    _g("eval/{data_source:.+?}/pass_at_{k:[0-9]+}", "eval_pass_at_k_ratio",
       "pass@k over the prompts of one data source (all: every eval prompt), k = eval_n_samples_per_prompt."),
    _g("eval/{data_source:.+?}/mean_positive_reward", "eval_mean_positive_reward",
       "Mean of max(reward, 0) over the eval trajectories of one data source (all: every one)."),
)

_TIMING = (
    _g("timing/{operation}", "timing_seconds",
       "Seconds of the training step (step) or of one timed part of it (generate, policy_train, sync_weights, "
       "eval, eval_generate, wait_for_generation_buffer, ...).", unit="s"),
)

_VLLM_KEYS = (
    _g(f"{_VLLM}/generation_throughput_tok_s", "vllm_generation_tokens_per_second",
       "Generated tokens (summed over engines) over the window's generation seconds.", unit="{token}/s"),
    _g(f"{_VLLM}/prompt_throughput_tok_s", "vllm_prompt_tokens_per_second",
       "Prompt tokens processed over the window's seconds.", unit="{token}/s"),
    _g(f"{_VLLM}/num_requests_{{kind:running|waiting}}", "vllm_requests",
       "Running or waiting requests summed over engines at the window's end.", unit="{request}"),
    _g(f"{_VLLM}/kv_cache_usage_perc", "vllm_kv_cache_usage_ratio",
       "KV-cache usage fraction (0-1), mean over engines."),
    _g(f"{_VLLM}/prefix_cache_hit_rate", "vllm_prefix_cache_hit_ratio",
       "Prefix-cache hits over queries in the window."),
    _g(f"{_VLLM}/{{kind:ttft|tpot}}_seconds_avg", "vllm_request_latency_seconds",
       "Mean time to first token (ttft) or inter-token latency (tpot) over the window.", unit="s"),
    _g(f"{_VLLM}/draft_acceptance_rate", "vllm_draft_acceptance_ratio",
       "Speculative decoding: accepted over drafted tokens in the window."),
)

# trainer.enable_ray_gpu_monitor: averages over the snapshots since the last flush
_RAY = (
    _pct(f"ray/node.{_NODE}.gpu.{{device_id}}.util", "ray_gpu_utilization_ratio",
         "Ray GPU monitor: utilisation of one GPU (device_id) of one node (part = node index), logged in "
         "percent."),
    _gib(f"ray/node.{_NODE}.gpu.{{device_id}}.mem_used_gb", "ray_gpu_memory_used_bytes",
         "Ray GPU monitor: memory used on one GPU (device_id) of one node (part = node index)."),
    _gib(f"ray/node.{_NODE}.cpu_ram_used_gb", "ray_node_memory_used_bytes",
         "Ray GPU monitor: host RAM used on one node (part = node index)."),
    _pct("ray/gpu.util.avg", "ray_gpu_utilization_avg_ratio",
         "Ray GPU monitor: mean utilisation over all GPUs, logged in percent."),
    _gib("ray/gpu.mem_used_gb.avg", "ray_gpu_memory_used_avg_bytes",
         "Ray GPU monitor: mean memory used over all GPUs."),
    _gib("ray/cpu_ram_used_gb.avg", "ray_node_memory_used_avg_bytes",
         "Ray GPU monitor: mean host RAM used over the nodes."),
)

SPECS: tuple[MetricSpec, ...] = (*_PROGRESS, *_REWARD, *_LOSS, *_POLICY, *_CRITIC, *_GENERATE, *_ASYNC, *_EVAL,
                                 *_TIMING, *_VLLM_KEYS, *_RAY)


# concept name (rl_otel.catalog.concepts) -> selectors of the families above that carry it, in order of preference
CONCEPT_SOURCES: dict[str, tuple[str, ...]] = {
    "reward": (f'{_P}reward_avg_raw_reward{{split="reward"}}',),
    "ref_kl": (f"{_P}policy_kl", f"{_P}loss_avg_kl"),
    "policy_loss": (f"{_P}policy_loss",),
    "clip_ratio": (f"{_P}policy_clip_ratio",),
    "entropy": (f"{_P}policy_entropy",),
    "response_length": (f'{_P}generate_num_tokens{{split="generate", stat="avg"}}',),
    "throughput": (f"{_P}trainer_tokens_per_gpu_per_second",),
    "step_duration": (f'{_P}timing_seconds{{operation="step"}}',),
    "eval_score": (f"{_P}eval_avg_score",),
    "learning_rate": (f"{_P}policy_learning_rate",),
    "grad_norm": (f"{_P}policy_grad_norm",),
    # training-inference mismatch as the mean absolute log-prob difference per token
    "train_infer_logprob_diff": (f'{_P}policy_rollout_train_logprobs_abs_diff{{stat="mean"}}',),
    "staleness": (f'{_P}async_staleness{{stat="max"}}',),
}
CONCEPT_TRANSFORMS: dict[str, str] = {}
# Labels a concept's source must set to line up with the other sources (concepts.Source.set_labels) and labels it
# must copy (concepts.Source.rename_labels: {to: from}).
CONCEPT_SET_LABELS: dict[str, dict[str, str]] = {
    f"{_P}eval_avg_score": {"metric": "reward"},
}
CONCEPT_RENAME_LABELS: dict[str, dict[str, str]] = {
    f"{_P}eval_avg_score": {"taskset": "data_source"},
}
