"""slime's metrics (THUDM/slime main after v0.3.1, Megatron backend), as passed to its ``logging_utils.log``.

Read off slime's code (tests/data/frameworks/slime.tsv). ``slime/observability/logging_utils.py:log`` hands the dict
to wandb unchanged and to TensorBoard key by key with no prefix, on three step axes: ``train/step`` (one log per
optimizer step, from the Megatron DP0/TP0/last-PP rank), ``rollout/step`` (the RolloutManager's sample metrics and
rollout throughput; the Megatron actor's ``rollout/*`` batch means, ``multi_turn/*``, ``passrate/*`` and
``perf/*`` timers) and ``eval/step``. Train metrics are, by default, means over the step's rollouts of per-rollout
token means (a mean of per-sequence token means); with ``--calculate-per-token-loss`` per-token means.

The keys resolve in ``default_catalog("slime")`` only: ``train/loss`` or ``train/grad_norm`` (veRL's SFT keys in the
shared catalog) and ``rollout/kl`` mean other things elsewhere. Keys another framework's module defines literally
(veRL's ``train/loss``, OpenRLHF's ``train/ppo_kl``) are written with an anonymous placeholder (``train/{_:loss}``):
a key is defined literally once in the union of all catalogs (``Catalog`` rejects a second one).
"""

from __future__ import annotations

from rl_otel.catalog.define import counter, gauge

_S = "slime"
_STATS = "{stat:mean|median|max|min}"  # numpy statistics over the rollout's samples
_TASKSET = "eval/{taskset}"  # the eval dataset's name (--eval-prompt-data / eval config)
# perf/{timer}_time of the Megatron actor's Timer (log_perf_data), summed since the previous perf log
_TIMERS = ("train_wait|train|data_preprocess|log_probs|ref_log_probs|teacher_log_probs|actor_train|ref_model_update|"
           "update_weights|save_model|sleep|wake_up")
_PER_SEQ = "mean of per-rollout token means over the step (per-token mean with --calculate-per-token-loss)"
_ROLLOUT_MEAN = "mean over the rollout's samples of per-sample token means"
_TRACED = "Only with sglang request tracing"
_PD = "Only with sglang PD disaggregation and tracing"


def _sample_metrics(prefix: str, name: str, scope: str) -> tuple:
    """The sample metrics the RolloutManager computes both for a rollout (``rollout/*``) and per eval dataset."""
    return (
        gauge(f"{prefix}/response_len/{_STATS}", f"{name}_effective_response_length",
              f"{scope}: effective response length in tokens (loss-mask sum, model tokens only), "
              "mean/median/max/min over the samples.", _S, unit="{token}"),
        gauge(f"{prefix}/repetition_frac", f"{name}_repetition_ratio",
              f"{scope}: fraction of samples whose response is over 10000 characters and whose last 10000 "
              "characters compress more than 10x with zlib (degenerate repetition).", _S),
        gauge(f"{prefix}/zero_std/count_{{kind}}", f"{name}_zero_std_groups",
              f"{scope}, non-PPO estimators: number of prompt groups whose samples all got the same reward, per "
              "reward value (kind, rounded to 0.1).", _S, unit="{group}"),
        gauge(f"{prefix}/prefix_cache_hit_rate", f"{name}_prefix_cache_hit_ratio",
              f"{scope}: sglang prefix cache hit rate, cached prompt tokens / prompt tokens over the samples.", _S),
        gauge(f"{prefix}/avg_cached_tokens_per_sample", f"{name}_cached_tokens_per_sample",
              f"{scope}: sglang prefix-cached prompt tokens per sample, mean over the samples.", _S,
              unit="{token}"),
        gauge(f"{prefix}/top_p_kept_vocab_per_token", f"{name}_top_p_kept_vocab_per_token",
              f"{scope}, only with --rollout-top-p < 1: vocabulary entries kept by top-p per loss-masked response "
              "token, mean over the samples.", _S),
        gauge(f"{prefix}/error_cat/{{reason}}", f"{name}_reward_category_ratio",
              f"{scope}, only with --log-reward-category: fraction of samples whose reward category "
              "(sample.reward[--log-reward-category]) is the reason label.", _S),
    )


_TRAIN = (
    counter("train/step", "rl_slime_train_steps",
            "wandb only: 0-based global optimizer step rollout_id * num_steps_per_rollout + step_id (the "
            "TensorBoard step of train/*).", _S, unit="{step}"),
    gauge("train/{_:loss}", "rl_slime_train_loss",
          f"Total actor objective pg_loss - entropy_coef * entropy (+ kl_loss_coef * kl_loss with --use-kl-loss), "
          f"{_PER_SEQ}.", _S),
    gauge("train/pg_loss", "rl_slime_train_pg_loss",
          f"PPO clipped (or CISPO/GSPO) policy-gradient loss per token, times TIS/OPSM weights when enabled, "
          f"{_PER_SEQ}.", _S),
    gauge("train/{_:entropy_loss}", "rl_slime_train_entropy",
          f"Policy entropy (nats) of the current model over loss-masked response tokens, {_PER_SEQ} (logged even "
          "with entropy_coef 0).", _S),
    gauge("train/pg_clipfrac", "rl_slime_train_pg_clip_ratio",
          f"Fraction of loss-masked response tokens whose ratio was clipped, {_PER_SEQ}.", _S),
    gauge("train/{_:ppo_kl}", "rl_slime_train_ppo_kl",
          f"Old-vs-current policy KL, old_log_prob - log_prob per token (k1), {_PER_SEQ}.", _S),
    gauge("train/kl_loss", "rl_slime_train_kl_loss",
          f"Only with --use-kl-loss: KL of the current policy to the reference per token (--kl-loss-type), "
          f"{_PER_SEQ}.", _S),
    gauge("train/train_rollout_logprob_abs_diff", "rl_slime_train_rollout_logprob_abs_diff",
          f"Training-inference mismatch (with sglang rollout log-probs): |trainer log-prob - sglang log-prob| per "
          f"token, {_PER_SEQ}.", _S),
    gauge("train/ois", "rl_slime_train_old_importance_ratio",
          f"Only with --use-tis or --get-mismatch-metrics: old-to-current importance ratio exp(log_prob - "
          f"old_log_prob) per token, {_PER_SEQ}.", _S),
    gauge("train/tis", "rl_slime_train_tis_importance_ratio",
          f"Only with --use-tis: training/inference importance ratio exp(trainer old log-prob - sglang log-prob) "
          f"per token before clamping, {_PER_SEQ}.", _S),
    gauge("train/tis_clipfrac", "rl_slime_train_tis_clip_ratio",
          f"Only with --use-tis: fraction of tokens whose TIS ratio was clamped (icepop: zeroed), {_PER_SEQ}.", _S),
    gauge("train/tis_abs", "rl_slime_train_tis_abs_deviation",
          f"Only with --use-tis: |TIS ratio - 1| per token, {_PER_SEQ}.", _S),
    gauge("train/opsm_clipfrac", "rl_slime_train_opsm_clip_ratio",
          "Only with --use-opsm: fraction of sequences masked by off-policy sequence masking, reduced like the "
          "other train metrics.", _S),
    gauge("train/opd_reverse_kl", "rl_slime_train_opd_reverse_kl",
          f"Only with on-policy distillation: student - teacher log-prob per token (reverse KL estimate), "
          f"{_PER_SEQ}.", _S),
    gauge("train/{_:grad_norm}", "rl_slime_train_grad_norm",
          "Megatron optimizer global gradient L2 norm before clipping of the step (NaN when the step was "
          "skipped).", _S),
    gauge("train/lr-pg_{part}", "rl_slime_train_learning_rate",
          "Learning rate of the actor optimizer's param group (part) after the step.", _S),
    gauge("train/global_batch_size", "rl_slime_train_global_batch_size",
          "Rollouts (samples in the common case) in the optimizer step across DP ranks.", _S, unit="{sample}"),
    gauge("train/mtp_loss", "rl_slime_train_mtp_loss",
          "Only with --enable-mtp-training: multi-token-prediction loss summed over the MTP heads, mean over "
          "micro-batches.", _S),
    gauge("train/mtp_{k:[0-9]+}_loss", "rl_slime_train_mtp_head_loss",
          "Only with --enable-mtp-training: multi-token-prediction loss of the 1-based head k, mean over "
          "micro-batches.", _S),
    # critic (role tag 'critic-')
    gauge("train/critic-value_loss", "rl_slime_critic_value_loss",
          f"Clipped value loss max((V_clipped - R)^2, (V - R)^2) per token (no 0.5 factor), {_PER_SEQ}.", _S),
    gauge("train/critic-value_clipfrac", "rl_slime_critic_value_clip_ratio",
          f"Fraction of tokens where |V - V_old| > value_clip, {_PER_SEQ}.", _S),
    gauge("train/critic-grad_norm", "rl_slime_critic_grad_norm",
          "Critic optimizer global gradient norm before clipping of the step.", _S),
    gauge("train/critic-lr-pg_{part}", "rl_slime_critic_learning_rate",
          "Learning rate of the critic optimizer's param group (part) after the step.", _S),
    gauge("train/critic-global_batch_size", "rl_slime_critic_global_batch_size",
          "Rollouts in the critic optimizer step across DP ranks.", _S, unit="{sample}"),
)

_ROLLOUT_BATCH = (  # the Megatron actor's view of the rollout batch (train_metric_utils.log_rollout_data)
    counter("rollout/step", "rl_slime_rollout_steps",
            "wandb only: 0-based rollout index (or its train-step equivalent with --wandb-always-use-train-step), "
            "the TensorBoard step of rollout/*, perf/*, multi_turn/* and passrate/*.", _S, unit="{step}"),
    gauge("rollout/log_probs", "rl_slime_rollout_logprob",
          f"Actor (old policy) log-prob recomputed by Megatron before training over loss-masked tokens, "
          f"{_ROLLOUT_MEAN}.", _S),
    gauge("rollout/ref_log_probs", "rl_slime_rollout_ref_logprob",
          f"Only with a reference model: reference log-prob over loss-masked tokens, {_ROLLOUT_MEAN}.", _S),
    gauge("rollout/rollout_log_probs", "rl_slime_rollout_engine_logprob",
          f"Log-prob reported by sglang at generation time over loss-masked tokens, {_ROLLOUT_MEAN}.", _S),
    gauge("rollout/teacher_log_probs", "rl_slime_rollout_teacher_logprob",
          f"Only with on-policy distillation: teacher log-prob over loss-masked tokens, {_ROLLOUT_MEAN}.", _S),
    gauge("rollout/advantages", "rl_slime_rollout_advantages",
          f"Advantages (GRPO: group-normalised reward broadcast to tokens; PPO: GAE), {_ROLLOUT_MEAN}.", _S),
    gauge("rollout/returns", "rl_slime_rollout_returns", f"Returns, {_ROLLOUT_MEAN}.", _S),
    gauge("rollout/values", "rl_slime_rollout_values",
          f"Only with --use-critic: critic value predictions, {_ROLLOUT_MEAN}.", _S),
    gauge("rollout/opd_reverse_kl", "rl_slime_rollout_opd_reverse_kl",
          f"Only with on-policy distillation: student - teacher log-prob per token, {_ROLLOUT_MEAN}.", _S),
    gauge("rollout/kl", "rl_slime_rollout_kl",
          "Per-token approx KL of the actor (old) to the reference used for KL-in-reward (zeros with --kl-coef 0), "
          "plain mean over the rank's response tokens (not loss-masked), averaged over ranks by samples.", _S),
    gauge("rollout/entropy", "rl_slime_rollout_entropy",
          "Only with --use-rollout-entropy: entropy (nats) of the actor's recomputation per response token, plain "
          "token mean (not loss-masked) per rank, averaged over ranks by samples.", _S),
    gauge("rollout/ref_entropy", "rl_slime_rollout_ref_entropy",
          "Only with --use-rollout-entropy and a reference model: reference entropy per response token, plain "
          "token mean per rank, averaged over ranks by samples.", _S),
    gauge("rollout/raw_reward", "rl_slime_rollout_raw_reward",
          "Raw per-sample reward before group normalisation, mean over the samples of the rollout batch.", _S),
    gauge("rollout/rewards", "rl_slime_rollout_rewards",
          "Per-sample reward fed to the advantage estimator (GRPO-like: minus the group mean, over the group std; "
          "so ~0), mean over the samples.", _S),
    gauge("rollout/response_lengths", "rl_slime_rollout_response_length",
          "Response length in tokens (incl. tool/observation tokens), mean over the samples.", _S, unit="{token}"),
    gauge("rollout/total_lengths", "rl_slime_rollout_total_length",
          "Prompt+response length in tokens, mean over the samples.", _S, unit="{token}"),
    gauge("rollout/truncated", "rl_slime_rollout_batch_truncated_ratio",
          "Fraction of the rollout batch's samples with status TRUNCATED (hit the max response length).", _S),
    gauge("rollout/round_number", "rl_slime_rollout_rounds",
          "Only when samples carry round_number metadata (multi-turn): rounds per sample, mean over the samples.",
          _S, unit="{turn}"),
    gauge("rollout/partition", "rl_slime_rollout_partition",
          "Logging artifact: mean of the samples' positions in the flattened rollout batch ((N - 1) / 2).", _S),
    gauge("multi_turn/{kind:raw|wo_obs}_response_length/response_length_{stat:mean|max|min}",
          "rl_slime_multi_turn_response_length",
          "Only with --log-multi-turn: response length in tokens per sample, incl. observation tokens (raw) or "
          "model tokens only (wo_obs), mean/max/min over the rank's samples, averaged over DP ranks.", _S,
          unit="{token}"),
    gauge("multi_turn/raw_response_length/response_length_clip_ratio", "rl_slime_multi_turn_response_clip_ratio",
          "Only with --log-multi-turn: fraction of samples whose full response length reached "
          "rollout_max_response_len.", _S),
    gauge("multi_turn/multi_turn_metric/round_number_{stat:mean|max|min}", "rl_slime_multi_turn_rounds",
          "Only with --log-multi-turn and round_number metadata: rounds per sample, mean/max/min over the rank's "
          "samples, averaged over DP ranks.", _S, unit="{turn}"),
    gauge("passrate/pass@{k:[0-9]+}", "rl_slime_pass_at_k",
          "Only with --log-passrate and n_samples_per_prompt > 1: unbiased pass@k of the training rollout "
          "(raw_reward == 1 is correct), mean over prompt groups.", _S),
)

_ROLLOUT_MANAGER = (  # the RolloutManager's sample metrics and throughput (rollout_metrics.py)
    *_sample_metrics("rollout", "rl_slime_rollout", "Rollout"),
    gauge("rollout/truncated_ratio", "rl_slime_rollout_truncated_ratio",
          "Fraction of the rollout's generated samples with status TRUNCATED.", _S),
    gauge("rollout/{_:spec_accept_rate}", "rl_slime_rollout_spec_accept_ratio",
          "Only with sglang speculative decoding: draft-token acceptance rate, mean over the rollout's samples.",
          _S),
    gauge("rollout/{_:spec_accept_length}", "rl_slime_rollout_spec_accept_length",
          "Only with sglang speculative decoding: accepted tokens per verify step, mean over the rollout's "
          "samples.", _S, unit="{token}"),
    gauge("rollout/dynamic_filter/drop_{reason}", "rl_slime_rollout_dynamic_filter_dropped_groups",
          "Only with --dynamic-sampling-filter-path: sample groups the dynamic filter dropped during the rollout, "
          "per drop reason.", _S, unit="{group}"),
    gauge("perf/rollout_time", "rl_slime_perf_rollout_duration_seconds",
          "Wall time of RolloutManager.generate for the rollout (generation and rewards).", _S, unit="s"),
    gauge("perf/tokens_per_gpu_per_sec", "rl_slime_perf_rollout_tokens_per_gpu_per_second",
          "Rollout throughput per rollout GPU: sum of response lengths / rollout time / rollout GPUs.", _S,
          unit="{token}/s"),
    gauge("perf/effective_tokens_per_gpu_per_sec", "rl_slime_perf_rollout_effective_tokens_per_gpu_per_second",
          "Rollout throughput per rollout GPU counting effective (loss-masked) response tokens only.", _S,
          unit="{token}/s"),
    gauge("perf/longest_sample_tokens_per_sec", "rl_slime_perf_longest_sample_tokens_per_second",
          "Longest response length / rollout time (decode speed of the tail sample).", _S, unit="{token}/s"),
    gauge("perf/longest_effective_sample_tokens_per_sec", "rl_slime_perf_longest_effective_sample_tokens_per_second",
          "Longest effective response length / rollout time.", _S, unit="{token}/s"),
    gauge(f"perf/non_generation_time/{_STATS}", "rl_slime_perf_non_generation_duration_seconds",
          "Only when some sample spent time outside generation (tools, environment): that time per sample, "
          "mean/median/max/min over the rollout's samples.", _S, unit="s"),
    gauge("perf/longest_sample_non_generation_time", "rl_slime_perf_longest_sample_non_generation_duration_seconds",
          "Only with non-generation time: mean non-generation time of the longest sample(s).", _S, unit="s"),
    gauge("perf/longest_effective_sample_non_generation_time",
          "rl_slime_perf_longest_effective_sample_non_generation_duration_seconds",
          "Only with non-generation time: mean non-generation time of the longest effective sample(s).", _S,
          unit="s"),
    gauge("perf/longest_sample_tokens_per_sec_without_non_generation",
          "rl_slime_perf_longest_sample_generation_tokens_per_second",
          "Longest response length / (rollout time - its non-generation time).", _S, unit="{token}/s"),
    gauge("perf/longest_effective_sample_tokens_per_sec_without_non_generation",
          "rl_slime_perf_longest_effective_sample_generation_tokens_per_second",
          "Longest effective response length / (rollout time - its non-generation time).", _S, unit="{token}/s"),
    gauge(f"perf/request/e2e_latency/{_STATS}", "rl_slime_perf_request_latency_seconds",
          f"{_TRACED}: end-to-end latency of an sglang request, mean/median/max/min over the rollout's requests.",
          _S, unit="s"),
    gauge(f"perf/request/queue_time/{_STATS}", "rl_slime_perf_request_queue_duration_seconds",
          f"{_TRACED}: scheduler queue time of an sglang request, mean/median/max/min over the rollout's requests.",
          _S, unit="s"),
    gauge(f"perf/decode/throughput/{_STATS}", "rl_slime_perf_request_decode_tokens_per_second",
          f"{_TRACED}: decode throughput of an sglang request, mean/median/max/min over the rollout's requests.",
          _S, unit="{token}/s"),
    gauge(f"perf/prefill/{{operation:bootstrap_queue|bootstrap|alloc_wait|forward|transfer_queue}}_duration/{_STATS}",
          "rl_slime_perf_prefill_duration_seconds",
          f"{_PD}: prefill-side duration of one stage (operation) of an sglang request, mean/median/max/min over "
          "the rollout's requests.", _S, unit="s"),
    gauge(f"perf/prefill/transfer_speed_gb_s/{_STATS}", "rl_slime_perf_prefill_transfer_bytes_per_second",
          f"{_PD}: KV-cache transfer speed of an sglang request (logged in GiB/s), mean/median/max/min over the "
          "rollout's requests.", _S, unit="By/s", scale=float(2**30), tracker_unit="GiBy/s"),
    gauge(f"perf/prefill/transfer_total_mb/{_STATS}", "rl_slime_perf_prefill_transfer_bytes",
          f"{_PD}: KV-cache bytes transferred for an sglang request (logged in MiB), mean/median/max/min over the "
          "rollout's requests.", _S, unit="By", scale=float(2**20), tracker_unit="MiBy"),
    gauge(f"perf/prefill/retry_count/{_STATS}", "rl_slime_perf_prefill_retries",
          f"{_PD}: prefill retries of an sglang request, mean/median/max/min over the rollout's requests.", _S),
    gauge(f"perf/decode/{{operation:prealloc|bootstrap|alloc_wait|transfer|forward}}_duration/{_STATS}",
          "rl_slime_perf_decode_duration_seconds",
          f"{_PD}: decode-side duration of one stage (operation) of an sglang request, mean/median/max/min over "
          "the rollout's requests.", _S, unit="s"),
)

_PERF = (  # the Megatron actor's timers and training throughput (train_metric_utils.log_perf_data)
    gauge(f"perf/{{operation:{_TIMERS}}}_time", "rl_slime_perf_timer_seconds",
          "Seconds the trainer spent in one operation since the previous perf log: train_wait (waiting for rollout "
          "data), train (the whole train block), data_preprocess, log_probs / ref_log_probs / teacher_log_probs "
          "(forward passes), actor_train (optimizer steps), ref_model_update, update_weights (sync to sglang), "
          "save_model, sleep / wake_up (offload).", _S, unit="s"),
    gauge("perf/step_time", "rl_slime_perf_step_duration_seconds",
          "Wall time of one rollout step as the trainer sees it: train_wait time + train time.", _S, unit="s"),
    gauge("perf/wait_time_ratio", "rl_slime_perf_wait_time_ratio",
          "Fraction of the step the trainer waited: train_wait time / step time.", _S),
    gauge("perf/{operation:actor_train|log_probs|ref_log_probs}_tflops", "rl_slime_perf_achieved_flop_per_second",
          "Achieved model FLOP/s per GPU of an operation (logged in TFLOP/s): actor_train 3 x, log_probs and "
          "ref_log_probs 1 x the forward FLOPs of the rollout's sequences / world size / its time (not divided by "
          "the peak: no MFU).", _S, unit="{flop}/s", scale=1e12, tracker_unit="T{flop}/s"),
    gauge("perf/actor_train_tok_per_s", "rl_slime_perf_actor_train_tokens_per_second",
          "Training throughput of the whole cluster: prompt+response tokens of the rollout batch / actor_train "
          "time.", _S, unit="{token}/s"),
    gauge("perf/update_weights_density", "rl_slime_perf_update_weights_density_ratio",
          "Only with disk-delta weight updates: changed bytes / total bytes of the last weight update.", _S),
    gauge("perf/update_weights_wire_bytes", "rl_slime_perf_update_weights_wire_bytes",
          "Only with disk-delta weight updates: bytes written for the last weight update (all ranks).", _S,
          unit="By"),
)

_EVAL = (  # log_eval_rollout_data, every --eval-interval rollouts; taskset = the eval dataset's name
    counter("eval/step", "rl_slime_eval_steps",
            "wandb only: rollout index at which the evaluation ran (the TensorBoard step of eval/*).", _S,
            unit="{step}"),
    gauge(f"{_TASKSET}-truncated_ratio", "rl_slime_eval_truncated_ratio",
          "Fraction of the eval dataset's samples that were truncated.", _S),
    gauge(f"{_TASKSET}-pass@{{k:[0-9]+}}", "rl_slime_eval_pass_at_k",
          "Only with --log-passrate and n_samples_per_eval_prompt > 1: unbiased pass@k over the eval dataset's "
          "prompts.", _S),
    *_sample_metrics(_TASKSET, "rl_slime_eval", "Eval, per dataset (taskset)"),
    gauge(f"{_TASKSET}/truncated_ratio", "rl_slime_eval_status_truncated_ratio",
          "Fraction of the eval dataset's samples with status TRUNCATED (the same value as -truncated_ratio).", _S),
    gauge(f"{_TASKSET}/spec_accept_rate", "rl_slime_eval_spec_accept_ratio",
          "Only with sglang speculative decoding: draft-token acceptance rate, mean over the eval dataset's "
          "samples.", _S),
    gauge(f"{_TASKSET}/spec_accept_length", "rl_slime_eval_spec_accept_length",
          "Only with sglang speculative decoding: accepted tokens per verify step, mean over the eval dataset's "
          "samples.", _S, unit="{token}"),
    gauge(_TASKSET, "rl_slime_eval_reward",
          "Eval reward, mean over all samples of the eval dataset (avg@n accuracy for 0/1 rewards).", _S),
)

SPECS = (*_TRAIN, *_ROLLOUT_BATCH, *_ROLLOUT_MANAGER, *_PERF, *_EVAL)

# Concept (rl_otel.catalog.concepts) -> selectors of the families above that carry it, in order of preference.
CONCEPT_SOURCES: dict[str, tuple[str, ...]] = {
    "reward": ("rl_slime_rollout_raw_reward",),
    # per token: the KL loss, else the KL-in-reward token mean (all zeros with --kl-coef 0: see CONCEPT_TRANSFORMS)
    "ref_kl": ("rl_slime_train_kl_loss", "rl_slime_rollout_kl"),
    "policy_kl": ("rl_slime_train_ppo_kl",),  # k1, old - new
    "policy_loss": ("rl_slime_train_pg_loss",),
    "clip_ratio": ("rl_slime_train_pg_clip_ratio",),
    "entropy": ("rl_slime_train_entropy", "rl_slime_rollout_entropy"),
    "response_length": ("rl_slime_rollout_response_length", 'rl_slime_rollout_effective_response_length{stat="mean"}'),
    # tokens/s: training (whole cluster) first, then rollout per GPU
    "throughput": ("rl_slime_perf_actor_train_tokens_per_second", "rl_slime_perf_rollout_tokens_per_gpu_per_second"),
    "step_duration": ("rl_slime_perf_step_duration_seconds",),
    "eval_score": ("rl_slime_eval_reward",),
    "learning_rate": ("rl_slime_train_learning_rate",),
    "grad_norm": ("rl_slime_train_grad_norm",),
    # training-inference mismatch: mean |trainer - sglang log-prob| per token (an abs diff)
    "train_infer_logprob_diff": ("rl_slime_train_rollout_logprob_abs_diff",),
    # training-inference mismatch as a ratio deviation: mean |TIS ratio - 1| per token (already a deviation), then
    # |mean TIS ratio - 1| (a ratio: see CONCEPT_TRANSFORMS)
    "train_infer_ratio_deviation": ("rl_slime_train_tis_abs_deviation", "rl_slime_train_tis_importance_ratio"),
}
# PromQL transforms ({} = the selector) a source needs to carry its concept (concepts.Source.transform).
CONCEPT_TRANSFORMS: dict[str, str] = {
    "rl_slime_rollout_kl": "{} != 0",  # zeros when --kl-coef is 0: no KL was computed
    "rl_slime_train_tis_importance_ratio": "abs({} - 1)",
}
# Labels a concept's source must set to line up with the other sources (concepts.Source.set_labels).
CONCEPT_SET_LABELS: dict[str, dict[str, str]] = {
    "rl_slime_eval_reward": {"metric": "reward"},
}
