"""Which of a framework's timers contain which: the facts :mod:`rl_otel.catalog.goodput` decides its leaves from.

One :class:`Loop` per training loop of a framework's current code (veRL's legacy ``RayPPOTrainer.fit`` and its V1
trainers differ), in the keys the framework logs (the fixtures' concrete keys, tests/data/frameworks/*.tsv). A
:class:`Nest` says what one timer contains: ``parts`` are timed one after another inside it (their sum is at most
its value), ``overlapping`` are measured inside it but add to nothing (statistics of per-sample times, a timer
running concurrently with a part). The tests build steps from these facts and check that the counted keys
(:func:`rl_otel.catalog.goodput.bucket_of`) never add a time twice and stay within the step.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LOOPS", "Loop", "Nest"]


@dataclass(frozen=True)
class Nest:
    """``key`` contains ``parts`` (sequential) and ``overlapping`` (measured inside, not additive)."""

    key: str
    parts: tuple[str, ...] = ()
    overlapping: tuple[str, ...] = ()


@dataclass(frozen=True)
class Loop:
    """One training loop of ``framework``, run by ``process``.

    ``step``: the key of the step's wall time (``None``: the loop has none, its wall time is the interval between
    its log calls); ``nests``: what contains what, from the step down; ``top``: the process's other timers (outside
    the step, or all of them when there is no step key); ``others``: durations the loop logs that are no timer of
    this process's wall time (derived values, statistics, another process's times, intervals).
    """

    framework: str
    name: str
    process: str
    source: str
    step: str | None
    nests: tuple[Nest, ...] = ()
    top: tuple[str, ...] = ()
    others: tuple[str, ...] = ()

    def all_keys(self) -> tuple[str, ...]:
        """Every key the loop names, once."""
        found = [*([self.step] if self.step else []), *self.top, *self.others]
        for nest in self.nests:
            found += [nest.key, *nest.parts, *nest.overlapping]
        return tuple(dict.fromkeys(found))


def _ts(*names: str) -> tuple[str, ...]:
    return tuple(f"timing_s/{n}" for n in names)


_AGENT_OPS = ("generate_sequences", "tool_calls", "compute_score")
_AGENT_LOOP = (*(f"timing_s/agent_loop/{op}/{stat}" for op in _AGENT_OPS for stat in ("min", "max", "mean")),
               *(f"timing_s/agent_loop/slowest/{op}" for op in _AGENT_OPS))
_PER_TOKEN = tuple(f"timing_per_token_ms/{op}" for op in ("gen", "ref", "values", "adv", "update_critic",
                                                          "update_actor"))

_VERL = (
    Loop("verl", "RayPPOTrainer.fit (legacy)", "trainer", "verl/trainer/ppo/ray_trainer.py:RayPPOTrainer.fit",
         "timing_s/step",
         (Nest("timing_s/step", _ts("gen", "reward", "old_log_prob", "ref", "values", "adv", "update_critic",
                                    "update_actor", "save_checkpoint", "update_weights", "dump_rollout_generations")),
          # generate_sequences, then sleep_replicas; the agent loop's per-sample statistics
          Nest("timing_s/gen", overlapping=_AGENT_LOOP)),
         top=_ts("start_profile", "testing", "stop_profile"),
         others=(*_PER_TOKEN, "perf/time_per_step")),
    Loop("verl", "V1 PPOTrainerSeparateAsync.fit", "trainer",
         "verl/trainer/ppo/v1/trainer_base.py:PPOTrainer.fit/step/_step_once; trainer_separate_async.py",
         "timing_s/step",
         # on_step_begin: switch_to_trainer; prepare_step: switch_wait; _step_once; save; on_step_end
         (Nest("timing_s/step", _ts("switch_to_trainer", "switch_wait", "gen", "reward", "old_log_prob", "ref",
                                    "values", "adv", "update_critic", "update_actor", "save_checkpoint",
                                    "update_weights", "switch_to_rollout")),),
         top=_ts("testing", "dump_rollout_generations"),
         others=("separate_async/decision/per_sample_time_seconds",
                 "separate_async/decision/effective_switch_cost_seconds")),
)


def _roll_phase(cluster: str, phase: str) -> str:
    return f"time/{cluster}/{phase}/total"


_ACTOR_TRAIN_STEP = _roll_phase("actor_train", "train_step")
_ROLL_SCHEDULER = (*(f"math_rule/scheduler/math_rule/time/{op}/{stat}" for op in ("generate", "reward")
                     for stat in ("min", "max", "mean")),
                   "math_rule/scheduler/math_rule/time/reward-math_rule/compute_rewards/total/mean")
_ROLL_ENV = (*(f"env/TerminalBench/traj_time_{m}" for m in (
    "env_total", "reset", "step", "step_min", "step_max", "generate", "generate_min", "generate_max",
    "generate_sum")), "env/SWEProxy/traj_time_total",
    *(f"env/SWEProxy/latency/{m}_{s}" for m in ("pure_inf", "env_exec", "proxy_ovh", "step_rt")
      for s in ("avg", "p99", "max")))
_ROLL_DOMAIN = tuple(f"math_rule/time/{op}" for op in ("get_sample_level_mask", "reward_postprocess",
                                                       "get_token_reward", "compute_advantage"))
# state_offload_manger: total = onload + execute + offload; onload contains reload_nccl, offload offload_nccl
_ROLL_PHASE_PARTS = (
    Nest(_ACTOR_TRAIN_STEP, tuple(f"time/actor_train/train_step/{p}" for p in ("onload", "execute", "offload"))),
    Nest("time/actor_train/train_step/onload", ("time/actor_train/train_step/reload_nccl",)),
    Nest("time/actor_train/train_step/offload", ("time/actor_train/train_step/offload_nccl",)),
    # FSDP2/Megatron save_checkpoint inside ActorWorker.do_checkpoint's Timer
    Nest(_roll_phase("actor_train", "do_checkpoint"), tuple(f"time/actor_train/do_checkpoint/{p}" for p in (
        "load", "offload", "dcp_save", "hf_save"))),
)
_ROLL_SYSTEM = tuple(f"system/time/{t}_mean" for t in ("tps", "actor_infer", "actor_infer_response", "actor_train"))

_ROLL = (
    Loop("roll", "RLVRPipeline.run", "trainer", "roll/pipeline/rlvr/rlvr_pipeline.py:RLVRPipeline.run",
         "time/step_total",
         (Nest("time/step_total", ("time/step_stop_server", "time/step_model_update", "time/val_step",
                                   "time/step_generate", "time/ref_log_probs_values", "time/old_log_probs",
                                   *_ROLL_DOMAIN, "time/step_train", _roll_phase("actor_train", "do_checkpoint")),
               # base_pipeline.do_checkpoint: the clusters checkpoint concurrently (blocking=False)
               overlapping=(_roll_phase("critic", "do_checkpoint"),)),
          Nest("time/step_model_update", (_roll_phase("actor_train", "model_update"),)),
          # the generate schedulers' per-request statistics and the reward clusters' phases
          Nest("time/step_generate", overlapping=_ROLL_SCHEDULER),
          Nest("time/ref_log_probs_values", (_roll_phase("reference", "compute_log_probs"),)),
          # critic.compute_values(blocking=False) beside actor_train.compute_log_probs
          Nest("time/old_log_probs", (_roll_phase("actor_train", "compute_log_probs"),),
               overlapping=(_roll_phase("critic", "compute_values"),)),
          Nest("time/step_train", (_ACTOR_TRAIN_STEP,), overlapping=(_roll_phase("critic", "train_step"),)),
          *_ROLL_PHASE_PARTS),
         others=_ROLL_SYSTEM),
    Loop("roll", "RLVRVLMPipeline.run", "trainer", "roll/pipeline/rlvr/rlvr_vlm_pipeline.py:RLVRVLMPipeline.run",
         "time/step_total",
         (Nest("time/step_total", ("time/step_stop_server", "time/step_model_update", "time/val_step",
                                   "time/step_generate", "time/ref_log_probs_values", "time/old_log_probs",
                                   "time/get_sample_level_mask", "math_rule/time/reward_postprocess",
                                   "math_rule/time/get_token_reward", "math_rule/time/compute_advantage",
                                   "time/step_train")),)),
    Loop("roll", "AgenticPipeline.run", "trainer", "roll/pipeline/agentic/agentic_pipeline.py:AgenticPipeline.run",
         "time/step_total",
         (Nest("time/step_total", (
             "time/step_model_update", "expand/expand_duration_ms", "time/step_rollout", "time/step_shrink",
             "time/step_ref_log_probs_values_reward", "time/step_old_log_probs_values",
             "time/step_cal_response_level_mask", "time/step_cal_norm_rewards", "time/step_cal_token_reward",
             "time/step_adv", "time/step_train", "time/step_compute_data_metrics",
             _roll_phase("actor_train", "do_checkpoint"), "time/step_log"),
             # validation in a thread beside the rollout (PHASE 6/7)
             overlapping=("time/step_val",)),
          Nest("time/step_rollout", overlapping=("time/get_batch_cost_train", "time/get_batch_cost_gqm", *_ROLL_ENV)),
          Nest("time/step_val", overlapping=("time/get_batch_cost_val", "val/time/get_batch_cost_gqm")),
          Nest("time/step_shrink", ("shrink/shrink_duration_ms",)))),
    # DPOPipeline.run: validation before the step timer, do_checkpoint after the tracker's log
    Loop("roll", "DPOPipeline.run", "trainer", "roll/pipeline/dpo/dpo_pipeline.py:DPOPipeline.run", "time/step_total",
         (Nest("time/step_total", ("time/cal_ref_log_probs", "time/actor_train")),),
         top=("time/val_step",)),
    Loop("roll", "SFTPipeline.run", "trainer", "roll/pipeline/sft/sft_pipeline.py:SFTPipeline.run", None,
         top=("time/val", "time/step_train", _roll_phase("sft_train", "do_checkpoint"))),
    Loop("roll", "DistillPipeline.run", "trainer", "roll/pipeline/distill/distill_pipeline.py:DistillPipeline.run",
         None,
         (Nest("train/step_train", ("train/teacher_forward", "logits_transfer/topk_probs/logits_transfer_total_time",
                                    "train/student_train_step")),
          Nest("train/teacher_forward", (_roll_phase("teacher", "teacher_forward"),)),
          Nest("logits_transfer/topk_probs/logits_transfer_total_time", (
              "logits_transfer/topk_probs/teacher2student_time",
              "logits_transfer/topk_probs/student_internal_broadcast_time")),
          Nest("train/student_train_step", (_roll_phase("student", "train_step"),))),
         top=("time/val", "train/step_train", _roll_phase("student", "do_checkpoint"))),
)

_TRINITY = (
    # Trainer.train: sample (read_experience; a sync may run while it waits), train_step, sync, save
    Loop("trinity", "Trainer.train", "trainer", "trinity/trainer/trainer.py:Trainer.train, "
         "trinity/trainer/verl/trainer.py:VERLTrainer.train_step (trinity-rft 0.6.0)", None,
         (Nest("time/train_step", ("time/step",)),
          Nest("time/step", ("time/old_log_prob", "time/ref", "time/values", "time/adv", "time/update_critic",
                             "time/update_actor"))),
         top=("time/read_experience", "time/train_step", "time/sync_weight", "time/save_checkpoint"),
         others=("time/trainer_sync_interval", "perf/time_per_step",
                 *(f"timing_per_token_ms/{op}" for op in ("ref", "values", "adv", "update_critic", "update_actor")))),
    Loop("trinity", "Explorer.explore", "explorer", "trinity/explorer/explorer.py:_finish_steps",
         "explore/time/sync_interval",
         (Nest("explore/time/sync_interval", ("explorer/time/wait_explore_step",), overlapping=("time/eval",)),),
         top=("time/bench",),
         others=(*(f"rollout/time/{op}/{s}" for op in ("run_execution", "task_execution") for s in ("mean", "max",
                                                                                                   "min")),
                 *(f"{p}/eval_taskset_0/time/{op}{s}" for p in ("eval", "bench")
                   for op in ("run_execution", "task_execution") for s in ("", "/mean", "/max", "/min", "/std")))),
    Loop("trinity", "ExperiencePipeline.process", "experience_pipeline",
         "trinity/buffer/pipelines/experience_pipeline.py:_process_experiences", None,
         (Nest("experience_pipeline/experience_pipeline/time/total", (
             "experience_pipeline/experience_pipeline/time/operator/0_ExperienceOperatorV1Wrapper",
             "experience_pipeline/experience_pipeline/time/operator/1_MyAsyncOperator",
             "experience_pipeline/experience_pipeline/time/write")),
          Nest("experience_pipeline/experience_pipeline/time/operator/0_ExperienceOperatorV1Wrapper",
               ("time/dj_process_experience",))),
         top=("experience_pipeline/experience_pipeline/time/total",)),
)

_TRL = (
    Loop("trl", "GRPOTrainer (transformers Trainer loop)", "trainer", "trl/trainer/grpo_trainer.py; "
         "transformers/trainer.py:Trainer", None,
         (Nest("eval_runtime", ("eval_model_preparation_time",)),),
         top=("eval_runtime", "eval_gsm8k_runtime"),
         others=("step_time", "train_runtime", "profiling/Time taken: GRPOTrainer._prepare_inputs",
                 "profiling/Time taken: GRPOTrainer.transformers.generate",
                 "profiling/Time taken: GRPOTrainer.accuracy_reward")),
    Loop("trl", "AsyncGRPOTrainer", "trainer", "trl/experimental/async_grpo/async_grpo_trainer.py", "perf/step_s",
         (Nest("perf/step_s", ("perf/rollout_wait_s", "perf/fwd_bwd_s", "perf/optimizer_s", "perf/weight_sync_s")),
          Nest("perf/fwd_bwd_s", ("perf/fwd_s",)),
          Nest("perf/weight_sync_s", ("perf/weight_sync_pause_s", "perf/weight_sync_barrier_s",
                                      "perf/weight_sync_transfer_s"))),
         others=("sample/time_in_queue_s", "rollout/score_s", "rollout/score_wait_s", "rollout/score_block_s",
                 "rollout/backpressure_s", "rollout/duration_s", "tools/latency_s", "tools/get_weather/latency_s",
                 "teacher_score_s/math")),
)

_OPENRLHF = (
    Loop("openrlhf", "PPOTrainer.fit", "trainer", "openrlhf/trainer/ppo_trainer.py:PPOTrainer.fit, "
         "BasePPOTrainer.train_step", "train/timing/step_total",
         (Nest("train/timing/step_total", tuple(f"train/timing/{op}" for op in (
             "generation", "make_experience", "ppo_train", "broadcast"))),)),
)

_SLIME_PERF = tuple(f"perf/{k}" for k in (
    "non_generation_time/mean", "longest_sample_non_generation_time",
    "longest_effective_sample_non_generation_time", "request/e2e_latency/mean", "request/queue_time/mean",
    *(f"prefill/{op}_duration/mean" for op in ("bootstrap_queue", "bootstrap", "alloc_wait", "forward",
                                               "transfer_queue")),
    *(f"decode/{op}_duration/mean" for op in ("prealloc", "bootstrap", "alloc_wait", "transfer", "forward"))))
_SLIME = (
    # train_wait: from the end of one train block to the start of the next (update_weights, save_model and sleep
    # after the previous train, the rollout, wake_up and data_preprocess before this one); ref_model_update runs
    # after this train block, inside the next train_wait, and is logged with this step
    Loop("slime", "MegatronTrainRayActor.train_actor", "trainer", "slime/backends/megatron_utils/actor.py; "
         "slime/observability/train_metric_utils.py:log_perf_data", "perf/step_time",
         (Nest("perf/step_time", ("perf/train_wait_time", "perf/train_time")),
          Nest("perf/train_wait_time", tuple(f"perf/{t}_time" for t in (
              "ref_model_update", "update_weights", "save_model", "sleep", "wake_up", "data_preprocess"))),
          Nest("perf/train_time", tuple(f"perf/{t}_time" for t in (
              "ref_log_probs", "teacher_log_probs", "log_probs", "actor_train"))))),
    Loop("slime", "RolloutManager.generate", "rollout", "slime/ray/rollout.py:RolloutManager.generate", None,
         top=("perf/rollout_time",), others=_SLIME_PERF),
)

_AREAL = (
    Loop("areal", "PPOTrainer.train", "trainer", "areal/trainer/rl_trainer.py:PPOTrainer.train", None,
         top=tuple(f"timeperf/{op}" for op in (
             "rollout_onload", "rollout_continue_generation", "rollout_resume", "rollout", "rollout_pause",
             "rollout_pause_generation", "rollout_offload", "critic_values", "ref_logp", "teacher_logp",
             "actor_onload", "recompute_logp", "compute_advantage", "train_step", "critic_train_step",
             "update_weights", "save", "checkpoint_for_recover", "actor_offload", "eval", "clear_batches"))),
)


def _nt(*names: str) -> tuple[str, ...]:
    return tuple(f"timing/train/{n}" for n in names)


_NEMO_SETUP = tuple(f"timing/setup/{n}_time_s" for n in (
    "vllm_init", "policy_init", "collective_init", "nemo_gym_init", "parallel_wall", "worker_setup", "other_setup"))
_NEMO_EFFICIENCY = ("efficiency/init/total_s", *(f"efficiency/idle/{c}_s" for c in (
    "buffer_starvation", "refit_bubble", "validation", "buffer_full_backoff", "generation_limit_pause",
    "refit_event_wait")), "efficiency/wasted/failed_trajectory_s", "efficiency/thread_seconds_total_s",
    "efficiency/total_waste_s", "efficiency/productive_time_s", "efficiency/total_wall_time_s")
_NEMO_SETUP_NEST = Nest("timing/setup/total_setup_time_s", overlapping=_NEMO_SETUP)
_NEMO_LOGPROBS = Nest("timing/train/policy_and_reference_logprobs", _nt(
    "get_logprobs/shard_data", "get_logprobs/submit_logprob_futures", "get_reference_policy_logprobs/shard_data",
    "get_reference_policy_logprobs/submit_reference_policy_logprob_futures"))
_NEMO_TRAINING = Nest("timing/train/policy_training", _nt("policy_training/sharding_data",
                                                          "policy_training/submit_training_futures"))
_NEMO = (
    Loop("nemo_rl", "grpo_train", "trainer", "nemo_rl/algorithms/grpo.py:grpo_train", "timing/train/total_step_time",
         (Nest("timing/train/total_step_time", (
             *_nt("data_processing", "prepare_for_generation/total", "generation", "reward_calculation",
                  "logprob_inference_prep", "policy_and_reference_logprobs", "advantage_calculation",
                  "training_prep", "policy_training", "recompute_kv_scales"),
             "timing/validation/total_validation_time", "timing/train/checkpointing")),
          # refit_policy_generation: the synchronizer's transfer inside the timed refit
          Nest("timing/train/prepare_for_generation/total", ("timing/train/prepare_for_generation/"
                                                             "transfer_and_update_weights",),
               overlapping=("refit/transfer/relay_flush_s", "refit/transfer/global_commit_s")),
          Nest("timing/train/generation", overlapping=("train/timing/rollout/aggregate_metrics",)),
          Nest("timing/train/reward_calculation", ("timing/train/dynamic_sampling",)),
          _NEMO_LOGPROBS, _NEMO_TRAINING, _NEMO_SETUP_NEST),
         top=("timing/setup/total_setup_time_s",),
         others=("train/trajectory_duration_s", "train/trajectory_duration_s/max", "train/trajectory_duration_s/p95",
                 "ray/ray_step")),
    Loop("nemo_rl", "async_grpo_train", "trainer", "nemo_rl/algorithms/grpo.py:async_grpo_train",
         "timing/train/total_step_time",
         (Nest("timing/train/total_step_time", _nt(
             "exposed_generation", "reward_calculation", "data_processing", "logprob_inference_prep",
             "policy_and_reference_logprobs", "advantage_calculation", "training_prep", "policy_training",
             "offload_before_refit", "idle/refit_bubble", "idle/validation", "checkpointing")),
          Nest("timing/train/exposed_generation", ("timing/train/idle/buffer_starvation",)),
          Nest("timing/train/data_processing", _nt("overlong_filter", "mask_sample_filter")),
          # refit_bubble: the collector's prepare_for_refit (counted in exposed_generation) and the refit
          Nest("timing/train/idle/refit_bubble", ("timing/train/weight_sync",)),
          Nest("timing/train/idle/validation", ("timing/validation/total_validation_time",)),
          _NEMO_LOGPROBS, _NEMO_TRAINING, _NEMO_SETUP_NEST),
         top=("timing/setup/total_setup_time_s", "timing/train/init/total"),
         others=_NEMO_EFFICIENCY),
    Loop("nemo_rl", "dpo_train", "trainer", "nemo_rl/algorithms/dpo.py:dpo_train, validate",
         "timing/train/total_step_time",
         (Nest("timing/train/total_step_time", ("timing/train/policy_training",
                                                "timing/validation/total_validation_time",
                                                "timing/train/checkpointing")),
          Nest("timing/validation/total_validation_time", ("timing/validation-helpsteer3/total_validation_time",)),
          _NEMO_TRAINING)),
    Loop("nemo_rl", "distillation_train", "trainer", "nemo_rl/algorithms/distillation.py:distillation_train",
         "timing/train/total_step_time",
         (Nest("timing/train/total_step_time", (
             *_nt("data_processing", "prepare_for_generation", "generation", "teacher_logprob_inference_prep",
                  "teacher_logprob_inference", "training_prep", "policy_training"),
             "timing/validation/total_validation_time", "timing/train/checkpointing")),
          Nest("timing/train/prepare_for_generation", ("timing/train/prepare_for_generation/"
                                                       "transfer_and_update_weights",)),
          _NEMO_TRAINING)),
)

_SKYRL = (
    Loop("skyrl", "RayPPOTrainer.train", "trainer", "skyrl/train/trainer.py:RayPPOTrainer.train", "timing/step",
         (Nest("timing/step", tuple(f"timing/{op}" for op in (
             "generate", "postprocess_generator_output", "convert_to_training_input", "fwd_logprobs_values_reward",
             "apply_reward_kl_penalty", "compute_advantages_and_returns", "train_critic_and_policy",
             "save_checkpoints", "save_hf_model", "update_ref_with_policy", "sync_weights"))),
          Nest("timing/generate", overlapping=(
              *(f"generate/trajectory_time_completion_{s}" for s in ("mean", "p90", "max")),
              *(f"generate/trajectory_completion_time_{s}" for s in ("mean", "p90", "max")),
              *(f"generate/group_completion_time_{s}" for s in ("mean", "p90", "max")),
              "generate/intra_group_completion_time_std_mean", "vllm/train/ttft_seconds_avg",
              "vllm/train/tpot_seconds_avg")),
          Nest("timing/train_critic_and_policy", ("timing/critic_train", "timing/policy_train")),
          Nest("timing/save_checkpoints", ("timing/cleanup_old_checkpoints",)),
          Nest("timing/eval", ("timing/eval_generate",))),
         top=("timing/eval",)),
    Loop("skyrl", "FullyAsyncRayPPOTrainer.train", "trainer", "skyrl/train/fully_async_trainer.py:"
         "FullyAsyncRayPPOTrainer.train, _collect_generation_mini_batch, _run_training", "timing/step",
         (Nest("timing/step", tuple(f"timing/{op}" for op in (
             "wait_for_generation_buffer", "convert_to_training_input", "run_training", "sync_weights"))),
          Nest("timing/run_training", tuple(f"timing/{op}" for op in (
              "fwd_logprobs_values_reward", "apply_reward_kl_penalty", "compute_advantages_and_returns",
              "train_critic_and_policy")))),
         top=("timing/eval", "timing/save_checkpoints", "timing/save_hf_model", "timing/update_ref_with_policy")),
)

_PRIME = (
    Loop("prime_rl", "trainer train()", "trainer", "src/prime_rl/trainer/rl/train.py:train", "trainer/time/step",
         (Nest("trainer/time/step", tuple(f"trainer/time/{op}" for op in (
             "wait_for_batch", "load_data", "forward_backward", "broadcast_weights", "save_ckpt"))),)),
    # step: batch to batch; the hold for the policy, packing and the checkpoint of one batch fall in the next
    # interval (the rest is rollout collection on the inference servers)
    Loop("prime_rl", "Orchestrator.finalize_train_batch", "orchestrator",
         "src/prime_rl/orchestrator/orchestrator.py:Orchestrator.finalize_train_batch, update_dispatch_gate",
         "orchestrator/time/step",
         (Nest("orchestrator/time/step", tuple(f"orchestrator/time/{op}" for op in (
             "wait_for_policy", "pack", "save_ckpt"))),),
         others=tuple(f"train/agg/effective/agent/timing/{p}/mean" for p in (
             "setup", "agent", "finalize", "scoring", "agent/model", "agent/harness", "total"))),
    # a line whose writer its keys do not tell (catalog.writers.SharedFile): served unattributed
    Loop("prime_rl", "time/* of no told writer", "trainer", "src/prime_rl/*", None,
         others=tuple(f"time/{op}" for op in ("step", "wait_for_batch", "load_data", "broadcast_weights",
                                               "save_ckpt", "forward_backward", "pack", "wait_for_policy"))),
)

LOOPS: tuple[Loop, ...] = (*_VERL, *_ROLL, *_TRINITY, *_TRL, *_OPENRLHF, *_SLIME, *_AREAL, *_NEMO, *_SKYRL, *_PRIME)
