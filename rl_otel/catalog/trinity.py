"""Trinity-RFT's metrics ("Monitor Metrics Reference"), with the veRL trainer families it reuses."""

from __future__ import annotations

from rl_otel.catalog.define import GIB, MIN_MAX_MEAN, gauge

_S = "trinity"
_STATS = "{stat:mean|max|min|std}"
_AT_K = "{stat:mean|std|best|worst}@{k:[0-9]+}"
_ACROSS = "{across:mean|std|max|min}"


def _eval_family(prefix: str) -> tuple:
    what = "evaluation" if prefix == "eval" else "benchmark"
    return (
        gauge(f"{prefix}/{{taskset}}/{{metric}}/{_AT_K}", f"rl_{prefix}_metric",
              f"A workflow metric on a {what} taskset: mean@k / std@k over each task's k runs (best@k / worst@k: "
              "bootstrap over subsets of size k), averaged over the taskset's tasks.", _S),
        gauge(f"{prefix}/{{taskset}}/{{metric}}/{_AT_K}/{_ACROSS}", f"rl_{prefix}_metric_across_tasks",
              f"detailed_stats of a {what} metric: mean, std, max or min across the taskset's tasks of the per-task "
              "statistic.", _S),
    )


SPECS = (
    gauge(f"rollout/{{metric}}/{_STATS}", "rl_rollout_metric",
          "A workflow metric of the rollout step: per task the mean over its runs, then mean/max/min/std over the "
          "step's tasks.", _S),
    *_eval_family("eval"),
    *_eval_family("bench"),
    gauge("time/experience_pipeline/{operator}", "rl_experience_pipeline_duration_seconds",
          "Time an experience-pipeline operator took in the step.", _S, unit="s"),
    gauge("timing_per_token_ms/{operation}", "rl_timing_per_token_seconds",
          "Execution time of a training operation per token processed (update_actor, update_critic, adv, ...).", _S,
          unit="s", scale=1e-3, tracker_unit="ms"),
    gauge("experience_pipeline/experience_count", "rl_experience_pipeline_experiences",
          "Number of experiences the experience pipeline processed in the step.", _S, unit="{experience}"),
    gauge(f"experience_pipeline/{{operator}}/{{metric}}/{_STATS}", "rl_experience_pipeline_metric",
          "A metric of an experience-pipeline operator (e.g. group_advantages/reward_mean), reduced over the step.",
          _S),
    gauge(f"sample/model_version/{MIN_MAX_MEAN}", "rl_sample_model_version",
          "Model version of the experiences sampled for training.", _S),
    gauge("sample/task_count", "rl_sample_tasks", "Number of tasks in the sampled batch.", _S, unit="{task}"),
)

# veRL's trainer metrics, which Trinity-RFT's trainer reports (actor/, critic/, perf/, response_length/, ...).
_V = "verl"
VERL_SPECS = (
    gauge("actor/entropy", "rl_actor_entropy", "Entropy of the policy over the batch's response tokens.", _V),
    gauge("actor/pg_clipfrac", "rl_actor_pg_clip_ratio", "Fraction of tokens whose policy-gradient term was clipped.",
          _V),
    gauge("actor/pg_clipfrac_lower", "rl_actor_pg_clip_lower_ratio",
          "Fraction of tokens clipped by the dual-clip lower bound.", _V),
    gauge("actor/ppo_kl", "rl_actor_ppo_kl", "KL between the old and the current policy (k1).", _V),
    gauge("actor/grad_norm", "rl_actor_grad_norm", "Gradient norm of the actor before clipping.", _V),
    gauge("critic/vf_loss", "rl_critic_vf_loss", "Value-function loss.", _V),
    gauge("critic/vf_clipfrac", "rl_critic_vf_clip_ratio", "Fraction of value predictions that were clipped.", _V),
    gauge("critic/vpred_mean", "rl_critic_vpred_mean", "Mean value prediction of the critic being optimized.", _V),
    gauge("critic/grad_norm", "rl_critic_grad_norm", "Gradient norm of the critic before clipping.", _V),
    gauge("critic/vf_explained_var", "rl_critic_vf_explained_variance",
          "Explained variance of the returns by the value function.", _V),
    gauge(f"response_length/{MIN_MAX_MEAN}", "rl_response_length", "Response length in tokens.", _V,
          unit="{token}"),
    gauge("response_length/clip_ratio", "rl_response_length_clip_ratio",
          "Fraction of responses cut at the maximum response length.", _V),
    gauge(f"prompt_length/{MIN_MAX_MEAN}", "rl_prompt_length", "Prompt length in tokens.", _V, unit="{token}"),
    gauge("prompt_length/clip_ratio", "rl_prompt_length_clip_ratio",
          "Fraction of prompts cut at the maximum prompt length.", _V),
    gauge("global_seqlen/{stat:mean|max|min|balanced_max|balanced_min|minmax_diff}", "rl_global_seqlen",
          "Sequence length per data-parallel rank (balanced_*: after sequence balancing).", _V, unit="{token}"),
    gauge("perf/throughput", "rl_perf_throughput_tokens_per_second", "Tokens per second per GPU.", _V,
          unit="{token}/s"),
    gauge("perf/time_per_step", "rl_perf_step_duration_seconds", "Wall time of one training step.", _V, unit="s"),
    gauge("perf/total_num_tokens", "rl_perf_step_tokens", "Tokens processed in the step.", _V, unit="{token}"),
    gauge("perf/max_memory_allocated_gb", "rl_perf_max_memory_allocated_bytes",
          "Peak GPU memory allocated in the step.", _V, unit="By", scale=GIB, tracker_unit="GiBy"),
    gauge("perf/max_memory_reserved_gb", "rl_perf_max_memory_reserved_bytes",
          "Peak GPU memory reserved in the step.", _V, unit="By", scale=GIB, tracker_unit="GiBy"),
    gauge("perf/cpu_memory_used_gb", "rl_perf_cpu_memory_used_bytes", "CPU memory used by the process.", _V,
          unit="By", scale=GIB, tracker_unit="GiBy"),
    gauge("perf/mfu/{cluster}", "rl_perf_mfu_ratio", "Model FLOPs utilization of a cluster (actor, critic, ...).",
          _V),
)
