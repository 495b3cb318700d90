"""prime-rl's metrics (PrimeIntellect-ai/prime-rl @ 559b4477, version 0.8.0), as ``prime_rl.monitors.log`` hands
them to its monitors (``metrics.jsonl`` of the FileMonitor, W&B).

Read off prime-rl's code (tests/data/frameworks/prime_rl.tsv). Two processes log: the trainer (step = the policy
version it produces: ``perf/*``, ``optim/*``, tensor statistics, ``time/*``, ``system/ckpt_disk_*``) and the
orchestrator (step = the batch it ships: rollout statistics under ``train/{env}/{subset}/...``, ``progress/*``,
``time/*``, ``off_policy/*``, ``batch/*``, ``curriculum/*``, and ``eval/{env}/...``). Under the ``rl`` entrypoint
both append to the SAME ``metrics.jsonl``, and both write ``time/step`` and ``time/save_ckpt`` with different
meanings: :data:`LINE_WRITERS` tells their lines apart (``rl-otel watch`` reads the trainer's ``time/step`` as
``trainer/time/step``, served with ``component="trainer"``). Trainer statistics are distributions over tokens,
samples or micro-batches (mean, median, std, min, max); orchestrator statistics are over episodes or an agent's
traces (mean, max, min, p10, p90).

A key resolves here only in a prime-rl run's catalog (``default_catalog("prime_rl")``): ``loss/*``, ``time/*``,
``train/*`` and ``eval/*`` are spelled like other frameworks' keys with other meanings. ``perf/throughput``, which
veRL's module defines literally (per GPU there), is written with an anonymous placeholder (``perf/{_:throughput}``):
a key is defined literally once in the union of all catalogs, and default_catalog(framework) leaves out the shared
entry of a key the framework's own entries cover.
"""

from __future__ import annotations

from rl_otel.catalog.define import GIB, counter, gauge
from rl_otel.catalog.spec import MetricSpec
from rl_otel.catalog.writers import SharedFile, Writer

_S = "prime_rl"
_P = "rl_prime_rl_"
_TENSOR = "{stat:mean|median|std|min|max}"  # the trainer's Tensors.compute_stats
_ROLLOUT = "{stat:mean|max|min|p10|p90}"  # the orchestrator's statistics over episodes or traces
# the orchestrator's rollout scope: train or eval, an env (agg: all train envs; an env name may hold '/') and the
# subset (all: every rollout that arrived; effective: the admitted, clean, trainable ones)
_SCOPE = "{stage:train|eval}/{env:.+?}/{split:all|effective}"
_AGENT = _SCOPE + "/{agent}"  # one agent's traces (single-agent envs: agent="agent")


# The trainer and the orchestrator append to the same metrics.jsonl and both write time/step and time/save_ckpt
# (src/prime_rl/trainer/rl/train.py, trainer/sft/train.py: one time dict with time/forward_backward;
# src/prime_rl/orchestrator/orchestrator.py: one dict with time/pack and time/wait_for_policy); the component names
# are the labels prime-rl's shared W&B mode gives the two processes (WANDB_SHARED_LABEL).
LINE_WRITERS = SharedFile(
    prefix="time/", shared=frozenset({"time/step", "time/save_ckpt"}),
    writers=(Writer("trainer", frozenset({"time/forward_backward"})),
             Writer("orchestrator", frozenset({"time/pack", "time/wait_for_policy"}))))
_COMPONENTS = "|".join(w.component for w in LINE_WRITERS.writers)


def _g(key: str, name: str, description: str, *, unit: str = "1", scale: float = 1.0,
       tracker_unit: str = "") -> MetricSpec:
    return gauge(key, _P + name, description, _S, unit=unit, scale=scale, tracker_unit=tracker_unit)


def _c(key: str, name: str, description: str, *, unit: str = "1") -> MetricSpec:
    return counter(key, _P + name, description, _S, unit=unit)


_TRAINER = (
    # keys veRL's module defines literally, written with an anonymous placeholder: a key is defined literally once
    # in the union of all catalogs (default_catalog(framework) leaves veRL's entries out)
    _g("perf/{_:throughput}", "perf_tokens_per_second",
       "Trainer: padded micro-batch tokens (seq_len x batch size) of all DP ranks over the forward-backward "
       "seconds.", unit="{token}/s"),
    _g("perf/throughput_per_gpu", "perf_tokens_per_gpu_per_second",
       "Trainer: perf/throughput (padded micro-batch tokens of all DP ranks over the forward-backward seconds) "
       "divided by the trainer world size.", unit="{token}/s"),
    _g("perf/mfu", "perf_mfu_ratio",
       "Trainer: model FLOPs utilisation, flop per token x tokens per second over the GPUs' peak BF16 FLOPs "
       "(logged in percent).", scale=0.01, tracker_unit="%"),
    _g("perf/peak_memory", "perf_peak_memory_reserved_bytes",
       "Trainer: torch.cuda.max_memory_reserved on rank 0.", unit="By", scale=GIB, tracker_unit="GiBy"),
    _g("optim/lr", "optim_learning_rate", "Trainer: learning rate of the first param group after the scheduler step."),
    _g("optim/grad_norm", "optim_grad_norm",
       "Trainer: total gradient norm before clipping (only when optim.max_norm is set)."),
    _g(f"loss/{_TENSOR}", "loss",
       "Trainer: a statistic over micro-batches and ranks of the micro-batch loss, its summed per-token loss over "
       "the step's global loss-token count (the step's loss is the sum of these values, not their mean)."),
    _g(f"entropy/{{env:.+?}}/{_TENSOR}", "entropy",
       "Trainer: a statistic over the loss-masked tokens of all ranks (env=all) or of one env of the per-token "
       "policy entropy (nats)."),
    _g(f"mismatch_kl/{{env:.+?}}/{_TENSOR}", "mismatch_kl",
       "Trainer: a statistic over the loss-masked tokens (env=all, or one env) of the per-token trainer-inference "
       "mismatch KL, the k3 estimate r - log r - 1 with r = pi_trainer / pi_inference."),
    _g(f"kl_ent_ratio/{_TENSOR}", "mismatch_kl_per_entropy",
       "Trainer: mismatch_kl/all/mean over entropy/all/mean (when the entropy is > 0)."),
    # default (DPPO + KL) loss: one value per sample (token-mean within it), statistics over samples and ranks
    _g(f"masked_mismatch_kl/{_TENSOR}", "masked_mismatch_kl",
       "Trainer: a statistic over samples of the mismatch KL mean over the sample's trust-region-masked tokens."),
    _g(f"unmasked_mismatch_kl/{_TENSOR}", "unmasked_mismatch_kl",
       "Trainer: a statistic over samples of the mismatch KL mean over the sample's kept tokens."),
    _g(f"is_masked/{_TENSOR}", "is_masked_ratio",
       "Trainer: a statistic over samples of the fraction of the sample's loss tokens masked by the DPPO trust "
       "region (|p_trainer - p_inference| beyond dppo_mask_low/high, by advantage sign)."),
    _g(f"is_masked_{{bound:low|high}}/{_TENSOR}", "is_masked_bound_ratio",
       "Trainer: a statistic over samples of the fraction of the sample's loss tokens masked with a negative "
       "advantage (low: probability dropped too far) or a positive one (high: rose too far)."),
    _g(f"masked_advantage_{{kind:positive|negative}}/{_TENSOR}", "masked_advantage_sign_ratio",
       "Trainer: a statistic over samples of the fraction of the sample's masked tokens with a positive or "
       "negative advantage."),
    # ref_kl loss (opd/opsd) and the cross-entropy loss (SFT/ECHO components)
    _g(f"ref_kl/{_TENSOR}", "ref_kl",
       "Trainer, opd/opsd only: a statistic over samples of the token-mean (ref logprob - trainer logprob), the "
       "reverse-KL signal to the reference or teacher."),
    _g(f"nll/{_TENSOR}", "nll",
       "Trainer: a statistic over samples of the token-mean NLL of the cross-entropy-weighted tokens."),
    _g(f"ref_kl/is_masked/{_TENSOR}", "ref_kl_is_masked_ratio",
       "Trainer, ref_kl loss: a statistic over samples of the fraction of tokens masked by the trust region "
       "(trainer probability more than 0.2 below the inference one)."),
    _g(f"ref_kl/{{kind:masked|unmasked}}_mismatch_kl/{_TENSOR}", "ref_kl_mismatch_kl",
       "Trainer, ref_kl loss: a statistic over samples of the mismatch KL mean over the sample's masked or kept "
       "tokens."),
    # MoE load balance (TT MoE models)
    _g(f"max_vio/{_TENSOR}", "moe_max_load_violation",
       "Trainer, MoE only: a statistic over layers, micro-batches and ranks of the per-layer max load violation "
       "of the expert token counts."),
    _g(f"routing_confidence/{_TENSOR}", "moe_routing_confidence",
       "Trainer, MoE only: a statistic over layers, micro-batches and ranks of the per-layer mean router "
       "confidence."),
    _g(f"{{component:{_COMPONENTS}}}/time/{{operation}}", "time_seconds",
       "Seconds of one part of a step, by the process that logged it (component, prime-rl's own name for it: "
       "trainer or orchestrator; rl-otel watch tells their lines of the one metrics.jsonl apart by their other "
       "keys and reads time/<operation> as <component>/time/<operation>): trainer wait_for_batch, load_data, "
       "forward_backward, broadcast_weights; orchestrator pack, wait_for_policy; both step (trainer: the whole "
       "trainer step; orchestrator: sink-to-sink seconds between two shipped batches) and save_ckpt (each "
       "process's own checkpoint save, 0 on other steps).", unit="s"),
    _g("time/{operation}", "time_unattributed_seconds",
       "A time/<operation> key whose process is not told (logged as it is, or a metrics.jsonl line with neither or "
       "both processes' marks): the trainer's and the orchestrator's step and save_ckpt share its series; prime-rl's "
       "own lines are read as rl_prime_rl_time_seconds{component}.", unit="s"),
    _g("system/ckpt_disk_{kind:free|used|total}_gib", "checkpoint_disk_bytes",
       "Trainer: free, used or total space of the checkpoint directory's filesystem.", unit="By", scale=GIB,
       tracker_unit="GiBy"),
    _g("system/ckpt_disk_free_ratio", "checkpoint_disk_free_ratio",
       "Trainer: free over total space of the checkpoint directory's filesystem."),
)

# orchestrator rollout statistics: episode level (values summed over the episode's traces) ...
_EPISODES = (
    _g(f"{_SCOPE}/num_{{kind:total|input|output}}_tokens/{_ROLLOUT}", "episode_tokens",
       "Total, input (prompt) or output (generated: the response length) tokens of an episode summed over its "
       "traces, a statistic over the subset's episodes.", unit="{token}"),
    _g(f"{_SCOPE}/num_turns/{_ROLLOUT}", "episode_turns",
       "Turns of an episode summed over its traces, a statistic over the subset's episodes.", unit="{turn}"),
    _g(f"{_SCOPE}/num_branches/{_ROLLOUT}", "episode_branches",
       "Branches of an episode summed over its traces, a statistic over the subset's episodes."),
    _g(f"{_SCOPE}/{{reason:has_error|cancelled}}/mean", "episode_failure_ratio",
       "Subset all: fraction of episodes that errored (has_error) or that the pipeline cancelled as stale "
       "(cancelled)."),
)

# ... and one agent's traces
_TRACES = (
    _g(f"{_AGENT}/reward/{_ROLLOUT}", "trace_reward",
       "The trace reward (sum of the weighted reward functions: the training reward), a statistic over the "
       "agent's traces."),
    _g(f"{_AGENT}/num_{{kind:total|input|output}}_tokens/{_ROLLOUT}", "trace_tokens",
       "Total, input or output tokens of a trace, a statistic over the agent's traces.", unit="{token}"),
    _g(f"{_AGENT}/num_turns/{_ROLLOUT}", "trace_turns",
       "Turns of a trace, a statistic over the agent's traces.", unit="{turn}"),
    _g(f"{_AGENT}/num_branches/{_ROLLOUT}", "trace_branches",
       "Branches of a trace, a statistic over the agent's traces."),
    _g(f"{_AGENT}/is_{{kind:truncated|completed|trainable|admitted}}/mean", "trace_status_ratio",
       "Fraction of the agent's traces truncated (max tokens or context), completed, carrying a training signal "
       "(trainable) or admitted by the source curriculum."),
    _g(f"{_AGENT}/{{reason:has_error|cancelled}}/mean", "trace_failure_ratio",
       "Subset all: fraction of the agent's traces with an error (has_error) or cancelled as stale (cancelled)."),
    _g(f"{_AGENT}/timing/{{phase:.+?}}/{_ROLLOUT}", "trace_phase_duration_seconds",
       "Seconds of one phase of a trace (setup, agent, agent/model, agent/harness, finalize, scoring, total), a "
       "statistic over the agent's traces.", unit="s"),
    _g(f"{_AGENT}/metrics/{{metric:.+?}}/{_ROLLOUT}", "trace_metric",
       "A verifiers metric of a trace, a statistic over the agent's traces."),
    _g(f"{_AGENT}/rewards/{{reward_func:.+?}}/{_ROLLOUT}", "trace_reward_function",
       "One reward function's value for a trace, a statistic over the agent's traces."),
    _g(f"{_AGENT}/error/{{reason}}", "trace_errors",
       "Subset all: the agent's traces whose last error has the type named in the key (reason).", unit="{trace}"),
    _g(f"{_AGENT}/solved_{{kind:none|all|some}}", "example_groups_solved_ratio",
       "Subset all: fraction of example groups whose traces all have reward 0 (none), all reward 1 (all) or "
       "neither (some)."),
    _g(f"{_AGENT}/stop_condition/{{reason}}", "trace_stop_condition_ratio",
       "Fraction of the agent's traces that stopped with the condition named in the key (generation_truncated: "
       "truncated for a reason other than prompt_too_long)."),
)

_ORCHESTRATOR = (
    _g("progress/tokens", "progress_batch_tokens",
       "Orchestrator: tokens of all the rollouts that arrived for this batch.", unit="{token}"),
    _g("progress/{kind:input|output}_tokens", "progress_batch_shipped_tokens",
       "Orchestrator: prompt (input) or generated (output) tokens of the batch's effective (shipped) traces.",
       unit="{token}"),
    _g("progress/rollouts", "progress_batch_rollouts",
       "Orchestrator: rollouts (traces) that arrived for this batch.", unit="{sample}"),
    _g("progress/tasks", "progress_batch_tasks", "Orchestrator: unique examples in the batch.", unit="{task}"),
    _c("progress/total_tokens", "progress_tokens",
       "Orchestrator: tokens of all the batches before this one (running total).", unit="{token}"),
    _c("progress/total_rollouts", "progress_rollouts",
       "Orchestrator: rollouts of all the batches before this one (running total).", unit="{sample}"),
    _c("progress/total_tasks", "progress_tasks",
       "Orchestrator: examples of all the batches before this one (running total).", unit="{task}"),
    _g("off_policy/{stat:mean|max}", "off_policy_staleness",
       "Orchestrator: episode staleness, (step - 1) - the policy version that started generating the episode, "
       "mean or max over the effective episodes.", unit="{step}"),
    _g("off_policy/{kind:in_flight|in_queue}/{stat:mean|max}", "off_policy_staleness_part",
       "Orchestrator: the part of an episode's staleness from policy updates during its generation (in_flight) or "
       "while it was buffered before shipping (in_queue), mean or max over episodes.", unit="{step}"),
    _g("off_policy/dropped", "off_policy_dropped_rollouts",
       "Orchestrator: queued traces the train sink voided as too stale since the last batch.", unit="{sample}"),
    _g("batch/{env:.+}", "batch_env_share_ratio", "Orchestrator: share of the batch's rollouts from one env."),
    _g("curriculum/{env:.+}/admission_rate", "curriculum_admission_ratio",
       "Orchestrator: fraction of an env's sampled examples its curriculum admitted since the last batch."),
)

_EVAL = (
    _g("eval/{env:.+?}/{split:all|effective}/{agent}/avg@{k:[0-9]+}", "eval_avg_at_k",
       "Orchestrator eval: mean reward over the env's eval traces of the agent (avg@k, k = rollouts per "
       "example)."),
    _g("eval/{env:.+?}/{split:all|effective}/{agent}/pass@{k:[0-9]+}", "eval_pass_at_k_ratio",
       "Orchestrator eval, binary rewards only: unbiased pass@k averaged over the env's examples."),
    _g("eval/{env:.+?}/{split:all|effective}/{agent}/pass^{k:[0-9]+}", "eval_pass_all_k_ratio",
       "Orchestrator eval, binary rewards only: unbiased pass^k (all k correct) averaged over the env's examples."),
    _g("eval/{env:.+?}/policy_version", "eval_policy_version",
       "Orchestrator eval: lowest policy version that generated the env's eval epoch.", unit="{version}"),
)

SPECS: tuple[MetricSpec, ...] = (*_TRAINER, *_EPISODES, *_TRACES, *_ORCHESTRATOR, *_EVAL)


# concept name (rl_otel.catalog.concepts) -> selectors of the families above that carry it, in order of preference
CONCEPT_SOURCES: dict[str, tuple[str, ...]] = {
    "reward": (f'{_P}trace_reward{{stage="train", env="agg", split="effective", stat="mean"}}',),
    "ref_kl": (f'{_P}ref_kl{{stat="mean"}}',),
    "policy_loss": (f'{_P}loss{{stat="mean"}}',),
    "clip_ratio": (f'{_P}is_masked_ratio{{stat="mean"}}',),
    "entropy": (f'{_P}entropy{{env="all", stat="mean"}}',),
    "response_length": (
        f'{_P}episode_tokens{{stage="train", env="agg", split="effective", kind="output", stat="mean"}}',),
    "throughput": (f"{_P}perf_tokens_per_second",),
    # the trainer's step as rl-otel watch reads prime-rl's lines, else a time/step of no told process
    "step_duration": (f'{_P}time_seconds{{component="trainer", operation="step"}}',
                      f'{_P}time_unattributed_seconds{{operation="step"}}'),
    "eval_score": (f'{_P}eval_avg_at_k{{split="effective"}}',),
    "gpu_memory_peak": (f"{_P}perf_peak_memory_reserved_bytes",),
    "learning_rate": (f"{_P}optim_learning_rate",),
    "grad_norm": (f"{_P}optim_grad_norm",),
    "mfu": (f"{_P}perf_mfu_ratio",),
    # training-inference mismatch: a per-token k3 KL
    "train_infer_kl": (f'{_P}mismatch_kl{{env="all", stat="mean"}}',),
    "staleness": (f'{_P}off_policy_staleness{{stat="max"}}',),
}
CONCEPT_TRANSFORMS: dict[str, str] = {}
# Labels a concept's source must set to line up with the other sources (concepts.Source.set_labels) and labels it
# must copy (concepts.Source.rename_labels: {to: from}).
CONCEPT_SET_LABELS: dict[str, dict[str, str]] = {
    f'{_P}eval_avg_at_k{{split="effective"}}': {"metric": "reward"},
}
CONCEPT_RENAME_LABELS: dict[str, dict[str, str]] = {
    f'{_P}eval_avg_at_k{{split="effective"}}': {"taskset": "env"},
}
