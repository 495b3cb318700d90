"""TRL's metrics (TRL 1.16.0 trainers, with the transformers 5.23.0 ``Trainer`` keys they all log) and the legacy
PPOTrainer's keys (TRL docs: "Logging").

TRL trainers subclass ``transformers.Trainer``: each step log carries ``loss``, ``grad_norm`` and
``learning_rate`` from transformers plus the trainer's own averaged metrics; ``train()`` ends with one summary log
(``train_runtime``, ``total_flos``, ...). During ``evaluate()`` TRL's ``log()`` prefixes its own metrics with
``eval_``: those twins are derived here from the train entries (:func:`eval_twin`), key ``eval_`` + key, name
``rl_eval_`` + the train name without ``rl_``.
"""

from __future__ import annotations

from rl_otel.catalog.define import (
    IMPORTANCE_RATIO_BUCKETS,
    KL_BUCKETS,
    LENGTH_BUCKETS,
    LOGPROB_BUCKETS,
    SIGNED_BUCKETS,
    counter,
    gauge,
    histogram,
)
from rl_otel.catalog.spec import MetricSpec

_S = "trl"
_T = "transformers"

# A reward function's name: its __name__ (may be '<lambda>'), a callable's class name, an environment's class
# name, or the last '/'-part of a reward model's id (dots and dashes); '.+' keeps a full 'org/model' id too.
_REWARD_FUNC = "{reward_func:.+}"
# The name of one dataset of a dict eval_dataset (transformers prefixes its keys with eval_{name}_).
_EVAL_SPLIT = "eval_{split}"


def eval_twin(spec: MetricSpec, description: str = "") -> MetricSpec:
    """The entry of ``spec``'s evaluation twin: key ``eval_`` + key, name ``rl_eval_`` + name without ``rl_``.

    TRL's ``log()`` (and transformers' ``evaluate()`` for ``loss``) prefixes the key with ``eval_`` when the value
    comes from the eval batches of one ``evaluate()`` call; the quantity and its unit are the train entry's.
    Twin names live beside Trinity-RFT's ``rl_eval_metric*`` families; ``Catalog()`` rejects a clash.
    """
    if not spec.name.startswith("rl_"):
        raise ValueError(f"{spec.name!r}: catalog names start with 'rl_'")
    if not description:
        description = (f"Evaluation twin of {spec.key} (the same quantity on the eval batches of one evaluate() "
                       f"call, averaged over them): {spec.description}")
    return MetricSpec(key="eval_" + spec.key, name="rl_eval_" + spec.name[len("rl_"):], kind=spec.kind,
                      unit=spec.unit, description=description, source=spec.source, scale=spec.scale,
                      buckets=spec.buckets, tracker_unit=spec.tracker_unit)


# --- transformers.Trainer (every TRL trainer) -------------------------------------------------------------------
LOSS = gauge("loss", "rl_loss",
             "Training loss (what the trainer's compute_loss returned) averaged over the optimizer steps since the "
             "previous log and across processes (transformers Trainer._maybe_log_save_evaluate).", _T)
GRAD_NORM = gauge("grad_norm", "rl_grad_norm",
                  "Total L2 norm of the gradients before clipping at the last optimizer step of the logging interval.",
                  _T)
LEARNING_RATE = gauge("learning_rate", "rl_learning_rate", "Scheduler learning rate at log time (last value).", _T)

_TRANSFORMERS_STEP = (
    LOSS, GRAD_NORM, LEARNING_RATE,
    gauge("epoch", "rl_epoch",
          "Fractional epoch position (state.epoch), added by Trainer.log to every train, summary and eval log.", _T,
          unit="{epoch}"),
    counter("num_input_tokens_seen", "rl_input_tokens_seen",
            "Input tokens seen over the run, summed over processes and restored on resume (only with "
            "include_num_input_tokens_seen; GRPO/RLOO/Distillation add prompt + completion tokens).", _T,
            unit="{token}"),
    gauge("train_tokens_per_second", "rl_train_tokens_per_second",
          "Tokens seen since this train() call started divided by the seconds since it started (a cumulative "
          "average; only with include_num_input_tokens_seen).", _T, unit="{token}/s"),
)

_TRANSFORMERS_SUMMARY = (
    gauge("train_runtime", "rl_train_runtime_seconds",
          "Wall-clock seconds of the train() call, in its summary log (with include_num_input_tokens_seen also in "
          "each step log: seconds since train() started).", _T, unit="s"),
    gauge("train_samples_per_second", "rl_train_samples_per_second",
          "Summary log: samples of the steps run in this train() call divided by train_runtime.", _T,
          unit="{sample}/s"),
    gauge("train_steps_per_second", "rl_train_steps_per_second",
          "Summary log: optimizer steps run in this train() call divided by train_runtime.", _T, unit="{step}/s"),
    counter("total_flos", "rl_floating_point_operations",
            "Summary log: floating point operations accumulated over the run (state.total_flos, 6 x parameters x "
            "input tokens; 0 for GRPO, RLOO and OnlineDPO).", _T, unit="{flop}"),
    gauge("train_loss", "rl_train_average_loss",
          "Summary log: mean training loss over all optimizer steps of the train() call.", _T),
    # TrainerMemoryTracker (skip_memory_metrics=False): init and train deltas in the train summary log; the eval_
    # ones are only in evaluate()'s return value.
    gauge("{stage:init|train|eval}_mem_{kind:cpu|gpu}_alloc_delta", "rl_trainer_memory_allocated_delta_bytes",
          "CPU or GPU memory allocated (end - begin) during the Trainer's __init__, train() or evaluate() "
          "(only with skip_memory_metrics=False).", _T, unit="By"),
    gauge("{stage:init|train|eval}_mem_{kind:cpu|gpu}_peaked_delta", "rl_trainer_memory_peaked_delta_bytes",
          "Extra CPU or GPU peak memory above the end value during the Trainer's __init__, train() or evaluate() "
          "(only with skip_memory_metrics=False).", _T, unit="By"),
    gauge("before_init_mem_{kind:cpu|gpu}", "rl_trainer_memory_before_init_bytes",
          "CPU (process RSS) or GPU (allocated) memory in use when the Trainer's __init__ started (only with "
          "skip_memory_metrics=False).", _T, unit="By"),
)

_TRANSFORMERS_EVAL = (
    eval_twin(LOSS, "Mean of the per-batch losses of one evaluate() call (non-finite ones dropped with "
                    "logging_nan_inf_filter); TRL trainers get it from their compute_loss through prediction_step."),
    gauge("eval_runtime", "rl_eval_runtime_seconds",
          "Wall-clock seconds of one evaluate() call (minus model preparation time).", _T, unit="s"),
    gauge("eval_samples_per_second", "rl_eval_samples_per_second",
          "Eval samples of one evaluate() call divided by eval_runtime.", _T, unit="{sample}/s"),
    gauge("eval_steps_per_second", "rl_eval_steps_per_second",
          "Eval batches of one evaluate() call divided by eval_runtime.", _T, unit="{step}/s"),
    gauge("eval_model_preparation_time", "rl_eval_model_preparation_time_seconds",
          "Seconds accelerate took to prepare the model for evaluation (only when evaluate() runs before the model "
          "was prepared).", _T, unit="s"),
    # eval_dataset given as a dict: transformers' keys carry the dataset's dict key (TRL's own eval_ keys do not).
    gauge(f"{_EVAL_SPLIT}_loss", "rl_eval_dataset_loss",
          "Mean eval loss of one evaluate() call on the eval dataset under that dict key (dict eval_dataset).", _T),
    gauge(f"{_EVAL_SPLIT}_runtime", "rl_eval_dataset_runtime_seconds",
          "Wall-clock seconds of one evaluate() call on the eval dataset under that dict key.", _T, unit="s"),
    gauge(f"{_EVAL_SPLIT}_samples_per_second", "rl_eval_dataset_samples_per_second",
          "Eval samples per second on the eval dataset under that dict key.", _T, unit="{sample}/s"),
    gauge(f"{_EVAL_SPLIT}_steps_per_second", "rl_eval_dataset_steps_per_second",
          "Eval batches per second on the eval dataset under that dict key.", _T, unit="{step}/s"),
    gauge(f"{_EVAL_SPLIT}_model_preparation_time", "rl_eval_dataset_model_preparation_time_seconds",
          "Seconds accelerate took to prepare the model before evaluating the eval dataset under that dict key.",
          _T, unit="s"),
)

# --- TRL trainers: keys with an eval_ twin --------------------------------------------------------------------
REWARD = gauge("reward", "rl_reward",
               "GRPO/RLOO: mean over the gathered batch of the weighted sum of the reward functions (NaN rows "
               "excluded), before advantage normalisation and, for RLOO, before the KL penalty.", _S)
KL = gauge("kl", "rl_kl",
           "KL between the policy and the reference model, only when beta != 0: GRPO token mean of the k3 estimator, "
           "RLOO token mean of old_logp - ref_logp (k1, can be negative), KTO batch KL estimate.", _S)
ENTROPY = gauge("entropy", "rl_entropy",
                "Mean per-token entropy (nats) of the policy's temperature-scaled next-token distribution over "
                "completion tokens (SFT: label tokens), token-weighted over all processes.", _S)

_WITH_EVAL_TWIN = (
    counter("num_tokens", "rl_trained_tokens",
            "Running total of tokens trained on: GRPO/RLOO/Distillation prompt + completion tokens "
            "(state.num_input_tokens_seen, survives resume), DPO/SFT/Reward/KTO/TPO attention-mask tokens "
            "(restarts at 0 on resume).", _S, unit="{token}"),
    # GRPO / RLOO generation
    gauge("completions/{stat:mean|min|max}_length", "rl_completions_length",
          "Completion length in tokens over the generation batch gathered from all processes (mean, min or max; "
          "with tools only model-generated tokens count).", _S, unit="{token}"),
    gauge("completions/{stat:mean|min|max}_terminated_length", "rl_completions_terminated_length",
          "Length in tokens of the completions that ended with EOS (mean, min or max; 0 when none did).", _S,
          unit="{token}"),
    gauge("completions/clipped_ratio", "rl_completions_clipped_ratio",
          "Fraction of completions cut at the maximum length (last token neither EOS nor pad).", _S),
    gauge("tools/call_frequency", "rl_tools_calls_per_completion",
          "Tool calls summed over all processes divided by the number of completions (only with tools).", _S,
          unit="{call}"),
    gauge("tools/failure_frequency", "rl_tools_failure_ratio",
          "Fraction of tool calls that failed, over all processes (0 when no call; only with tools).", _S),
    gauge(f"rewards/{_REWARD_FUNC}/{{stat:mean|std}}", "rl_function_reward",
          "Raw (unweighted) reward of one reward function or reward model: nanmean or Bessel-corrected nanstd over "
          "the gathered batch; None when it scored no sample of the interval.", _S),
    REWARD,
    gauge("reward_std", "rl_reward_std",
          "Bessel-corrected NaN-aware std of the weighted reward over the whole gathered batch (not per group).",
          _S),
    gauge("frac_reward_zero_std", "rl_reward_zero_std_ratio",
          "Fraction of samples whose group of num_generations completions has zero reward std (no advantage "
          "signal); with scale_rewards='batch' it tests the batch std (0 or 1).", _S),
    gauge("sampling/sampling_logp_difference/{stat:mean|max}", "rl_sampling_logp_difference",
          "Only with vLLM importance-sampling correction: |trainer logprob - vLLM sampling logprob| over "
          "completion tokens (nats), mean over processes or max.", _S),
    gauge("sampling/importance_sampling_ratio/{stat:min|mean|max}", "rl_sampling_importance_ratio",
          "Only with vLLM importance-sampling correction: the truncated importance ratio pi_old / pi_vllm over "
          "tokens (or sequences), min, mean or max over processes.", _S),
    # GRPO / RLOO loss
    KL,
    ENTROPY,
    gauge("policy_loss", "rl_policy_loss",
          "GRPO with an entropy bonus: the policy term of the loss before the bonus, nanmean over processes.", _S),
    gauge("aux_loss", "rl_aux_loss",
          "Router load-balancing auxiliary loss of MoE models (output_router_logits), mean over processes.", _S),
    gauge("clip_ratio/{region:low|high|region}_{stat:mean|min|max}", "rl_clip_ratio",
          "Fraction of completion tokens (RLOO: sequences) whose importance ratio was clipped with an advantage of "
          "matching sign: region low (ratio < 1 - epsilon_low, A < 0), high (> 1 + epsilon_high, A > 0) or either; "
          "stat mean over tokens, min or max over sequences of the per-sequence fraction.", _S),
    gauge("cispo_clip_ratio", "rl_cispo_clip_ratio",
          "loss_type='cispo': fraction of completion tokens with ratio > epsilon_high and positive advantage.", _S),
    gauge("vespo/phi_seq_mean", "rl_vespo_phi_sequence_mean",
          "loss_type='vespo': mean gamma weight phi(w) of the sequence-level importance ratio.", _S),
    # DPO, KTO, OnlineDPO, ORPO, CPO, TPO
    gauge("rewards/{kind:chosen|rejected}", "rl_preference_reward",
          "Mean implicit reward of the chosen or rejected completions: beta x (policy - reference) log-probability "
          "summed over completion tokens (ORPO/CPO: beta x average token log-probability of the policy).", _S),
    gauge("rewards/accuracies", "rl_preference_reward_accuracy_ratio",
          "Fraction of preference pairs whose chosen reward exceeds the rejected reward.", _S),
    gauge("rewards/margins", "rl_preference_reward_margin",
          "Mean over pairs of the chosen reward minus the rejected reward.", _S),
    gauge("logps/{kind:chosen|rejected}", "rl_preference_logps",
          "Mean policy log-probability (nats) of the chosen or rejected completions, summed over completion tokens "
          "(ORPO/CPO: average token log-probability).", _S),
    gauge("logits/{kind:chosen|rejected}", "rl_preference_logits",
          "Mean over the chosen or rejected completion tokens of the vocabulary-mean next-token logit.", _S),
    gauge("mean_token_accuracy", "rl_token_accuracy_ratio",
          "Fraction of target tokens (DPO/TPO: chosen completion tokens; SFT: label tokens) whose label is the "
          "argmax prediction, over all processes.", _S),
    # RewardTrainer
    gauge("{stat:min|mean|max}_reward", "rl_reward_model_score",
          "RewardTrainer: minimum, mean or maximum reward-model score over the gathered chosen and rejected batch.",
          _S),
    gauge("accuracy", "rl_reward_model_accuracy_ratio",
          "RewardTrainer: fraction of pairs where score(chosen) > score(rejected), mean over processes.", _S),
    gauge("margin", "rl_reward_model_margin",
          "RewardTrainer: mean score(chosen) - score(rejected), mean over processes.", _S),
    # ORPO / CPO
    gauge("nll_loss", "rl_nll_loss",
          "ORPO/CPO: cross-entropy of the policy on the chosen completions (the SFT part of the loss).", _S),
    gauge("log_odds_ratio", "rl_orpo_log_odds_ratio",
          "ORPO: mean over pairs of log sigmoid(log odds(chosen) - log odds(rejected)), the odds-ratio term before "
          "beta.", _S),
    gauge("log_odds_chosen", "rl_orpo_log_odds_chosen",
          "ORPO: mean over pairs of log odds(chosen) - log odds(rejected) from average token log-probabilities.", _S),
    # A2PO
    gauge("v_star", "rl_a2po_v_star", "A2PO: mean estimated optimal value V*(prompt) of the batch prompts.", _S),
    gauge("implicit_reward", "rl_a2po_implicit_reward",
          "A2PO: mean beta2 x (sequence log-probability of the policy - of the reference).", _S),
    gauge("advantage", "rl_a2po_advantage", "A2PO: mean regression target reward - V* (optimal advantage).", _S),
    # IW-OPD (this process only)
    gauge("iw_opd/mean_advantage", "rl_iw_opd_advantage",
          "IW-OPD: mean weighted advantage (teacher logp - rollout logp) x weight over valid tokens, this process "
          "only.", _S),
    gauge("iw_opd/mean_abs_advantage", "rl_iw_opd_abs_advantage",
          "IW-OPD: mean |teacher logp - rollout logp| over valid tokens, this process only.", _S),
    gauge("iw_opd/{stat:mean|min|max}_weight", "rl_iw_opd_weight",
          "IW-OPD: importance weight 1 + gamma x (1 - prefix |A| share) of the valid tokens (mean, min or max), this "
          "process only.", _S),
    # SDPO / SDFT self-distillation
    gauge("self_distillation/distillation_loss", "rl_self_distillation_loss",
          "SDPO/SDFT: self-distillation loss (student vs teacher with context), mean over processes; 0 when no "
          "sample was re-prompted.", _S),
    gauge("{kind:sdpo|sdft}/distillation_loss", "rl_self_distillation_trainer_loss",
          "SDPO/SDFT: the self-distillation loss again, under the trainer's lower-cased name.", _S),
    gauge("self_distillation/server_logprob_abs_diff", "rl_self_distillation_server_logprob_abs_diff",
          "SDPO/SDFT with a teacher server: mean |student logp - server teacher logp| over loss tokens.", _S),
    gauge("self_distillation/policy_loss", "rl_self_distillation_policy_loss",
          "SDPO: clipped policy-gradient loss term, mean over processes.", _S),
    gauge("self_distillation/reward_{stat:mean|std|min|max}", "rl_self_distillation_reward",
          "SDPO reward diagnostics: mean, std, minimum or maximum reward over the gathered batch.", _S),
    gauge("self_distillation/group_reward_std_mean", "rl_self_distillation_group_reward_std",
          "SDPO reward diagnostics: mean over prompt groups of the group reward std.", _S),
    gauge("self_distillation/flat_group_fraction", "rl_self_distillation_flat_group_ratio",
          "SDPO reward diagnostics: fraction of prompt groups whose reward std is within the flat tolerance.", _S),
    gauge("self_distillation/rewards/{reward_func}", "rl_self_distillation_function_reward",
          "SDPO: nanmean of one reward function over the batch, averaged over processes.", _S),
    gauge("self_distillation/success_group_fraction", "rl_self_distillation_success_group_ratio",
          "SDPO: fraction of prompt groups with at least one successful completion.", _S),
    gauge("self_distillation/success_sample_fraction", "rl_self_distillation_success_sample_ratio",
          "SDPO: fraction of samples that got a successful sibling solution as teacher context.", _S),
    gauge("self_distillation/feedback_available_fraction", "rl_self_distillation_feedback_available_ratio",
          "SDPO: fraction of samples with environment feedback available.", _S),
    gauge("self_distillation/feedback_used_fraction", "rl_self_distillation_feedback_used_ratio",
          "SDPO: fraction of samples whose teacher context used feedback.", _S),
    gauge("self_distillation/reprompt_sample_fraction", "rl_self_distillation_reprompt_sample_ratio",
          "SDPO: fraction of samples re-prompted for self-distillation.", _S),
)

_TWIN_DESCRIPTIONS = {
    "num_tokens": "Evaluation twin of num_tokens: the train running total at evaluation time (eval batches are not "
                  "counted).",
}
EVAL_TWINS = tuple(eval_twin(spec, _TWIN_DESCRIPTIONS.get(spec.key, "")) for spec in _WITH_EVAL_TWIN)

# --- TRL trainers: train-only keys ----------------------------------------------------------------------------
_TRAIN_ONLY = (
    gauge("step_time", "rl_step_time_seconds",
          "GRPO/RLOO/Distillation: wall seconds of the training_step calls of one optimizer step (including "
          "generation when it happens inside), this process's own timer.", _S, unit="s"),
    gauge("entropy_coef", "rl_entropy_coef",
          "GRPO with an entropy bonus: current entropy coefficient (constant, or adapted toward entropy_target).",
          _S),
    # OnlineDPO (trl.experimental; no eval keys); objective/kl and objective/entropy: see the legacy PPO entries
    gauge("objective/non_score_reward", "rl_objective_non_score_reward",
          "OnlineDPO: mean over completions of -beta x sequence KL to the reference model.", _S),
    gauge("objective/rlhf_reward", "rl_objective_rlhf_reward",
          "OnlineDPO: mean over completions of the reward-function score plus the non-score (KL) reward.", _S),
    gauge("objective/scores", "rl_objective_scores",
          "OnlineDPO: mean summed reward-function score (after missing_eos_penalty) over all completions.", _S),
    gauge("objective/scores_margin", "rl_objective_scores_margin",
          "OnlineDPO: mean over prompts of score(chosen) - score(rejected), chosen being the higher-scored of the "
          "two completions.", _S),
    gauge("val/contain_eos_token", "rl_val_contain_eos_token_ratio",
          "OnlineDPO: fraction of this process's completions that contain EOS (not gathered across processes).",
          _S),
    gauge("beta", "rl_online_dpo_beta", "OnlineDPO: current DPO beta (per-epoch schedule when a list).", _S),
    # GOLD / IW-OPD
    gauge("on_policy_loss", "rl_on_policy_loss",
          "GOLD/IW-OPD: mean loss of the micro-batches trained on freshly generated completions since the last log "
          "(all-reduced over processes); absent when none.", _S),
    gauge("off_policy_loss", "rl_off_policy_loss",
          "GOLD/IW-OPD: mean loss of the micro-batches trained on dataset completions since the last log; absent "
          "when none.", _S),
    gauge("matched_loss", "rl_gold_matched_loss",
          "GOLD cross-tokenizer ULD: mean loss on the token positions matched between student and teacher "
          "vocabularies.", _S),
    gauge("unmatched_loss", "rl_gold_unmatched_loss",
          "GOLD cross-tokenizer ULD: mean loss on the unmatched token positions.", _S),
    gauge("completions/{kind:on_policy|off_policy}_{stat:mean|min|max}_length", "rl_distillation_completions_length",
          "IW-OPD: completion length in tokens (labels != -100) of the on-policy or off-policy micro-batch, mean, "
          "min or max gathered over processes.", _S, unit="{token}"),
    gauge("completions/truncated_fraction", "rl_completions_truncated_ratio",
          "IW-OPD on-policy micro-batches: fraction of completions reaching max_new_tokens.", _S),
    # AsyncGRPO / AsyncDistillation (trl.experimental; rank 0; *_total keys are window sums, reset at every log)
    gauge("ratio", "rl_async_importance_ratio",
          "AsyncGRPO: token mean over all processes of pi_theta / pi_behaviour.", _S),
    gauge("rewards/{reward_func}", "rl_async_function_reward",
          "AsyncGRPO rollout worker: raw reward of one reward function averaged over the window's samples.", _S),
    gauge("sample/dropped_stale_total", "rl_async_dropped_stale_samples",
          "Async: samples dropped for staleness above max_staleness during the logging window (window sum).", _S,
          unit="{sample}"),
    gauge("sample/rollout_queue_size", "rl_async_rollout_queue_size",
          "Async: rollout queue size when the trainer pulled a sample.", _S, unit="{sample}"),
    gauge("sample/time_in_queue_s", "rl_async_sample_queue_time_seconds",
          "Async: seconds a sample waited in the rollout queue.", _S, unit="s"),
    gauge("sample/staleness_{stat:mean|max}", "rl_async_sample_staleness",
          "Async: policy versions between a sample's generation and its training, mean or max.", _S,
          unit="{version}"),
    gauge("sample/forwarded_tokens_{stat:mean|max}", "rl_async_sample_forwarded_tokens",
          "Async: tokens forwarded per sample, mean or max.", _S, unit="{token}"),
    gauge("sample/trained_tokens_{stat:mean}", "rl_async_sample_trained_tokens",
          "Async: loss tokens (completion mask) per sample, mean.", _S, unit="{token}"),
    gauge("batch/dropped_oversize_total", "rl_async_batch_dropped_oversize_samples",
          "Async: samples longer than token_budget dropped during the logging window (window sum).", _S,
          unit="{sample}"),
    gauge("batch/masked_token_frac", "rl_async_batch_masked_token_ratio",
          "Async: fraction of forwarded tokens that carry no loss.", _S),
    gauge("batch/samples_per_row", "rl_async_batch_samples_per_row", "Async: samples packed per row.", _S,
          unit="{sample}"),
    gauge("batch/row_tokens_{stat:mean|max}", "rl_async_batch_row_tokens",
          "Async: tokens per packed row, mean or max.", _S, unit="{token}"),
    gauge("batch/row_imbalance", "rl_async_batch_row_imbalance", "Async: max row load / mean row load.", _S),
    gauge("batch/packing_ratio", "rl_async_batch_packing_ratio",
          "AsyncGRPO: forwarded sample tokens / row tokens.", _S),
    gauge("batch/row_fill_frac", "rl_async_batch_row_fill_ratio",
          "Async: row tokens / (token_budget x rows).", _S),
    gauge("batch/pad_frac", "rl_async_batch_pad_ratio",
          "Async: share of inter-rank padding in the broadcast batch.", _S),
    gauge("batch/microbatches_per_step", "rl_async_batch_microbatches_per_step",
          "Async: micro-batches in one optimizer step.", _S, unit="{batch}"),
    gauge("batch/forwarded_tokens_per_step", "rl_async_batch_forwarded_tokens_per_step",
          "Async: tokens forwarded in one optimizer step.", _S, unit="{token}"),
    gauge("batch/trained_tokens_per_step", "rl_async_batch_trained_tokens_per_step",
          "Async: loss tokens in one optimizer step.", _S, unit="{token}"),
    gauge("batch/samples_per_step", "rl_async_batch_samples_per_step", "Async: samples in one optimizer step.",
          _S, unit="{sample}"),
    gauge("batch/groups_per_step", "rl_async_batch_groups_per_step",
          "AsyncGRPO: prompt groups completed in one optimizer step.", _S, unit="{group}"),
    gauge("perf/fwd_bwd_s", "rl_async_forward_backward_seconds",
          "Async: seconds in training_step (forward + backward) for one optimizer step.", _S, unit="s"),
    gauge("perf/fwd_s", "rl_async_forward_seconds", "Async: forward seconds for one optimizer step.", _S, unit="s"),
    gauge("perf/optimizer_s", "rl_async_optimizer_seconds", "Async: seconds of optimizer.step.", _S, unit="s"),
    gauge("perf/step_s", "rl_async_step_seconds",
          "Async: seconds between consecutive optimizer-step ends (absent on the first step).", _S, unit="s"),
    gauge("perf/rollout_wait_s", "rl_async_rollout_wait_seconds",
          "Async: seconds the trainer blocked on an empty rollout queue.", _S, unit="s"),
    gauge("perf/forwarded_tok_s_fwd_bwd", "rl_async_forward_backward_tokens_per_second",
          "Async: forwarded tokens / forward + backward seconds.", _S, unit="{token}/s"),
    gauge("perf/forwarded_tok_s_wall_clock", "rl_async_forwarded_tokens_per_second",
          "Async: forwarded tokens / wall-clock step seconds.", _S, unit="{token}/s"),
    gauge("perf/trained_tok_s_wall_clock", "rl_async_trained_tokens_per_second",
          "Async: loss tokens / wall-clock step seconds.", _S, unit="{token}/s"),
    gauge("perf/mfu_fwd_bwd", "rl_async_forward_backward_mfu_ratio",
          "Async: model FLOPs utilisation over forward + backward time (only when the device peak is known).", _S),
    gauge("perf/mfu_wall_clock", "rl_async_mfu_ratio",
          "Async: model FLOPs utilisation over wall-clock step time (only when the device peak is known).", _S),
    gauge("perf/weight_sync_s", "rl_async_weight_sync_seconds",
          "Async: seconds of one policy-to-vLLM weight sync.", _S, unit="s"),
    gauge("perf/weight_sync_{part:pause|barrier|transfer}_s", "rl_async_weight_sync_part_seconds",
          "Async: seconds of one phase (pause, barrier or transfer) of a policy-to-vLLM weight sync.", _S, unit="s"),
    gauge("rollout/score_s", "rl_async_rollout_score_seconds",
          "Async rollout worker: seconds to score one group (AsyncDistillation: one rollout by the teacher).", _S,
          unit="s"),
    gauge("rollout/score_wait_s", "rl_async_rollout_score_wait_seconds",
          "AsyncGRPO rollout worker: seconds the scorer waited for a group.", _S, unit="s"),
    gauge("rollout/score_block_s", "rl_async_rollout_score_block_seconds",
          "AsyncGRPO rollout worker: seconds generation was blocked by a full scoring queue.", _S, unit="s"),
    gauge("rollout/score_queue_size", "rl_async_rollout_score_queue_size",
          "AsyncGRPO rollout worker: groups waiting to be scored.", _S, unit="{group}"),
    gauge("rollout/inflight", "rl_async_rollout_inflight_requests",
          "Async rollout worker: generation tasks in flight.", _S, unit="{request}"),
    gauge("rollout/generated_tok_s", "rl_async_rollout_generated_tokens_per_second",
          "Async rollout worker: completion tokens generated since the previous push / seconds.", _S,
          unit="{token}/s"),
    gauge("rollout/backpressure_s", "rl_async_rollout_backpressure_seconds",
          "Async rollout worker: seconds the worker waited on a full rollout buffer.", _S, unit="s"),
    gauge("rollout/vllm_retry_total", "rl_async_rollout_vllm_retries",
          "Async rollout worker: vLLM HTTP calls retried during the logging window (window sum).", _S,
          unit="{request}"),
    gauge("rollout/samples_per_rollout", "rl_async_rollout_samples_per_rollout",
          "AsyncGRPO rollout worker: training rows produced per conversation.", _S, unit="{sample}"),
    gauge("rollout/turns_{stat:mean|max}", "rl_async_rollout_turns",
          "AsyncGRPO rollout worker: turns per conversation, mean or max.", _S, unit="{turn}"),
    gauge("rollout/fork_frac", "rl_async_rollout_fork_ratio",
          "AsyncGRPO rollout worker: share of turn transitions that forked the sequence.", _S),
    gauge("rollout/realign_frac", "rl_async_rollout_realign_ratio",
          "AsyncGRPO rollout worker: share of turn transitions that were realigned.", _S),
    gauge("rollout/drift_tokens_{stat:mean|max}", "rl_async_rollout_drift_tokens",
          "AsyncGRPO rollout worker: re-tokenisation drift tokens per turn transition, mean or max.", _S,
          unit="{token}"),
    gauge("rollout/duration_s", "rl_async_rollout_duration_seconds",
          "Async rollout worker: seconds of one rollout (conversation).", _S, unit="s"),
    gauge("rollout/correctness_mean", "rl_async_rollout_correctness",
          "AsyncGRPO rollout worker (OpenEnv harness): mean environment correctness.", _S),
    gauge("tools/loop_exhausted_frac", "rl_async_tools_loop_exhausted_ratio",
          "AsyncGRPO rollout worker: share of conversations that hit the tool-loop limit.", _S),
    gauge("tools/latency_s", "rl_async_tools_latency_seconds",
          "AsyncGRPO rollout worker: mean tool-call latency over all tools.", _S, unit="s"),
    gauge("tools/parallel_calls_mean", "rl_async_tools_parallel_calls",
          "AsyncGRPO rollout worker: tool calls per assistant turn, mean.", _S, unit="{call}"),
    gauge("tools/unknown_name_total", "rl_async_tools_unknown_name_calls",
          "AsyncGRPO rollout worker: calls to unknown tool names during the logging window (window sum).", _S,
          unit="{call}"),
    gauge("tools/{tool}/call_total", "rl_async_tool_calls",
          "AsyncGRPO rollout worker: calls of one tool during the logging window (window sum).", _S, unit="{call}"),
    gauge("tools/{tool}/failure_total", "rl_async_tool_failures",
          "AsyncGRPO rollout worker: failed calls of one tool during the logging window (window sum).", _S,
          unit="{call}"),
    gauge("tools/{tool}/latency_s", "rl_async_tool_latency_seconds",
          "AsyncGRPO rollout worker: mean call latency of one tool.", _S, unit="s"),
    # AsyncDistillation
    gauge("jsd", "rl_distillation_jsd",
          "AsyncDistillation: token mean over all processes of the generalized JSD between the student's and the "
          "teacher's top-k distributions.", _S),
    gauge("teacher_entropy", "rl_distillation_teacher_entropy",
          "AsyncDistillation: token mean of the teacher's top-k distribution entropy (nats).", _S),
    gauge("teacher_token_frac/{model}", "rl_teacher_token_ratio",
          "AsyncDistillation with several teachers: share of tokens scored by one teacher.", _S),
    gauge("teacher_jsd/{model}", "rl_teacher_jsd",
          "AsyncDistillation with several teachers: JSD on one teacher's tokens (NaN when it scored none).", _S),
    gauge("teacher_entropy/{model}", "rl_teacher_entropy",
          "AsyncDistillation with several teachers: teacher entropy on one teacher's tokens.", _S),
    gauge("teacher_score_s/{model}", "rl_teacher_score_seconds",
          "AsyncDistillation with several teachers: mean seconds one teacher took to score a rollout.", _S,
          unit="s"),
    # Profiling timers: sent straight to wandb / mlflow / trackio, never through Trainer.log
    # one label for '{trainer class}.{name}': the name may itself hold dots (transformers.generate)
    gauge("profiling/Time taken: {operation:.+}", "rl_profiling_duration_seconds",
          "Wall seconds of one call of a profiled trainer method, profiling_context block or reward function "
          "(operation: trainer class and name, e.g. GRPOTrainer._prepare_inputs).", _S, unit="s"),
)

# --- Legacy PPOTrainer (TRL <= 0.11, its `log_with` API; replaced in 0.12, no PPOTrainer in TRL 1.16) ----------
_PPO = "Legacy PPOTrainer (TRL <= 0.11): "
_LEGACY_PPO = (
    gauge("env/reward_{stat:mean|std}", "rl_env_reward",
          _PPO + "reward from the environment / reward model over the batch (alias ppo/mean_scores, "
          "ppo/std_scores).", _S),
    histogram("env/reward_dist", "rl_env_reward_dist",
              _PPO + "distribution of the reward from the environment.", _S, SIGNED_BUCKETS),
    gauge("objective/kl", "rl_objective_kl",
          "KL between the policy and the reference model: mean over the batch of the sequence-summed "
          "logp_policy - logp_ref (nats), logged by the legacy PPOTrainer (TRL <= 0.11) and, with the same "
          "meaning, by OnlineDPOTrainer (trl.experimental, averaged over processes).", _S),
    histogram("objective/kl_dist", "rl_objective_kl_dist", _PPO + "distribution of objective/kl.", _S,
              KL_BUCKETS),
    gauge("objective/kl_coef", "rl_objective_kl_coef",
          _PPO + "coefficient of the KL penalty in the objective (adaptive with AdaptiveKLController).", _S),
    gauge("objective/entropy", "rl_objective_entropy",
          "Sampled sequence entropy estimate: mean over completions of -(sum of the sampled tokens' log-probs) "
          "(nats), logged by the legacy PPOTrainer (TRL <= 0.11) and, with the same meaning, by OnlineDPOTrainer "
          "(trl.experimental, averaged over processes).", _S),
    histogram("objective/logprobs", "rl_objective_logprobs_dist",
              _PPO + "distribution of the log-probabilities of the tokens the policy took.", _S, LOGPROB_BUCKETS),
    histogram("objective/ref_logprobs", "rl_objective_ref_logprobs_dist",
              _PPO + "distribution of the reference model's log-probabilities of the tokens taken.", _S,
              LOGPROB_BUCKETS),
    gauge("ppo/mean_non_score_reward", "rl_ppo_mean_non_score_reward",
          _PPO + "mean KL penalty reward (objective/kl x objective/kl_coef, negated).", _S),
    gauge("ppo/{stat:mean|std}_scores", "rl_ppo_scores", _PPO + "reward-model scores (alias of env/reward_mean|std).",
          _S),
    gauge("ppo/learning_rate", "rl_ppo_learning_rate", _PPO + "learning rate of PPO.", _S),
    gauge("ppo/policy/entropy", "rl_ppo_policy_entropy", _PPO + "entropy of the policy from its logits.", _S),
    gauge("ppo/policy/clipfrac", "rl_ppo_policy_clip_ratio",
          _PPO + "fraction of probability ratios outside the PPO clipping range.", _S),
    gauge("ppo/policy/approxkl", "rl_ppo_policy_approx_kl",
          _PPO + "k2 KL estimate between old and new policy: 0.5 x masked_mean((logprobs - old_logprobs)^2).", _S),
    gauge("ppo/policy/policykl", "rl_ppo_policy_policy_kl",
          _PPO + "k1 KL estimate between old and new policy: masked_mean(old_logprobs - logprobs).", _S),
    histogram("ppo/policy/ratio", "rl_ppo_policy_ratio_dist",
              _PPO + "distribution of the new/old policy probability ratio.", _S, IMPORTANCE_RATIO_BUCKETS),
    gauge("ppo/policy/advantages_{stat:mean}", "rl_ppo_policy_advantages", _PPO + "mean GAE advantage estimate.",
          _S),
    histogram("ppo/policy/advantages", "rl_ppo_policy_advantages_dist", _PPO + "distribution of the GAE advantages.",
              _S, SIGNED_BUCKETS),
    gauge("ppo/returns/{stat:mean|var}", "rl_ppo_returns", _PPO + "TD(lambda) returns (advantage + values).", _S),
    gauge("ppo/val/{stat:mean|var}", "rl_ppo_val", _PPO + "values of the value function.", _S),
    gauge("ppo/val/var_explained", "rl_ppo_val_explained_variance",
          _PPO + "explained variance of the value function.", _S),
    gauge("ppo/val/clipfrac", "rl_ppo_val_clip_ratio", _PPO + "fraction of value predictions that were clipped.", _S),
    gauge("ppo/val/vpred", "rl_ppo_val_vpred", _PPO + "values predicted by the value function.", _S),
    gauge("ppo/val/error", "rl_ppo_val_error", _PPO + "mean squared error between ppo/val/vpred and the returns.", _S),
    gauge("ppo/loss/{kind:policy|value|total}", "rl_ppo_loss",
          _PPO + "PPO losses: policy, value, and their sum (total).", _S),
    gauge("tokens/queries_len_{stat:mean|std}", "rl_tokens_queries_length", _PPO + "length of the query tokens.", _S,
          unit="{token}"),
    histogram("tokens/queries_dist", "rl_tokens_queries_length_dist", _PPO + "distribution of query lengths.", _S,
              LENGTH_BUCKETS, unit="{token}"),
    gauge("tokens/responses_len_{stat:mean|std}", "rl_tokens_responses_length",
          _PPO + "length of the response tokens.", _S, unit="{token}"),
    histogram("tokens/responses_dist", "rl_tokens_responses_length_dist", _PPO + "distribution of response lengths.",
              _S, LENGTH_BUCKETS, unit="{token}"),
)

# Order matters for templates only (first full match wins): the enumerated rewards/{kind:chosen|rejected} comes
# before AsyncGRPO's rewards/{reward_func}.
SPECS = (*_TRANSFORMERS_STEP, *_TRANSFORMERS_SUMMARY, *_TRANSFORMERS_EVAL, *_WITH_EVAL_TWIN, *EVAL_TWINS,
         *_TRAIN_ONLY, *_LEGACY_PPO)
