"""ROLL's metrics (ROLL docs: "Trackers and Metrics", "Experiment Data Analysis", 指标说明)."""

from __future__ import annotations

from rl_otel.catalog.define import (GIB, IMPORTANCE_RATIO_BUCKETS, KL_BUCKETS, LENGTH_BUCKETS, LOGPROB_BUCKETS,
                                    MIN_MAX_MEAN, SIGNED_BUCKETS, counter, gauge, histogram)

_S = "roll"
INFIX = "{cluster}/{phase}"
GPU_STAGES = "start/offload|start/onload|end/onload|end/offload"
GPU_KINDS = "allocated|reserved|max_allocated|max_reserved"

SPECS = (
    # Validation
    gauge(f"val/score/{MIN_MAX_MEAN}", "rl_val_score",
          "Score per episode in the validation phase (stat: mean, max or min over episodes).", _S),
    # Value function
    gauge("critic/lr", "rl_critic_learning_rate", "Learning rate of the value function (critic).", _S),
    gauge("critic/loss", "rl_critic_loss", "Loss between the value network's predictions and the returns.", _S),
    gauge("critic/value", "rl_critic_value",
          "Mean value predicted by the old value network for the batch at the start of the PPO iteration.", _S),
    gauge("critic/vpred", "rl_critic_vpred",
          "Mean value predicted by the value network being optimized, for the batch.", _S),
    gauge("critic/clipfrac", "rl_critic_clip_ratio", "Fraction of value predictions clipped by value_clip.", _S),
    gauge("critic/error", "rl_critic_error", "Mean squared error between value predictions and returns.", _S),
    # Rewards, advantages, returns, values
    gauge(f"critic/score/{MIN_MAX_MEAN}", "rl_critic_score", "Raw environment reward (score) over the batch.", _S),
    gauge(f"critic/rewards/{MIN_MAX_MEAN}", "rl_critic_rewards", "Normalized/clipped reward over the batch.", _S),
    gauge(f"critic/advantages/{MIN_MAX_MEAN}", "rl_critic_advantages", "Advantages over the batch's tokens.", _S),
    gauge(f"critic/returns/{MIN_MAX_MEAN}", "rl_critic_returns", "Returns (expected cumulative reward).", _S),
    gauge(f"critic/values/{MIN_MAX_MEAN}", "rl_critic_values", "Value-function estimates over the batch.", _S),
    gauge(f"tokens/response_length/{MIN_MAX_MEAN}", "rl_tokens_response_length",
          "Length of generated responses in tokens.", _S, unit="{token}"),
    gauge(f"tokens/prompt_length/{MIN_MAX_MEAN}", "rl_tokens_prompt_length", "Length of prompts in tokens.", _S,
          unit="{token}"),
    # Policy
    gauge("actor/lr", "rl_actor_learning_rate", "Learning rate of the policy network (actor).", _S),
    gauge("actor/ppo_ratio_high_clipfrac", "rl_actor_ppo_ratio_high_clip_ratio",
          "Fraction of tokens whose PPO ratio was clipped at the upper bound (1 + clip).", _S),
    gauge("actor/ppo_ratio_low_clipfrac", "rl_actor_ppo_ratio_low_clip_ratio",
          "Fraction of tokens whose PPO ratio was clipped at the lower bound (1 - clip).", _S),
    gauge("actor/ppo_ratio_clipfrac", "rl_actor_ppo_ratio_clip_ratio",
          "Fraction of tokens whose PPO ratio was clipped (either bound).", _S),
    gauge("actor/ratio_{stat:mean|max|min}", "rl_actor_importance_ratio",
          "Importance ratio exp(logp_new - logp_old) over the batch's tokens.", _S),
    gauge("actor/clipfrac", "rl_actor_clip_ratio", "Clipping fraction of the policy network (actor).", _S),
    gauge("actor/kl_loss", "rl_actor_kl_loss", "KL penalty between the current and the reference policy.", _S),
    gauge("actor/total_loss", "rl_actor_total_loss",
          "Weighted sum of policy-gradient, KL and entropy losses: the loss back-propagated.", _S),
    gauge("actor/approxkl", "rl_actor_approx_kl",
          "Approximate KL between the current and the old policy (k2 = 0.5 * mean((logp - logp_old)^2)).", _S),
    gauge("actor/policykl", "rl_actor_policy_kl",
          "k1 KL estimate between the current and the old policy as ROLL computes it: mean(logp - logp_old) "
          "(TRL's ppo/policy/policykl has the opposite sign).", _S),
    # Evaluation metrics (log-probabilities and entropy)
    gauge(f"critic/ref_log_prob/{MIN_MAX_MEAN}", "rl_critic_ref_log_prob",
          "Log-probability of the taken tokens under the reference model.", _S),
    gauge(f"critic/old_log_prob/{MIN_MAX_MEAN}", "rl_critic_old_log_prob",
          "Log-probability of the taken tokens under the old policy (actor before training).", _S),
    gauge(f"critic/entropy/{MIN_MAX_MEAN}", "rl_critic_entropy", "Entropy of the policy over the batch's tokens.", _S),
    gauge("critic/reward_clip_frac", "rl_critic_reward_clip_ratio", "Fraction of rewards that were clipped.", _S),
    # PPO loss
    gauge("actor/pg_loss", "rl_actor_pg_loss", "Policy-gradient loss of PPO.", _S),
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
    # SFT loss
    gauge("actor/sft_loss", "rl_actor_sft_loss", "Supervised fine-tuning loss.", _S),
    gauge("actor/positive_sft_loss", "rl_actor_positive_sft_loss", "SFT loss on positive samples.", _S),
    gauge("actor/negative_sft_loss", "rl_actor_negative_sft_loss", "SFT loss on negative samples.", _S),
    # System
    gauge("system/tps", "rl_system_tokens_per_second", "Tokens processed per second (system throughput).", _S,
          unit="{token}/s"),
    counter("system/samples", "rl_system_samples", "Total number of samples processed.", _S, unit="{sample}"),
    # Phase durations: time/rollout, time/adv, ... (Trinity's time/eval, time/wait_explore_step too)
    gauge("time/{operation}", "rl_operation_duration_seconds",
          "Duration of a pipeline operation (time/rollout, time/adv, time/eval, ...).", "roll,trinity", unit="s"),
    # state_offload_manager: time/{metric_infix}/..., memory/{metric_infix}/..., memory/cpu/{metric_infix}/...
    gauge(f"time/{INFIX}/{{part:total|execute|onload|offload}}", "rl_phase_last_duration_seconds",
          "Last duration of a cluster's phase: total, execute (the work), onload or offload of model state.", _S,
          unit="s"),
    gauge(f"memory/{INFIX}/{{stage:{GPU_STAGES}}}/{{kind:{GPU_KINDS}}}/{{device_id:[0-9]+}}", "rl_gpu_memory_bytes",
          "GPU memory of the process on a device at a stage of a phase (peaks since the phase started).", _S,
          unit="By", scale=GIB, tracker_unit="GiBy"),
    gauge(f"memory/{INFIX}/end/onload/{{kind:max_allocated|max_reserved}}_frac/{{device_id:[0-9]+}}",
          "rl_gpu_memory_peak_ratio",
          "Peak allocated/reserved GPU memory during a phase as a fraction of the device's total memory.", _S),
    gauge(f"memory/cpu/{INFIX}/{{stage:start|end}}/{{kind:rss|vms}}", "rl_cpu_memory_bytes",
          "Resident (rss) or virtual (vms) memory of the process at the start or end of a phase.", _S,
          unit="By", scale=GIB, tracker_unit="GiBy"),
)
