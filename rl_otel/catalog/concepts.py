"""Concepts: one quantity that several frameworks log under their own keys (mean reward, KL, clip fraction, ...).

A run of TRL logs ``reward``, one of ROLL or veRL ``critic/score/mean``, one of Trinity-RFT's explorer
``rollout/reward/mean``: three keys, three catalog entries, one concept. A :class:`Concept` lists the series
(``sources``, in order of preference) that carry it, and the recording rules, alerts and dashboard panels read the
concept, never one framework's series: ``run:rl_reward:avg`` is recorded from whichever source a run reports
(``avg by (job, run) (a) or avg by (job, run) (b) ...``: the first source a run reports wins).

Each source is a PromQL selector of a catalog family (checked by the tests: the name exists, the matched labels are
the entry's) and optionally labels it sets (``set_labels``) so sources with different label sets line up - veRL's
``data_source`` becomes the ``taskset`` of an eval score, TRL's unlabeled ``eval_reward`` gets ``metric="reward"``.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

__all__ = ["CONCEPTS", "SANE_RANGES", "Concept", "Source", "concept"]

_SELECTOR = re.compile(r'([a-z_][a-z0-9_]*)(?:\{(.*)\})?')
_MATCHER = re.compile(r'(\w+)\s*(=~|!=|!~|=)\s*"((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Source:
    """One series set carrying a concept: ``selector`` (a metric name with optional ``{label="v"}`` matchers)."""

    selector: str
    set_labels: tuple[tuple[str, str], ...] = ()
    rename_labels: tuple[tuple[str, str], ...] = ()  # (to, from): copy label ``from`` into ``to``
    # a PromQL filter or transform of the (relabelled) selector, ``{}`` standing for it: ``"{} > 0"`` drops the
    # zeros a framework logs when it did not compute the quantity (ROLL's critic/entropy/mean without log-probs)
    transform: str = ""

    @property
    def metric(self) -> str:
        m = _SELECTOR.fullmatch(self.selector)
        if m is None:
            raise ValueError(f"concept source {self.selector!r} is not a PromQL selector")
        return m.group(1)

    @property
    def matchers(self) -> tuple[tuple[str, str, str], ...]:
        """``(label, op, value)`` of the selector's braces."""
        m = _SELECTOR.fullmatch(self.selector)
        if m is None or not m.group(2):
            return ()
        return tuple((match[1], match[2], match[3]) for match in _MATCHER.finditer(m.group(2)))

    def promql(self, extra: str = "") -> str:
        """The selector (with ``extra`` matchers such as Grafana's ``run=~"$run"`` added) and its relabelling."""
        sel = self.selector
        if extra:
            sel = sel[:-1] + ", " + extra + "}" if sel.endswith("}") else sel + "{" + extra + "}"
        for to, frm in self.rename_labels:
            sel = f'label_replace({sel}, "{to}", "$1", "{frm}", "(.*)")'
        for name, value in self.set_labels:
            sel = f'label_replace({sel}, "{name}", "{value}", "", "")'
        return self.transform.replace("{}", sel) if self.transform else sel


@dataclass(frozen=True)
class Concept:
    """A quantity frameworks log under different keys; recorded per run as ``record``.

    ``agg`` reduces ranks (and the source's extra labels) of a run: ``max`` for quantities where the worst rank
    matters (KL, clip fraction), ``avg`` for batch means, ``sum`` for throughput. ``by`` lists labels kept
    besides ``job`` and ``run``.
    """

    name: str
    record: str
    agg: str
    unit: str
    description: str
    sources: tuple[Source, ...]
    by: tuple[str, ...] = field(default=())

    def expr(self, matchers: str = "", by: tuple[str, ...] = ("job", "run")) -> str:
        """``agg by (job, run, ...) (s1) or agg by (job, run, ...) (s2) ...``: the recording rule's form; the
        dashboard's filters each source by ``matchers`` (Grafana's ``job=~"$job", run=~"$run"``) and reduces
        ``by=("run",)``. The concept's own ``by`` labels are always kept."""
        labels = ", ".join(dict.fromkeys((*by, *self.by)))
        return " or ".join(f"{self.agg} by ({labels}) ({s.promql(matchers)})" for s in self.sources)

    @property
    def metrics(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(s.metric for s in self.sources))


def _s(selector: str, transform: str = "", **set_labels: str) -> Source:
    return Source(selector, tuple(set_labels.items()), transform=transform)


CONCEPTS: tuple[Concept, ...] = (
    Concept("reward", "run:rl_reward:avg", "avg", "1",
            "Mean reward (score) of the batch's samples: ROLL/veRL critic/score/mean, TRL reward, Trinity-RFT's "
            "rollout reward, TRL PPO env/reward_mean.",
            (_s('rl_critic_score{stat="mean"}'), _s("rl_reward"), _s('rl_rollout_metric{metric="reward", stat="mean"}'),
             _s('rl_env_reward{stat="mean"}'), _s('rl_ppo_scores{stat="mean"}'),
             _s('rl_objective_rlhf_reward'))),
    Concept("policy_kl", "run:rl_policy_kl:max", "max", "1",
            "KL between the old (rollout) and the updated policy in one PPO update: ROLL actor/approxkl, veRL "
            "actor/ppo_kl, TRL PPO ppo/policy/approxkl.",
            (_s("rl_actor_approx_kl"), _s("rl_actor_ppo_kl"), _s("rl_ppo_policy_approx_kl"),
             _s("rl_actor_importance_sampling_approx_kl"), _s("rl_actor_usual_ppo_kl"))),
    Concept("ref_kl", "run:rl_ref_kl:avg", "avg", "1",
            "KL between the policy and the reference model, per token: TRL kl, veRL actor/kl_loss and "
            "actor/reward_kl_penalty, ROLL actor/kl_loss (TRL's objective/kl, a sum over the sequence, is the "
            "concept sequence_ref_kl).",
            (_s("rl_kl"), _s("rl_actor_kl_loss"), _s("rl_actor_reward_kl_penalty"),
             _s("rl_advantage_kl"))),
    Concept("policy_loss", "run:rl_policy_loss:avg", "avg", "1",
            "Policy-gradient loss: ROLL/veRL actor/pg_loss, TRL loss (the trainer's training loss), TRL PPO "
            "ppo/loss/policy.",
            (_s("rl_actor_pg_loss"), _s("rl_loss"), _s('rl_ppo_loss{kind="policy"}'), _s("rl_actor_final_loss"))),
    Concept("clip_ratio", "run:rl_clip_ratio:max", "max", "1",
            "Fraction of tokens whose importance ratio hit the PPO clip: ROLL actor/ppo_ratio_clipfrac, veRL "
            "actor/pg_clipfrac, TRL clip_ratio/region_mean, TRL PPO ppo/policy/clipfrac.",
            (_s("rl_actor_ppo_ratio_clip_ratio"), _s("rl_actor_clip_ratio"), _s("rl_actor_pg_clip_ratio"),
             _s('rl_clip_ratio{region="region", stat="mean"}'), _s("rl_ppo_policy_clip_ratio"),
             _s("rl_actor_usual_pg_clip_ratio"))),
    Concept("importance_ratio_max", "run:rl_importance_ratio:max", "max", "1",
            "Largest importance ratio exp(logp - logp_old) of a batch: ROLL actor/ratio_max.",
            (_s('rl_actor_importance_ratio{stat="max"}'),)),
    Concept("entropy", "run:rl_entropy:avg", "avg", "1",
            "Mean per-token entropy of the policy (nats): ROLL critic/entropy/mean, veRL actor/entropy, TRL "
            "entropy, TRL PPO ppo/policy/entropy (objective/entropy, a sum over the sequence, is the concept "
            "sequence_entropy). ROLL logs critic/entropy/mean = 0 when it does not recompute log-probs (its default "
            "with init_kl_coef=0 and one backward step): an exact 0 is no entropy and is left out.",
            (_s('rl_critic_entropy{stat="mean"}', "{} > 0"), _s("rl_actor_entropy"), _s("rl_entropy"),
             _s("rl_ppo_policy_entropy"))),
    Concept("explained_variance", "run:rl_explained_variance:min", "min", "1",
            "Explained variance of the returns by the value function: veRL critic/vf_explained_var, TRL PPO "
            "ppo/val/var_explained.",
            (_s("rl_critic_vf_explained_variance"), _s("rl_ppo_val_explained_variance"))),
    Concept("response_length", "run:rl_response_length:avg", "avg", "{token}",
            "Mean response length in tokens: ROLL tokens/response_length/mean, veRL response_length/mean, TRL "
            "completions/mean_length.",
            (_s('rl_tokens_response_length{stat="mean"}'), _s('rl_response_length{stat="mean"}'),
             _s('rl_completions_length{stat="mean"}'), _s('rl_tokens_responses_length{stat="mean"}'))),
    Concept("throughput", "run:rl_tokens_per_second:sum", "sum", "{token}/s",
            "Tokens processed per second, summed over ranks: ROLL system/tps, veRL perf/throughput.",
            (_s("rl_system_tokens_per_second"), _s("rl_perf_throughput_tokens_per_second"))),
    Concept("step_duration", "run:rl_step_duration_seconds:max", "max", "s",
            "Wall time of one training step: veRL perf/time_per_step and timing_s/step, ROLL time/step, TRL "
            "step_time.",
            (_s("rl_perf_step_duration_seconds"), _s('rl_step_timing_seconds{operation="step"}'),
             _s("rl_step_time_seconds"), _s('rl_operation_duration_seconds{operation=~"step|step_total"}'))),
    Concept("eval_score", "run_taskset:rl_eval_score:avg", "avg", "1",
            "Mean evaluation score per task set and metric: Trinity-RFT eval/{taskset}/{metric}/mean@k, veRL "
            "val-core/{data_source}/{var}/mean@N, ROLL val/score/mean, TRL eval_reward.",
            (_s('rl_eval_metric{stat="mean"}'), _s('rl_eval_metric_across_tasks{stat="mean", across="mean"}'),
             Source('rl_val_metric{stat="mean"}', rename_labels=(("taskset", "data_source"), ("metric", "var"))),
             _s('rl_val_score{stat="mean"}', metric="score"),
             _s("rl_eval_reward", metric="reward")),
            by=("taskset", "metric", "k")),
    Concept("gpu_memory_peak_ratio", "run_phase:rl_gpu_memory_peak_ratio:max", "max", "1",
            "Peak allocated or reserved GPU memory of a phase over the device's total: ROLL "
            "memory/{cluster}/{phase}/end/onload/max_*_frac/{device}, rl_otel's phase()",
            (_s("rl_gpu_memory_peak_ratio"),), by=("cluster", "phase")),
    Concept("gpu_memory_peak", "run:rl_gpu_memory_peak_bytes:max", "max", "By",
            "Peak GPU memory allocated by a rank in a step: veRL perf/max_memory_allocated_gb, ROLL "
            "memory/.../end/onload/max_allocated.",
            (_s("rl_perf_max_memory_allocated_bytes"), _s('rl_gpu_memory_bytes{kind="max_allocated"}'),
             _s("rl_worker_max_memory_allocated_bytes"), _s('rl_system_gpu_memory_peak_bytes{kind="allocated"}'))),
    Concept("learning_rate", "run:rl_learning_rate:max", "max", "1",
            "Learning rate of the policy: ROLL actor/lr, veRL actor/lr, TRL learning_rate.",
            (_s("rl_actor_learning_rate"), _s("rl_learning_rate"), _s("rl_ppo_learning_rate"))),
    Concept("grad_norm", "run:rl_grad_norm:max", "max", "1",
            "Gradient norm of the policy before clipping: veRL/ROLL actor/grad_norm, TRL grad_norm.",
            (_s("rl_actor_grad_norm"), _s("rl_grad_norm"),
             _s('rl_cluster_grad_norm{cluster=~"actor_train|actor|student|student_train|sft_train"}'))),
    Concept("sequence_ref_kl", "run:rl_sequence_ref_kl:avg", "avg", "1",
            "KL between the policy and the reference model summed over a sequence (not per token): TRL "
            "OnlineDPO/PPO objective/kl. Never mixed with the per-token ref_kl; alerts compare it with itself.",
            (_s("rl_objective_kl"),)),
    Concept("sequence_entropy", "run:rl_sequence_entropy:avg", "avg", "1",
            "Entropy of the policy summed over a sequence (not per token): TRL OnlineDPO/PPO objective/entropy. "
            "Never mixed with the per-token entropy; alerts compare it with itself.",
            (_s("rl_objective_entropy"),)),
    Concept("train_infer_kl", "run:rl_train_infer_kl:max", "max", "1",
            "Training-inference mismatch: per-token KL between the inference engine's log-probs (vLLM, SGLang) "
            "and the trainer's for the same tokens and weights: veRL/Trinity-RFT rollout_corr/k3_kl (decoupled "
            "mode) or actor/rollout_corr/k3_kl (bypass mode), else their k1 rollout_corr/kl. Frameworks being "
            "added: NeMo-RL train/gen_kl_error, prime-rl mismatch_kl, OpenRLHF vllm_kl.",
            (_s("rl_rollout_corr_k3_kl"), _s("rl_actor_rollout_corr_k3_kl"), _s("rl_rollout_corr_kl"),
             _s("rl_actor_rollout_corr_kl"))),
    Concept("train_infer_ratio_deviation", "run:rl_train_infer_ratio_deviation:max", "max", "1",
            "Training-inference mismatch as |mean ratio - 1| of trainer over engine token probabilities: ROLL "
            "actor/train_infer_ratio_token_mean (train-infer correction on). Frameworks being added: NeMo-RL "
            "train/token_mult_prob_error (|x - 1|).",
            (_s('rl_actor_train_infer_ratio{kind="token"}', "abs({} - 1)"),)),
    Concept("train_infer_logprob_diff", "run:rl_train_infer_logprob_diff:max", "max", "1",
            "Training-inference mismatch as the mean absolute log-prob difference per token: veRL/Trinity-RFT "
            "rollout_corr/log_ppl_abs_diff. Frameworks being added: slime train/train_rollout_logprob_abs_diff, "
            "SkyRL policy/rollout_train_logprobs_abs_diff_mean.",
            (_s("rl_rollout_corr_log_ppl_abs_diff"), _s("rl_actor_rollout_corr_log_ppl_abs_diff"))),
    Concept("staleness", "run:rl_staleness:max", "max", "{version}",
            "Off-policy staleness of asynchronous RL, in policy versions between generating a sample and training "
            "on it (the batch's worst): veRL training/off_policy/trajectory_staleness/max, TRL sample/"
            "staleness_max, Trinity-RFT sample/model_version_drift/max. Frameworks being added: AReaL "
            "version_stats/*staleness*, SkyRL async/staleness_*, prime-rl off_policy/*.",
            (_s('rl_off_policy_trajectory_staleness{stat="max"}'), _s('rl_async_sample_staleness{stat="max"}'),
             _s('rl_sample_model_version_drift{stat="max"}'))),
    Concept("mfu", "run:rl_mfu_ratio:max", "max", "1",
            "Model FLOPs utilization, a fraction of the hardware's peak: veRL/Trinity-RFT perf/mfu/{cluster}, veRL "
            "SFT train/mfu, TRL async perf/mfu_wall_clock and perf/mfu_fwd_bwd.",
            (_s("rl_perf_mfu_ratio"), _s("rl_train_mfu_ratio"), _s("rl_async_mfu_ratio"),
             _s("rl_async_forward_backward_mfu_ratio"))),
)



def _scoped_sources() -> dict[str, tuple[Source, ...]]:
    """The sources the scoped frameworks' catalogs add to the concepts (their modules' ``CONCEPT_SOURCES``, with
    the ``CONCEPT_TRANSFORMS``, ``CONCEPT_SET_LABELS`` and ``CONCEPT_RENAME_LABELS`` a selector needs), in the
    order of :data:`rl_otel.catalog.SCOPED_FRAMEWORKS`: after the shared frameworks' sources."""
    from rl_otel.catalog import SCOPED_FRAMEWORKS, framework_module

    added: dict[str, tuple[Source, ...]] = {}
    for name in SCOPED_FRAMEWORKS:
        module = framework_module(name)
        transforms = getattr(module, "CONCEPT_TRANSFORMS", {})
        set_labels = getattr(module, "CONCEPT_SET_LABELS", {})
        renames = getattr(module, "CONCEPT_RENAME_LABELS", {})
        for concept_name, selectors in module.CONCEPT_SOURCES.items():
            sources = tuple(Source(sel, tuple(set_labels.get(sel, {}).items()), tuple(renames.get(sel, {}).items()),
                                   transforms.get(sel, "")) for sel in selectors)
            added[concept_name] = added.get(concept_name, ()) + sources
    return added


def _with_scoped(shared: tuple[Concept, ...], added: dict[str, tuple[Source, ...]]) -> tuple[Concept, ...]:
    unknown = sorted(set(added) - {c.name for c in shared})
    if unknown:
        raise ValueError(f"framework catalogs name concepts that do not exist: {unknown}")
    return tuple(dataclasses.replace(c, sources=c.sources + added.get(c.name, ())) for c in shared)


_SCOPED = _scoped_sources()
CONCEPTS = _with_scoped(CONCEPTS, _SCOPED)

# Values no healthy run can report (a unit or aggregation bug upstream, or in the catalog's scale): the sanity
# alert counts, per concept, the source series outside [low, high]. A framework's source added to a concept is
# checked with it.
SANE_RANGES: dict[str, tuple[float, float]] = {
    "clip_ratio": (0.0, 1.0), "mfu": (0.0, 1.0), "gpu_memory_peak_ratio": (0.0, 1.0),
    "response_length": (0.0, float("inf")), "step_duration": (0.0, float("inf")),
    "throughput": (0.0, float("inf")), "entropy": (0.0, float("inf")), "staleness": (0.0, float("inf")),
}

# Series whose NaN or ±Inf means the update is garbage (the NaN-loss alert counts them): every framework's
# policy and critic losses and gradient norms.
NON_FINITE_WATCHED: tuple[str, ...] = (
    "rl_actor_pg_loss", "rl_actor_total_loss", "rl_actor_kl_loss", "rl_critic_loss", "rl_critic_vf_loss",
    "rl_ppo_loss", "rl_actor_grad_norm", "rl_critic_grad_norm", "rl_loss", "rl_grad_norm", "rl_actor_final_loss",
    "rl_cluster_grad_norm",
    # the scoped frameworks' policy losses and gradient norms
    *dict.fromkeys(src.metric for name in ("policy_loss", "grad_norm") for src in _SCOPED.get(name, ())),
)


def concept(name: str) -> Concept:
    for c in CONCEPTS:
        if c.name == name:
            return c
    raise KeyError(f"no concept named {name!r}; known: {[c.name for c in CONCEPTS]}")
