"""OpenRLHF's metrics (OpenRLHF 0.11.0 and 0.11.2, PPO trainer, sync and async, and the train/* keys of its DPO,
reward-model and SFT trainers that the extra-log entry would otherwise take), as written to TensorBoard and wandb.

Read off OpenRLHF's code (tests/data/frameworks/openrlhf.tsv). ``openrlhf/utils/logging_utils.py`` prefixes every key
of the PPO trainer's status dict with ``train/`` and every eval key with ``eval/`` (eval keys already start with
``eval_``: ``eval/eval_{datasource}_pass1``); one Ray actor (the PPOTrainer, or the async TrainingActor) writes.
Actor keys are reduced in ActorPPOTrainer.ppo_train: a 0-D tensor (already a token mean) is weighted by the
micro-batch's action tokens, a per-sample tensor is averaged over the micro-batch and weighted by its samples; the
result is all-reduced over DP ranks and averaged over the micro-batches of all epochs. ``actor_lr`` and
``actor_grad_norm`` are the last values.

The keys resolve in ``default_catalog("openrlhf")`` only: ``train/kl`` or ``train/reward`` mean other things in
other frameworks. A key another framework's module defines literally (NeMo-RL's ``train/reward``) is written with an
anonymous placeholder (``train/{_:reward}``): a key is defined literally once in the union of all catalogs.
"""

from __future__ import annotations

from rl_otel.catalog.define import counter, gauge

_S = "openrlhf"
# The 'datasource' field of an eval-dataset row ('default' if absent); '.+' keeps an 'org/name' source whole.
_DATASOURCE = "{taskset:.+}"
_TIMERS = "generation|make_experience|ppo_train|broadcast|step_total"
# An extra_logs entry of the reward function is any train/* key of one segment without an entry of its own (the
# status dict's keys are concrete entries, found first). A reward function's extra log is a per-sample score or
# flag, never a loss, a norm, a KL, a learning rate, a step or a size: those spellings (other frameworks' train/*
# keys, such as train/pg_loss or train/lr-pg_0) are left out, so they never read as OpenRLHF's.
_EXTRA = "{metric:(?![^/]*(?:loss|norm|kl|lr|clipfrac|step|size)$)(?![^/]*-)[^/]+}"

SPECS = (
    # Progress (wandb only)
    counter("train/global_step", "rl_openrlhf_train_steps",
            "wandb only: the 1-based PPO global step of the train log (the TensorBoard step of train/*).", _S,
            unit="{step}"),
    counter("eval/global_step", "rl_openrlhf_eval_steps",
            "wandb only: the PPO global step at which the evaluation ran.", _S, unit="{step}"),
    # Actor update (ActorPPOTrainer.training_step, PolicyLoss)
    gauge("train/policy_loss", "rl_openrlhf_policy_loss",
          "PPO clipped surrogate loss as back-propagated (~ per-token mean in token mode, mean of per-sequence token "
          "means in sequence mode/GSPO), token-weighted mean over micro-batches, ranks and epochs.", _S),
    gauge("train/entropy_loss", "rl_openrlhf_entropy",
          "Only with actor.entropy_coef: policy entropy (nats) over response tokens aggregated like the loss (~ "
          "per-token mean), token-weighted mean over micro-batches, ranks and epochs.", _S),
    gauge("train/ppo_clip_ratio", "rl_openrlhf_ppo_clip_ratio",
          "Fraction of response tokens where the clipped surrogate was chosen (surr2 < surr1), masked token mean "
          "per micro-batch, token-weighted mean.", _S),
    gauge("train/ppo_kl", "rl_openrlhf_ppo_kl",
          "Old-vs-current policy KL, per-token mean of old_log_probs - log_probs (k1) over response tokens, "
          "token-weighted mean over micro-batches, ranks and epochs.", _S),
    gauge("train/vllm_kl", "rl_openrlhf_vllm_kl",
          "Training-inference mismatch (only with vLLM IS correction): per-token mean of vLLM rollout log-prob - "
          "actor-recomputed old log-prob (k1 KL of rollout to trainer), token-weighted mean.", _S),
    gauge("train/kl", "rl_openrlhf_kl",
          "KL to the reference policy: per-sequence token mean of the approx KL (k1/k2/k3) averaged over sequences "
          "when KL is in the reward (0 without a reference), or the per-token KL loss term with kl.use_loss.", _S),
    gauge("train/is_filter_ratio", "rl_openrlhf_is_filter_ratio",
          "Only with the train/rollout importance-sampling correction (is_correction_level token or seq; OpenRLHF "
          "0.11.2 and later): fraction of the units (tokens, or sequences at seq level) whose gated statistic (the "
          "ratio pi_train/pi_rollout, or a binary-KL or TV divergence) fell outside the threshold band and were "
          "dropped (mask mode) or clamped (clip mode), token-weighted mean over micro-batches, ranks and epochs; "
          "near 1, the step's policy gradient is about zero.", _S),
    gauge("train/logprobs_diff", "rl_openrlhf_logprobs_diff",
          "Mean of actor log-prob - reference log-prob over response tokens (per-sequence token means averaged "
          "over sequences, or the micro-batch token mean with kl.use_loss); 0 without a reference or KL coef.", _S),
    gauge("train/actor_lr", "rl_openrlhf_actor_learning_rate",
          "Actor learning rate from the scheduler at the last micro-batch of the step.", _S),
    gauge("train/actor_grad_norm", "rl_openrlhf_actor_grad_norm",
          "Actor global gradient norm before clipping (DeepSpeed) at the last optimizer step of the PPO step.", _S),
    # Per-sample rollout info averaged over the training batch (sample-weighted)
    gauge("train/{_:reward}", "rl_openrlhf_reward",
          "Per-sequence reward from the reward function/agent or reward model (after length penalties, before the "
          "group baseline), mean over training samples and epochs.", _S),
    gauge("train/score", "rl_openrlhf_score",
          "Only when the reward function returns scores: per-sequence score (used by dynamic filtering), mean over "
          "training samples.", _S),
    gauge("train/return", "rl_openrlhf_return",
          "Per-sequence sum over tokens of the shaped reward (normalised reward at EOS minus kl_coef x per-token "
          "KL), mean over training samples.", _S),
    gauge("train/group_reward_std", "rl_openrlhf_group_reward_std",
          "Only with n_samples_per_prompt > 1: std of the rewards within the sample's prompt group, mean over "
          "training samples.", _S),
    gauge("train/response_clip_ratio", "rl_openrlhf_response_clip_ratio",
          "Fraction of training samples whose prompt+response length reached the truncation length.", _S),
    gauge("train/response_length", "rl_openrlhf_response_length",
          "Response length in tokens (first to last action token), mean over training samples.", _S,
          unit="{token}"),
    gauge("train/total_length", "rl_openrlhf_total_length",
          "Prompt+response length in tokens after truncation, mean over training samples.", _S, unit="{token}"),
    gauge("train/truncated", "rl_openrlhf_truncated_ratio",
          "Fraction of training samples whose generation hit max tokens (finish_reason == length), sample-weighted "
          "over micro-batches and epochs.", _S),
    # Critic (with a critic / GAE)
    gauge("train/critic_loss", "rl_openrlhf_critic_loss",
          "0.5 x (clipped) squared error between values and returns, ~ per-token mean, mean over ranks and "
          "micro-batches.", _S),
    gauge("train/values", "rl_openrlhf_critic_values",
          "Critic value predictions during the update, masked token mean, mean over ranks and micro-batches.", _S),
    gauge("train/critic_lr", "rl_openrlhf_critic_learning_rate",
          "Critic learning rate from the scheduler, mean over micro-batches.", _S),
    gauge("train/critic_grad_norm", "rl_openrlhf_critic_grad_norm",
          "Critic global gradient norm before clipping (DeepSpeed), mean over ranks and micro-batches.", _S),
    # Rollout batch statistics (before dynamic batch balancing)
    gauge("train/rollout/reward_mean", "rl_openrlhf_rollout_reward_mean",
          "Per-sample reward, mean over all samples of the step's rollout batch.", _S),
    gauge("train/rollout/reward_std", "rl_openrlhf_rollout_reward_std",
          "Per-sample reward, unbiased std over all samples of the step's rollout batch (0 with one sample).", _S),
    gauge("train/rollout/response_length_mean", "rl_openrlhf_rollout_response_length_mean",
          "Response length in tokens, mean over all samples of the step's rollout batch.", _S, unit="{token}"),
    gauge("train/rollout/truncated_rate", "rl_openrlhf_rollout_truncated_ratio",
          "Fraction of the rollout batch's samples truncated at max tokens (finish_reason == length).", _S),
    gauge("train/rollout/num_samples", "rl_openrlhf_rollout_samples",
          "Number of samples (responses) in the step's rollout batch.", _S, unit="{sample}"),
    gauge("train/dynamic_filtering_pass_rate", "rl_openrlhf_dynamic_filtering_pass_ratio",
          "Only with dynamic filtering: accepted samples / prompts consumed by the generation call (up to "
          "n_samples_per_prompt, as samples are counted against prompts).", _S, scale=0.01, tracker_unit="%"),
    # Timing (wall clock of the trainer actor)
    gauge(f"train/timing/{{operation:{_TIMERS}}}", "rl_openrlhf_timing_seconds",
          "Wall time of one part of the step: generation (rollout incl. rewards), make_experience (forward "
          "passes, advantages), ppo_train (actor and critic updates), broadcast (weight sync to vLLM), step_total "
          "(sync: their sum; async: time since the previous training step finished).", _S, unit="s"),
    # Eval (every eval.steps steps)
    gauge(f"eval/eval_{_DATASOURCE}_pass{{k:[0-9]+}}", "rl_openrlhf_eval_pass_at_k",
          "Per data source (taskset): mean over prompts of the best reward among the prompt's k eval samples "
          "(pass@k for 0/1 rewards); pass1 is the mean over prompts of the mean reward of its samples.", _S),
    gauge(f"eval/eval_{_DATASOURCE}_response_length_mean", "rl_openrlhf_eval_taskset_response_length_mean",
          "Per data source (taskset): response length in tokens, mean over its eval samples.", _S, unit="{token}"),
    gauge(f"eval/eval_{_DATASOURCE}_truncated_rate", "rl_openrlhf_eval_taskset_truncated_ratio",
          "Per data source (taskset): fraction of its eval samples truncated at max tokens.", _S),
    gauge("eval/eval_response_length_mean", "rl_openrlhf_eval_response_length_mean",
          "Response length in tokens, mean over all eval samples of all data sources.", _S, unit="{token}"),
    gauge("eval/eval_truncated_rate", "rl_openrlhf_eval_truncated_ratio",
          "Fraction of all eval samples truncated at max tokens.", _S),
    gauge("eval/eval_num_samples", "rl_openrlhf_eval_samples",
          "Number of eval samples generated (prompts x n_samples_per_prompt).", _S, unit="{sample}"),
    # The preference (train_dpo, train_rm) and SFT (train_sft) trainers' train/* keys that are no extra log: written
    # by the same loggers, they would otherwise land in the extra-log entry below. Logged every logging_steps
    # optimizer steps: the last micro-batch's values (mean over ranks) and the *_mean over the accumulation window.
    gauge("train/acc", "rl_openrlhf_preference_accuracy",
          "DPO and reward-model training: fraction of the last micro-batch's preference pairs whose chosen "
          "response scored above the rejected one (DPO: the implicit reward; reward model: its score), mean over "
          "ranks.", _S),
    gauge("train/acc_mean", "rl_openrlhf_preference_accuracy_mean",
          "DPO and reward-model training: rank 0's train/acc averaged over the micro-batches of the optimizer step "
          "(gradient accumulation).", _S),
    gauge("train/{kind:chosen|reject}_reward", "rl_openrlhf_preference_reward",
          "DPO and reward-model training: reward of the chosen or rejected responses, mean over the last "
          "micro-batch and the ranks: DPO's implicit reward beta x (policy - reference log-probability of the "
          "response), or the reward model's score.", _S),
    gauge("train/loss_mean", "rl_openrlhf_train_loss_mean",
          "DPO and reward-model training: rank 0's preference loss; SFT: rank 0's language-model (NLL) loss; "
          "averaged over the micro-batches of the optimizer step.", _S),
    # An extra_logs entry of the reward function/agent (e.g. math_accuracy): last, after every own train/* key.
    gauge(f"train/{_EXTRA}", "rl_openrlhf_reward_extra",
          "An extra_logs entry returned by the reward function or agent (metric: its name), one scalar per "
          "sample, mean over training samples.", _S),
)

# Concept (rl_otel.catalog.concepts) -> selectors of the families above that carry it, in order of preference.
CONCEPT_SOURCES: dict[str, tuple[str, ...]] = {
    "reward": ("rl_openrlhf_rollout_reward_mean", "rl_openrlhf_reward"),
    "ref_kl": ("rl_openrlhf_kl",),  # per token (per-sequence token mean, or the token-mean KL loss)
    "policy_kl": ("rl_openrlhf_ppo_kl",),  # k1, old - new
    "policy_loss": ("rl_openrlhf_policy_loss",),
    "clip_ratio": ("rl_openrlhf_ppo_clip_ratio",),
    "entropy": ("rl_openrlhf_entropy",),
    "response_length": ("rl_openrlhf_rollout_response_length_mean", "rl_openrlhf_response_length"),
    "step_duration": ('rl_openrlhf_timing_seconds{operation="step_total"}',),
    "eval_score": ('rl_openrlhf_eval_pass_at_k{k="1"}',),
    "learning_rate": ("rl_openrlhf_actor_learning_rate",),
    "grad_norm": ("rl_openrlhf_actor_grad_norm",),
    # training-inference mismatch, a k1 KL (rollout - trainer log-prob, per token): not an abs diff, not a ratio
    "train_infer_kl": ("rl_openrlhf_vllm_kl",),
}
# Labels a concept's source must set to line up with the other sources (concepts.Source.set_labels).
CONCEPT_SET_LABELS: dict[str, dict[str, str]] = {
    'rl_openrlhf_eval_pass_at_k{k="1"}': {"metric": "pass"},
}
