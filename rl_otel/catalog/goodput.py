"""Goodput buckets: where a process's wall time goes, and which logged durations may be added up to say so.

Every framework times parts of its training step and logs them (veRL ``timing_s/*``, OpenRLHF
``train/timing/*``, NeMo-RL ``timing/train/*``, prime-rl ``time/*``, SkyRL ``timing/*``, slime ``perf/*_time``,
AReaL ``timeperf/*``, Trinity-RFT and ROLL ``time/*``, TRL ``perf/*_s``), and rl_otel times phases itself
(``tel.phase()``, ROLL's ``state_offload_manger``). Those timers nest (veRL's ``step`` contains ``gen``, NeMo-RL's
``policy_training`` contains ``policy_training/sharding_data``), run concurrently (ROLL's critic checkpoints while
the actor does) or are statistics of per-sample times (veRL's ``agent_loop/generate_sequences/max``): adding all of
them counts time twice. This module says, for every duration entry of the catalog, the one bucket its time goes to
when it is a *leaf* (no other counted timer contains it or runs beside it), and ``None`` when it is not.

The decisions are data (:data:`FAMILIES`, one per catalog entry, by the entry's name and label values); the
containment facts they were read from are data too (:mod:`rl_otel.catalog.goodput_nesting`, with the framework
file and function of each), and the tests check the one against the other. Imports nothing outside the catalog.

The runtime (goodput series, rules, dashboards) uses :func:`bucket_of` for logged keys, :func:`phase_bucket` for
phases and :func:`is_step_duration` / :func:`step_key_of` for the wall time a step's buckets divide; the time of a
step no leaf covers is ``waiting`` unless the step key says otherwise (:attr:`Decision.rest`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rl_otel.catalog.spec import MetricSpec

__all__ = ["BUCKETS", "FAMILIES", "PHASES", "UNDECIDED", "Decision", "Family", "bucket_of", "decision_of",
           "is_step_duration", "phase_bucket", "step_key_of"]

# The buckets, in the order dashboards stack them. ``waiting`` is time in no measured work (buffer starvation, a
# trainer blocked on rollouts, idle between phases): what a step's leaves leave over is waiting too.
BUCKETS: tuple[str, ...] = ("startup", "generation", "training", "inference", "weight_sync", "offload",
                            "validation", "checkpointing", "other", "waiting")

TRAINER = "trainer"  # the process that runs the training loop and logs the step (ROLL's pipeline driver too)


@dataclass(frozen=True)
class Decision:
    """What one logged duration is for the goodput accounting.

    ``bucket`` is where its time goes; ``None`` when it is no leaf (``why`` says what contains it or what it
    is). ``process`` is whose wall time it divides (``trainer`` unless a framework's other process measured it:
    slime's rollout manager, Trinity-RFT's explorer, prime-rl's orchestrator). ``step`` marks the key that measures
    the wall time of a whole step of that process; its ``rest`` is the bucket of the step time its leaves leave
    over.
    """

    bucket: str | None
    why: str = ""
    process: str = TRAINER
    step: bool = False
    rest: str = "waiting"


@dataclass(frozen=True)
class Family:
    """The decisions for one catalog entry (``name``: its OTel name, unique across every framework's catalog).

    ``by`` names the labels whose values pick a decision (none: ``default`` holds for the whole entry); a value
    tuple not in ``decisions`` gets ``default``. ``phases``: the entry is rl_otel's phase histogram, decided by
    :func:`phase_bucket` from its ``phase`` and ``part`` labels. ``source`` is where the facts were read.
    """

    name: str
    source: str
    default: Decision
    by: tuple[str, ...] = ()
    decisions: Mapping[tuple[str, ...], Decision] = field(default_factory=lambda: MappingProxyType({}))
    phases: bool = False


def _leaf(bucket: str, process: str = TRAINER) -> Decision:
    return Decision(bucket, process=process)


def _inner(why: str, process: str = TRAINER) -> Decision:
    return Decision(None, why, process=process)


def _step(why: str, process: str = TRAINER, rest: str = "waiting") -> Decision:
    return Decision(None, why, process=process, step=True, rest=rest)


def _family(name: str, source: str, default: Decision, by: tuple[str, ...] = (),
            decisions: Mapping[str | tuple[str, ...], Decision] | None = None, phases: bool = False) -> Family:
    table = {(k,) if isinstance(k, str) else k: v for k, v in (decisions or {}).items()}
    return Family(name, source, default, by, MappingProxyType(table), phases)


_PER_SAMPLE = "a statistic (min/max/mean/percentile) of per-sample or per-request times, not a sum of wall time"
_DERIVED = "computed from other timers (per token, a ratio, an alias or an estimate), no timer of its own"
# the decision for a label value no table names (a timer a framework added since its code was read): not counted
UNDECIDED = Decision(None, "a value no decision names: not counted until the framework's code is read for it")

# ---------------------------------------------------------------------------------------------------------------
# ROLL (alibaba/ROLL @ 8eb27cc2): the pipeline driver's Timer blocks (roll/pipeline/*/*_pipeline.py) contain the
# workers' state_offload_manger phases (time/{cluster}/{phase}/*, roll/utils/context_managers.py), so the driver's
# time/step_* timers are the leaves. Trinity-RFT 0.6.0 logs its trainer's timers under the same time/{operation}.
_ROLL = "roll/pipeline/{rlvr/rlvr,agentic/agentic,dpo/dpo,sft/sft,distill/distill}_pipeline.py:*Pipeline.run"
_TRINITY = ("trinity/trainer/trainer.py:Trainer.train, trinity/trainer/verl/trainer.py:VERLTrainer.train_step, "
            "trinity/explorer/explorer.py (trinity-rft 0.6.0)")
_EXPLORER = "explorer"
# veRL's trainer's parts of a step, which Trinity-RFT's trainer logs too (its VERLTrainer.train_step is veRL's)
_VERL_TRAIN_PARTS: dict[str | tuple[str, ...], Decision] = {
    "old_log_prob": _leaf("inference"),
    "ref": _leaf("inference"),
    "values": _leaf("inference"),
    "adv": _leaf("other"),
    "update_critic": _leaf("training"),
    "update_actor": _leaf("training"),
}

_ROLL_FAMILIES = (
    _family("rl_operation_duration_seconds", f"{_ROLL}; {_TRINITY}", UNDECIDED, ("operation",), {
        # ROLL's drivers: RLVR (and its VLM variant), agentic, DPO, SFT, distill
        "step_total": _step("RLVR/VLM log the previous step's total at the start of the next (0 at the first); "
                            "agentic and DPO the current step's"),
        "step_stop_server": _leaf("offload"),  # pause sampling, offload actor_infer's other params (async)
        "step_model_update": _leaf("weight_sync"),
        "val_step": _leaf("validation"),
        "step_generate": _leaf("generation"),  # the generate schedulers' get_batch, rewards included
        "ref_log_probs_values": _leaf("inference"),
        "old_log_probs": _leaf("inference"),  # old log-probs and critic values, concurrently
        "step_train": _leaf("training"),  # actor train_step with the critic's concurrently
        "get_sample_level_mask": _leaf("other"),
        "get_batch_cost_train": _inner("the scheduler-return-to-driver latency of a batch, inside "
                                       "time/step_rollout (agentic_pipeline.py)"),
        "step_rollout": _leaf("generation"),
        "step_shrink": _leaf("offload"),  # offloads actor_infer from the training GPUs (partial-GPU mode)
        "step_ref_log_probs_values_reward": _leaf("inference"),
        "step_old_log_probs_values": _leaf("inference"),
        "step_cal_response_level_mask": _leaf("other"),
        "step_cal_norm_rewards": _leaf("other"),
        "step_cal_token_reward": _leaf("other"),
        "step_adv": _leaf("other"),
        "step_compute_data_metrics": _leaf("other"),
        "step_log": _leaf("other"),
        "step_val": _inner("agentic validation runs in a thread concurrently with time/step_rollout "
                           "(agentic_pipeline.py: executor.submit(self.val))"),
        "get_batch_cost_val": _inner("inside time/step_val"),
        "get_batch_cost_gqm": _inner("the group-queue wait inside a scheduler's get_batch, within "
                                     "time/step_rollout (rollout_scheduler.py:_get_batch_impl)"),
        "val": _leaf("validation"),  # SFT, distill
        "cal_ref_log_probs": _leaf("inference"),  # DPO
        "actor_train": _leaf("training"),  # DPO
        "cal_log_probs": _inner("DPO validation's log-prob pass, inside time/val_step (dpo_pipeline.py:val)"),
        # Trinity-RFT's trainer: verl's timing_raw renamed timing_s/ -> time/ (VERLTrainer.train_step)
        "step": _inner("Trinity-RFT: veRL's step timer inside time/train_step; the trainer's loop has no timer "
                       "of its own (trainer.py:Trainer.train)"),
        "train_step": _inner("Trinity-RFT: contains time/step and its parts (trainer.py:Trainer.train_step)"),
        **_VERL_TRAIN_PARTS,
        "read_experience": _leaf("waiting"),  # the trainer blocked on the explorer's experiences
        "sync_weight": _leaf("weight_sync"),
        "trainer_sync_interval": _inner("the interval between two weight syncs, spanning steps"),
        "save_checkpoint": _leaf("checkpointing"),
        "dj_process_experience": _inner("Data-Juicer processing inside an experience-pipeline operator, another "
                                        "process (trinity/service/data_juicer/client.py)"),
        "eval": _inner("the explorer's evaluation, measured from its start, runs concurrently with the explore "
                       "steps it spans (explorer.py:_finish_eval_step)", _EXPLORER),
        "bench": _leaf("validation", _EXPLORER),  # benchmark mode: evaluation only
    }),
    _family("rl_phase_last_duration_seconds", "roll/utils/context_managers.py:state_offload_manger; "
            "roll/pipeline/base_worker.py:*Worker.do_checkpoint; roll/pipeline/base_pipeline.py:do_checkpoint",
            _inner("a worker phase inside the driver's time/step_* timers (and total = onload + execute + "
                   "offload; reload_nccl/offload_nccl inside onload/offload; do_checkpoint's load, offload, "
                   "dcp_save, hf_save inside its total)"), ("cluster", "phase", "part"), {
        # do_checkpoint runs in the driver's step outside every time/step_* timer: the trained cluster's is a leaf
        ("actor_train", "do_checkpoint", "total"): _leaf("checkpointing"),
        ("sft_train", "do_checkpoint", "total"): _leaf("checkpointing"),
        ("student", "do_checkpoint", "total"): _leaf("checkpointing"),
        ("critic", "do_checkpoint", "total"): _inner("checkpoints concurrently with actor_train "
                                                     "(base_pipeline.py:do_checkpoint, blocking=False)"),
    }),
    _family("rl_domain_operation_duration_seconds", "roll/pipeline/rlvr/rlvr_pipeline.py:RLVRPipeline.run "
            "(per-domain loop, one domain after another)", _leaf("other")),
    _family("rl_distill_operation_duration_seconds", "roll/pipeline/distill/distill_pipeline.py:DistillPipeline.run",
            UNDECIDED, ("operation",), {
                "teacher_forward": _leaf("inference"),
                "student_train_step": _leaf("training"),
                "step_train": _inner("contains train/teacher_forward, the logits transfer and "
                                     "train/student_train_step"),
            }),
    _family("rl_logits_transfer_duration_seconds", "roll/pipeline/distill/logits_transfer_group.py:"
            "LogitsTransferGroup.logits_transfer (one tensor after another)", UNDECIDED, ("operation",), {
                "logits_transfer_total": _leaf("other"),
                "teacher2student": _inner("inside logits_transfer_total_time"),
                "student_internal_broadcast": _inner("inside logits_transfer_total_time"),
            }),
    _family("rl_partial_gpu_rebalance_duration_seconds", "roll/distributed/scheduler/router.py:PartialGPUManager; "
            "roll/pipeline/agentic/agentic_pipeline.py:AgenticPipeline.run", UNDECIDED, ("operation",), {
                "expand": _leaf("offload"),  # PHASE 5, outside every time/step_* timer
                "shrink": _inner("inside time/step_shrink"),
            }),
    _family("rl_system_timer_mean_duration_seconds", "roll/utils/metrics/metrics_manager.py:add_system_metrics",
            _inner("a mean over a 5-step window of ROLL's throughput timers")),
    _family("rl_val_operation_duration_seconds", "roll/pipeline/agentic/agentic_pipeline.py:AgenticPipeline.val",
            _inner("a validation sub-timer inside time/step_val")),
    *(_family(name, "roll/pipeline/agentic/env_manager/*_env_manager.py", _inner(_PER_SAMPLE))
      for name in ("rl_env_duration_seconds", "rl_val_env_duration_seconds", "rl_val_tag_env_duration_seconds")),
    _family("rl_domain_scheduler_call_duration_seconds", "roll/distributed/scheduler/generate_scheduler.py:"
            "DynamicSamplingScheduler._get_batch_impl", _inner(_PER_SAMPLE)),
    _family("rl_domain_scheduler_reward_phase_duration_seconds", "roll/distributed/scheduler/generate_scheduler.py",
            _inner("per-call statistics of the reward clusters' phases, inside time/step_generate")),
)

# ---------------------------------------------------------------------------------------------------------------
# veRL 0.9.1: compute_timing_metrics logs timing_raw as timing_s/{name}; marked_timer accumulates.
_VERL = ("verl/trainer/ppo/ray_trainer.py:RayPPOTrainer.fit; verl/trainer/ppo/v1/trainer_base.py:PPOTrainer.fit, "
         "trainer_{sync,colocate_async,separate_async}.py (verl 0.9.1)")
_VERL_FAMILIES = (
    _family("rl_step_timing_seconds", _VERL, UNDECIDED, ("operation",), {
        "step": _step("excludes testing (and start/stop_profile; V1: dump_rollout_generations)"),
        "gen": _leaf("generation"),  # V1 async trainers: sampling the replay buffer, waiting for rollouts
        "reward": _leaf("inference"),  # the colocated reward model (rule-based scores come with gen)
        **_VERL_TRAIN_PARTS,
        "save_checkpoint": _leaf("checkpointing"),
        "update_weights": _leaf("weight_sync"),
        "testing": _leaf("validation"),
        "dump_rollout_generations": _leaf("other"),
        "start_profile": _leaf("other"),
        "stop_profile": _leaf("other"),
        "switch_wait": _leaf("generation"),  # the hybrid engine lent to generation until enough samples
        "switch_to_trainer": _leaf("offload"),  # rollout replicas removed, aborted, put to sleep
        "switch_to_rollout": _leaf("offload"),
    }),
    _family("rl_timing_per_token_seconds", "verl/trainer/ppo/metric_utils.py:compute_timing_metrics",
            _inner(_DERIVED)),
    _family("rl_agent_loop_timing_seconds", "verl/experimental/agent_loop/agent_loop.py:_performance_metrics",
            _inner(_PER_SAMPLE)),
    _family("rl_agent_loop_slowest_timing_seconds", "verl/experimental/agent_loop/agent_loop.py:"
            "_performance_metrics", _inner("the slowest sample's times, inside timing_s/gen")),
    _family("rl_perf_step_duration_seconds", "verl/trainer/ppo/metric_utils.py:compute_throughout_metrics",
            _inner("= timing_s/step (an alias, logged beside it)")),
    _family("rl_separate_async_per_sample_wait_seconds", "verl/trainer/ppo/v1/trainer_separate_async.py",
            _inner(_DERIVED)),
    _family("rl_separate_async_effective_switch_cost_seconds", "verl/trainer/ppo/v1/trainer_separate_async.py",
            _inner(_DERIVED)),
)

# ---------------------------------------------------------------------------------------------------------------
# TRL 1.16.0 and transformers 5.23.0
_ASYNC = "trl/experimental/async_grpo/async_grpo_trainer.py:AsyncGRPOTrainer._log_step_metrics/_sync_weight"
_WORKER = "trl/experimental/async_grpo/async_rollout_worker.py:AsyncRolloutWorker"
_TRL_FAMILIES = (
    _family("rl_async_step_seconds", _ASYNC, _step("end of the previous step to the end of this one: rollout "
                                                   "wait, forward/backward, optimizer and weight sync")),
    _family("rl_async_forward_backward_seconds", _ASYNC, _leaf("training")),
    _family("rl_async_forward_seconds", _ASYNC, _inner("the forward passes inside perf/fwd_bwd_s")),
    _family("rl_async_optimizer_seconds", _ASYNC, _leaf("training")),
    _family("rl_async_rollout_wait_seconds", _ASYNC, _leaf("waiting")),
    _family("rl_async_weight_sync_seconds", _ASYNC, _leaf("weight_sync")),
    _family("rl_async_weight_sync_part_seconds", _ASYNC, _inner("pause, barrier, transfer: parts of "
                                                                "perf/weight_sync_s")),
    _family("rl_async_sample_queue_time_seconds", _ASYNC, _inner(_PER_SAMPLE)),
    *(_family(name, _WORKER, _inner("the rollout worker's per-group or per-conversation time, concurrent with "
                                    "the trainer and with each other; a window mean"))
      for name in ("rl_async_rollout_score_seconds", "rl_async_rollout_score_wait_seconds",
                   "rl_async_rollout_score_block_seconds", "rl_async_rollout_backpressure_seconds",
                   "rl_async_rollout_duration_seconds", "rl_async_tools_latency_seconds",
                   "rl_async_tool_latency_seconds", "rl_teacher_score_seconds")),
    _family("rl_step_time_seconds", "trl/trainer/grpo_trainer.py:GRPOTrainer.training_step",
            _inner("training_step summed over gradient accumulation: generation, scoring and forward/backward in "
                   "one number (no optimizer step); no finer per-step timer exists in TRL's synchronous trainers")),
    _family("rl_profiling_duration_seconds", "trl/extras/profiling.py:ProfilingContext",
            _inner("one call's duration sent to the tracker per call; calls nest (_prepare_inputs contains "
                   "generate, the reward functions and sync_weights)")),
    _family("rl_train_runtime_seconds", "transformers/trainer.py:Trainer._finalize_training",
            _inner("the whole train() call, logged once at its end")),
    _family("rl_eval_runtime_seconds", "transformers/trainer.py:Trainer.evaluate", _leaf("validation")),
    _family("rl_eval_dataset_runtime_seconds", "transformers/trainer.py:Trainer.evaluate (one per eval dataset)",
            _leaf("validation")),
    *(_family(name, "transformers/trainer.py:Trainer.evaluation_loop", _inner("inside eval_runtime"))
      for name in ("rl_eval_model_preparation_time_seconds", "rl_eval_dataset_model_preparation_time_seconds")),
)

# ---------------------------------------------------------------------------------------------------------------
# Trinity-RFT 0.6.0 (its time/{operation} keys are decided with ROLL's above)
_PIPELINE = "experience_pipeline"
_TRINITY_FAMILIES = (
    _family("rl_explorer_wait_explore_step_seconds", "trinity/explorer/explorer.py:_finish_explore_step",
            _leaf("generation", _EXPLORER)),  # the explorer waits for the rollout coordinator's batch
    _family("rl_explore_sync_interval_seconds", "trinity/explorer/explorer.py:_finish_steps",
            _step("the explorer's wall time between two weight syncs (read task, one or more explore steps, "
                  "eval); logged at the last step of the interval", _EXPLORER)),
    _family("rl_rollout_duration_seconds", "trinity/explorer/workflow_runner.py, scheduler.py",
            _inner(_PER_SAMPLE, _EXPLORER)),
    *(_family(name, "trinity/utils/metrics.py:calculate_task_level_metrics", _inner(_PER_SAMPLE, _EXPLORER))
      for name in ("rl_eval_duration_seconds", "rl_eval_duration_across_tasks_seconds", "rl_bench_duration_seconds",
                   "rl_bench_duration_across_tasks_seconds")),
    _family("rl_experience_pipeline_call_duration_seconds", "trinity/buffer/pipelines/experience_pipeline.py:"
            "_process_experiences", _leaf("other", _PIPELINE)),  # one batch through the pipeline actor
    *(_family(name, "trinity/buffer/pipelines/experience_pipeline.py:_process_experiences",
              _inner("an operator's or the write's time, inside experience_pipeline/.../time/total", _PIPELINE))
      for name in ("rl_experience_pipeline_duration_seconds", "rl_experience_pipeline_write_duration_seconds",
                   "rl_experience_pipeline_legacy_duration_seconds")),
)

# ---------------------------------------------------------------------------------------------------------------
_OPENRLHF = ("openrlhf/trainer/ppo_trainer.py:BasePPOTrainer.train_step, PPOTrainer.fit; "
             "openrlhf/trainer/ppo_trainer_async.py:TrainingActor.fit (OpenRLHF @ 3c3be623)")
_SLIME = ("slime/backends/megatron_utils/actor.py, slime/observability/train_metric_utils.py:log_perf_data, "
          "slime/observability/timer.py (slime @ 624b824a)")
_AREAL = "areal/trainer/rl_trainer.py:PPOTrainer.train (AReaL @ 4aef98d8)"
_NEMO = ("nemo_rl/algorithms/grpo.py:grpo_train, async_grpo_train; sft.py, dpo.py, distillation.py; "
         "nemo_rl/models/policy/lm_policy.py (NeMo-RL @ 7ea279ab)")
_SKYRL = "skyrl/train/trainer.py:RayPPOTrainer.train; skyrl/train/fully_async_trainer.py (SkyRL @ a9564572)"
_PRIME = ("src/prime_rl/trainer/rl/train.py:train; src/prime_rl/orchestrator/orchestrator.py:"
          "Orchestrator.finalize_train_batch (prime-rl @ 559b4477)")
_ORCHESTRATOR, _ROLLOUT = "orchestrator", "rollout"

_SCOPED_FAMILIES = (
    _family("rl_openrlhf_timing_seconds", _OPENRLHF, UNDECIDED, ("operation",), {
        "generation": _leaf("generation"),  # async: measured by GenerateSamplesActor, beside the trainer
        "make_experience": _leaf("inference"),  # reward, reference, critic and old-policy forwards, advantages
        "ppo_train": _leaf("training"),
        "broadcast": _leaf("weight_sync"),
        "step_total": _step("synchronous: the sum of the other four timing/* keys (eval and checkpoints untimed); "
                            "async: wall time since the previous step, queue wait included, generation overlapping"),
    }),
    # slime: one Timer singleton per process, reset at log_perf_data; train_wait runs whenever train does not
    _family("rl_slime_perf_timer_seconds", _SLIME, UNDECIDED, ("operation",), {
        "train_wait": _inner("the time between two train blocks: contains update_weights, save_model, sleep, "
                             "wake_up, data_preprocess, ref_model_update and the wait for the rollout"),
        "train": _inner("contains log_probs, ref_log_probs, teacher_log_probs, actor_train"),
        "data_preprocess": _leaf("other"),
        "log_probs": _leaf("inference"),
        "ref_log_probs": _leaf("inference"),
        "teacher_log_probs": _leaf("inference"),
        "actor_train": _leaf("training"),
        "ref_model_update": _leaf("other"),  # copies the actor's weights into the CPU reference backup
        "update_weights": _leaf("weight_sync"),
        "save_model": _leaf("checkpointing"),
        "sleep": _leaf("offload"),
        "wake_up": _leaf("offload"),
    }),
    _family("rl_slime_perf_step_duration_seconds", _SLIME,
            _step("perf/train_wait_time + perf/train_time: the trainer's wall time since its previous train block")),
    _family("rl_slime_perf_rollout_duration_seconds", "slime/ray/rollout.py:RolloutManager.generate",
            _leaf("generation", _ROLLOUT)),
    *(_family(name, "slime/observability/rollout_metrics.py", _inner(_PER_SAMPLE, _ROLLOUT))
      for name in ("rl_slime_perf_non_generation_duration_seconds",
                   "rl_slime_perf_longest_sample_non_generation_duration_seconds",
                   "rl_slime_perf_longest_effective_sample_non_generation_duration_seconds",
                   "rl_slime_perf_request_latency_seconds", "rl_slime_perf_request_queue_duration_seconds",
                   "rl_slime_perf_prefill_duration_seconds", "rl_slime_perf_decode_duration_seconds")),
    # AReaL: every timer is top-level in the loop (stats_tracker.record_timing; a timer run twice in a step is
    # reported as the mean of its runs)
    _family("rl_areal_step_operation_duration_seconds", _AREAL, UNDECIDED, ("operation",), {
        "rollout": _leaf("generation"),  # prepare_batch: async rollout workers fill it, the trainer waits
        "critic_values": _leaf("inference"),
        "ref_logp": _leaf("inference"),
        "teacher_logp": _leaf("inference"),
        "recompute_logp": _leaf("inference"),
        "compute_advantage": _leaf("other"),
        "train_step": _leaf("training"),
        "critic_train_step": _leaf("training"),
        "update_weights": _leaf("weight_sync"),
        "save": _leaf("checkpointing"),
        "checkpoint_for_recover": _leaf("checkpointing"),
        "eval": _leaf("validation"),
        "clear_batches": _leaf("other"),
        **{op: _leaf("offload") for op in ("rollout_pause", "rollout_pause_generation", "rollout_offload",
                                           "rollout_onload", "rollout_continue_generation", "rollout_resume")},
    }),
    _family("rl_areal_engine_offload_duration_seconds", "areal/trainer/rl_trainer.py:_onload_model/_offload_model",
            _leaf("offload")),
    # NeMo-RL: timer.get_timing_metrics(reduction_op="sum") of the step's Timer, logged as timing/train/{name}
    _family("rl_nemo_rl_timing_train_seconds", _NEMO, UNDECIDED, ("operation",), {
        "total_step_time": _step("contains every other timing/train/* key of the step and, synchronous, the "
                                 "step's validation"),
        "data_processing": _leaf("other"),
        "prepare_for_generation_total": _leaf("weight_sync"),  # the refit, with the offload/onload it needs
        "prepare_for_generation_transfer_and_update_weights": _inner("inside prepare_for_generation/total"),
        "prepare_for_generation": _leaf("weight_sync"),  # distillation.py
        "generation": _leaf("generation"),
        "reward_calculation": _leaf("other"),  # rewards, baselines; dynamic sampling inside
        "dynamic_sampling": _inner("inside reward_calculation (grpo.py:dynamic_sampling)"),
        "logprob_inference_prep": _leaf("offload"),  # prepare_for_lp_inference: the policy back on the GPU
        "policy_and_reference_logprobs": _leaf("inference"),
        **{k: _inner("inside policy_and_reference_logprobs (lm_policy.py:Policy.get_*logprobs)") for k in (
            "get_logprobs_shard_data", "get_logprobs_submit_logprob_futures",
            "get_reference_policy_logprobs_shard_data",
            "get_reference_policy_logprobs_submit_reference_policy_logprob_futures")},
        "advantage_calculation": _leaf("other"),
        "training_prep": _leaf("offload"),  # prepare_for_training: model to train mode, optimizer back on GPU
        "policy_training": _leaf("training"),
        **{k: _inner("inside policy_training (lm_policy.py:Policy.train)") for k in (
            "policy_training_sharding_data", "policy_training_submit_training_futures")},
        "recompute_kv_scales": _leaf("inference"),  # FP8 KV-scale calibration forward
        "checkpointing": _leaf("checkpointing"),
        "teacher_logprob_inference_prep": _leaf("offload"),
        "teacher_logprob_inference": _leaf("inference"),
        # async_grpo_train
        "exposed_generation": _leaf("waiting"),  # the trainer blocked on the trajectory collector
        "idle_buffer_starvation": _inner("inside exposed_generation"),
        "overlong_filter": _inner("inside data_processing"),
        "mask_sample_filter": _inner("inside data_processing"),
        "idle_refit_bubble": _inner("contains weight_sync and part of exposed_generation"),
        "offload_before_refit": _leaf("offload"),
        "weight_sync": _leaf("weight_sync"),
        "idle_validation": _inner("contains timing/validation/total_validation_time"),
        "init_total": _leaf("startup"),  # the first step only: waiting for the buffer's first batch
    }),
    _family("rl_nemo_rl_setup_timing_seconds", "nemo_rl/algorithms/grpo.py:setup; metric_utils.py:"
            "SetupTimingMetrics", _inner("a part of total_setup_time_s (parts run in parallel when "
                                         "generation is not colocated)"), ("operation",), {
                "total_setup": _leaf("startup"),
            }),
    _family("rl_nemo_rl_timing_validation_seconds", "nemo_rl/algorithms/{grpo,sft,dpo}.py:validate",
            _leaf("validation")),
    _family("rl_nemo_rl_timing_validation_dataset_seconds", "nemo_rl/algorithms/dpo.py:validate",
            _inner("dpo.py sums the datasets' times into timing/validation/total_validation_time")),
    _family("rl_nemo_rl_train_rollout_phase_seconds", "nemo_rl/experience/rollouts.py:run_async_nemo_gym_rollout",
            _inner("a NeMo-Gym rollout phase inside timing/train/generation")),
    *(_family(name, "nemo_rl/algorithms/grpo.py:aggregate_rollout_metrics", _inner(_PER_SAMPLE))
      for name in ("rl_nemo_rl_train_trajectory_duration_seconds",
                   "rl_nemo_rl_train_trajectory_duration_distribution_seconds")),
    *(_family(name, "nemo_rl/algorithms/utils.py:print_efficiency_summary",
              _inner("NeMo-RL's own cumulative run accounting of the time timing/train/* already reports"))
      for name in ("rl_nemo_rl_efficiency_category_seconds", "rl_nemo_rl_efficiency_thread_seconds",
                   "rl_nemo_rl_efficiency_waste_seconds", "rl_nemo_rl_efficiency_productive_seconds",
                   "rl_nemo_rl_efficiency_wall_seconds")),
    _family("rl_nemo_rl_refit_transfer_seconds", "nemo_rl/weight_sync/vllm_remote_sparse_weight_synchronizer.py",
            _inner("inside the refit (prepare_for_generation/total or weight_sync)")),
    _family("rl_nemo_rl_ray_monitor_elapsed_seconds", "nemo_rl/utils/logger.py:RayGpuMonitorLogger.flush",
            _inner("the GPU monitor's own clock, no training work")),
    # SkyRL: Timer(name, all_timings) accumulates; logged as timing/{name}
    _family("rl_skyrl_timing_seconds", _SKYRL, UNDECIDED, ("operation",), {
        "step": _step("excludes eval (and the fully-async trainer's epoch-end checkpoint)"),
        "generate": _leaf("generation"),
        "postprocess_generator_output": _leaf("other"),
        "convert_to_training_input": _leaf("other"),
        "fwd_logprobs_values_reward": _leaf("inference"),
        "apply_reward_kl_penalty": _leaf("other"),
        "compute_advantages_and_returns": _leaf("other"),
        "train_critic_and_policy": _leaf("training"),
        "critic_train": _inner("inside train_critic_and_policy"),
        "policy_train": _inner("inside train_critic_and_policy"),
        "sync_weights": _leaf("weight_sync"),
        "save_checkpoints": _leaf("checkpointing"),
        "save_hf_model": _leaf("checkpointing"),
        "cleanup_old_checkpoints": _inner("inside save_checkpoints"),
        "update_ref_with_policy": _leaf("other"),  # copies the policy's weights into the reference model
        "eval": _leaf("validation"),
        "eval_generate": _inner("the evaluation's generation, inside timing/eval (evaluate.py)"),
        "run_training": _inner("fully async: contains fwd_logprobs_values_reward, apply_reward_kl_penalty, "
                               "compute_advantages_and_returns and train_critic_and_policy"),
        "wait_for_generation_buffer": _leaf("waiting"),
    }),
    *(_family(name, "skyrl/train/generators/utils.py; skyrl/train/utils/trainer_utils.py", _inner(_PER_SAMPLE))
      for name in ("rl_skyrl_generate_trajectory_time_seconds", "rl_skyrl_generate_trajectory_completion_time_seconds",
                   "rl_skyrl_generate_group_completion_time_seconds",
                   "rl_skyrl_generate_intra_group_completion_time_std_seconds",
                   "rl_skyrl_vllm_request_latency_seconds")),
    # prime-rl: the trainer's and the orchestrator's time/* told apart by catalog.writers (component label)
    _family("rl_prime_rl_time_seconds", _PRIME, UNDECIDED, ("component", "operation"), {
        ("trainer", "step"): _step("the trainer's step: wait for the batch, load it, forward/backward and "
                                   "optimizer, weight broadcast, checkpoint"),
        ("trainer", "wait_for_batch"): _leaf("waiting"),
        ("trainer", "load_data"): _leaf("other"),
        ("trainer", "forward_backward"): _leaf("training"),  # the optimizer step included
        ("trainer", "broadcast_weights"): _leaf("weight_sync"),
        ("trainer", "save_ckpt"): _leaf("checkpointing"),
        ("orchestrator", "step"): _step("batch-to-batch time of the orchestrator; what its timers leave is "
                                        "rollout collection on the inference servers", _ORCHESTRATOR,
                                        rest="generation"),
        ("orchestrator", "pack"): _leaf("other", _ORCHESTRATOR),
        ("orchestrator", "save_ckpt"): _leaf("checkpointing", _ORCHESTRATOR),
        ("orchestrator", "wait_for_policy"): _leaf("waiting", _ORCHESTRATOR),
    }),
    _family("rl_prime_rl_time_unattributed_seconds", _PRIME,
            _inner("a time/* line of no told writer: trainer or orchestrator, whose step it divides is unknown")),
    _family("rl_prime_rl_trace_phase_duration_seconds", "src/prime_rl/orchestrator/metrics.py:TraceMetrics",
            _inner(_PER_SAMPLE, _ORCHESTRATOR)),
)

# rl_otel's own series: its phases are decided by phase_bucket; timestamps are no durations
_RL_OTEL_FAMILIES = (
    _family("rl_phase_duration_seconds", "rl_otel/_internal/runtime/phase.py (tel.phase)", _inner(""),
            phases=True),
    _family("rl_phase_gpu_duration_seconds", "rl_otel/_internal/probes/gpu_time.py (CUDA events of tel.phase)",
            _inner("GPU time inside a phase whose host time is counted already")),
    _family("rl_last_step_timestamp_seconds", "rl_otel/catalog/meta.py", _inner("a timestamp, no duration")),
    _family("rl_last_progress_timestamp_seconds", "rl_otel/catalog/meta.py", _inner("a timestamp, no duration")),
    _family("rl_phase_started_timestamp_seconds", "rl_otel/catalog/meta.py", _inner("a timestamp, no duration")),
    _family("rl_collective_started_timestamp_seconds", "rl_otel/catalog/meta.py",
            _inner("a timestamp, no duration")),
    # the accounting's own output (rl_otel/_internal/pipeline/goodput.py): what the leaves add up to, never a leaf
    *(_family(name, "rl_otel/_internal/pipeline/goodput.py", _inner("the goodput accounting's own output"))
      for name in ("rl_goodput_bucket_seconds", "rl_goodput_wall_seconds", "rl_collective_wait_seconds",
                   "rl_rank_compute_seconds")),
)

FAMILIES: Mapping[str, Family] = MappingProxyType({f.name: f for f in (
    *_ROLL_FAMILIES, *_VERL_FAMILIES, *_TRL_FAMILIES, *_TRINITY_FAMILIES, *_SCOPED_FAMILIES, *_RL_OTEL_FAMILIES)})

# ---------------------------------------------------------------------------------------------------------------
# Phases: a phase's execute part goes to the bucket of its name, its onload and offload parts to offload; total is
# their sum. ROLL's names are its state_offload_manger metric_infix phases (roll/pipeline/base_worker.py,
# distill_worker.py, dpo/actor_worker.py, rlvr/rewards/llm_judge_reward_worker.py, distributed/executor/worker.py);
# the rest are the names rl_otel's demo and docs give tel.phase() and the frameworks' own timer names.
PHASES: Mapping[str, str] = MappingProxyType({
    # ROLL
    "train_step": "training", "compute_log_probs": "inference", "compute_values": "inference",
    "compute_rewards": "inference", "teacher_forward": "inference", "model_update": "weight_sync",
    "do_checkpoint": "checkpointing",
    # conventional names
    "generate": "generation", "generation": "generation", "rollout": "generation", "gen": "generation",
    "train": "training", "update_actor": "training", "update_critic": "training", "ppo_update": "training",
    "ref_log_probs": "inference", "old_log_probs": "inference", "compute_ref_log_probs": "inference",
    "update_weights": "weight_sync", "sync_weights": "weight_sync", "weight_sync": "weight_sync",
    "broadcast_weights": "weight_sync", "refit": "weight_sync",
    "onload": "offload", "offload": "offload", "load_states": "offload", "offload_states": "offload",
    "validation": "validation", "validate": "validation", "val": "validation", "eval": "validation",
    "evaluate": "validation", "testing": "validation",
    "save_checkpoint": "checkpointing", "checkpoint": "checkpointing", "save": "checkpointing",
    "load_checkpoint": "checkpointing",
    "startup": "startup", "setup": "startup", "init": "startup",
    "compute_advantage": "other", "compute_advantages": "other", "reward": "other",
    "wait": "waiting", "wait_for_batch": "waiting", "idle": "waiting",
})
_PART_BUCKETS: Mapping[str, str | None] = MappingProxyType({
    "onload": "offload", "offload": "offload",
    "total": None,  # onload + execute + offload
    "reload_nccl": None, "offload_nccl": None,  # inside onload / offload (ROLL's offload_nccl)
    "load": None, "dcp_save": None, "hf_save": None,  # inside ROLL's do_checkpoint total
})


def phase_bucket(phase: str, part: str = "execute") -> str | None:
    """The bucket of a phase's ``part``: ``execute`` (the work) goes to the bucket of the phase's name (a name
    :data:`PHASES` does not know is measured work: ``other``), ``onload`` and ``offload`` to ``offload``; ``None``
    for ``total`` and the other parts, which contain or are contained in those three."""
    if part != "execute":
        return _PART_BUCKETS.get(part)
    return PHASES.get(phase, "other")


def decision_of(spec: MetricSpec, labels: tuple[tuple[str, str], ...] = ()) -> Decision | None:
    """The goodput decision for a logged key resolved to ``spec`` with ``labels``; ``None`` for an entry that is
    not a duration (no family is listed for it)."""
    family = FAMILIES.get(spec.name)
    if family is None:
        return None
    values = dict(labels)
    if family.phases:
        part = values.get("part", "execute")
        return Decision(phase_bucket(values.get("phase", ""), part),
                        "" if part != "total" else "onload + execute + offload")
    if not family.by:
        return family.default
    return family.decisions.get(tuple(values.get(label, "") for label in family.by), family.default)


def bucket_of(spec: MetricSpec, labels: tuple[tuple[str, str], ...] = ()) -> str | None:
    """The bucket a logged duration's time belongs to, or ``None`` when it is no leaf: a total containing other
    timers, a part of a counted timer, a per-token, per-sample or per-request statistic, a timer running beside a
    counted one, a timestamp, or an entry that is no duration at all."""
    decision = decision_of(spec, labels)
    return None if decision is None else decision.bucket


def step_key_of(spec: MetricSpec, labels: tuple[tuple[str, str], ...] = ()) -> Decision | None:
    """The decision of a key measuring the wall time of a whole step (its process, what its leaves leave over),
    else ``None``."""
    decision = decision_of(spec, labels)
    return decision if decision is not None and decision.step else None


def is_step_duration(spec: MetricSpec, labels: tuple[tuple[str, str], ...] = ()) -> bool:
    """True for the key that measures the wall time of a whole step of some process (veRL ``timing_s/step``,
    NeMo-RL ``timing/train/total_step_time``, prime-rl ``trainer/time/step``, ...)."""
    return step_key_of(spec, labels) is not None
