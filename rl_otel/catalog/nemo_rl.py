"""NeMo-RL's metrics (NVIDIA-NeMo/RL @ 7ea279ab, 2026-08-22), as its ``Logger.log_metrics`` hands them to the
wandb/swanlab/tensorboard/mlflow backends (``f"{prefix}/{name}"``).

Read off NeMo-RL's code (tests/data/frameworks/nemo_rl.tsv): GRPO (sync and async), SFT and DPO trainers, the
setup timers, the async efficiency summary, the sparse weight synchronizer and the Ray GPU monitor. Worker scalars
(``train/*`` of the loss function) are per-microbatch values already divided by the global token (or sequence)
count and summed over microbatches and DP workers: a global token-mean per optimizer step, summed over the optimizer
steps of a training step when there are several. The driver logs from one process.

A key resolves here only in a NeMo-RL run's catalog (``default_catalog("nemo_rl")``): NeMo-RL's ``train/loss``,
``train/grad_norm`` and ``train/lr`` are spelled like veRL's SFT keys, and ``validation/*``, ``timing/*``, ``ray/*``
like other frameworks' keys with other meanings. The three keys veRL's module defines literally are written with an
anonymous placeholder (``train/{_:loss}``): a key is defined literally once in the union of all catalogs, and
default_catalog(framework) leaves out the shared entry of a key the framework's own entries cover.
"""

from __future__ import annotations

from rl_otel.catalog.define import GIB, counter, gauge
from rl_otel.catalog.spec import MetricSpec

_S = "nemo_rl"
_P = "rl_nemo_rl_"
# NeMo-Gym rollout metrics come under train/ and, for validation, the same names under validation/.
_STAGE = "{stage:train|validation}"
_GYM_STATS = "{stat:mean|max|min|median|stddev}"
# the Ray node index of the GPU monitor's keys: no `node` label exists yet (asked for), `part` carries it
_NODE = "{part}"


def _g(key: str, name: str, description: str, *, unit: str = "1", scale: float = 1.0,
       tracker_unit: str = "") -> MetricSpec:
    return gauge(key, _P + name, description, _S, unit=unit, scale=scale, tracker_unit=tracker_unit)


def _c(key: str, name: str, description: str, *, unit: str = "1") -> MetricSpec:
    return counter(key, _P + name, description, _S, unit=unit)


def _pct(key: str, name: str, description: str) -> MetricSpec:
    """A fraction NeMo-RL logs in percent (0-100), served as a 0-1 ratio."""
    return _g(key, name, description, scale=0.01, tracker_unit="%")


def _gib(key: str, name: str, description: str) -> MetricSpec:
    return _g(key, name, description, unit="By", scale=GIB, tracker_unit="GiBy")

_SETUP = (
    _g("timing/setup/{operation}_time_s", "setup_timing_seconds",
       "Seconds grpo.setup() spent in one setup part (vllm_init, policy_init, collective_init, nemo_gym_init, "
       "parallel_wall, worker_setup, other_setup) or in all of it (total_setup); logged once at step 0.", unit="s"),
    _g("timing/setup/parallel_init_enabled", "setup_parallel_init_enabled",
       "1 when the generation and policy workers were initialised in parallel (non-colocated only), logged at "
       "step 0."),
)

_GRPO = (
    # keys veRL's module defines literally, written with an anonymous placeholder: a key is defined literally once
    # in the union of all catalogs (default_catalog(framework) leaves veRL's entries out)
    _g("train/{_:loss}", "train_loss",
       "Total loss of the step (clipped PG + beta * KL + VAPO NLL) as a global token-mean (or sequence-mean for a "
       "sequence-level loss), summed over the optimizer steps of the step; SFT/DPO: their loss function's value."),
    _g("train/{_:grad_norm}", "train_grad_norm",
       "Gradient L2 norm of the optimizer step (rank-0 worker; summed over the optimizer steps of the step)."),
    _g("train/{_:lr}", "train_learning_rate",
       "Learning rate of the optimizer's first param group (mean over microbatches)."),
    _g("train/reward", "train_reward",
       "Mean over the step's samples of the sequence's total_reward (environment reward after scaling/shaping; "
       "with dynamic sampling the unfiltered batch mean)."),
    _g("train/filtered_reward", "train_filtered_reward",
       "Dynamic sampling (DAPO) only: mean total_reward over the samples kept (prompts with non-zero reward std)."),
    _g("train/mean_prompt_length", "train_mean_prompt_length",
       "Mean over the step's samples of the prompt length in tokens.", unit="{token}"),
    _g("train/total_num_tokens", "train_batch_tokens",
       "Sum over the step's samples of the full sequence length (prompt plus all turns) in tokens.",
       unit="{token}"),
    _g("train/advantages/{stat:mean|max|min|sum}", "train_advantages",
       "Advantages over the valid response tokens: mean, max or min (0 if none), or the sum of the whole "
       "[batch, seq] advantages tensor (masked positions included)."),
    _pct("train/baseline_reward/pct_{kind:0|1|mixed}", "train_baseline_reward_groups_ratio",
       "Fraction of samples whose group baseline (the prompt group's mean reward) is exactly 0 (all wrong), exactly "
       "1 (all correct) or neither (mixed: a learning signal); logged in percent."),
    _g("train/num_mask_sample_filtered", "train_mask_sample_filtered_samples",
       "Samples whose loss was masked because the environment flagged them (mask_sample).", unit="{sample}"),
    _g("train/dynamic_sampling_num_gen_batches", "train_dynamic_sampling_generation_batches",
       "Dynamic sampling only: generation batches drawn to fill this step's training batch.", unit="{batch}"),
    _g("train/dynamic_sampling_num_discarded_valid_samples", "train_dynamic_sampling_discarded_samples",
       "Dynamic sampling only: non-zero-std prompts collected beyond the needed batch and dropped.",
       unit="{sample}"),
    _g("train/draft_grad_norm", "train_draft_grad_norm",
       "Speculative-decoding draft model only: gradient norm of the draft head."),
    _g("train/moe/{metric}", "train_moe_metric",
       "MoE models only: a MoE router statistic the worker reports (moe_metrics, e.g. the load-balancing loss)."),
    _g("train/mtp/{metric}", "train_mtp_metric",
       "Multi-token-prediction models only: an MTP statistic the worker reports (mtp_metrics)."),
    # ClippedPGLossFn microbatch metrics
    _g("train/probs_ratio", "train_probs_ratio",
       "Global token-mean of the importance ratio pi_theta / pi_old before clipping."),
    _g("train/probs_ratio_{stat:min|max}", "train_probs_ratio_extreme",
       "Min or max over valid tokens and microbatches of the unclipped importance ratio (-1 if no valid token)."),
    _g("train/probs_ratio_clamped", "train_probs_ratio_clamped",
       "Global token-mean of the importance ratio clamped to [1 - eps_low, 1 + eps_high]."),
    _g("train/probs_ratio_clamped_{stat:min|max}", "train_probs_ratio_clamped_extreme",
       "Min or max over valid tokens of the clamped importance ratio (-1 if no valid token)."),
    _g("train/kl_penalty", "train_kl_penalty",
       "KL(pi_theta || pi_ref) to the reference policy (reference_policy_kl_type estimator, default k3), "
       "normalised like the loss (token-mean for a token-level loss), not multiplied by the coefficient; 0 when "
       "the KL penalty is off."),
    _g("train/token_mult_prob_error", "train_token_mult_prob_error",
       "Global token-mean of exp(|generation logprob - training-policy logprob|): the multiplicative probability "
       "error between the inference engine and the trainer (1.0 = identical)."),
    _g("train/gen_kl_error", "train_gen_kl_error",
       "Global token-mean of KL(P_gen || P_train) between the inference engine's and the training policy's "
       "token log-probs (reference_policy_kl_type estimator)."),
    _g("train/policy_kl_error", "train_policy_kl_error",
       "Global token-mean of KL(P_train || P_gen), the reverse direction of gen_kl_error."),
    _g("train/js_divergence_error", "train_js_divergence_error",
       "Global token-mean of the Jensen-Shannon divergence between the training policy's and the inference "
       "engine's token probabilities."),
    _g("train/sampling_importance_ratio", "train_sampling_importance_ratio",
       "Mean of the off-policy importance weight pi_old / pi_gen after TIS truncation (token-mean, or "
       "sequence-mean with sequence-level importance ratios)."),
    _g("train/is_oob_ratio", "train_importance_weight_out_of_bounds_ratio",
       "Truncated importance sampling only: fraction of tokens (tis/icepop) or sequences (seq-mask-tis) whose "
       "importance weight is outside the truncation bounds."),
    _g("train/approx_entropy", "train_approx_entropy",
       "Global token-mean of -(pi_curr / pi_gen) * log pi_curr: the importance-weighted estimate of the policy "
       "entropy over generated tokens (nats)."),
    _g("train/positive_nll_loss", "train_positive_nll_loss",
       "VAPO only: NLL on the tokens of correct (reward > 0) samples, summed over microbatches of per-microbatch "
       "means."),
    _g("train/num_valid_samples", "train_valid_samples",
       "Unmasked samples seen by the loss, summed over microbatches and DP workers.", unit="{sample}"),
    _g("train/wd", "train_weight_decay",
       "Weight decay of the optimizer's first param group (Megatron backend only; mean over microbatches)."),
    _g("train/global_valid_seqs", "train_global_valid_sequences",
       "Valid (unmasked) sequences in the global batch (mean over microbatches).", unit="{sample}"),
    _g("train/global_valid_toks", "train_global_valid_tokens",
       "Valid (loss-masked-in) tokens in the global batch (mean over microbatches).", unit="{token}"),
    # sequence-level logprob error masking
    _g("train/{stat:max|mean|min}_seq_mult_prob_error", "train_seq_mult_prob_error",
       "Max, mean or min over sequences of the per-sequence token-mean of exp(|generation logprob - training "
       "logprob|) (zeros when the previous log-probs are skipped)."),
    _g("train/{stat:max|mean|min}_seq_mult_prob_error_after_mask", "train_seq_mult_prob_error_after_mask",
       "Max, mean or min per-sequence multiplicative probability error over the sequences kept after "
       "seq_logprob_error_threshold masking."),
    _g("train/masked_correct_pct", "train_masked_correct_ratio",
       "Fraction of the sequences masked for a high logprob error that had reward 1."),
    _g("train/num_masked_seqs_by_logprob_error", "train_logprob_error_masked_sequences",
       "Sequences masked out because their multiplicative probability error exceeded seq_logprob_error_threshold.",
       unit="{sample}"),
    # message-level advantage penalties
    _g("train/invalid_tool_call_rate", "train_invalid_tool_call_ratio",
       "Fraction of assistant messages with an invalid tool call."),
    _g("train/malformed_thinking_rate", "train_malformed_thinking_ratio",
       "Fraction of assistant messages with malformed thinking tags."),
    _g("train/num_invalid_tool_calls", "train_invalid_tool_calls",
       "Assistant messages with an invalid tool call.", unit="{call}"),
    _g("train/num_malformed_thinking", "train_malformed_thinking_messages",
       "Assistant messages with malformed thinking tags.", unit="{turn}"),
    _g("train/num_assistant_messages", "train_assistant_messages",
       "Assistant messages checked for the message-level penalties.", unit="{turn}"),
    # speculative decoding (vLLM)
    _g("train/vllm/spec_num_drafts", "train_spec_drafts",
       "vLLM speculative drafts proposed during this step's generation.", unit="{draft}"),
    _g("train/vllm/spec_num_{kind:draft|accepted}_tokens", "train_spec_tokens",
       "Draft tokens proposed (draft) or accepted (accepted) during this step's generation.", unit="{token}"),
    _g("train/vllm/spec_acceptance_length", "train_spec_acceptance_length",
       "1 + accepted / drafts: mean tokens emitted per draft during the step.", unit="{token}"),
    _g("train/vllm/spec_acceptance_rate", "train_spec_acceptance_ratio",
       "Accepted over drafted tokens during the step."),
    _g("train/vllm/spec_acceptance_rate-pos-{k:[0-9]+}", "train_spec_position_acceptance_ratio",
       "Acceptance rate of draft position k during the step."),
    # native rollouts
    _g("train/total_turns", "train_total_turns", "Sum over samples of the turns (generation rounds).",
       unit="{turn}"),
    _g("train/{stat:avg|max}_turns_per_sample", "train_turns_per_sample",
       "Mean (avg) or max over samples of the turns per sample (native rollouts).", unit="{turn}"),
    _g("train/natural_termination_rate", "train_natural_termination_ratio",
       "Fraction of samples the environment terminated (episode ended)."),
    _g("train/truncation_rate", "train_truncation_ratio", "Fraction of samples truncated at the max sequence length."),
    _g("train/max_turns_reached_rate", "train_max_turns_reached_ratio",
       "Fraction of samples still active when max_rollout_turns was reached."),
    _g("train/mean_total_tokens_per_sample", "train_mean_total_tokens_per_sample",
       "Mean over samples of the full conversation length in tokens (prompt, generations and environment "
       "observations).", unit="{token}"),
    _g("train/{stat:mean|max}_gen_tokens_per_sample", "train_gen_tokens_per_sample",
       "Mean or max over samples of the generated (assistant) tokens summed over the sample's turns: the response "
       "length.", unit="{token}"),
    _g("train/mean_env_tokens_per_sample", "train_mean_env_tokens_per_sample",
       "Mean over samples of the environment-observation tokens per sample.", unit="{token}"),
    _g("train/{stat:mean|max|min}_total_reward", "train_total_reward",
       "Mean, max or min over samples of total_reward (async engine path)."),
    _g("train/mean_reward_low", "train_mean_reward_low",
       "Mean reward of the low-length partition (length-reward diagnostics, when configured)."),
    _g("train/{reason:reasoning_equal_to_final_answer|empty_final_answer|unwanted_token|malformed_think_tag}_rate",
       "train_reward_penalty_ratio",
       "Fraction of samples penalised for one reason: duplicated reasoning, an empty final answer, unwanted tokens "
       "or malformed think tags."),
    _g("train/timing/rollout/{phase}", "train_rollout_phase_seconds",
       "Seconds of one NeMo-Gym rollout phase (await_results, postprocess_results, aggregate_metrics, ...) in this "
       "step.", unit="s"),
    # async GRPO
    _g("train/buffer_size", "train_replay_buffer_groups",
       "Async GRPO: trajectory groups in the replay buffer after sampling this step.", unit="{group}"),
    _g("train/avg_trajectory_age", "train_avg_trajectory_age",
       "Async GRPO: mean over the sampled trajectory groups of (current weight version - the version that "
       "generated them), the off-policy staleness in steps.", unit="{step}"),
    _g("train/trajectory_duration_s", "train_trajectory_duration_seconds",
       "Async GRPO: mean over trajectory groups of the group's generation wall time.", unit="s"),
    _g("train/trajectory_duration_s/{stat:max|p95}", "train_trajectory_duration_distribution_seconds",
       "Async GRPO: max or 95th percentile over trajectory groups of the group's generation wall time.", unit="s"),
)

# NeMo-Gym rollout metrics (and the async engine path's percentiles), under train/ and validation/
_GYM = (
    _g(f"{_STAGE}/turns_per_sample/{{stat:mean|max|min|median|stddev|p95|p99}}", "rollout_turns_per_sample",
       "Turns (user messages) per sample, a statistic over the batch's samples (NeMo-Gym or async engine "
       "rollouts).", unit="{turn}"),
    _g(f"{_STAGE}/total_tokens_per_sample/{_GYM_STATS}", "rollout_total_tokens_per_sample",
       "Total tokens per sample, a statistic over the batch's samples (NeMo-Gym rollouts).", unit="{token}"),
    _g(f"{_STAGE}/gen_tokens_per_sample/{_GYM_STATS}", "rollout_gen_tokens_per_sample",
       "Assistant (generated) tokens per sample, a statistic over the batch's samples (NeMo-Gym rollouts).",
       unit="{token}"),
    _g(f"{_STAGE}/max_gen_tokens_per_turn/{{stat:mean|max|min|median|stddev|p95}}", "rollout_max_gen_tokens_per_turn",
       "The sample's longest single generation in tokens, a statistic over the batch's samples.", unit="{token}"),
    _g(f"{_STAGE}/total_reward/{_GYM_STATS}", "rollout_total_reward",
       "The sample's total_reward (NeMo-Gym full_result.reward), a statistic over the batch's samples."),
    # last: a NeMo-Gym agent's own fields, four segments ending in a statistic
    _g(f"{_STAGE}/{{agent}}/{{metric}}/{_GYM_STATS}", "rollout_agent_metric",
       "A numeric full_result field (metric) returned by the NeMo-Gym agent (role), a statistic over the agent's "
       "samples."),
)

_PERFORMANCE = (
    _g("performance/samples_per_sec", "performance_samples_per_second",
       "Samples (prompts x generations) of the step divided by the step's total time, whole cluster.",
       unit="{sample}/s"),
    _g("performance/samples_per_sec_per_gpu", "performance_samples_per_gpu_per_second",
       "performance/samples_per_sec divided by the total GPUs.", unit="{sample}/s"),
    _g("performance/tokens_per_sec", "performance_tokens_per_second",
       "train/total_num_tokens (prompt + response) divided by the step's total time, whole cluster.",
       unit="{token}/s"),
    _g("performance/tokens_per_sec_per_gpu", "performance_tokens_per_gpu_per_second",
       "performance/tokens_per_sec divided by the total GPUs.", unit="{token}/s"),
    _g("performance/{operation:policy_training|policy_and_reference_logprobs|training_worker_group|generation}"
       "_tokens_per_sec_per_gpu", "performance_operation_tokens_per_gpu_per_second",
       "Tokens of the step divided by the time of one operation (policy training, policy and reference logprobs, "
       "both: training_worker_group, or generation) and by the GPUs doing it.", unit="{token}/s"),
    _g("performance/{operation:training_worker_group|generation}_tokens_per_sec",
       "performance_operation_tokens_per_second",
       "Per-GPU tokens per second of the training worker group or of generation times their GPUs.",
       unit="{token}/s"),
    _g("performance/average_token_imbalance", "performance_average_token_imbalance_ratio",
       "1 - mean(worker tokens / max worker tokens) over the generation workers: the idle fraction expected from "
       "load imbalance."),
    _g("performance/training_worker_idle_time_ratio", "performance_training_worker_idle_time_ratio",
       "Async non-colocated only: exposed generation time over training + logprob + exposed generation + refit "
       "time."),
    _g("performance/train_flops_per_gpu", "performance_train_floating_point_operations_per_gpu_per_second",
       "Achieved training FLOP per second per GPU (total FLOPs / training seconds / ranks; logged in TFLOPS), only "
       "when FLOPs tracking is available and packing is off.", unit="{flop}/s", scale=1e12, tracker_unit="T{flop}/s"),
    _g("performance/train_fp_utilization", "performance_train_fp_utilization_ratio",
       "Model FLOPs utilisation: achieved over theoretical peak TFLOPS (0-1)."),
)

_TIMING = (
    _g("timing/train/valid_tokens_per_sec_per_gpu", "timing_train_valid_tokens_per_gpu_per_second",
       "train/global_valid_toks (loss tokens) divided by the step's total time and by the total GPUs.",
       unit="{token}/s"),
    _g("timing/train/{operation:.+}", "timing_train_seconds",
       "Seconds of the training step (total_step_time) or of a timed part of it (generation, policy_training, "
       "get_logprobs/shard_data, idle/buffer_starvation, ...), summed per timer label within the step.", unit="s"),
    _g("timing/validation/total_validation_time", "timing_validation_seconds",
       "Wall seconds of the validation pass.", unit="s"),
    _g("timing/validation-{split}/total_validation_time", "timing_validation_dataset_seconds",
       "DPO: wall seconds validating the validation dataset named in the key (split).", unit="s"),
)

# print_efficiency_summary (async GRPO): cumulative since training start
_EFFICIENCY = (
    _c("efficiency/{kind:init|idle|wasted}/{operation}_s", "efficiency_category_seconds",
       "Async GRPO: seconds spent in one efficiency category (kind/operation, e.g. idle/buffer_starvation) since "
       "training start; collector-thread categories are summed over concurrent threads.", unit="s"),
    _pct("efficiency/{kind:init|idle|wasted}/{operation}_pct", "efficiency_category_wall_time_ratio",
       "Async GRPO: seconds in one efficiency category since training start over the total wall time (logged in "
       "percent)."),
    _c("efficiency/thread_seconds_total_s", "efficiency_thread_seconds",
       "Async GRPO: sum of the collector-thread categories since training start.", unit="s"),
    _c("efficiency/total_waste_s", "efficiency_waste_seconds",
       "Async GRPO: sum of the wall-clock waste categories since training start (capped at the wall time).",
       unit="s"),
    _c("efficiency/productive_time_s", "efficiency_productive_seconds",
       "Async GRPO: wall seconds since training start minus the wasted ones.", unit="s"),
    _c("efficiency/total_wall_time_s", "efficiency_wall_seconds", "Async GRPO: wall seconds since training start.",
       unit="s"),
    _pct("efficiency/efficiency_pct", "efficiency_productive_ratio",
       "Async GRPO: productive over total wall time since training start (logged in percent)."),
)

_REFIT = (
    _g("refit/delta/{kind:changed|total}_elements", "refit_delta_elements",
       "Sparse weight sync: weight elements changed since the last sync (changed) or considered (total).",
       unit="{element}"),
    _pct("refit/delta/changed_pct", "refit_delta_changed_ratio",
       "Sparse weight sync: fraction of the weight elements changed since the last sync (logged in percent)."),
    _pct("refit/delta_verify/mismatch_pct", "refit_delta_verify_mismatch_ratio",
       "Sparse weight sync: fraction of the verification samples that mismatched after the update (logged in "
       "percent)."),
    _g("refit/delta_verify/mean_abs", "refit_delta_verify_mean_abs_error",
       "Sparse weight sync: mean absolute verification error after the update."),
    _g("refit/transfer/payloads", "refit_transfer_payloads", "Sparse weight sync: payloads sent in the transfer."),
    _g("refit/transfer/{operation:relay_flush|global_commit}_s", "refit_transfer_seconds",
       "Sparse weight sync: seconds to flush the relay (relay_flush) or for the global commit (global_commit).",
       unit="s"),
)

_VALIDATION = (
    _g("validation/accuracy", "validation_accuracy",
       "GRPO: mean over all validation rollouts of total_reward (the validation score; accuracy for 0/1 "
       "rewards)."),
    _g("validation/avg_length", "validation_avg_length",
       "GRPO: mean over validation batches of the generated tokens per sample.", unit="{token}"),
    _g("validation/pass_k", "validation_pass_at_k_ratio",
       "GRPO with several generations per prompt: fraction of validation prompts with any rollout reward > 0."),
    _g("validation/val_loss", "validation_loss", "SFT: token-weighted mean NLL over the validation batches."),
)

_SFT_DPO = (
    _g("train/num_unmasked_tokens", "train_unmasked_tokens",
       "SFT: loss tokens summed over microbatches and DP workers.", unit="{token}"),
    _g("train/train_fp_utilization", "train_fp_utilization_ratio",
       "SFT: model FLOPs utilisation, achieved over theoretical peak TFLOPS (0-1)."),
    _g("train/sft_loss", "train_sft_loss",
       "DPO: NLL (SFT) loss on the chosen responses, summed over microbatches of globally normalised values."),
    _g("train/preference_loss", "train_preference_loss",
       "DPO: preference loss -log sigmoid(beta * (chosen margin - rejected margin)), summed over microbatches of "
       "globally normalised values."),
    _g("train/accuracy", "train_preference_accuracy_ratio",
       "DPO: fraction of pairs whose chosen implicit reward exceeds the rejected one."),
    _g("train/rewards_{kind:chosen|rejected}_mean", "train_implicit_rewards",
       "DPO: mean implicit reward beta * (log pi - log pi_ref) of the chosen or rejected responses."),
    _g("validation-{split}/{metric:accuracy|loss|sft_loss|preference_loss|rewards_chosen_mean|rewards_rejected_mean}",
       "validation_dataset_metric",
       "DPO: a validation metric (preference accuracy, DPO loss, SFT loss, preference loss, chosen or rejected "
       "implicit reward) over the validation dataset named in the key (split)."),
    _g("validation-{split}/num_valid_samples", "validation_dataset_valid_samples",
       "DPO: valid samples of the validation dataset named in the key (split).", unit="{sample}"),
    _g("validation-{split}/global_valid_seqs", "validation_dataset_valid_sequences",
       "DPO: valid sequences of the validation dataset named in the key (split).", unit="{sample}"),
    _g("validation-{split}/global_valid_toks", "validation_dataset_valid_tokens",
       "DPO: valid tokens of the validation dataset named in the key (split).", unit="{token}"),
)

# RayGpuMonitorLogger: its step is the seconds since the monitor started, not the training step
_RAY = (
    _pct(f"ray/node.{_NODE}.gpu.{{device_id}}.util", "ray_gpu_utilization_ratio",
       "Ray GPU monitor: utilisation of one GPU (device_id) of one node (part = node index), logged in percent."),
    _gib(f"ray/node.{_NODE}.gpu.{{device_id}}.mem_gb", "ray_gpu_memory_used_bytes",
       "Ray GPU monitor: memory used on one GPU (device_id) of one node (part = node index)."),
    _gib(f"ray/node.{_NODE}.mem_gb", "ray_node_memory_used_bytes",
       "Ray GPU monitor: host RAM used on one node (part = node index)."),
    _gib(f"ray/node.{_NODE}.mem_total_gb", "ray_node_memory_total_bytes",
       "Ray GPU monitor: host RAM of one node (part = node index)."),
    # TensorBoard and MLflow prefix the step metric's name too: ray/ray/ray_step
    _g("ray/{_:ray/ray|ray}_step", "ray_monitor_elapsed_seconds",
       "Ray GPU monitor: seconds since the monitor started (its W&B step metric).", unit="s"),
)

SPECS: tuple[MetricSpec, ...] = (*_SETUP, *_GRPO, *_GYM, *_PERFORMANCE, *_TIMING, *_EFFICIENCY, *_REFIT,
                                 *_VALIDATION, *_SFT_DPO, *_RAY)


# concept name (rl_otel.catalog.concepts) -> selectors of the families above that carry it, in order of preference
CONCEPT_SOURCES: dict[str, tuple[str, ...]] = {
    "reward": (f"{_P}train_reward", f'{_P}rollout_total_reward{{stage="train", stat="mean"}}',
               f'{_P}train_total_reward{{stat="mean"}}'),
    "ref_kl": (f"{_P}train_kl_penalty",),
    "policy_loss": (f"{_P}train_loss",),
    "importance_ratio_max": (f'{_P}train_probs_ratio_extreme{{stat="max"}}',),
    "entropy": (f"{_P}train_approx_entropy",),
    "response_length": (f'{_P}train_gen_tokens_per_sample{{stat="mean"}}',
                        f'{_P}rollout_gen_tokens_per_sample{{stage="train", stat="mean"}}'),
    "throughput": (f"{_P}performance_tokens_per_second",),
    "step_duration": (f'{_P}timing_train_seconds{{operation="total_step_time"}}',),
    "eval_score": (f"{_P}validation_accuracy",),
    "learning_rate": (f"{_P}train_learning_rate",),
    "grad_norm": (f"{_P}train_grad_norm",),
    "mfu": (f"{_P}performance_train_fp_utilization_ratio", f"{_P}train_fp_utilization_ratio"),
    # training-inference mismatch: a KL (gen_kl_error), and a probability ratio >= 1 (token_mult_prob_error)
    "train_infer_kl": (f"{_P}train_gen_kl_error",),
    "train_infer_ratio_deviation": (f"{_P}train_token_mult_prob_error",),
    "staleness": (f"{_P}train_avg_trajectory_age",),
}
# PromQL transforms a source needs to carry its concept (``{}`` stands for the selector), as concepts.Source has
CONCEPT_TRANSFORMS: dict[str, str] = {
    f"{_P}train_token_mult_prob_error": "abs({} - 1)",  # >= 1 by construction: exp(|logprob difference|)
}
# Labels a concept's source must set to line up with the other sources (concepts.Source.set_labels).
CONCEPT_SET_LABELS: dict[str, dict[str, str]] = {
    f"{_P}validation_accuracy": {"metric": "reward"},  # the mean total_reward of the validation rollouts
}
