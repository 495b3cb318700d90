"""ROLL's metrics: the keys its pipelines pass to ``tracker.log`` (alibaba/ROLL at 8eb27cc, tests/data/frameworks/
roll.tsv) and the ones its docs name ("Trackers and Metrics", "Experiment Data Analysis", 指标说明).

Keys veRL logs too (``critic/score/mean``, ``actor/pg_loss``, ``critic/lr``, ``global_seqlen/mean``, ...) are
defined in verl.py. RLVR's per-reward-domain copies (``{domain}/<key>``, add_domain_metrics) are families of their
own (``rl_domain_*``), never the global family with a domain label.
"""

from __future__ import annotations

from rl_otel.catalog.define import (
    GIB,
    IMPORTANCE_RATIO_BUCKETS,
    KL_BUCKETS,
    LENGTH_BUCKETS,
    LOGPROB_BUCKETS,
    MIN_MAX_MEAN,
    SIGNED_BUCKETS,
    counter,
    gauge,
    histogram,
)

_S = "roll"
INFIX = "{cluster}/{phase}"
GPU_STAGES = "start/offload|start/onload|end/onload|end/offload"
GPU_KINDS = "allocated|reserved|max_allocated|max_reserved"
# state_offload_manger parts (context_managers.py) and the checkpoint sub-timers of do_checkpoint (megatron, fsdp2)
PARTS = "total|execute|onload|offload|reload_nccl|offload_nccl|load|dcp_save|hf_save"
MIN_MAX_MEAN_DIFF = "{stat:mean|max|min|diff}"
MIN_MAX_MEAN_STD = "{stat:mean|max|min|std}"
RIGHT_ERROR = "{kind:right|error}"  # samples with score == 1 / score == 0
TRAIN_CLUSTERS = "actor_train|sft_train|student|student_train"  # clusters whose strategy runs optimizer steps
# ROLL's env managers log per-trajectory env metrics as env/{tag}/{metric} (info["metrics"] of the env, and the
# managers' own timings); grouped by unit, the rest (rates, flags, scores) falls into the dimensionless family.
ENV_METRICS = (
    ("turns", "{turn}", "num_actions|current_step", "Turn counts"),
    ("tool_calls", "{call}", "num_tool_calls|num_failed_tool_calls|tool_use_counter|tool_success_counter|tool_call"
     "|success_tool_call|failed_tool_call|invalid_tool_call", "Tool-call counts"),
    ("duration_seconds", "s", "traj_time_env_total|traj_time_reset|traj_time_step|traj_time_step_min"
     "|traj_time_step_max|traj_time_generate|traj_time_generate_min|traj_time_generate_max|traj_time_generate_sum"
     "|traj_time_total|latency/pure_inf_avg|latency/pure_inf_p99|latency/pure_inf_max|latency/env_exec_avg"
     "|latency/env_exec_p99|latency/env_exec_max|latency/proxy_ovh_avg|latency/proxy_ovh_p99|latency/proxy_ovh_max"
     "|latency/step_rt_avg|latency/step_rt_p99|latency/step_rt_max", "Durations"),
    ("tokens", "{token}", "traj_time_response_length|traj_time_response_length_min|traj_time_response_length_max"
     "|response_length|step_prompt_length|step_prompt_length_min|step_prompt_length_max|step_response_length"
     "|step_response_length_min|step_response_length_max|prompt_length|total_tokens", "Token counts"),
    ("tokens_per_second", "{token}/s", "traj_time_tokens_per_second|traj_time_tokens_per_second_min"
     "|traj_time_tokens_per_second_max", "Generation speeds"),
    ("steps_per_second", "{turn}/s", "throughput/step_per_sec", "Env steps per second"),
    ("samples", "{sample}", "num_branches_or_steps", "Training samples produced"),
    ("metric", "1", ".+", "Dimensionless metrics (success, action validity, penalties, scores, fractions)"),
)


def _twin(key: str, name: str, description: str, *, unit: str = "1", both: bool = True) -> tuple:
    """A batch metric of RLVR's metrics manager and its per-domain copy ``{domain}/<key>`` (add_domain_metrics)."""
    domain = gauge(f"{{domain}}/{key}", "rl_domain_" + name[len("rl_"):],
                   f"RLVR, per reward domain (over the domain's samples): {description[0].lower()}{description[1:]}",
                   _S, unit=unit)
    return (gauge(key, name, description, _S, unit=unit), domain) if both else (domain,)


def _env_families(prefix: str, name: str, where: str) -> tuple:
    """The env metric families under ``prefix`` (env/{tag}, val/env/{tag}, val/{tag}/env/{env}), one per unit."""
    return tuple(
        gauge(f"{prefix}/{{metric:{metrics}}}", f"{name}_{suffix}",
              f"{what} an env manager logs per trajectory {where}, reduced over trajectories (mean, or by the key's "
              "_min/_max/_sum/_p99 suffix).", _S, unit=unit)
        for suffix, unit, metrics, what in ENV_METRICS)


SPECS = (
    # Validation
    gauge(f"{{_:val/score|val_score/all}}/{MIN_MAX_MEAN}", "rl_val_score",
          "Validation score (agentic val/score: episode score over trajectories; VLM val_score/all/mean: mean "
          "response score), mean, max or min.", _S),
    gauge(f"val/{{tag}}/score/{MIN_MAX_MEAN}", "rl_val_tag_score",
          "Agentic validation score of one env tag: mean/max/min over trajectory groups of the group-mean episode "
          "score.", _S),
    gauge("val_score/{tag:(?!all/)[^/]+}/mean", "rl_val_data_tag_score",
          "VLM validation: mean response score of one data tag.", _S),
    gauge("val_correct/all/mean", "rl_val_correct_ratio",
          "RLVR validation: fraction of validation responses with score == 1.", _S),
    gauge("val_correct/{tag:(?!all/)[^/]+}/mean", "rl_val_tag_correct_ratio",
          "RLVR validation: fraction of one data tag's validation responses with score == 1.", _S),
    gauge("val/env/response_length", "rl_val_env_response_length",
          "Agentic validation: mean response tokens per trajectory of the validation rollout.", _S, unit="{token}"),
    gauge("val/scheduler/group_filter_count", "rl_val_scheduler_filtered_groups",
          "Agentic validation: trajectory groups the group filter dropped in the validation rollout.", _S,
          unit="{group}"),
    gauge("val/time/{operation}", "rl_val_operation_duration_seconds",
          "Agentic validation: duration of a rollout operation of the validation batch (get_batch_cost_gqm, ...).",
          _S, unit="s"),
    *_env_families("val/env/{tag}", "rl_val_env", "of an env tag in the validation rollout"),
    *_env_families("val/{tag}/env/{env}", "rl_val_tag_env",
                   "in the agentic-rollout pipeline's tag group (the whole batch's env metrics under every tag)"),
    # DPO
    gauge("actor/acc", "rl_actor_dpo_accuracy_ratio",
          "DPO: fraction of pairs whose chosen reward exceeds the rejected one, mean over micro-batches and ranks.",
          _S),
    # actor/chosen_reward is Trinity-RFT's key too (same quantity): its entry in trinity.py covers ROLL's.
    gauge("actor/reject_reward", "rl_actor_dpo_rejected_reward",
          "DPO: mean implicit reward of the rejected responses, mean over micro-batches and ranks.", _S),
    gauge("val/actor/loss", "rl_val_actor_loss", "DPO validation: DPO/IPO loss of the last validation batch.", _S),
    gauge("val/actor/acc", "rl_val_actor_dpo_accuracy_ratio",
          "DPO validation: fraction of the last validation batch's pairs whose chosen reward exceeds the rejected "
          "one.", _S),
    gauge("val/actor/{kind:chosen|reject}_reward", "rl_val_actor_dpo_reward",
          "DPO validation: mean implicit reward of the chosen or rejected responses of the last validation batch.",
          _S),
    # Value function
    gauge("critic/value", "rl_critic_value",
          "Mean value predicted by the old value network for the batch at the start of the PPO iteration.", _S),
    gauge("critic/vpred", "rl_critic_vpred",
          "Mean value predicted by the value network being optimized, for the batch.", _S),
    gauge("critic/clipfrac", "rl_critic_clip_ratio",
          "Fraction of value predictions clipped by value_clip (without value_clip ROLL logs the squared error "
          "here).", _S),
    gauge("critic/error", "rl_critic_error", "Mean squared error between value predictions and returns.", _S),
    # Batch data metrics (RLVR metrics manager, agentic compute_train_data_metrics) and their per-domain copies
    *_twin("critic/score/{stat:mean|max|min}", "rl_critic_score",
           "Raw response-level score of the reward worker, mean/max/min over samples.", both=False),
    *_twin("critic/rewards/{stat:mean|max|min}", "rl_critic_rewards",
           "Sum of the token-level rewards (normalized/clipped score minus the KL penalty), mean/max/min over "
           "samples.", both=False),
    *_twin("critic/advantages/{stat:mean|max|min}", "rl_critic_advantages",
           "Advantages pooled over the batch's response tokens, mean/max/min.", both=False),
    *_twin("critic/returns/{stat:mean|max|min}", "rl_critic_returns",
           "Returns pooled over the batch's response tokens, mean/max/min.", both=False),
    *_twin("critic/values/{stat:mean|max|min}", "rl_critic_values",
           "Critic values pooled over the batch's response tokens (GAE only), mean/max/min.", both=False),
    gauge(f"critic/entropy/{MIN_MAX_MEAN}", "rl_critic_entropy",
          "Token-mean entropy of the old policy over the batch's response tokens (0 when old log-probs are not "
          "recomputed).", _S),
    *_twin("critic/entropy/{stat:mean|max|min}", "rl_critic_entropy",
           "Token-mean entropy of the old policy; ROLL copies the whole batch's value into every domain.",
           both=False),
    *_twin("critic/correct/mean", "rl_critic_correct_ratio", "Fraction of samples with score == 1."),
    *_twin("critic/score_distribution/{bound:max|min}_value", "rl_critic_score_bound",
           "The score ROLL counts as correct (max, 1) or incorrect (min, 0): a constant."),
    *_twin("critic/score_distribution/{kind:correct|incorrect}_samples_ratio", "rl_critic_score_distribution_ratio",
           "Fraction of samples with score == 1 (correct) or score == 0 (incorrect)."),
    *_twin("critic/token_level_rewards_mean/{stat:mean|max|min}", "rl_critic_token_level_rewards_mean",
           "Per-sample mean of the token-level rewards over all positions (padding included), mean/max/min over "
           "samples."),
    *_twin("critic/raw_advantages/{stat:mean|max|min}", "rl_critic_raw_advantages",
           "Advantages before whitening and clipping, pooled over the batch's response tokens, mean/max/min."),
    *_twin(f"critic/{RIGHT_ERROR}_response/advantages/{MIN_MAX_MEAN_STD}", "rl_critic_scored_response_advantages",
           "Advantages pooled over the response tokens of the samples with score == 1 (right) or 0 (error)."),
    *_twin(f"critic/{RIGHT_ERROR}_response/raw_advantages/{MIN_MAX_MEAN_STD}",
           "rl_critic_scored_response_raw_advantages",
           "Advantages before whitening and clipping, pooled over the response tokens of the samples with score == 1 "
           "(right) or 0 (error)."),
    gauge(f"{{_:token|tokens}}/prompt_length/{MIN_MAX_MEAN}", "rl_tokens_prompt_length",
          "Prompt length in tokens, mean/max/min over samples (RLVR token/..., agentic and docs tokens/...).", _S,
          unit="{token}"),
    *_twin("token/prompt_length/{stat:mean|max|min}", "rl_tokens_prompt_length",
           "Prompt length in tokens, mean/max/min over samples.", unit="{token}", both=False),
    gauge(f"{{_:token|tokens}}/response_length/{MIN_MAX_MEAN_DIFF}", "rl_tokens_response_length",
          "Response length in tokens (response mask, sample-level masks not applied), mean/max/min over samples and "
          "max - min (RLVR token/..., agentic and docs tokens/...).", _S, unit="{token}"),
    *_twin(f"token/response_length/{MIN_MAX_MEAN_DIFF}", "rl_tokens_response_length",
           "Response length in tokens, mean/max/min over samples and max - min.", unit="{token}", both=False),
    *_twin(f"token/total_length/{MIN_MAX_MEAN_DIFF}", "rl_tokens_total_length",
           "Prompt plus response length in tokens, mean/max/min over samples and max - min.", unit="{token}"),
    *_twin("token/total_response_length/clip", "rl_tokens_truncated_responses",
           "Number of samples whose response reached the maximum response length.", unit="{sample}"),
    *_twin(f"token/{RIGHT_ERROR}_response_length/clip", "rl_tokens_scored_truncated_responses",
           "Number of samples with score == 1 (right) or 0 (error) whose response reached the maximum length.",
           unit="{sample}"),
    *_twin(f"token/{RIGHT_ERROR}_response_length/{{stat:mean|max|min}}", "rl_tokens_scored_response_length",
           "Response length in tokens of the untruncated samples with score == 1 (right) or 0 (error), "
           "mean/max/min (mean NaN when there are none).", unit="{token}"),
    gauge(f"tokens/non_prompt_length/{MIN_MAX_MEAN}", "rl_tokens_non_prompt_length",
          "Agentic: non-prompt tokens of a row (responses and env observations), mean/max/min over rows.", _S,
          unit="{token}"),
    *_twin("actor/{kind:max_len|difficulty|error_len|final}_mask_ratio", "rl_actor_sample_mask_ratio",
           "Fraction of samples a sample-level mask keeps (max_len, difficulty, error_len, final: all masks)."),
    *_twin("actor/samples_used", "rl_actor_mask_kept_samples", "Number of samples the sample-level masks keep.",
           unit="{sample}"),
    *_twin("actor/samples_total", "rl_actor_mask_input_samples", "Number of samples before the sample-level masks.",
           unit="{sample}"),
    *_twin("critic/kl", "rl_critic_kl",
           "KL estimate between the old and the reference policy, token mean per sample then mean over samples."),
    *_twin("critic/kl_coef", "rl_critic_kl_coef",
           "KL coefficient applied to the token rewards in the step (0 unless add_token_level_kl)."),
    gauge("critic/reward_clip_frac", "rl_critic_reward_clip_ratio",
          "Fraction of samples whose normalized response-level reward was clipped to +-reward_clip.", _S),
    *_twin("critic/reward_clip_frac", "rl_critic_reward_clip_ratio",
           "Fraction of samples whose normalized response-level reward was clipped to +-reward_clip.", both=False),
    *_twin("critic/token_reward_clip_frac", "rl_critic_token_reward_clip_ratio",
           "Fraction of all token-reward positions (padding included) clipped to +-reward_clip."),
    *_twin("critic/advantage_clip_frac", "rl_critic_advantage_clip_ratio",
           "Fraction of all advantage positions (padding included) clipped to +-advantage_clip."),
    gauge("{domain}/time/{operation:get_sample_level_mask|reward_postprocess|get_token_reward|compute_advantage}",
          "rl_domain_operation_duration_seconds",
          "RLVR: time of a per-reward-domain step of the driver (masks, reward postprocessing, token rewards, "
          "advantages).", _S, unit="s"),
    gauge(f"critic/{{kind:episode|step}}_rewards_norm/{MIN_MAX_MEAN}", "rl_critic_normalized_rewards",
          "GiGPO: normalized episode or step reward, mean/max/min over rows.", _S),
    # Agentic rollout batch (before train-batch selection)
    gauge(f"rollout/score/{MIN_MAX_MEAN}", "rl_rollout_score",
          "Agentic: episode score per trajectory over the whole rollout batch, mean/max/min.", _S),
    gauge(f"rollout/response_length/{MIN_MAX_MEAN}", "rl_rollout_response_length",
          "Agentic: response tokens per row over the whole rollout batch, mean/max/min.", _S, unit="{token}"),
    gauge(f"rollout/prompt_length/{MIN_MAX_MEAN}", "rl_rollout_prompt_length",
          "Agentic: prompt tokens per row over the whole rollout batch, mean/max/min.", _S, unit="{token}"),
    gauge(f"rollout/non_prompt_length/{MIN_MAX_MEAN}", "rl_rollout_non_prompt_length",
          "Agentic: non-prompt tokens per row over the whole rollout batch, mean/max/min.", _S, unit="{token}"),
    # Prompt groups (num_return_sequences > 1)
    gauge(f"group/response_length_diff/{MIN_MAX_MEAN}", "rl_group_response_length_range",
          "Max - min response length within a prompt group, mean/max/min over groups.", _S, unit="{token}"),
    gauge("group/correct_ratio/{stat:mean|std}", "rl_group_correct_ratio",
          "Fraction of a prompt group's responses with score == 1, mean/std over groups.", _S),
    gauge("group/{kind:all_correct|all_incorrect|mixed}_groups_ratio", "rl_group_outcome_ratio",
          "Fraction of prompt groups whose responses are all correct, all incorrect, or mixed.", _S),
    gauge(f"group/advantage_diff/{MIN_MAX_MEAN}", "rl_group_advantage_range",
          "Max - min per-sample mean advantage within a prompt group, mean/max/min over groups.", _S),
    gauge("group/correct_vs_incorrect_advantage_diff/{stat:mean|std}", "rl_group_correct_advantage_gap",
          "Mean advantage of the correct minus the incorrect samples of a mixed group, mean/std over groups.", _S),
    # Policy
    gauge("actor/ppo_ratio_high_clipfrac", "rl_actor_ppo_ratio_high_clip_ratio",
          "Fraction of tokens whose PPO ratio was clipped at the upper bound (1 + clip).", _S),
    gauge("actor/ppo_ratio_low_clipfrac", "rl_actor_ppo_ratio_low_clip_ratio",
          "Fraction of tokens whose PPO ratio was clipped at the lower bound (1 - clip).", _S),
    gauge("actor/ppo_ratio_clipfrac", "rl_actor_ppo_ratio_clip_ratio",
          "Fraction of tokens whose PPO ratio was clipped (either bound).", _S),
    gauge("actor/ratio_{stat:mean|max|min}", "rl_actor_importance_ratio",
          "Importance ratio exp(logp_new - logp_old) over the batch's tokens.", _S),
    gauge("actor/clipfrac", "rl_actor_clip_ratio", "Clipping fraction of the policy network (actor).", _S),
    gauge("actor/total_loss", "rl_actor_total_loss",
          "Weighted sum of policy-gradient, KL and entropy losses: the loss back-propagated.", _S),
    gauge("actor/approxkl", "rl_actor_approx_kl",
          "Approximate KL between the current and the old policy (k2 = 0.5 * mean((logp - logp_old)^2)).", _S),
    gauge("actor/policykl", "rl_actor_policy_kl",
          "k1 KL estimate between the current and the old policy as ROLL computes it: mean(logp - logp_old) "
          "(TRL's ppo/policy/policykl has the opposite sign).", _S),
    gauge("actor/backward_steps", "rl_actor_backward_steps",
          "Optimizer steps per train_step on a data-parallel rank (the divisor of the @sum metrics).", _S,
          unit="{step}"),
    # pg_variant tis / topr / cispo / kimi15 (cispo and kimi15 keys carry their prefix twice, as ROLL writes them)
    gauge("actor/tis_{bound:lower|upper}_clipfrac", "rl_actor_tis_bound_clip_ratio",
          "pg_variant=tis: fraction of tokens whose truncated importance ratio hit the lower or upper bound.", _S),
    gauge("actor/tis_total_clipfrac", "rl_actor_tis_clip_ratio",
          "pg_variant=tis: fraction of tokens whose truncated importance ratio hit either bound.", _S),
    gauge("actor/tis_clipped_ratio_mean", "rl_actor_tis_clipped_importance_ratio",
          "pg_variant=tis: truncated importance ratio, token mean per sequence then mean over sequences.", _S),
    gauge("actor/tis_{bound:lower|upper}_bound", "rl_actor_tis_bound",
          "pg_variant=tis: configured lower or upper truncation bound of the importance ratio (a constant).", _S),
    gauge("actor/topr_{kind:positive|negative}_loss", "rl_actor_topr_subset_loss",
          "pg_variant=topr: loss on the positive- or negative-score samples, mean over micro-batches and ranks.", _S),
    gauge("actor/topr_weighted_{kind:positive|negative}_loss", "rl_actor_topr_weighted_subset_loss",
          "pg_variant=topr: weighted loss on the positive- or negative-score samples.", _S),
    gauge("actor/topr_{kind:positive|negative}_samples", "rl_actor_topr_samples",
          "pg_variant=topr: number of positive- or negative-score samples per optimizer step.", _S, unit="{sample}"),
    gauge("actor/topr_{kind:positive|negative}_ratio", "rl_actor_topr_sample_ratio",
          "pg_variant=topr: fraction of positive- or negative-score samples.", _S),
    gauge("actor/topr_negative_{bound:lower|upper}_clipfrac", "rl_actor_topr_negative_bound_clip_ratio",
          "pg_variant=topr: fraction of negative-sample positions clipped at the lower or upper bound.", _S),
    gauge("actor/topr_negative_total_clipfrac", "rl_actor_topr_negative_clip_ratio",
          "pg_variant=topr: fraction of negative-sample positions clipped at either bound.", _S),
    gauge("actor/topr_scores_{stat:mean|std}", "rl_actor_topr_scores",
          "pg_variant=topr: score of the micro-batch's samples, mean (std: std across micro-batches).", _S),
    gauge("actor/topr_{kind:positive|negative}_weight", "rl_actor_topr_weight",
          "pg_variant=topr: configured weight of the positive or negative samples (a constant).", _S),
    gauge("actor/cispo_cispo_epsilon_{bound:low|high}", "rl_actor_cispo_epsilon",
          "pg_variant=cispo: configured low or high epsilon (a constant).", _S),
    gauge("actor/cispo_cispo_clip_{bound:lower|upper}", "rl_actor_cispo_clip_bound",
          "pg_variant=cispo: lower or upper clip bound of the importance ratio (a constant).", _S),
    gauge("actor/cispo_cispo_use_unified_mask", "rl_actor_cispo_unified_mask",
          "pg_variant=cispo: 1 if the unified mask is used, else 0 (a constant).", _S),
    gauge("actor/cispo_cispo_{bound:lower|upper}_clipfrac", "rl_actor_cispo_bound_clip_ratio",
          "pg_variant=cispo: fraction of positions whose ratio was clipped at the lower or upper bound.", _S),
    gauge("actor/cispo_cispo_total_clipfrac", "rl_actor_cispo_clip_ratio",
          "pg_variant=cispo: fraction of positions whose ratio was clipped at either bound.", _S),
    gauge("actor/cispo_cispo_masked_{kind:positive|negative}_tokens", "rl_actor_cispo_masked_tokens_ratio",
          "pg_variant=cispo with the unified mask: fraction of positive- or negative-advantage tokens masked.", _S),
    gauge("actor/cispo_cispo_kept_tokens", "rl_actor_cispo_kept_tokens_ratio",
          "pg_variant=cispo with the unified mask: fraction of tokens kept.", _S),
    gauge("actor/cispo_clipped_ratio_mean", "rl_actor_cispo_clipped_importance_ratio",
          "pg_variant=cispo: clipped importance ratio, token mean per sequence then mean over sequences.", _S),
    gauge("actor/kimi15_kimi15_tau", "rl_actor_kimi15_tau", "pg_variant=kimi15: configured tau (a constant).", _S),
    gauge("actor/kimi15_kimi15_log_ratio_{stat:mean|std}", "rl_actor_kimi15_log_ratio",
          "pg_variant=kimi15: log(pi/pi_old) over all positions, mean (std: std across micro-batches).", _S),
    gauge("actor/kimi15_kimi15_log_ratio_abs_mean", "rl_actor_kimi15_abs_log_ratio",
          "pg_variant=kimi15: mean of |log(pi/pi_old)| over all positions.", _S),
    gauge("actor/kimi15_kimi15_{kind:policy_grad|kl_reg}_magnitude", "rl_actor_kimi15_magnitude",
          "pg_variant=kimi15: magnitude of the policy-gradient term or of the KL regulariser.", _S),
    gauge("actor/kimi15_kimi15_reg_ratio", "rl_actor_kimi15_reg_ratio",
          "pg_variant=kimi15: KL-regulariser magnitude over policy-gradient magnitude.", _S),
    # Train/inference mismatch correction (train_infer_corrections.py)
    gauge("actor/train_infer_ratio_{kind:token|geometric|sequence|segment}_mean", "rl_actor_train_infer_ratio",
          "Ratio exp(old_logp - infer_logp) between trainer and inference engine at a granularity, token mean per "
          "sequence then mean over sequences.", _S),
    gauge("actor/train_infer_diff_{kind:token|geometric|sequence|segment}_mean", "rl_actor_train_infer_diff",
          "Probability difference exp(old_logp) - exp(infer_logp) between trainer and inference engine at a "
          "granularity, token mean per sequence then mean over sequences.", _S),
    gauge("actor/is_weight_clipfrac", "rl_actor_is_weight_clip_ratio",
          "Fraction of response tokens whose importance-sampling weight exceeded its upper bound.", _S),
    gauge("actor/train_infer_{kind:token|geometric|sequence|segment}_{metric:ratio|diff}_mask_mean",
          "rl_actor_train_infer_filter_pass_ratio",
          "Fraction of response tokens that pass the ratio or diff filter at a granularity.", _S),
    gauge("actor/train_infer_final_mask_mean", "rl_actor_train_infer_final_pass_ratio",
          "Fraction of response tokens that pass all train/inference filters.", _S),
    # Evaluation metrics (log-probabilities)
    gauge(f"critic/ref_log_prob/{MIN_MAX_MEAN}", "rl_critic_ref_log_prob",
          "Log-probability of the taken tokens under the reference model.", _S),
    gauge(f"critic/old_log_prob/{MIN_MAX_MEAN}", "rl_critic_old_log_prob",
          "Log-probability of the taken tokens under the old policy (actor before training).", _S),
    # PPO loss
    gauge("actor/weighted_pg_loss", "rl_actor_weighted_pg_loss", "Weighted policy-gradient loss.", _S),
    gauge("actor/valid_samples", "rl_actor_valid_samples", "Number of valid samples in the batch.", _S,
          unit="{sample}"),
    gauge("actor/total_samples", "rl_actor_total_samples", "Number of samples in the batch (batch size).", _S,
          unit="{sample}"),
    gauge("actor/valid_sample_ratio", "rl_actor_valid_sample_ratio", "Fraction of valid samples in the batch.", _S),
    gauge("actor/sample_weights_{stat:mean|max|min}", "rl_actor_sample_weights", "Sample weights in the batch.", _S),
    # Distributions (rl_otel.stats.ppo_stats(distributions=True)): the batch behind the mean/max/min above
    histogram("actor/ratio_dist", "rl_actor_importance_ratio_dist",
              "Distribution of the importance ratio exp(logp - logp_old) over the batch's response tokens.", _S,
              IMPORTANCE_RATIO_BUCKETS),
    histogram("actor/log_prob_dist", "rl_actor_log_prob_dist",
              "Distribution of the policy's log-probabilities of the response tokens.", _S, LOGPROB_BUCKETS),
    histogram("actor/kl_dist", "rl_actor_kl_dist",
              "Distribution of the per-token k1 KL logp - logp_ref against the reference policy.", _S, KL_BUCKETS),
    histogram("critic/advantages_dist", "rl_critic_advantages_dist",
              "Distribution of the advantages over the batch's response tokens.", _S, SIGNED_BUCKETS),
    histogram("critic/rewards_dist", "rl_critic_rewards_dist",
              "Distribution of the per-sequence (normalized/clipped) rewards.", _S, SIGNED_BUCKETS),
    histogram("critic/score_dist", "rl_critic_score_dist", "Distribution of the raw per-sequence scores.", _S,
              SIGNED_BUCKETS),
    histogram("tokens/response_length_dist", "rl_tokens_response_length_dist",
              "Distribution of response lengths in tokens.", _S, LENGTH_BUCKETS, unit="{token}"),
    # SFT loss (named in ROLL's docs; the code logs none of these three)
    gauge("actor/sft_loss", "rl_actor_sft_loss", "Supervised fine-tuning loss.", _S),
    gauge("actor/positive_sft_loss", "rl_actor_positive_sft_loss", "SFT loss on positive samples.", _S),
    gauge("actor/negative_sft_loss", "rl_actor_negative_sft_loss", "SFT loss on negative samples.", _S),
    # SFT, distillation and the cluster-named training keys of the strategies ({cluster}/grad_norm, ...)
    # every training strategy logs it as {worker_config.name}/loss@sum (op_compute_language_loss of the megatron,
    # deepspeed and fsdp2 strategies): SFT's main loss, and the loss of any training cluster whose loss is the
    # language-model loss, so every cluster that runs optimizer steps, not only sft_train
    gauge(f"{{cluster:{TRAIN_CLUSTERS}}}/loss", "rl_cluster_loss",
          "Token-mean language-model loss of a training cluster's step (the strategies' {cluster}/loss@sum: per "
          "micro-batch over the global label-token count, summed over micro-batches and ranks); SFT's main loss.",
          _S),
    gauge("{cluster:sft_train|student}/val_loss", "rl_cluster_val_loss",
          "SFT or distillation: validation language-model loss.", _S),
    gauge("student/lr", "rl_student_learning_rate", "Distillation: learning rate of the student.", _S),
    gauge("train/train_{kind:distill|student}_loss", "rl_distill_loss",
          "Distillation: the distillation divergence loss or the student's language-model loss, token mean over the "
          "step.", _S),
    gauge("train/{operation:teacher_forward|student_train_step|step_train}", "rl_distill_operation_duration_seconds",
          "Distillation: time of the teacher forward, the student train step, or the whole train step.", _S,
          unit="s"),
    gauge("logits_transfer/{kind:topk_probs|topk_log_probs|topk_indices|topk_inf_mask}/"
          "{operation:logits_transfer_total|teacher2student|student_internal_broadcast}_time",
          "rl_logits_transfer_duration_seconds",
          "Distillation: time to transfer one teacher-logits tensor (total, teacher to student, broadcast inside "
          "the student).", _S, unit="s"),
    gauge(f"{{cluster:{TRAIN_CLUSTERS}}}/grad_norm", "rl_cluster_grad_norm",
          "Gradient norm before clipping of a training cluster, mean over optimizer steps and data-parallel ranks.",
          _S),
    gauge(f"{{cluster:{TRAIN_CLUSTERS}|critic}}/"
          "{metric:load_balancing_loss|seq_load_balancing_loss|global_load_balancing_loss|z_loss}",
          "rl_moe_aux_loss", "Megatron MoE: auxiliary router loss of a cluster, mean over layers and gradient "
          "accumulation steps.", _S),
    gauge(f"{{cluster:{TRAIN_CLUSTERS}|critic}}/mtp_{{k:[0-9]+}} loss", "rl_mtp_loss",
          "Megatron multi-token prediction: loss of MTP layer k of a cluster.", _S),
    # System
    gauge("system/step", "rl_system_step",
          "0-based pipeline step ROLL writes into every step's metrics (resume replays log at it).", _S,
          unit="{step}"),
    gauge("system/global_step", "rl_system_global_step", "RLVR: 0-based global step.", _S, unit="{step}"),
    gauge("system/batch_size", "rl_system_batch_size", "RLVR: responses in the training batch.", _S,
          unit="{sample}"),
    gauge("system/{_:tps/tps|tps}", "rl_system_tokens_per_second",
          "Tokens per second of the pipeline step over the last <= 5 steps (RLVR system/tps/tps: prompt and "
          "response tokens of the whole step; agentic system/tps: tokens trained, model update to training).", _S,
          unit="{token}/s"),
    gauge("system/tps_gpu", "rl_system_tokens_per_gpu_per_second",
          "RLVR: system/tps/tps divided by the number of GPUs of the resource manager.", _S, unit="{token}/s"),
    gauge("system/{operation:actor_infer|actor_infer_response|actor_train}/tps", "rl_system_phase_tokens_per_second",
          "RLVR: tokens per second of the generate (actor_infer; actor_infer_response: response tokens only) or "
          "training phase over the last <= 5 steps.", _S, unit="{token}/s"),
    gauge("system/{operation:actor_infer|actor_infer/response|actor_train}/tps_{kind:gpu|dp}",
          "rl_system_phase_tokens_per_worker_per_second",
          "RLVR: a phase's tokens per second divided by the cluster's world size (gpu) or data-parallel size "
          "(dp).", _S, unit="{token}/s"),
    gauge("system/time/{operation:tps|actor_infer|actor_infer_response|actor_train}_mean",
          "rl_system_timer_mean_duration_seconds",
          "RLVR: mean duration of the last <= 5 timed whole steps (tps) or phases.", _S, unit="s"),
    counter("system/samples", "rl_system_samples",
            "Samples processed so far: (step + 1) * batch size (RLVR responses, agentic trajectories).", _S,
            unit="{sample}"),
    gauge("system/batch_{kind:add|remove}_count", "rl_system_batch_adjusted_rows",
          "Agentic: rows duplicated (add) or dropped (remove) to make the batch divisible by the batch sizes.", _S,
          unit="{sample}"),
    gauge(f"system/state_batch_size/{MIN_MAX_MEAN}", "rl_system_state_group_size",
          "GiGPO: rows per (trajectory group, state) group, mean/max/min over groups.", _S, unit="{sample}"),
    gauge("system/max_memory_{kind:allocated|reserved}", "rl_system_gpu_memory_peak_bytes",
          "FSDP2: peak GPU memory allocated or reserved after the optimizer step, max over steps and ranks.", _S,
          unit="By", scale=GIB, tracker_unit="GiBy"),
    gauge("mask/final_mask_sum_eq_0", "rl_mask_all_samples_masked",
          "RLVR: 1 if the sample-level masks left no token to train on (training skipped), else 0.", _S),
    # Phase durations: time/rollout, time/adv, time/step_*, ... (Trinity's time/eval, time/wait_explore_step too)
    gauge("time/{operation}", "rl_operation_duration_seconds",
          "Duration of a pipeline operation (ROLL time/step_total: the step's wall time, in RLVR the previous "
          "step's; time/step_generate, time/rollout, Trinity-RFT time/eval, ...).",
          "roll,trinity", unit="s"),
    # state_offload_manger: time/{metric_infix}/..., memory/{metric_infix}/..., memory/cpu/{metric_infix}/...
    gauge(f"time/{INFIX}/{{part:{PARTS}}}", "rl_phase_last_duration_seconds",
          "Last duration of a cluster's phase: total, execute (the work), onload or offload of model state, NCCL "
          "group reload/offload, and the checkpoint sub-timers (load, dcp_save, hf_save).", _S, unit="s"),
    gauge(f"memory/{INFIX}/{{kind:reload_nccl|offload_nccl}}", "rl_phase_nccl_memory_change_bytes",
          "Absolute change of the device memory in use when a cluster destroys (offload_nccl) or re-creates "
          "(reload_nccl) its NCCL groups around a phase.", _S,
          unit="By", scale=GIB, tracker_unit="GiBy"),
    gauge(f"memory/{INFIX}/{{stage:{GPU_STAGES}}}/{{kind:{GPU_KINDS}}}/{{device_id:[0-9]+}}", "rl_gpu_memory_bytes",
          "GPU memory of the process on a device at a stage of a phase (peaks since the phase started).", _S,
          unit="By", scale=GIB, tracker_unit="GiBy"),
    gauge(f"memory/{INFIX}/end/onload/{{kind:max_allocated|max_reserved}}_frac/{{device_id:[0-9]+}}",
          "rl_gpu_memory_peak_ratio",
          "Peak allocated/reserved GPU memory during a phase as a fraction of the device's total memory.", _S),
    gauge(f"memory/cpu/{INFIX}/{{stage:start|end}}/{{kind:rss|vms}}", "rl_cpu_memory_bytes",
          "Resident (rss) or virtual (vms) memory of the process at the start or end of a phase.", _S,
          unit="By", scale=GIB, tracker_unit="GiBy"),
    gauge("global_seqlen/{cluster}/{stat:mean|max|min|balanced_max|balanced_min|minmax_diff}",
          "rl_cluster_global_seqlen",
          "Summed attention tokens per data-parallel partition of a cluster's train batch (balanced_*: after "
          "balancing; minmax_diff: max - min before).", _S, unit="{token}"),
    gauge(f"dynamic_batching/{INFIX}/{{kind:valid_tokens|actual_tokens_origin|actual_tokens|removed_padding_tokens}}",
          "rl_dynamic_batching_tokens",
          "Dynamic batching of a cluster's phase: unpadded tokens, padded tokens before and after, padding removed.",
          _S, unit="{token}"),
    gauge(f"dynamic_batching/{INFIX}/removed_padding_ratio", "rl_dynamic_batching_removed_padding_ratio",
          "Dynamic batching of a cluster's phase: fraction of the padding tokens removed.", _S),
    # Rollout schedulers (RLVR: per reward domain, the domain repeated inside the scheduler's own key)
    gauge("{domain}/scheduler/{metric:collect_query_count|query_use_count|query_filter_count}",
          "rl_domain_scheduler_prompts",
          "RLVR scheduler of a reward domain: prompts collected into the batch, consumed, or dropped by the query "
          "filter.", _S, unit="{prompt}"),
    gauge("{domain}/scheduler/off_policy_ratio", "rl_domain_scheduler_off_policy_lag",
          "RLVR scheduler of a reward domain: mean steps between a sample's sampling start and its training step.",
          _S, unit="{step}"),
    gauge("{domain}/scheduler/{_}/time/{operation:generate|reward}/count", "rl_domain_scheduler_calls",
          "RLVR scheduler of a reward domain: generate or reward calls timed in the step.", _S, unit="{request}"),
    gauge(f"{{domain}}/scheduler/{{_}}/time/{{operation:generate|reward}}/{MIN_MAX_MEAN}",
          "rl_domain_scheduler_call_duration_seconds",
          "RLVR scheduler of a reward domain: duration of one generate or reward call, mean/max/min over the step.",
          _S, unit="s"),
    gauge(f"{{domain}}/scheduler/{{_}}/time/{INFIX}/{{part:{PARTS}}}/{MIN_MAX_MEAN}",
          "rl_domain_scheduler_reward_phase_duration_seconds",
          "RLVR reward worker of a domain: its phase timings per request, mean/max/min over requests.", _S, unit="s"),
    gauge(f"{{domain}}/scheduler/{{_}}/score/{MIN_MAX_MEAN}", "rl_domain_scheduler_score",
          "RLVR scheduler of a reward domain: reward score of the collected responses, mean/max/min.", _S),
    gauge(f"{{domain}}/scheduler/{{_}}/spec_accept_rate/{MIN_MAX_MEAN}", "rl_domain_scheduler_spec_accept_ratio",
          "RLVR speculative decoding: per-request accept rate of draft tokens, mean/max/min over requests.", _S),
    gauge(f"{{domain}}/scheduler/{{_}}/spec_accept_length/{MIN_MAX_MEAN}", "rl_domain_scheduler_spec_accept_length",
          "RLVR speculative decoding: per-request accepted length per draft (1 + accepted/drafts), mean/max/min.",
          _S, unit="{token}"),
    gauge(f"{{domain}}/scheduler/{{_}}/spec_{{kind:accept|draft}}_token_num/{MIN_MAX_MEAN}",
          "rl_domain_scheduler_spec_tokens",
          "RLVR speculative decoding: per-request accepted or drafted tokens, mean/max/min over requests.", _S,
          unit="{token}"),
    gauge("scheduler/group_filter_count", "rl_scheduler_filtered_groups",
          "Agentic: trajectory groups the group filter dropped since the last batch.", _S, unit="{group}"),
    # Agentic env managers
    gauge("env/response_length", "rl_env_response_length",
          "Agentic: response tokens per trajectory (step-wise managers: mean per turn), mean over trajectories.",
          _S, unit="{token}"),
    *_env_families("env/{tag}", "rl_env", "of an env tag"),
    # vLLM engine and partial-GPU mode (agentic)
    gauge("vllm/kv_cache_usage_perc_max", "rl_vllm_kv_cache_usage_peak_ratio",
          "vLLM: peak KV-cache usage fraction over snapshots and inference workers since the last log.", _S),
    gauge("vllm/num_requests_waiting_max", "rl_vllm_waiting_requests_peak",
          "vLLM: peak number of waiting requests over snapshots and inference workers since the last log.", _S,
          unit="{request}"),
    counter("vllm/num_preemptions_max", "rl_vllm_preemptions",
            "vLLM: cumulative preemptions (the engine counter), max over inference workers.", _S,
            unit="{preemption}"),
    counter("vllm/spec_decode_num_drafts", "rl_vllm_spec_decode_drafts",
            "vLLM speculative decoding: cumulative drafts (the engine counter), mean over inference workers.", _S,
            unit="{draft}"),
    counter("vllm/spec_decode_num_{kind:draft|accepted}_tokens", "rl_vllm_spec_decode_tokens",
            "vLLM speculative decoding: cumulative draft or accepted tokens (the engine counters), mean over "
            "inference workers.", _S, unit="{token}"),
    gauge("{operation:shrink|expand}/aborted", "rl_partial_gpu_aborted_requests",
          "Agentic partial-GPU mode: requests aborted while shrinking or expanding the inference workers.", _S,
          unit="{request}"),
    gauge("{operation:shrink|expand}/remapped", "rl_partial_gpu_remapped_routes",
          "Agentic partial-GPU mode: request routes remapped while shrinking or expanding.", _S),
    gauge("{operation:shrink|expand}/{_:shrink|expand}_duration_ms", "rl_partial_gpu_rebalance_duration_seconds",
          "Agentic partial-GPU mode: time to shrink or expand the inference workers.", _S, unit="s", scale=1e-3,
          tracker_unit="ms"),
    gauge("{operation:shrink|expand}/{_:offload|load}_ranks", "rl_partial_gpu_moved_ranks",
          "Agentic partial-GPU mode: the data-parallel ranks offloaded or loaded; ROLL logs a Python list, which a "
          "gauge refuses (counted as a bad value).", _S),
)
