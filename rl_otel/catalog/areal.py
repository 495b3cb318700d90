"""AReaL's metrics (inclusionAI/AReaL 1.0.4, PPO/GRPO trainer), as committed by its ``StatsLogger``.

Read off AReaL's code (tests/data/frameworks/areal.tsv). ``areal/utils/stats_logger.py:StatsLogger.commit`` logs on
rank 0 only, with no prefix, to wandb/swanlab/trackio and TensorBoard the dict of ``stats_tracker.export_all()``
(the actor engine's, reduced over the DP group, the rollout's and the eval rollout's), one commit per PPO step.
A key's shape says how it was reduced: ``stat(...)`` gives ``{key}/avg`` (masked sum / mask count over the whole
step and all DP ranks), ``{key}/min`` and ``{key}/max`` (one family here, with a ``stat`` label); ``denominator``
gives a count summed over the step; ``scalar`` gives the mean of the recorded values; ``record_timing`` gives
``timeperf/{name}`` in seconds.

The keys resolve in ``default_catalog("areal")`` only: ``rollout/reward`` means other things elsewhere.
"""

from __future__ import annotations

from rl_otel.catalog.define import gauge
from rl_otel.catalog.spec import MetricSpec

_S = "areal"
_STAT = "{stat:avg|min|max}"
_ACTOR = "ppo_actor"
_UPDATE = "ppo_actor/update"
_LOGP = "ppo_actor/update/compute_logp"
_OVER_STEP = "over {} of the step (avg over all DP ranks)"
_TOKENS = _OVER_STEP.format("loss-masked tokens")
_SEQS = _OVER_STEP.format("sequences")
# proximal log-prob approximation methods (actor.prox_logp_method)
_METHOD = "{kind:loglinear|linear|rollout}"
_TIMERS = ("rollout|critic_values|ref_logp|teacher_logp|recompute_logp|compute_advantage|train_step|critic_train_step|"
           "update_weights|save|checkpoint_for_recover|eval|clear_batches|rollout_pause|rollout_pause_generation|"
           "rollout_offload|rollout_onload|rollout_continue_generation|rollout_resume")


def _stat(key: str, name: str, what: str, over: str = _TOKENS, unit: str = "1") -> MetricSpec:
    """The family of a ``stat(...)`` key: ``{key}/avg|min|max``."""
    return gauge(f"{key}/{_STAT}", name, f"{what}: avg/min/max {over}.", _S, unit=unit)


_BATCH = (  # PPOActor._ppo_update: the training batch before the update
    gauge(f"{_ACTOR}/n_seqs", "rl_areal_actor_sequences",
          "Sequences (trajectories) in the training batch, summed over DP ranks.", _S, unit="{sample}"),
    gauge(f"{_ACTOR}/n_tokens", "rl_areal_actor_tokens",
          "Tokens (attention-mask positions) in the training batch, summed over DP ranks.", _S, unit="{token}"),
    gauge(f"{_ACTOR}/n_valid_tokens", "rl_areal_actor_valid_tokens",
          "Loss-masked (generated, trained) tokens in the training batch, summed over DP ranks.", _S,
          unit="{token}"),
    gauge(f"{_ACTOR}/correct_n_seqs", "rl_areal_actor_correct_sequences",
          "Sequences of the training batch with reward > 0.", _S, unit="{sample}"),
    gauge(f"{_ACTOR}/incorrect_n_seqs", "rl_areal_actor_incorrect_sequences",
          "Sequences of the training batch with reward <= 0.", _S, unit="{sample}"),
    _stat(f"{_ACTOR}/task_reward", "rl_areal_actor_task_reward",
          "Per-sequence task reward from the workflow (after the overlong penalty, before scaling and "
          "normalisation)", _SEQS),
    _stat(f"{_ACTOR}/advantages", "rl_areal_actor_advantages",
          "Per-token advantage (GAE, optionally normalised)"),
    _stat(f"{_ACTOR}/kl_rewards", "rl_areal_actor_kl_reward",
          "Per-token KL reward -kl_ctl x KL(old policy || reference) (0 with kl_ctl 0 or no reference)"),
    _stat(f"{_ACTOR}/final_reward", "rl_areal_actor_final_reward",
          "Per-token reward used for GAE (the KL reward plus the scaled task reward on the last token)"),
    _stat(f"{_ACTOR}/seq_len", "rl_areal_actor_sequence_length",
          "Sequence length prompt+response in tokens (attention-mask sum)", _SEQS, "{token}"),
    _stat(f"{_ACTOR}/prompt_len", "rl_areal_actor_prompt_length",
          "Prompt length in tokens (attention-mask sum minus loss-mask sum)", _SEQS, "{token}"),
    _stat(f"{_ACTOR}/no_eos_ratios", "rl_areal_actor_no_eos_ratio",
          "Per-sequence no-EOS flag (1 when the sequence fills the padded length, i.e. truncated; avg = truncation "
          "rate)", _SEQS),
    _stat(f"{_ACTOR}/correct_seq_len", "rl_areal_actor_correct_sequence_length",
          "Sequence length in tokens of the sequences with reward > 0", _OVER_STEP.format("correct sequences"),
          "{token}"),
    _stat(f"{_ACTOR}/incorrect_seq_len", "rl_areal_actor_incorrect_sequence_length",
          "Sequence length in tokens of the sequences with reward <= 0", _OVER_STEP.format("incorrect sequences"),
          "{token}"),
    gauge(f"{_ACTOR}/agent", "rl_areal_actor_trajectory_starts",
          "Only with actor.log_agent_stats: trajectory starts (begin_of_trajectory > 0) in the training batch.", _S,
          unit="{sample}"),
    gauge(f"{_ACTOR}/{{var:eps_clip|mask_no_eos_with_zero|use_dual_clip|c_clip|rs_upper|rs_lower}}",
          "rl_areal_actor_config",
          "A configuration value echoed each step (var): PPO clip epsilon, the zero-reward-without-EOS flag, the "
          "dual-clip flag, c_clip, the rejection-sampling upper and lower bounds.", _S),
)

_OPTIMIZER = (  # engine train_batch, per mini-batch; scalars averaged over mini-batches and DP ranks
    gauge(f"{_UPDATE}/grad_norm", "rl_areal_actor_grad_norm",
          "Actor global gradient norm before clipping of an optimizer step (NaN if non-finite), mean over the "
          "step's mini-batches.", _S),
    gauge(f"{_UPDATE}/lr", "rl_areal_actor_learning_rate",
          "Actor learning rate at an optimizer step, mean over the step's mini-batches.", _S),
    gauge(f"{_UPDATE}/update_successful", "rl_areal_actor_update_success_ratio",
          "Fraction of the actor's optimizer steps applied (1 unless a grad norm was non-finite).", _S),
    gauge(f"{_UPDATE}/num_micro_batches", "rl_areal_actor_micro_batches",
          "Micro-batches per mini-batch per rank, mean over mini-batches and ranks.", _S),
)

_LOSS = (  # grpo_loss_fn / ppo_actor_loss_fn, per micro-batch, aggregated over the step
    gauge(f"{_UPDATE}/n_tokens", "rl_areal_actor_update_tokens",
          "Tokens in all micro-batches of the update, summed over mini-batches and DP ranks.", _S, unit="{token}"),
    gauge(f"{_UPDATE}/n_valid_tokens", "rl_areal_actor_update_valid_tokens",
          "Loss-masked tokens in all micro-batches of the update (after M2PO masking), summed.", _S, unit="{token}"),
    gauge(f"{_UPDATE}/clipped_tokens", "rl_areal_actor_update_clipped_tokens",
          "Loss-masked tokens where the PPO clip was active, summed over the update.", _S, unit="{token}"),
    gauge(f"{_UPDATE}/dual_clipped_tokens", "rl_areal_actor_update_dual_clipped_tokens",
          "Loss-masked tokens where the dual clip was active, summed over the update.", _S, unit="{token}"),
    gauge(f"{_UPDATE}/unclipped_behave_tokens", "rl_areal_actor_update_unclipped_behave_tokens",
          "Decoupled PPO only: loss-masked tokens whose behaviour importance weight survived rejection sampling, "
          "summed over the update.", _S, unit="{token}"),
    _stat(f"{_UPDATE}/actor_loss", "rl_areal_actor_loss",
          "Per-token (decoupled) PPO clipped policy loss times the behaviour importance weight"),
    _stat(f"{_UPDATE}/importance_weight", "rl_areal_actor_importance_weight",
          "Per-token ratio pi_theta / pi_proximal = exp(logp - prox_logp)"),
    _stat(f"{_UPDATE}/approx_kl", "rl_areal_actor_approx_kl",
          "Per-token log-ratio logp_current - logp_proximal (new minus old: the negative of the k1 KL(old || "
          "new) sample)"),
    _stat(f"{_UPDATE}/clip_ratio", "rl_areal_actor_clip_ratio",
          "Per-token PPO clip indicator (avg = the fraction of tokens clipped)"),
    _stat(f"{_UPDATE}/dual_clip_ratio", "rl_areal_actor_dual_clip_ratio",
          "Per-token dual-clip indicator (avg = the fraction of tokens dual-clipped)"),
    _stat(f"{_UPDATE}/entropy", "rl_areal_actor_entropy",
          "Per-token policy entropy (nats) of the current model during the update"),
    _stat(f"{_UPDATE}/{{kind:new|old}}_logp", "rl_areal_actor_logprob",
          "Per-token log-prob of the current policy (new) or the behaviour policy (old: the inference engine's, or "
          "the recomputed proximal one without the decoupled loss)"),
    _stat(f"{_UPDATE}/clipped_{{kind:new|old}}_logp", "rl_areal_actor_clipped_logprob",
          "PPO only: per-token current (new) or old log-prob of the clipped tokens", _OVER_STEP.format(
              "clipped tokens")),
    _stat(f"{_UPDATE}/vocab_{{bound:min|max}}_logits", "rl_areal_actor_vocab_logit",
          "Per-token smallest (bound=min) or largest (bound=max) logit over the vocabulary",
          _OVER_STEP.format("all tokens")),
    _stat(f"{_UPDATE}/behave_imp_weight", "rl_areal_actor_behave_importance_weight",
          "Decoupled PPO only: per-token behaviour importance weight pi_proximal / pi_behave = exp(prox_logp - "
          "inference logp), capped or masked by rejection sampling", _OVER_STEP.format("unclipped behaviour tokens")),
    _stat(f"{_UPDATE}/behave_approx_kl", "rl_areal_actor_behave_approx_kl",
          "Decoupled PPO only: per-token prox_logp (trainer recompute) - inference-engine logp (k1 KL of the "
          "behaviour policy to the proximal one: staleness plus training-inference mismatch)",
          _OVER_STEP.format("unclipped behaviour tokens")),
    gauge(f"{_UPDATE}/rs_filtered_fraction", "rl_areal_actor_rejection_filtered_ratio",
          "Decoupled PPO with rejection sampling: fraction of tokens or sequences filtered out by the behaviour "
          "weight bounds, mean over micro-batches.", _S),
    _stat(f"{_UPDATE}/rkl_loss", "rl_areal_actor_reverse_kl_loss",
          "Only with a teacher (distillation): per-token reverse-KL term logp - teacher_logp (or the IS-weighted "
          "teacher reward for pure KD)"),
    _stat(f"{_UPDATE}/sapo_soft_gate", "rl_areal_actor_sapo_soft_gate",
          "Only with use_sapo_loss: per-token SAPO soft gate"),
    _stat(f"{_UPDATE}/sapo_scaled_gate_{{kind:pos|neg}}", "rl_areal_actor_sapo_scaled_gate",
          "Only with use_sapo_loss: per-token SAPO scaled gate for positive (pos) or negative (neg) advantages"),
    gauge(f"{_UPDATE}/tree_token_ratio", "rl_areal_actor_tree_token_ratio",
          "Only with tree training: packed-tree tokens / original tokens of a mini-batch (prefix sharing), mean "
          "over mini-batches.", _S),
)

_VALID = _OVER_STEP.format("valid tokens")
_DRIFT = (  # _log_proximal_approximation_stats: training-inference drift and the proximal log-prob approximation
    gauge(f"{_LOGP}/n_valid_tokens", "rl_areal_actor_drift_valid_tokens",
          "Tokens the drift metrics are computed over (the behaviour mask if decoupled, else the loss mask).", _S,
          unit="{token}"),
    _stat(f"{_LOGP}/kl_div_{{kind:direct|taylor|dual}}", "rl_areal_actor_drift_kl",
          "Per-token KL estimate between the rollout (inference) policy and the trained policy, r = logp - "
          "old_logp: direct = k1 (old_logp - logp), taylor = k2 (r^2 / 2), dual = k3 (exp(r) - 1 - r)", _VALID),
    _stat(f"{_LOGP}/prox_logp_gt", "rl_areal_actor_proximal_logprob",
          "When the proximal log-prob is recomputed: per-token recomputed proximal log-prob", _VALID),
    _stat(f"{_LOGP}/{_METHOD}/approx_logp", "rl_areal_actor_approx_proximal_logprob",
          "prox_logp_method (kind) approximation: per-token approximated proximal log-prob", _VALID),
    _stat(f"{_LOGP}/{_METHOD}/behave_imp_weight", "rl_areal_actor_approx_behave_importance_weight",
          "prox_logp_method (kind) approximation: per-token exp(approx_logp - old_logp)", _VALID),
    _stat(f"{_LOGP}/{_METHOD}/importance_weight", "rl_areal_actor_approx_importance_weight",
          "prox_logp_method (kind) approximation: per-token exp(logp - approx_logp)", _VALID),
    _stat(f"{_LOGP}/{_METHOD}/abs_error", "rl_areal_actor_approx_logprob_abs_error",
          "prox_logp_method (kind), metrics mode: per-token |prox_logp_gt - approx_logp|", _VALID),
    _stat(f"{_LOGP}/{_METHOD}/rel_error", "rl_areal_actor_approx_logprob_rel_error",
          "prox_logp_method (kind), metrics mode: per-token relative error of approx_logp vs prox_logp_gt", _VALID),
    _stat(f"{_LOGP}/{_METHOD}/squared_error", "rl_areal_actor_approx_logprob_squared_error",
          "prox_logp_method (kind), metrics mode: per-token squared error of approx_logp vs prox_logp_gt", _VALID),
    _stat(f"{_LOGP}/{_METHOD}/behave_imp_weight_abs_error", "rl_areal_actor_approx_behave_weight_abs_error",
          "prox_logp_method (kind), metrics mode: per-token absolute error of the behaviour weight vs the "
          "recomputed one", _VALID),
    _stat(f"{_LOGP}/{_METHOD}/behave_imp_weight_rel_error", "rl_areal_actor_approx_behave_weight_rel_error",
          "prox_logp_method (kind), metrics mode: per-token relative error of the behaviour weight vs the "
          "recomputed one", _VALID),
    _stat(f"{_LOGP}/{_METHOD}/importance_weight_abs_error", "rl_areal_actor_approx_importance_weight_abs_error",
          "prox_logp_method (kind), metrics mode: per-token absolute error of the importance weight vs the "
          "recomputed one", _VALID),
    _stat(f"{_LOGP}/{_METHOD}/importance_weight_rel_error", "rl_areal_actor_approx_importance_weight_rel_error",
          "prox_logp_method (kind), metrics mode: per-token relative error of the importance weight vs the "
          "recomputed one", _VALID),
)

_VERSIONS = (  # _log_version_staleness_stats: per micro-batch scalars, averaged over micro-batches and DP ranks
    gauge(f"{_UPDATE}/version_stats/n_valid_tokens", "rl_areal_actor_staleness_valid_tokens",
          "Tokens considered for staleness (behaviour or loss mask), summed over the update.", _S, unit="{token}"),
    gauge(f"{_UPDATE}/version_stats/sample_staleness_{{kind:theta|proximal}}_{_STAT}",
          "rl_areal_actor_sample_staleness",
          "Policy versions between a generated token's policy and the current (theta: v) or proximal (proximal: "
          "v - 1) policy: the micro-batch's mean (avg), max or min over generated tokens, averaged over "
          "micro-batches and DP ranks.", _S, unit="{version}"),
    gauge(f"{_UPDATE}/version_stats/v_{{kind:theta|proximal}}", "rl_areal_actor_policy_version",
          "Policy version during the update: current (theta, = the global step) or proximal (theta - 1).", _S,
          unit="{version}"),
    gauge(f"{_UPDATE}/version_stats/n_valid_generated_tokens", "rl_areal_actor_staleness_generated_tokens",
          "Generated tokens (version >= 0) per micro-batch, mean over micro-batches and DP ranks.", _S,
          unit="{token}"),
)

_CRITIC = (  # PPOCritic._ppo_update, ppo_loss_fn (only with a critic)
    gauge("ppo_critic/{var:eps_clip|mask_no_eos_with_zero}", "rl_areal_critic_config",
          "A critic configuration value echoed each step (var): the value clip epsilon, the zero-reward-without-EOS "
          "flag.", _S),
    gauge("ppo_critic/grad_norm", "rl_areal_critic_grad_norm",
          "Critic gradient norm before clipping, mean over the step's mini-batches.", _S),
    gauge("ppo_critic/lr", "rl_areal_critic_learning_rate",
          "Critic learning rate, mean over the step's mini-batches.", _S),
    gauge("ppo_critic/update_successful", "rl_areal_critic_update_success_ratio",
          "Fraction of the critic's optimizer steps applied.", _S),
    gauge("ppo_critic/num_micro_batches", "rl_areal_critic_micro_batches",
          "Critic micro-batches per mini-batch per rank, mean over mini-batches and ranks.", _S),
    gauge("ppo_critic/n_tokens", "rl_areal_critic_tokens", "Tokens in the critic update, summed.", _S,
          unit="{token}"),
    gauge("ppo_critic/n_valid_tokens", "rl_areal_critic_valid_tokens",
          "Loss-masked tokens in the critic update, summed.", _S, unit="{token}"),
    gauge("ppo_critic/clipped_tokens", "rl_areal_critic_clipped_tokens",
          "Tokens where the value clip was active in the critic update, summed.", _S, unit="{token}"),
    _stat("ppo_critic/critic_loss", "rl_areal_critic_loss", "Per-token clipped value loss"),
    _stat("ppo_critic/{kind:new|old|target}_value", "rl_areal_critic_value",
          "Per-token value prediction during (new) or before (old) the update, or the return it is fitted to "
          "(target)"),
    _stat("ppo_critic/clip_ratio", "rl_areal_critic_clip_ratio",
          "Per-token value-clip indicator (avg = the fraction of tokens clipped)"),
    _stat("ppo_critic/clipped_{kind:new|old}_value", "rl_areal_critic_clipped_value",
          "Per-token new or old value of the value-clipped tokens", _OVER_STEP.format("clipped tokens")),
)

_ROLLOUT = (  # named trackers 'rollout' / 'eval-rollout': scalars, mean over the recorded episodes
    gauge("rollout/reward", "rl_areal_rollout_reward",
          "Reward per generated sample (RLVR: the reward function's value; multi-turn: the discounted final "
          "reward), mean over the samples generated since the previous commit (async: incl. later steps' ones).",
          _S),
    gauge("rollout/num_turns", "rl_areal_rollout_turns",
          "Multi-turn workflow only: turns per episode, mean over the episodes since the previous commit.", _S,
          unit="{turn}"),
    gauge("rollout/accepted", "rl_areal_rollout_accepted",
          "1 per trajectory accepted by the workflow executor, averaged: always 1.0 (the count is in the dropped "
          "__count key).", _S),
    gauge("rollout/rejected", "rl_areal_rollout_rejected",
          "1 per trajectory rejected by the dynamic filter or failed, averaged: always 1.0 when present (the count "
          "is dropped).", _S),
    gauge("eval-rollout/reward", "rl_areal_eval_reward",
          "Eval score: reward per eval sample, mean over the eval samples generated at this step (only on steps "
          "the evaluator fires).", _S),
    gauge("eval-rollout/num_turns", "rl_areal_eval_turns",
          "Multi-turn eval only: turns per eval episode, mean over the eval episodes.", _S, unit="{turn}"),
)

_TIMING = (  # stats_tracker.record_timing in the trainer process
    gauge(f"timeperf/{{operation:{_TIMERS}}}", "rl_areal_step_operation_duration_seconds",
          "Wall seconds of one operation of the PPO step (operation): rollout (waiting for or generating the "
          "batch), critic_values / ref_logp / teacher_logp / recompute_logp (forward passes), compute_advantage, "
          "train_step / critic_train_step (updates), update_weights, save, checkpoint_for_recover, eval, "
          "clear_batches, and the rollout engine's pause / offload / onload / resume steps.", _S, unit="s"),
    gauge("timeperf/{worker:actor|critic|ref|teacher}_{operation:onload|offload}",
          "rl_areal_engine_offload_duration_seconds",
          "Only with offloading: seconds to onload or offload (operation) an engine (role), mean over the step's "
          "onloads or offloads.", _S, unit="s"),
)

SPECS = (*_BATCH, *_OPTIMIZER, *_LOSS, *_DRIFT, *_VERSIONS, *_CRITIC, *_ROLLOUT, *_TIMING,
         # an agent statistic named in actor.log_agent_stats_keys (metric): last, after every ppo_actor/{x}/{stat}
         _stat(f"{_ACTOR}/{{metric}}", "rl_areal_actor_agent_stat",
               "Only with actor.log_agent_stats: a per-trajectory agent statistic (metric)",
               _OVER_STEP.format("trajectories")))

# Concept (rl_otel.catalog.concepts) -> selectors of the families above that carry it, in order of preference.
CONCEPT_SOURCES: dict[str, tuple[str, ...]] = {
    "reward": ('rl_areal_actor_task_reward{stat="avg"}', "rl_areal_rollout_reward"),
    # approx_kl is new - old (the negative of the k1 sample): see CONCEPT_TRANSFORMS
    "policy_kl": ('rl_areal_actor_approx_kl{stat="avg"}',),
    "policy_loss": ('rl_areal_actor_loss{stat="avg"}',),
    "clip_ratio": ('rl_areal_actor_clip_ratio{stat="avg"}',),
    "importance_ratio_max": ('rl_areal_actor_importance_weight{stat="max"}',),
    "entropy": ('rl_areal_actor_entropy{stat="avg"}',),
    "eval_score": ("rl_areal_eval_reward",),
    "learning_rate": ("rl_areal_actor_learning_rate",),
    "grad_norm": ("rl_areal_actor_grad_norm",),
    # training-inference mismatch as a per-token KL: k1 of the behaviour (inference) policy to the recomputed
    # proximal one (decoupled PPO; also holds staleness when async), then the k3 of the rollout to the trained policy
    "train_infer_kl": ('rl_areal_actor_behave_approx_kl{stat="avg"}',
                       'rl_areal_actor_drift_kl{kind="dual", stat="avg"}'),
    # training-inference mismatch as a ratio: mean behaviour importance weight (see CONCEPT_TRANSFORMS)
    "train_infer_ratio_deviation": ('rl_areal_actor_behave_importance_weight{stat="avg"}',),
    # policy versions between generating a token and training on it: the batch's worst (per micro-batch max)
    "staleness": ('rl_areal_actor_sample_staleness{kind="theta", stat="max"}',),
}
# PromQL transforms ({} = the selector) a source needs to carry its concept (concepts.Source.transform).
CONCEPT_TRANSFORMS: dict[str, str] = {
    'rl_areal_actor_approx_kl{stat="avg"}': "-({})",
    'rl_areal_actor_behave_importance_weight{stat="avg"}': "abs({} - 1)",
}
# Labels a concept's source must set to line up with the other sources (concepts.Source.set_labels).
CONCEPT_SET_LABELS: dict[str, dict[str, str]] = {
    "rl_areal_eval_reward": {"metric": "reward"},
}
