"""Trinity-RFT's own metrics, as trinity-rft 0.6.0's code emits them (explorer, experience pipeline, trainer); the
veRL trainer keys its trainer reuses (actor/pg_loss, critic/score/mean, perf/..., ...) are veRL's, in verl.py.

Trinity aggregates a workflow's ``Experience.metrics`` run -> task -> step (``trinity/utils/metrics.py``): a plain
key ``x`` becomes ``rollout/x/mean|max|min`` over the step's tasks; a key with a reducer suffix ``x:sum``, ``x:max``,
``x:min`` or ``x:last`` is reduced by it at every level and becomes ``rollout/x/sum`` (``/max``, ``/min``,
``/last``). Evaluation gives ``eval/{taskset}/x/{mean,std,best,worst}@k`` (``bench/`` in bench mode), with
``detailed_stats`` a further ``/mean|max|min|std`` over the taskset's tasks. Keys that Prometheus names cannot hold
(``@``, ``<``, ``>``, ``:``, user-chosen taskset and metric names) are templates: the free parts become labels.
"""

from __future__ import annotations

from rl_otel.catalog.define import MIN_MAX_MEAN, counter, gauge

_S = "trinity"
_AT_K = "{stat:mean|std|best|worst}@{k:[0-9]+}"
_ACROSS = "{across:mean|std|max|min}"
# A user-chosen taskset name: everything after the first '/' of the batch id "{step}/{name}", so it may hold '/'.
_TASKSET = "{taskset:.+}"
_EXEC_TIMERS = "{operation:run_execution|task_execution}"


def _eval_family(prefix: str) -> tuple:
    """The keys of one evaluation (``eval``) or benchmark (``bench``) taskset, most specific first."""
    what = "evaluation" if prefix == "eval" else "benchmark (mode=bench)"
    return (
        gauge(f"{prefix}/{_TASKSET}/finished_task_count", f"rl_{prefix}_finished_tasks",
              f"Number of the {what} taskset's tasks that completed in the step.", _S, unit="{task}"),
        gauge(f"{prefix}/{_TASKSET}/time/{_EXEC_TIMERS}", f"rl_{prefix}_duration_seconds",
              f"Wall seconds of a workflow run (run_execution) or of a runner's (sub-)task with retries "
              f"(task_execution) on a {what} taskset: per task the mean over its runs, then the mean over the "
              "taskset's tasks (no @k).", _S, unit="s"),
        gauge(f"{prefix}/{_TASKSET}/time/{_EXEC_TIMERS}/{_ACROSS}", f"rl_{prefix}_duration_across_tasks_seconds",
              f"monitor.detailed_stats of a {what} timer: mean, std (ddof=0), max or min across the taskset's "
              "tasks of each task's mean run_execution/task_execution seconds.", _S, unit="s"),
        gauge(f"{prefix}/{_TASKSET}/{{metric}}/{_AT_K}", f"rl_{prefix}_metric",
              f"A workflow metric on a {what} taskset: per task mean@k / std@k (np.std, ddof=0) over its k runs, "
              "best@k / worst@k the bootstrap mean of the max / min of k runs drawn with replacement (1000 draws, "
              "seed 42); then the mean over the taskset's tasks.", _S),
        gauge(f"{prefix}/{_TASKSET}/{{metric}}/{_AT_K}/{_ACROSS}", f"rl_{prefix}_metric_across_tasks",
              f"monitor.detailed_stats of a {what} metric: mean, std (ddof=0), max or min across the taskset's "
              "tasks of the per-task statistic @k.", _S),
        # `x:sum` (`:max`, `:min`, `:last`) metrics: reduced over experiences, runs and tasks, no @k. The lookahead
        # keeps the detailed-stats timers (`.../time/run_execution/max`) out; '@' keeps `mean@4/max` out.
        gauge(f"{prefix}/{_TASKSET}/{{metric:(?!(?:run|task)_execution/)[^/@]+}}/{{stat:sum|max|min|last}}",
              f"rl_{prefix}_reduced_metric",
              f"A workflow metric logged with a reducer suffix (x:sum, x:max, x:min, x:last) on a {what} taskset: "
              "reduced by it over each run's experiences, the task's runs and the taskset's tasks (no @k).", _S),
    )


SPECS = (
    # Explorer, train mode (trinity/explorer/explorer.py, rollout_coordinator.py)
    gauge("rollout/model_version", "rl_rollout_model_version",
          "Weight version the explorer's rollout models hold (trainer step of the last synced weights; -1 before "
          "the first sync), logged with every explore step.", _S, unit="{step}"),
    gauge("rollout/finished_task_count", "rl_rollout_finished_tasks",
          "Number of the explore step's tasks that completed (fewer than batch_size with over_rollout).", _S,
          unit="{task}"),
    gauge("explorer/time/wait_explore_step", "rl_explorer_wait_explore_step_seconds",
          "Seconds the explorer waited in finalize_train_batch for the explore step's tasks and experience "
          "pipeline (the documented time/wait_explore_step).", _S, unit="s"),
    gauge("explore/time/sync_interval", "rl_explore_sync_interval_seconds",
          "Seconds from the first explore step after the last weight sync to the end of the finished steps, logged "
          "at the last finished step (prefix explore/, not explorer/).", _S, unit="s"),
    gauge("rollout/time/{operation}/{stat:mean|max|min|std|sum|last}", "rl_rollout_duration_seconds",
          "A workflow timer of the explore step (run_execution: wall seconds of one workflow run; task_execution: "
          "of a runner's (sub-)task with retries): per task the mean over its runs, then mean/max/min over the "
          "step's tasks (std, sum, last as for rl_rollout_metric).", _S, unit="s"),
    # The generic family: one key segment per metric name, so rollout/time/... (seconds, above) and the serve-mode
    # rollout/model_{i}/... keys never reach it.
    gauge("rollout/{metric}/{stat:mean|max|min|std|sum|last}", "rl_rollout_metric",
          "A workflow metric of the explore step: a plain metric is averaged over each run's experiences and the "
          "task's runs, then stat mean/max/min over the step's tasks (Trinity emits no std; only "
          "rl_otel.stats.rollout_step_metrics(stats=...) adds it); a metric logged as x:sum/x:max/x:min/x:last "
          "is reduced by that at every level (stat sum: the step's grand total; last: the last finished task).",
          _S),
    *_eval_family("eval"),
    *_eval_family("bench"),
    # Serve mode (trinity/explorer/proxy/service.py)
    counter("rollout/model_{model:[0-9]+}/total_request_count", "rl_rollout_engine_requests",
            "Requests the serve-mode proxy routed to rollout engine {model} since the service started.", _S,
            unit="{request}"),
    gauge("rollout/model_{model:[0-9]+}/model_version", "rl_rollout_engine_model_version",
          "Weight version of serve-mode rollout engine {model}.", _S, unit="{step}"),
    counter("rollout/total_experience_count", "rl_rollout_served_experiences",
            "Experiences recorded from served completions since the serve-mode service started.", _S,
            unit="{experience}"),
    counter("rollout/ready_experience_count", "rl_rollout_ready_experiences",
            "Served experiences that received feedback (reward) and were marked ready since the service started.",
            _S, unit="{experience}"),
    # Experience pipeline (trinity/buffer/pipelines/experience_pipeline.py), logged by the explorer's monitor
    gauge("time/experience_pipeline/{operator}", "rl_experience_pipeline_legacy_duration_seconds",
          "Time an experience-pipeline operator took in the step, under the key layout of Trinity-RFT's Monitor "
          "Metrics Reference; trinity-rft 0.6.0's code no longer emits it (see rl_experience_pipeline_duration_"
          "seconds).", _S, unit="s"),
    gauge("experience_pipeline/experience_pipeline/time/operator/{operator}",
          "rl_experience_pipeline_duration_seconds",
          "Seconds an experience-pipeline operator took in the step; operator is '{index}_{class name}', the class "
          "being ExperienceOperatorV1Wrapper for every built-in operator (the doubled prefix is Trinity's).", _S,
          unit="s"),
    gauge("experience_pipeline/experience_pipeline/time/write", "rl_experience_pipeline_write_duration_seconds",
          "Seconds the experience pipeline spent writing the step's processed experiences to the trainer's buffer.",
          _S, unit="s"),
    gauge("experience_pipeline/experience_pipeline/time/total", "rl_experience_pipeline_call_duration_seconds",
          "Seconds of the whole experience-pipeline call of the step (input save, operators and write).", _S,
          unit="s"),
    gauge("experience_pipeline/experience_count", "rl_experience_pipeline_experiences",
          "Number of experiences the experience pipeline wrote to the trainer's buffer in the step (after all "
          "operators).", _S, unit="{experience}"),
    gauge("experience_pipeline/{operator:(?!experience_pipeline/)[^/]+}/{metric}/{stat:mean|max|min}",
          "rl_experience_pipeline_metric",
          "A per-task-group metric of an experience-pipeline operator (group_advantages/reward_mean, "
          "gigpo/episode_reward_std, origin_group_advantages/reward_std, ...): mean, max or min over the step's "
          "groups.", _S),
    gauge("experience_pipeline/filtered_count", "rl_experience_pipeline_filtered_experiences",
          "Experiences removed in the step by the operator that wrote this key last (GRPO std_threshold, step-wise "
          "GRPO, reward_filter, dapo_dynamic_sampling, invalid_reward_filter).", _S, unit="{experience}"),
    gauge("experience_pipeline/skipped_group_ratio", "rl_experience_pipeline_skipped_group_ratio",
          "Fraction of the step's task groups that step-wise GRPO skipped for a reward std under std_threshold.",
          _S),
    gauge("experience_pipeline/gigpo/anchor_groups_total", "rl_experience_pipeline_gigpo_anchor_groups",
          "GiGPO: number of anchor-state groups (distinct env_state_hash) in the step.", _S, unit="{group}"),
    gauge("experience_pipeline/gigpo/anchor_groups_size_gt1", "rl_experience_pipeline_gigpo_shared_anchor_groups",
          "GiGPO: number of the step's anchor-state groups with more than one member.", _S, unit="{group}"),
    gauge("experience_pipeline/gigpo/anchor_group_hit_ratio", "rl_experience_pipeline_gigpo_anchor_group_hit_ratio",
          "GiGPO: fraction of the step's anchor-state groups with more than one member (0 when there are none).",
          _S),
    gauge("experience_pipeline/gigpo/mean_abs_A_E", "rl_experience_pipeline_gigpo_episode_advantage_abs_mean",
          "GiGPO: mean absolute episode-level advantage over the step's experiences.", _S),
    gauge("experience_pipeline/gigpo/mean_abs_A_S", "rl_experience_pipeline_gigpo_step_advantage_abs_mean",
          "GiGPO: mean absolute step-level (anchor-state) advantage over the step's experiences.", _S),
    gauge("experience_pipeline/operator_filtered_count", "rl_experience_pipeline_std_filtered_experiences",
          "reward_std_filter: experiences dropped in the step because their task group's reward std was at or "
          "under the threshold.", _S, unit="{experience}"),
    gauge("experience_pipeline/dropped_all_{kind:correct|wrong}", "rl_experience_pipeline_dropped_groups",
          "dapo_dynamic_sampling: task groups dropped in the step because every rollout was correct (kind=correct) "
          "or every rollout was wrong (kind=wrong).", _S, unit="{group}"),
    gauge("experience_pipeline/masked_truncated_count", "rl_experience_pipeline_masked_truncated_experiences",
          "mask_response_truncated: experiences of the step whose action mask was zeroed for a truncated response.",
          _S, unit="{experience}"),
    gauge(f"experience_pipeline/reward_diff/{MIN_MAX_MEAN}", "rl_experience_pipeline_reward_diff",
          "reward_shaping_mapper: shaped minus original reward, mean/max/min over the step's experiences (0 when "
          "there are none).", _S),
    gauge("experience_pipeline/selection/{kind}_ratio", "rl_experience_pipeline_selection_ratio",
          "pass_rate_calculator: fraction of the step's tasks whose pass rate (mean reward over the task's "
          "experiences) meets kind: valid (0 < p < 1), strict_valid (1/16 < p < 15/16), <1, >0, <15_16, >1_16.",
          _S),
    # Trainer (trinity/trainer/trainer.py, algorithm/sample_strategy); time/* durations are ROLL's time/{operation}
    gauge(f"sample/model_version/{MIN_MAX_MEAN}", "rl_sample_model_version",
          "Weight version that generated each experience of the sampled training batch: mean, max or min over the "
          "batch's experiences.", _S, unit="{step}"),
    gauge(f"sample/model_version_drift/{MIN_MAX_MEAN}", "rl_sample_model_version_drift",
          "Weight-version change during each experience's rollout: mean, max or min over the sampled batch's "
          "experiences.", _S, unit="{step}"),
    gauge("sample/task_count", "rl_sample_tasks", "Number of distinct tasks in the step's sampled training batch.",
          _S, unit="{task}"),
    # Advantage fns run in the trainer (trinity/trainer/verl/trainer.py: prefix_metrics(..., "advantage"))
    gauge("advantage/kl", "rl_advantage_kl",
          "In-reward KL penalty of the step: mean over sequences of the token-mean KL(old || ref), for algorithms "
          "computing advantages in the trainer with kl_penalty_fn != none (veRL's actor/reward_kl_penalty).", _S),
    gauge("advantage/kl_coef", "rl_advantage_kl_coef",
          "KL penalty coefficient used for the step's in-reward KL (adaptive controllers update it afterwards).",
          _S),
    gauge("advantage/frac_clipped", "rl_advantage_clipped_ratio",
          "clipb/clipv advantage fns: fraction of the batch's response tokens masked out by the clip.", _S),
    gauge("advantage/frac_clipped_pos", "rl_advantage_clipped_positive_ratio",
          "clipb/clipv advantage fns: fraction of the batch's positive-advantage tokens masked out by the clip.",
          _S),
    gauge("advantage/frac_clipped_neg", "rl_advantage_clipped_negative_ratio",
          "clipb/clipv advantage fns: fraction of the batch's negative-advantage tokens masked out by the clip.",
          _S),
    gauge("advantage/ES", "rl_advantage_clipb_statistic_mean",
          "clipb advantage fn: masked mean over the batch's response tokens of the clip statistic S, E[S].", _S),
    gauge("advantage/varS", "rl_advantage_clipb_statistic_variance",
          "clipb advantage fn: masked population variance over the batch's response tokens of the clip statistic "
          "S.", _S),
    gauge("advantage/stdD", "rl_advantage_clipv_statistic_std",
          "clipv advantage fn: masked population std over the batch's response tokens of the clip statistic D.",
          _S),
    gauge("advantage/jsd/{stat:mean|std}", "rl_advantage_jsd",
          "jsd advantage fn: per-sequence summed token JSD(student, teacher), mean or std (unbiased; 0 for one "
          "sequence) over the batch's sequences.", _S),
    gauge("advantage/kl/{stat:mean|std}", "rl_advantage_distill_kl",
          "on_policy_distill advantage fn: per-sequence summed (student - teacher) log-prob, mean or std "
          "(unbiased; 0 for one sequence) over the batch's sequences.", _S),
    gauge("advantage/advantages/{stat:mean}", "rl_advantage_sequence_advantage",
          "jsd / on_policy_distill advantage fns: per-sequence summed token advantage, mean over the batch's "
          "sequences.", _S),
    # Trinity's policy-loss fns (trinity/algorithm/policy_loss_fn) through the veRL engine as actor/<key>: per
    # micro-batch, reduced by verl.utils.metric.reduce_metrics (mean unless the key holds 'max' or 'min')
    gauge("actor/final_loss", "rl_actor_final_loss",
          "Combined unscaled loss of a micro-batch (policy loss - entropy term + KL term), mean over micro-batches.",
          _S),
    gauge("actor/seq_mask/masked_tokens", "rl_actor_seq_mask_masked_tokens_ratio",
          "PPO with sequence masking: fraction of response tokens masked (negative advantage in a sequence whose "
          "KL exceeds delta_sequence_masking), mean over micro-batches.", _S),
    gauge("actor/seq_mask/mean_sequence_kl", "rl_actor_seq_mask_mean_sequence_kl",
          "PPO with sequence masking: mean sequence-level KL the masking compares to its threshold, mean over "
          "micro-batches.", _S),
    gauge("actor/ppo_kl_seq", "rl_actor_ppo_kl_seq",
          "GSPO: sequence-level approximate KL between the current and the old policy, mean over micro-batches.",
          _S),
    gauge("actor/cispo_loss", "rl_actor_cispo_loss", "CISPO policy loss, mean over micro-batches.", _S),
    gauge("actor/unmasked_frac", "rl_actor_unmasked_ratio",
          "CISPO: fraction of response tokens not masked by the mask clip, mean over micro-batches.", _S),
    gauge("actor/dpo_loss", "rl_actor_dpo_loss", "DPO loss, mean over micro-batches.", _S),
    gauge("actor/chosen_reward", "rl_actor_chosen_reward",
          "DPO: beta times the mean (policy - reference) log-ratio of the chosen responses, mean over "
          "micro-batches.", _S),
    gauge("actor/rejected_reward", "rl_actor_rejected_reward",
          "DPO: beta times the mean (policy - reference) log-ratio of the rejected responses, mean over "
          "micro-batches.", _S),
    gauge("actor/accuracy_mean", "rl_actor_preference_accuracy_ratio",
          "DPO: fraction of pairs whose chosen log-ratio exceeds the rejected one, mean over micro-batches.", _S),
    gauge("actor/ratio/mean", "rl_actor_ratio_mean",
          "importance_sampling policy loss: mean importance ratio exp(logp - logp_old) over the response tokens, "
          "mean over micro-batches.", _S),
    gauge("actor/approx_kl", "rl_actor_importance_sampling_approx_kl",
          "importance_sampling policy loss: mean of -(logp - logp_old) over the response tokens (k1 KL of the old "
          "against the current policy), mean over micro-batches.", _S),
    gauge("actor/opmd_loss", "rl_actor_opmd_loss", "OPMD policy loss, mean over micro-batches.", _S),
    gauge("actor/sapo_loss", "rl_actor_sapo_loss", "SAPO policy loss, mean over micro-batches.", _S),
    gauge("actor/avg_soft_gate", "rl_actor_avg_soft_gate",
          "SAPO: mean soft-gate value over the response tokens, mean over micro-batches.", _S),
    gauge("actor/avg_ratio", "rl_actor_avg_ratio",
          "SAPO / TOPR: mean importance ratio over the response tokens, mean over micro-batches.", _S),
    gauge("actor/pos_adv_frac", "rl_actor_positive_advantage_ratio",
          "SAPO: fraction of response tokens with a positive advantage, mean over micro-batches.", _S),
    gauge("actor/sft_is_loss", "rl_actor_sft_is_loss",
          "CHORD: importance-weighted SFT loss, mean over micro-batches.", _S),
    gauge("actor/sft_phi_loss", "rl_actor_sft_phi_loss",
          "CHORD: SFT loss with the phi token weighting, mean over micro-batches.", _S),
    gauge("actor/topr_loss", "rl_actor_topr_loss", "TOPR policy loss, mean over micro-batches.", _S),
    gauge("actor/avg_alpha", "rl_actor_avg_alpha",
          "TOPR: mean alpha weight over the response tokens, mean over micro-batches.", _S),
    gauge("actor/usual/pg_loss", "rl_actor_usual_pg_loss",
          "Mixed policy loss: PPO policy-gradient loss on the non-expert (usual) experiences, weighted by their "
          "micro-batch share.", _S),
    gauge("actor/usual/pg_clipfrac", "rl_actor_usual_pg_clip_ratio",
          "Mixed policy loss: fraction of the non-expert (usual) tokens whose ratio was clipped, weighted by their "
          "micro-batch share.", _S),
    gauge("actor/usual/pg_clipfrac_lower", "rl_actor_usual_pg_clip_lower_ratio",
          "Mixed policy loss: fraction of the non-expert (usual) tokens clipped by the dual-clip bound, weighted by "
          "their micro-batch share.", _S),
    gauge("actor/usual/ppo_kl", "rl_actor_usual_ppo_kl",
          "Mixed policy loss: approximate KL between the current and the old policy on the non-expert (usual) "
          "experiences, weighted by their micro-batch share.", _S),
    gauge("actor/expert/sft_loss", "rl_actor_expert_sft_loss",
          "Mixed policy loss: SFT loss on the expert experiences, weighted by their micro-batch share.", _S),
    gauge("actor/expert/sft_phi_loss", "rl_actor_expert_sft_phi_loss",
          "CHORD: phi-weighted SFT loss on the expert experiences, weighted by their micro-batch share.", _S),
    gauge("actor/mu", "rl_actor_chord_mu", "CHORD: current SFT weight mu from the mu schedule.", _S),
    # Tinker trainer: the Tinker service's own metrics, merged raw with a literal reducer suffix
    gauge("{kind:loss|surrogate_loss}:{stat:sum}", "rl_tinker_loss",
          "Tinker trainer: the batch's sum of Trinity's custom loss (kind=loss) or of the service-side linear "
          "surrogate loss used to back-propagate it (kind=surrogate_loss), as forward_backward_custom returns it.",
          _S),
)
