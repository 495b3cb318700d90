"""ROLL's metrics (ROLL docs: "Trackers and Metrics", "Experiment Data Analysis", 指标说明)."""

from __future__ import annotations

from rl_otel.catalog.define import GIB, MIN_MAX_MEAN, counter, gauge

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
          "KL between the current and the old policy (k1 = mean(logp_old - logp)).", _S),
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
