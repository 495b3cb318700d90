"""veRL's metrics (verl 0.9.1: PPO trainers V1 and legacy, SFT trainer), as passed to ``Tracking.log``.

Read off verl's code (tests/data/frameworks/verl.tsv). Worker metrics (``actor/*``, ``critic/*``) are per
mini-batch values reduced by ``verl.utils.metric.reduce_metrics``: a key containing ``max`` -> max, ``min`` -> min,
anything else -> mean. Trinity-RFT's trainer and ROLL reuse many of these keys; they are defined here once.
"""

from __future__ import annotations

from rl_otel.catalog.define import GIB, MIN_MAX_MEAN, counter, gauge

_S = "verl"
_SR = "verl,roll"  # keys ROLL logs under the same name
_STATS = "{stat:mean|max|min|std}"
_ROLE = "{worker:actor|critic}"
# Rejection-sampling options of algorithm.rollout_correction.rollout_rs (their names contain '_').
_RS_OPTIONS = ("token_k1|token_k2|token_k3|seq_sum_k1|seq_sum_k2|seq_sum_k3|seq_mean_k1|seq_mean_k2|seq_mean_k3|"
               "seq_max_k2|seq_max_k3")
# timing_raw names of the PPO trainers (V1 and legacy; marked_timer); enumerated so other timing_s/ keys fall back.
_TIMERS = ("step|gen|reward|old_log_prob|ref|values|adv|update_critic|update_actor|save_checkpoint|update_weights|"
           "testing|dump_rollout_generations|start_profile|stop_profile|switch_wait|switch_to_trainer|"
           "switch_to_rollout")
_PER_TOKEN_TIMERS = "gen|ref|values|adv|update_critic|update_actor"


def _rollout_corr(prefix: str, name: str, mode: str) -> tuple:
    """``rollout_corr/*`` (decoupled mode: pi_old vs pi_rollout) or ``actor/rollout_corr/*`` (bypass mode)."""
    rs = f"{prefix}/rollout_rs_{{kind:{_RS_OPTIONS}}}"
    return (
        # rollout_is (importance weights)
        gauge(f"{prefix}/rollout_is_{{stat:mean|max|min|std}}", f"{name}_is_weight",
              f"{mode}: rollout_is importance weights over response tokens: masked mean of the applied (truncated) "
              "weights, max/min weight (sequence level: exp of the max/min sequence log-ratio, capped at exp(20)), "
              "std of the weights clamped to [0, threshold].", _S),
        gauge(f"{prefix}/rollout_is_eff_sample_size", f"{name}_is_effective_sample_size_ratio",
              f"{mode}: normalized effective sample size of the IS weights, 1 / mean((w / mean w)^2) over response "
              "tokens with weights clamped to the threshold (1 = uniform weights).", _S),
        gauge(f"{prefix}/rollout_is_ratio_fraction_{{bound:high|low}}", f"{name}_is_out_of_bound_ratio",
              f"{mode}: fraction of raw IS ratios (tokens, or sequences at sequence level) above the upper (high) "
              "or below the lower (low, default 1/upper) threshold.", _S),
        gauge(f"{prefix}/rollout_is_seq_{{stat:mean|std|max|min}}", f"{name}_is_seq_weight",
              f"{mode}: per-sequence mean IS weight, mean/std/max/min over sequences.", _S),
        gauge(f"{prefix}/rollout_is_seq_max_deviation", f"{name}_is_seq_max_deviation",
              f"{mode}: max over sequences of |per-sequence mean IS weight - 1|.", _S),
        gauge(f"{prefix}/rollout_is_seq_fraction_{{bound:high|low}}", f"{name}_is_seq_out_of_bound_ratio",
              f"{mode}: fraction of sequences whose raw mean IS weight is above the upper (high) or below the lower "
              "(low) threshold.", _S),
        gauge(f"{prefix}/rollout_is_oob_ratio", f"{name}_is_outside_bounds_ratio",
              f"{mode}: IcePop mode only: fraction of tokens whose raw IS ratio is outside [lower, upper].", _S),
        gauge(f"{prefix}/rollout_is_batch_norm_factor", f"{name}_is_batch_norm_factor",
              f"{mode}: with rollout_is_batch_normalize: the batch mean weight the IS weights were divided by.", _S),
        # rollout_rs (rejection sampling), per option
        gauge(f"{rs}_{{stat:mean|max|min|std}}", f"{name}_rs_statistic",
              f"{mode}: the statistic of a rollout_rs option (kind): masked mean and std over response tokens, "
              "max/min (per sequence at sequence level).", _S),
        gauge(f"{rs}_fraction_{{bound:high|low}}", f"{name}_rs_out_of_bound_ratio",
              f"{mode}: fraction of a rollout_rs option's statistic above the upper (high) or below the lower (low; "
              "0 without a lower bound) threshold.", _S),
        gauge(f"{rs}_seq_{{stat:mean|std|max|min}}", f"{name}_rs_seq_statistic",
              f"{mode}: per-sequence statistic of a rollout_rs option, mean/std/max/min over sequences.", _S),
        gauge(f"{rs}_seq_max_deviation", f"{name}_rs_seq_max_deviation",
              f"{mode}: max over sequences of |statistic| of a rollout_rs option.", _S),
        gauge(f"{rs}_seq_fraction_{{bound:high|low}}", f"{name}_rs_seq_out_of_bound_ratio",
              f"{mode}: fraction of sequences whose statistic of a rollout_rs option is above the upper (high) or "
              "below the lower (low; only *_k1 options, 0.0 without a valid sequence) threshold.", _S),
        gauge(f"{rs}_masked_fraction", f"{name}_rs_masked_ratio",
              f"{mode}: fraction of response tokens rejected by one rollout_rs option.", _S),
        gauge(f"{rs}_seq_masked_fraction", f"{name}_rs_seq_masked_ratio",
              f"{mode}: fraction of valid sequences with any token rejected by one rollout_rs option.", _S),
        gauge(f"{prefix}/rollout_rs_masked_fraction", f"{name}_rs_combined_masked_ratio",
              f"{mode}: fraction of response tokens rejected by all rollout_rs options combined.", _S),
        gauge(f"{prefix}/rollout_rs_seq_masked_fraction", f"{name}_rs_combined_seq_masked_ratio",
              f"{mode}: fraction of sequences with any token rejected by the rollout_rs options.", _S),
        # off-policy diagnostics (always with rollout log-probs)
        gauge(f"{prefix}/{{engine:training|rollout}}_ppl", f"{name}_perplexity",
              f"{mode}: mean over sequences of exp(-token-mean log-prob) under the trainer (training) or the "
              "rollout (rollout) policy.", _S),
        gauge(f"{prefix}/{{engine:training|rollout}}_log_ppl", f"{name}_log_perplexity",
              f"{mode}: mean over sequences of the negative token-mean log-prob under the trainer (training) or "
              "the rollout (rollout) policy.", _S),
        gauge(f"{prefix}/kl", f"{name}_kl",
              f"{mode}: KL(rollout || trainer), token masked mean of (rollout log-prob - trainer log-prob).", _S),
        gauge(f"{prefix}/k3_kl", f"{name}_k3_kl",
              f"{mode}: token masked mean of the k3 estimator exp(d) - d - 1, d = trainer - rollout log-prob.", _S),
        gauge(f"{prefix}/log_ppl_diff", f"{name}_log_ppl_diff",
              f"{mode}: mean over sequences of (rollout - trainer) token-mean log-prob.", _S),
        gauge(f"{prefix}/log_ppl_abs_diff", f"{name}_log_ppl_abs_diff",
              f"{mode}: mean over sequences of |(rollout - trainer) token-mean log-prob|.", _S),
        gauge(f"{prefix}/log_ppl_diff_{{stat:max|min}}", f"{name}_log_ppl_diff_extreme",
              f"{mode}: max or min over sequences of (rollout - trainer) token-mean log-prob.", _S),
        gauge(f"{prefix}/ppl_ratio", f"{name}_ppl_ratio",
              f"{mode}: mean over sequences of exp(log_ppl_diff) = trainer perplexity / rollout perplexity.", _S),
        gauge(f"{prefix}/chi2_{{kind:token|seq}}", f"{name}_chi2",
              f"{mode}: chi-square divergence: token masked mean of rho^2 - 1 (token), or mean over sequences of "
              "(prod rho)^2 - 1 (seq); rho = pi_trainer / pi_rollout, log-ratio clamped to +-20.", _S),
    )


_DECOUPLED = ("rollout correction, decoupled mode (pi_old vs pi_rollout over the batch; on by default: "
              "algorithm.rollout_correction set and rollout.calculate_log_probs=true)")
_BYPASS = ("rollout correction, bypass mode (current policy vs pi_rollout per micro-batch, mean over micro-batches "
           "and mini-batches; policy_loss.loss_mode=bypass_mode)")

# Keys ROLL logs too (defined here only; roll.py must not define them again).
_SHARED_WITH_ROLL = (
    gauge(f"critic/score/{MIN_MAX_MEAN}", "rl_critic_score",
          "Sequence score (sum of token_level_scores: the raw reward incl. the reward model's score), mean/max/min "
          "over non-aborted sequences (response length > 0); NaN if every sample is aborted.", _SR),
    gauge(f"critic/rewards/{MIN_MAX_MEAN}", "rl_critic_rewards",
          "Sequence reward (sum of token_level_rewards: the score minus beta*KL with algorithm.use_kl_in_reward, "
          "else the score), mean/max/min over non-aborted sequences; NaN if every sample is aborted.", _SR),
    gauge(f"critic/advantages/{MIN_MAX_MEAN}", "rl_critic_advantages",
          "Advantages, mean/max/min over all response tokens (response_mask); NaN if the mask is empty.", _SR),
    gauge(f"critic/returns/{MIN_MAX_MEAN}", "rl_critic_returns",
          "Returns, mean/max/min over all response tokens (response_mask); NaN if the mask is empty.", _SR),
    gauge(f"critic/values/{MIN_MAX_MEAN}", "rl_critic_values",
          "Only with a critic: the critic's value predictions before the update, mean/max/min over response "
          "tokens; NaN if the mask is empty.", _SR),
    gauge("actor/pg_loss", "rl_actor_pg_loss",
          "Policy-gradient loss aggregated with loss_agg_mode over the global mini-batch (micro-batch partial sums "
          "summed, DP-averaged), mean over mini-batches; absent in pure top-k distillation.", _SR),
    gauge("actor/kl_loss", "rl_actor_kl_loss",
          "Only with actor.use_kl_loss: KL(current || reference) estimator (kl_loss_type) aggregated with "
          "loss_agg_mode over the global mini-batch, mean over mini-batches.", _SR),
    gauge("actor/lr", "rl_actor_learning_rate",
          "Learning rate of the actor returned by the LR scheduler step after the last mini-batch of the update.",
          _SR),
    gauge("critic/loss", "rl_critic_loss",
          "Only with a critic: critic loss summed over micro-batches, averaged over DP ranks; mean over "
          "mini-batches.", _SR),
    gauge("critic/lr", "rl_critic_learning_rate",
          "Only with a critic: critic learning rate after the last mini-batch of the update.", _SR),
)

_OWN = (
    # Progress
    counter("training/global_step", "rl_training_steps",
            "Index of the training step just finished (starts at 1, +1 per step; the step passed to "
            "Tracking.log).", _S, unit="{step}"),
    gauge("training/epoch", "rl_training_epoch", "0-based index of the current data epoch.", _S, unit="{epoch}"),
    # Scores, values (compute_data_metrics)
    gauge("critic/vf_explained_var", "rl_critic_vf_explained_variance",
          "Only with a critic: 1 - Var(returns - values) / (Var(returns) + 1e-5) over response tokens (unbiased "
          "torch.var); NaN if the mask is empty, can be negative.", _S),
    # Lengths, turns
    gauge(f"response_length/{MIN_MAX_MEAN}", "rl_response_length",
          "Response length in tokens, mean/max/min over all sequences (aborted samples count as 0).", _S,
          unit="{token}"),
    gauge("response_length/clip_ratio", "rl_response_length_clip_ratio",
          "Fraction of all sequences whose response length equals the padded max response length (truncated); "
          "aborted samples count in the denominator.", _S),
    gauge(f"response_length_non_aborted/{MIN_MAX_MEAN}", "rl_response_length_non_aborted",
          "Response length in tokens, mean/max/min over non-aborted sequences; NaN if every sample is aborted.", _S,
          unit="{token}"),
    gauge("response_length_non_aborted/clip_ratio", "rl_response_length_non_aborted_clip_ratio",
          "Fraction of non-aborted sequences whose response length equals the max response length; NaN if every "
          "sample is aborted.", _S),
    gauge("response/aborted_ratio", "rl_response_aborted_ratio",
          "Fraction of sequences that are aborted (response length 0).", _S),
    gauge(f"prompt_length/{MIN_MAX_MEAN}", "rl_prompt_length",
          "Prompt length in tokens (non-padding), mean/max/min over sequences.", _S, unit="{token}"),
    gauge("prompt_length/clip_ratio", "rl_prompt_length_clip_ratio",
          "Fraction of sequences whose prompt length equals the padded max prompt length.", _S),
    gauge(f"num_turns/{MIN_MAX_MEAN}", "rl_num_turns",
          "Agent-loop turn count (__num_turns__), mean/max/min over sequences.", _S, unit="{turn}"),
    gauge(f"training/num_turns/{MIN_MAX_MEAN}", "rl_training_num_turns",
          "V1 trainer: turn count, mean/max/min over non-padding trajectories (duplicate of num_turns/*).", _S,
          unit="{turn}"),
    gauge(f"tool_call_counts/{MIN_MAX_MEAN}", "rl_tool_calls",
          "Tool calls per sequence, mean/max/min over sequences; only if the batch carries tool_call_counts.", _S,
          unit="{call}"),
    gauge("global_seqlen/{stat:mean|max|min|balanced_max|balanced_min|minmax_diff}", "rl_global_seqlen",
          "Tokens per data-parallel rank: min/max/minmax_diff of the per-rank sums before balancing, balanced_min/"
          "balanced_max after balancing, mean = total tokens / DP ranks.", _S, unit="{token}"),
    # Timing (compute_timing_metrics): timers add up within a step
    gauge(f"timing_s/{{operation:{_TIMERS}}}", "rl_step_timing_seconds",
          "Wall time of the training step (step) or of a part of it (timing_raw, accumulated within the step; "
          "step excludes testing).", _S, unit="s"),
    gauge(f"timing_per_token_ms/{{operation:{_PER_TOKEN_TIMERS}}}", "rl_timing_per_token_seconds",
          "Time of a training operation per token: timing_s/{operation} divided by the batch's response tokens "
          "(gen) or prompt+response tokens (ref, values, adv, update_critic, update_actor); 0 if that count is 0.",
          "verl,trinity", unit="s", scale=1e-3, tracker_unit="ms"),
    gauge("timing_s/agent_loop/{operation:generate_sequences|tool_calls|compute_score}/{stat:min|max|mean}",
          "rl_agent_loop_timing_seconds",
          "Legacy trainer (agent-loop stats merged into timing_raw): per-sample LLM generation, tool-call or reward "
          "scoring time, min/max/mean over the batch's samples.", _S, unit="s"),
    gauge("timing_s/agent_loop/num_preempted/{stat:min|max|mean}", "rl_agent_loop_preemptions",
          "Legacy trainer: per-sample count of request preemptions, min/max/mean over the batch's samples.", _S,
          unit="{preemption}"),
    gauge("timing_s/agent_loop/slowest/{operation:generate_sequences|tool_calls|compute_score}",
          "rl_agent_loop_slowest_timing_seconds",
          "Legacy trainer: generation, tool-call or scoring time of the slowest sample (max of generate + tool + "
          "score time).", _S, unit="s"),
    gauge("timing_s/agent_loop/slowest/num_preempted", "rl_agent_loop_slowest_preemptions",
          "Legacy trainer: request preemptions of the slowest sample.", _S, unit="{preemption}"),
    gauge("timing_s/agent_loop/slowest/{kind:prompt_length|response_length}", "rl_agent_loop_slowest_length",
          "Legacy trainer: prompt or response length in tokens of the slowest sample.", _S, unit="{token}"),
    # Throughput, MFU, memory
    gauge("perf/total_num_tokens", "rl_perf_step_tokens",
          "Tokens (prompt + response, non-padding) in the step's training batch (per step, not cumulative).", _S,
          unit="{token}"),
    gauge("perf/time_per_step", "rl_perf_step_duration_seconds", "Wall time of the training step (= timing_s/step).",
          _S, unit="s"),
    gauge("perf/throughput", "rl_perf_throughput_tokens_per_second",
          "Tokens per second per GPU: perf/total_num_tokens / (timing_s/step * n_gpus).", _S, unit="{token}/s"),
    gauge("perf/mfu/{cluster}", "rl_perf_mfu_ratio",
          "Model FLOPs utilization (fraction) of a worker's pass (actor update, critic update, actor_infer: the "
          "old-log-prob forward), mean over mini-batches.", _S),
    gauge(f"{_ROLE}/perf/max_memory_allocated_gb", "rl_perf_max_memory_allocated_bytes",
          "Peak device memory allocated by torch on the actor's or critic's reporting rank (DP rank 0), max over "
          "mini-batches (logged in GiB despite the _gb name).", _S, unit="By", scale=GIB, tracker_unit="GiBy"),
    gauge(f"{_ROLE}/perf/max_memory_reserved_gb", "rl_perf_max_memory_reserved_bytes",
          "Peak device memory reserved by the caching allocator on the actor's or critic's reporting rank, max "
          "over mini-batches (logged in GiB).", _S, unit="By", scale=GIB, tracker_unit="GiBy"),
    gauge(f"{_ROLE}/perf/cpu_memory_used_gb", "rl_perf_cpu_memory_used_bytes",
          "Host memory in use (psutil virtual_memory().used) on the actor's or critic's reporting node, mean over "
          "mini-batches (logged in GiB).", _S, unit="By", scale=GIB, tracker_unit="GiBy"),
    gauge("perf/max_memory_allocated_gb", "rl_worker_max_memory_allocated_bytes",
          "Peak device memory allocated by torch on the training worker, logged without a role prefix (SFT "
          "trainer; older veRL workers), in GiB.", _S, unit="By", scale=GIB, tracker_unit="GiBy"),
    gauge("perf/max_memory_reserved_gb", "rl_worker_max_memory_reserved_bytes",
          "Peak device memory reserved by the caching allocator on the training worker, logged without a role "
          "prefix (SFT trainer; older veRL workers), in GiB.", _S, unit="By", scale=GIB, tracker_unit="GiBy"),
    gauge("perf/cpu_memory_used_gb", "rl_worker_cpu_memory_used_bytes",
          "Host memory in use on the training worker's node, logged without a role prefix (SFT trainer; older veRL "
          "workers), in GiB.", _S, unit="By", scale=GIB, tracker_unit="GiBy"),
    # Actor (policy loss, entropy, KL)
    gauge("actor/pg_clipfrac", "rl_actor_pg_clip_ratio",
          "Fraction of response tokens where the clipped surrogate is active: token masked mean per micro-batch "
          "(independent of loss_agg_mode), mean over DP ranks, micro-batches and mini-batches.", _S),
    gauge("actor/pg_clipfrac_lower", "rl_actor_pg_clip_lower_ratio",
          "Fraction of response tokens with A < 0 where the dual-clip bound (-A * clip_ratio_c) applies: token "
          "masked mean per micro-batch, mean over DP ranks, micro-batches and mini-batches.", _S),
    gauge("actor/ppo_kl", "rl_actor_ppo_kl",
          "Approximate KL(old || current): token masked mean of (old_log_prob - log_prob) (log-ratio clamped to "
          "+-20) per micro-batch, mean over DP ranks, micro-batches and mini-batches.", _S),
    gauge("actor/entropy_loss", "rl_actor_entropy_loss",
          "Entropy aggregated with loss_agg_mode over the global mini-batch, mean over mini-batches (only when "
          "entropy is computed).", _S),
    gauge("actor/kl_coef", "rl_actor_kl_coef", "Only with actor.use_kl_loss: the configured kl_loss_coef.", _S),
    gauge("actor/loss", "rl_actor_loss",
          "Total actor loss (pg - entropy_coeff * entropy + kl_coef * kl [+ distillation]) summed over "
          "micro-batches, averaged over DP ranks; mean over mini-batches.", _S),
    gauge("actor/grad_norm", "rl_actor_grad_norm",
          "Gradient norm of the actor before clipping, per optimizer step (inf/NaN when the step is skipped as "
          "non-finite); mean over mini-batches.", _S),
    gauge("actor/mtp_losses/mtp_{k:[0-9]+}_loss", "rl_actor_mtp_loss",
          "Megatron multi-token prediction: MTP loss of depth k, averaged over DP ranks; mean over mini-batches.",
          _S),
    gauge("actor/entropy", "rl_actor_entropy",
          "Policy entropy (nats) from the old-log-prob forward pass, aggregated over the whole batch with "
          "loss_agg_mode (token-mean: mean per token; seq-mean-token-mean: mean of per-sequence means; ...); "
          "absent in bypass mode.", _S),
    gauge("actor/reward_kl_penalty", "rl_actor_reward_kl_penalty",
          "Only with algorithm.use_kl_in_reward: batch mean of the per-sequence token-mean KL(old policy || ref) "
          "subtracted from the reward.", _S),
    gauge("actor/reward_kl_penalty_coeff", "rl_actor_reward_kl_penalty_coeff",
          "Only with algorithm.use_kl_in_reward: KL coefficient beta applied this step (before the adaptive "
          "controller's update).", _S),
    # Critic
    gauge("critic/vf_loss", "rl_critic_vf_loss",
          "Only with a critic: 0.5 * clipped value loss aggregated with loss_agg_mode over the global mini-batch; "
          "mean over mini-batches.", _S),
    gauge("critic/vf_clipfrac", "rl_critic_vf_clip_ratio",
          "Only with a critic: fraction of response tokens where the clipped value loss is the larger one (token "
          "masked mean per micro-batch); mean over micro-batches, ranks and mini-batches.", _S),
    gauge("critic/vpred_mean", "rl_critic_vpred_mean",
          "Only with a critic: token masked mean of the current value predictions per micro-batch; mean over "
          "micro-batches, ranks and mini-batches.", _S),
    gauge("critic/grad_norm", "rl_critic_grad_norm",
          "Only with a critic: gradient norm of the critic before clipping per optimizer step; mean over "
          "mini-batches.", _S),
    # Validation (process_validation_metrics): val-core = the core var (acc, else reward) at the largest N
    gauge("val-{split:core|aux}/{data_source:.+?}/{var}/{stat:mean|std}@{k:[0-9]+}", "rl_val_metric",
          "Validation metric of a data source and variable (acc, reward or a reward_extra_info key): per prompt "
          "the mean (stat=mean) or population std (stat=std) over its k responses, averaged over prompts; "
          "split=core for the core variable's headline values, aux otherwise.", _S),
    gauge("val-{split:core|aux}/{data_source:.+?}/{var}/{stat:best|worst|maj}@{k:[0-9]+}/{across:mean|std}",
          "rl_val_metric_bootstrap",
          "Validation best-of-k, worst-of-k or majority-vote-of-k of a variable: per prompt the mean or std "
          "(across) over 1000 bootstrap resamples of k responses, averaged over prompts (maj only if every "
          "response has a pred).", _S),
    gauge(f"val-aux/num_turns/{MIN_MAX_MEAN}", "rl_val_num_turns",
          "Agent-loop turn count of validation responses, min/max/mean over responses.", _S, unit="{turn}"),
    # Rollout-vs-trainer probabilities
    gauge("training/rollout_probs_diff_valid", "rl_training_rollout_probs_diff_valid",
          "1 if the batch had any response token to compare actor and rollout probabilities, else 0 (then the "
          "rollout_probs_diff values are NaN).", _S),
    gauge("training/rollout_probs_diff_{stat:max|mean|std}", "rl_training_rollout_probs_diff",
          "|p_actor - p_rollout| of the response tokens' probabilities, max/mean/std over response tokens.", _S),
    gauge("training/rollout_actor_probs_pearson_corr", "rl_training_rollout_actor_probs_pearson_correlation",
          "Pearson correlation over response tokens of the actor's and the rollout's token probabilities.", _S),
    # Off-policy / async (V1 trainer)
    gauge(f"training/off_policy/trajectory_spans/{MIN_MAX_MEAN}", "rl_off_policy_trajectory_spans",
          "V1 trainer: model versions a trajectory was generated across (max - min generating step + 1), "
          "mean/max/min over non-padding trajectories.", _S, unit="{step}"),
    gauge(f"training/off_policy/trajectory_staleness/{MIN_MAX_MEAN}", "rl_off_policy_trajectory_staleness",
          "V1 trainer: versions a trajectory lags the current policy, lower bound ((global_step - 1) - max "
          "generating step), mean/max/min over non-padding trajectories.", _S, unit="{step}"),
    gauge(f"training/off_policy/trajectory_staleness_worst/{MIN_MAX_MEAN}",
          "rl_off_policy_trajectory_staleness_worst",
          "V1 trainer: versions a trajectory lags the current policy, worst case ((global_step - 1) - min "
          "generating step), mean/max/min over non-padding trajectories.", _S, unit="{step}"),
    gauge("training/{reason:off_policy|filter_groups|rollout_failure}/evicted_samples", "rl_training_evicted_groups",
          "V1 trainer: prompt groups evicted this step (only when > 0): too stale (off_policy, "
          "max_off_policy_threshold), all responses with the same metric value (filter_groups, DAPO) or a failed "
          "rollout (rollout_failure).", _S, unit="{group}"),
    gauge(f"training/off_policy/evicted_samples_staleness/{MIN_MAX_MEAN}", "rl_off_policy_evicted_staleness",
          "V1 trainer: staleness (global_step - submit step + 1) of the groups evicted as too stale, mean/max/min "
          "over them.", _S, unit="{step}"),
    gauge("training/filter_groups/discarded_surplus_samples", "rl_filter_groups_discarded_surplus_groups",
          "V1 sync DAPO: finished prompt groups discarded beyond the batch size this step (only when > 0).", _S,
          unit="{group}"),
    gauge("separate_async/switch/threshold_ratio", "rl_separate_async_switch_threshold_ratio",
          "V1 separate_async: fraction of train_batch_size that must be sampleable before the hybrid engine "
          "switches back to training (value used this step).", _S),
    gauge("separate_async/switch/wait_samples", "rl_separate_async_switch_wait_groups",
          "V1 separate_async: prompt groups the trainer was short of when sampling this step.", _S, unit="{group}"),
    gauge("separate_async/switch/idle", "rl_separate_async_switch_idle",
          "V1 separate_async: 1 if the trainer waited longer than the replay buffer poll interval this step, "
          "else 0.", _S),
    gauge("separate_async/decision/sampleable_count", "rl_separate_async_sampleable_groups",
          "V1 separate_async: prompt groups already sampleable for the next step.", _S, unit="{group}"),
    gauge("separate_async/decision/remaining", "rl_separate_async_remaining_groups",
          "V1 separate_async: prompt groups still missing to reach the switch threshold.", _S, unit="{group}"),
    gauge("separate_async/decision/should_switch_to_rollout", "rl_separate_async_should_switch_to_rollout",
          "V1 separate_async: 1 if the hybrid engine is lent to rollout for the next step, else 0.", _S),
    gauge("separate_async/decision/per_sample_time_seconds", "rl_separate_async_per_sample_wait_seconds",
          "V1 separate_async: running average wait time per missing sample (once measured).", _S, unit="s"),
    gauge("separate_async/decision/effective_switch_cost_seconds",
          "rl_separate_async_effective_switch_cost_seconds",
          "V1 separate_async: average to-rollout plus to-trainer switch cost (once both are measured).", _S,
          unit="s"),
    # Checkpoint engine (delta_sharded), MoE rollout, speculative decoding
    gauge("checkpoint_engine/changed_ratio", "rl_checkpoint_engine_changed_ratio",
          "delta_sharded checkpoint engine: fraction of weight elements changed since the last sync (1.0 on the "
          "full seed sync).", _S),
    gauge("checkpoint_engine/changed_elems", "rl_checkpoint_engine_changed_elements",
          "delta_sharded checkpoint engine: weight elements sent this sync.", _S, unit="{element}"),
    gauge("checkpoint_engine/payload_mbytes", "rl_checkpoint_engine_payload_bytes",
          "delta_sharded checkpoint engine: bytes on the wire this sync (logged in MiB).", _S, unit="By",
          scale=float(2**20), tracker_unit="MiBy"),
    gauge("checkpoint_engine/flushes", "rl_checkpoint_engine_flushes",
          "delta_sharded checkpoint engine: bucket flushes streamed this sync.", _S, unit="{flush}"),
    gauge("rollout/moe/{stat:max|min|avg}_vio/layer_{part}", "rl_rollout_moe_load_violation",
          "MoE load imbalance of one layer (part = layer index) over the metrics interval: max or min over experts "
          "of (load share * num_experts - 1), or mean over experts of its absolute value (avg).", _S),
    gauge("rollout/moe/{stat:max|min|avg}_vio/{across:max|avg}", "rl_rollout_moe_load_violation_across_layers",
          "MoE load imbalance (max_vio, min_vio or avg_vio of each layer) reduced over the layers: max or mean "
          "(avg).", _S),
    gauge("rollout/moe/routed_experts_found", "rl_rollout_moe_routed_experts_found",
          "1 if any routed-expert assignment was counted in the MoE metrics interval, else 0.", _S),
    gauge("rollout/moe/routed_expert_assignments", "rl_rollout_moe_routed_expert_assignments",
          "Routed (token, layer, top-k) expert assignments counted over the MoE metrics interval (reset after "
          "logging).", _S, unit="{assignment}"),
    gauge("rollout/spec_accept_rate", "rl_rollout_spec_accept_ratio",
          "Speculative decoding: accepted / draft tokens, mean over requests (0 for requests without drafts).", _S),
    gauge("rollout/spec_accept_length", "rl_rollout_spec_accept_length",
          "Speculative decoding: 1 + accepted tokens per verify step, mean over requests.", _S, unit="{token}"),
    # Gradient variance proxies (actor.calculate_sum_pi_squared; legacy trainer in practice)
    gauge("variance_proxy/proxy1_signal_strength", "rl_variance_proxy_signal_strength",
          "Gradient variance proxy 1: the squared actor grad norm (0.0 without a grad norm).", _S),
    gauge("variance_proxy/proxy2_total_power", "rl_variance_proxy_total_power",
          "Gradient variance proxy 2: mean over sequences of A^2 * W (IS-weighted when rollout IS weights "
          "exist), W = sum over tokens of (1 - 2 pi_t + sum pi^2).", _S),
    gauge("variance_proxy/proxy3_pure_noise", "rl_variance_proxy_pure_noise",
          "Gradient variance proxy 3: (proxy2 - proxy1) / (B - 1), floored at 0.", _S),
    gauge("variance_proxy/expected_a_squared", "rl_variance_proxy_expected_advantage_squared",
          "Mean over sequences of the squared per-sequence mean advantage.", _S),
    gauge("variance_proxy/expected_w", "rl_variance_proxy_expected_w", "Mean over sequences of W.", _S),
    # GDPO
    gauge(f"gdpo/{{var}}/{_STATS}", "rl_gdpo_reward",
          "A reward component named in algorithm.gdpo_reward_keys, mean/std/max/min over the batch.", _S),
    # Rollout correction: decoupled (rollout_corr/) and bypass (actor/rollout_corr/)
    *_rollout_corr("rollout_corr", "rl_rollout_corr", _DECOUPLED),
    *_rollout_corr("actor/rollout_corr", "rl_actor_rollout_corr", _BYPASS),
    # On-policy distillation (actor loss metrics)
    gauge("actor/distillation/loss", "rl_actor_distillation_loss",
          "Distillation loss aggregated with loss_agg_mode over the global mini-batch, mean over mini-batches.",
          _S),
    gauge("actor/distillation/loss_{stat:min|max}", "rl_actor_distillation_token_loss",
          "Per-token distillation loss before clamping, min or max over response tokens, micro-batches and "
          "mini-batches.", _S),
    gauge("actor/distillation/abs_loss", "rl_actor_distillation_abs_loss",
          "KL-estimator distillation modes: mean |per-token loss| over response tokens.", _S),
    gauge("actor/distillation/{model:student|teacher}_mass", "rl_actor_distillation_topk_mass_ratio",
          "forward_kl_topk: the student's or teacher's probability mass in the top-k tokens, mean over response "
          "tokens.", _S),
    gauge("actor/distillation/{model:student|teacher}_mass_{stat:min|max}",
          "rl_actor_distillation_topk_mass_extreme_ratio",
          "forward_kl_topk: the student's or teacher's top-k probability mass, min or max over response tokens.",
          _S),
    gauge("actor/distillation/overlap_ratio", "rl_actor_distillation_topk_overlap_ratio",
          "forward_kl_topk: |teacher top-k and student top-k overlap| / k, mean over response tokens.", _S),
    gauge("actor/distillation/overlap_token_advantage", "rl_actor_distillation_overlap_token_advantage",
          "forward_kl_topk: mean teacher-token KL contribution over overlapping positions (0.0 if none).", _S),
    gauge("actor/distillation/pg_clipfrac", "rl_actor_distillation_pg_clip_ratio",
          "distillation_loss.use_policy_gradient: pg_clipfrac of the policy loss using -distillation loss as the "
          "advantage.", _S),
    gauge("actor/distillation/pg_clipfrac_lower", "rl_actor_distillation_pg_clip_lower_ratio",
          "distillation_loss.use_policy_gradient: pg_clipfrac_lower of the policy loss using -distillation loss "
          "as the advantage.", _S),
    gauge("actor/distillation/ppo_kl", "rl_actor_distillation_ppo_kl",
          "distillation_loss.use_policy_gradient: ppo_kl of the policy loss using -distillation loss as the "
          "advantage.", _S),
    # SFT trainer
    gauge("train/loss", "rl_train_loss", "SFT: token-mean NLL over the global batch of the step.", _S),
    gauge("train/grad_norm", "rl_train_grad_norm", "SFT: gradient norm of the step.", _S),
    gauge("train/lr", "rl_train_learning_rate", "SFT: learning rate after the step.", _S),
    gauge("train/mfu", "rl_train_mfu_ratio", "SFT: model FLOPs utilization (fraction).", _S),
    gauge("train/global_tokens", "rl_train_global_batch_tokens", "SFT: tokens in the step's global batch.", _S,
          unit="{token}"),
    counter("train/total_tokens(B)", "rl_train_tokens",
            "SFT: tokens trained since the process started (running total; logged in billions).", _S,
            unit="{token}", scale=1e9, tracker_unit="G{token}"),
    gauge("val/loss", "rl_val_loss", "SFT: validation loss, mean over validation batches and DP ranks.", _S),
)


SPECS = (*_SHARED_WITH_ROLL, *_OWN)
