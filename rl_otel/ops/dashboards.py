"""Grafana dashboards as plain data, generated from the catalog (units, descriptions) and the thresholds.

Seven dashboards: training overview, phases, memory, rollout/eval (Trinity-RFT), fleet, where the time goes
(goodput, stragglers, hangs), and the rollout engines (vLLM, SGLang). The template variables form a tree: datasource
-> job -> run, then cluster -> phase -> device_id, or role -> rank (or role -> replica); a dashboard shows the
branch up to the last variable its panels use (no dropdown that changes nothing), and every query filters on the
variables it depends on. ``python3 -m rl_otel.ops`` writes them to ``grafana/dashboards/*.json``.

No data: every panel says why it may be empty, in Grafana's "no data" text and at the end of its description
(:func:`no_data`), derived from what it reads: the frameworks whose keys feed its series (the catalog entries'
``source``, through a recorded series' concept), a GPU (torch's allocator, NVML, the frameworks' device-memory
keys), a baseline that needs the run's own history, a series that exists only when something is wrong, a phase
that must be running (or have run within the rate window).

Colours: a panel with an alert threshold is red on the alert's side of it (above for KL, below for entropy);
fractions (0-1) show as percent, other ratios (the importance ratio) as plain numbers. Rates and quantiles are
left out where nothing ran in the window (no NaN lines once training ends).
"""

from __future__ import annotations

import dataclasses
import json
import re
import urllib.parse
from dataclasses import dataclass, field

from rl_otel.catalog.concepts import concept
from rl_otel.catalog.spec import MetricSpec
from rl_otel.ops import contract, nodata
from rl_otel.ops import rules as r
from rl_otel.ops.nodata import spec_for
from rl_otel.ops.promql import metric_names
from rl_otel.ops.rules import OUT_OF_RANGE
from rl_otel.ops.thresholds import DEFAULT, Thresholds

DS = {"type": "prometheus", "uid": "${datasource}"}
RUN = 'job=~"$job", run=~"$run"'
PHASE = RUN + ', cluster=~"$cluster", phase=~"$phase"'
DEVICE = PHASE + ', device_id=~"$device_id"'
RATE = "$__rate_interval"

ROLE = RUN + ', role=~"$role"'
RANK = ROLE + ', rank=~"$rank"'
_WALL = contract.GOODPUT_WALL.exposed
# (name, label_values query): each query filters on the variables before it (its parent, PARENTS), so choosing a
# run narrows clusters and roles. A process's role and rank are listed from its goodput wall clock: every process
# with goodput accounting serves one, rollout engines that log no step included.
VARIABLES = (
    ("job", "label_values(rl_step, job)"),
    ("run", 'label_values(rl_step{job=~"$job"}, run)'),
    ("cluster", f"label_values(rl_phase_duration_seconds_count{{{RUN}}}, cluster)"),
    ("phase", f'label_values(rl_phase_duration_seconds_count{{{RUN}, cluster=~"$cluster"}}, phase)'),
    ("device_id", f"label_values(rl_gpu_memory_bytes{{{PHASE}}}, device_id)"),
    ("role", f"label_values({_WALL}{{{RUN}}}, role)"),
    ("rank", f"label_values({_WALL}{{{ROLE}}}, rank)"),
    # a rollout engine's replicas (in-process engines and engine servers alike), from the engines' recorded gauge
    ("replica", f"label_values(run_role_replica:rl_engine_requests_running:max{{{ROLE}}}, replica)"),
)
PARENTS = {"run": "job", "cluster": "run", "phase": "cluster", "device_id": "phase", "role": "run", "rank": "role",
           "replica": "role"}
# Variables whose "All" is not the default: one rank at first (a role may have a thousand), more on demand.
ON_DEMAND = frozenset({"rank"})
# where a generation phase's engine is shown (the rollout engines' dashboard, rollout_engines())
ENGINES_LINK = (("Rollout engines: what the engine did meanwhile", "rl-otel-engines"),)


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""
    exemplar: bool = False  # draw the series' exemplars (a phase's trace ID: a click opens it in Tempo)


@dataclass(frozen=True)
class Panel:
    """One panel. ``unit``/``description`` default to the catalog's for the first query's metric.
    ``needs_gpu``: its series exist only where torch sees a CUDA device or NVML a GPU."""

    title: str
    queries: tuple[Query, ...]
    kind: str = "timeseries"
    unit: str = ""
    description: str = ""
    threshold: float | None = None
    below: bool = False  # the alert's side of ``threshold`` is below it (entropy, explained variance)
    steps: tuple[tuple[str, float | None], ...] = ()  # explicit (colour, from) threshold steps instead
    needs_gpu: bool = False
    stack: bool = False
    when_empty: str = ""  # why the panel may be empty besides what no_data() derives (a window nothing ran in)
    width: int = 12
    concept: str | None = None  # the concept of rl_otel.catalog.concepts the panel shows (any framework's keys)
    repeat: str = ""  # a variable: one panel per selected value of it (Grafana's panel repeat)
    rows: bool = False  # a heatmap whose rows are its series (one per rank), not histogram buckets
    unstacked: tuple[str, ...] = ()  # legends of a stacked panel's series drawn as a line over the stack
    links: tuple[tuple[str, str], ...] = ()  # (title, dashboard uid): panel links to another dashboard


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    panels: tuple[Panel, ...] = field(default_factory=tuple)
    thresholds: Thresholds = DEFAULT  # the windows a panel's "no data" text names (a baseline's age)
    traces: bool = False  # a link to the run's step traces in Tempo (docs/tracing.md)


def _q(expr: str, legend: str = "", exemplar: bool = False) -> Query:
    return Query(expr, legend, exemplar)


def _heat(metric: str, title: str, sel: str = RUN) -> Panel:
    return Panel(title, (_q(f"sum by (le) (increase({metric}_bucket{{{sel}}}[{RATE}]))", "{{le}}"),), kind="heatmap")


def _concept(name: str, title: str, legend: str = "{{run}}", threshold: float | None = None,
             below: bool = False, unit: str = "") -> Panel:
    """A panel of one concept: every framework's series of it, reduced per run (see rl_otel.catalog.concepts);
    its unit (unless given) and description are the concept's."""
    return Panel(title, (_q(concept(name).expr(RUN, by=("run",)), legend),), threshold=threshold, below=below,
                 concept=name, unit=unit)


_UNITS = {"s": "s", "By": "bytes", "{token}": "short", "{token}/s": "short"}


def training(t: Thresholds) -> Dashboard:
    return Dashboard("rl-otel-training", "RL training overview",
                     "Reward, KL, entropy, clipping, losses, learning rate and speed of the selected runs, whichever "
                     "framework (ROLL, veRL, TRL, Trinity-RFT) logged them.", (
        _concept("reward", "Reward (mean over the batch)"),
        Panel("Score min / max (ROLL, veRL)", (_q(f'avg by (run, stat) (rl_critic_score{{{RUN}, stat=~"min|max"}})',
                                                  "{{run}} {{stat}}"),)),
        _concept("policy_kl", "KL old -> new policy", threshold=t.approx_kl_max),
        _concept("ref_kl", "KL to the reference policy"),
        _concept("sequence_ref_kl", "KL to the reference, per sequence (TRL objective/kl)"),
        _concept("sequence_entropy", "Entropy, per sequence (TRL objective/entropy)"),
        _concept("train_infer_kl", "Training-inference mismatch (KL engine vs trainer)",
                 threshold=t.mismatch_kl_max),
        _concept("train_infer_logprob_diff", "Training-inference mismatch (mean |log-prob difference|)",
                 threshold=t.mismatch_logprob_diff_max),
        _concept("train_infer_ratio_deviation", "Training-inference mismatch (|prob ratio - 1|)",
                 threshold=t.mismatch_ratio_deviation_max, unit="none"),  # built from importance ratios: a number
        _concept("staleness", "Off-policy staleness (policy versions, worst sample)", threshold=t.staleness_max),
        _concept("mfu", "MFU", threshold=1.0),
        _concept("entropy", "Entropy (per token)", threshold=t.entropy_min, below=True),
        _concept("clip_ratio", "Clip fraction", threshold=t.clip_ratio_max),
        _concept("importance_ratio_max", "Importance ratio max", threshold=t.ratio_max),
        _heat("rl_actor_importance_ratio_dist", "Importance ratio distribution"),
        _concept("policy_loss", "Policy loss"),
        _concept("learning_rate", "Learning rate"),
        _concept("grad_norm", "Gradient norm (policy)"),
        _concept("explained_variance", "Value function explained variance", threshold=t.explained_variance_min,
                 below=True),
        _concept("response_length", "Response length (mean, tokens)"),
        Panel("Step", (_q(f"max by (run) (rl_step{{{RUN}}})", "{{run}}"),), kind="stat"),
        Panel("Steps per second", (_q(f"max by (run) (deriv(rl_step{{{RUN}}}[{RATE}]))", "{{run}}"),),
              unit="short"),
        _concept("throughput", "Tokens per second"),
        _concept("step_duration", "Step duration"),
        Panel("Seconds since the last step", (
            _q(f"time() - max by (run) (rl_last_step_timestamp_seconds{{{RUN}}})", "{{run}}"),),
            unit="s", description="Liveness: grows without bound when a trainer hangs.",
            threshold=t.stall_seconds),
        _concept("eval_score", "Eval score (mean per task set)", legend="{{run}} {{taskset}} {{metric}} @{{k}}"),
    ))


# the phases that ran in the rate window (a 0/0 or a quantile of empty buckets would draw NaN once training ends)
_RUNNING = (f'(sum by (cluster, phase) (rate(rl_phase_duration_seconds_count{{{PHASE}, part="total"}}[{RATE}])) '
            '> 0)')


# why a rate-window phase panel is empty while a finished run lingers (the last durations stay in the gauges)
_IDLE = ("no phase ran in the rate window (training ended or the run lingers: Last duration panels keep the last "
         "values)")


def phases(t: Thresholds) -> Dashboard:
    sel = PHASE
    return Dashboard("rl-otel-phases", "RL phases", "Where a step's time goes: every cluster's phases and their "
                     "onload / execute / offload split (ROLL's state_offload_manager).", traces=True, panels=(
        Panel("Phase duration p95 (total)", (
            _q("histogram_quantile(0.95, sum by (le, cluster, phase) "
               f'(rate(rl_phase_duration_seconds_bucket{{{sel}, part="total"}}[{RATE}]))) and on (cluster, phase) '
               f'{_RUNNING}', "{{cluster}}/{{phase}}", exemplar=True),),
            description="95th percentile of a phase's duration over the rate window; no line where the phase did "
                        "not run in the window (after training ends). With tracing on and Prometheus' exemplar "
                        "storage, the dots are phases' exemplars: a click opens the step's trace in Tempo.",
            when_empty=_IDLE, links=ENGINES_LINK),
        Panel("Phase duration mean (total)", (
            _q(f'sum by (cluster, phase) (rate(rl_phase_duration_seconds_sum{{{sel}, part="total"}}[{RATE}])) / '
               f'{_RUNNING}', "{{cluster}}/{{phase}}"),), unit="s",
            description="Mean duration of a phase over the rate window; no line where the phase did not run in "
                        "the window (after training ends).", when_empty=_IDLE),
        Panel("Phase GPU time mean vs host time mean (execute)", (
            _q(f'sum by (cluster, phase) (rate(rl_phase_gpu_duration_seconds_sum{{{sel}, part="execute"}}[{RATE}])) '
               f'/ sum by (cluster, phase) (rate(rl_phase_gpu_duration_seconds_count{{{sel}, part="execute"}}'
               f'[{RATE}]))', "{{cluster}}/{{phase}} GPU"),
            _q(f'sum by (cluster, phase) (rate(rl_phase_duration_seconds_sum{{{sel}, part="execute"}}[{RATE}])) / '
               f'sum by (cluster, phase) (rate(rl_phase_duration_seconds_count{{{sel}, part="execute"}}[{RATE}]))',
               "{{cluster}}/{{phase}} host")), unit="s", needs_gpu=True,
            description="On a GPU the host's time of a phase is how long it took to launch the work; the GPU time "
                        "(CUDA events at the phase's edges, read off the training thread) is how long the work "
                        "ran. A host line far under its GPU line: the work is queued, and a later phase (or an "
                        "offload's copy) waits for it."),
        Panel("Last duration: onload / execute / offload", (
            _q(f'max by (cluster, phase, part) (rl_phase_last_duration_seconds{{{sel}, '
               'part=~"onload|execute|offload"})', "{{cluster}}/{{phase}} {{part}}"),), kind="bargauge",
            stack=True),
        Panel("Share of time per part", (
            _q(f'sum by (part) (increase(rl_phase_duration_seconds_sum{{{sel}, part!="total"}}[$__range]))',
               "{{part}}"),), kind="piechart", unit="s",
            description="Time spent in onload / execute / offload over the dashboard's time range, all selected "
                        "phases together."),
        Panel("Last total duration per rank (stragglers)", (
            _q(f'max by (rank, cluster, phase) (rl_phase_last_duration_seconds{{{sel}, part="total"}})',
               "rank {{rank}} {{cluster}}/{{phase}}"),)),
        Panel("Phases running now (seconds)", (
            _q(f"time() - min by (cluster, phase) (rl_phase_started_timestamp_seconds{{{sel}}})",
               "{{cluster}}/{{phase}}"),), unit="s",
            description="How long each phase now in progress has been running (rl_phase_started_timestamp_seconds, "
                        "present while a tel.phase() block runs); RLPhaseStuck fires at phase_stuck_ratio times its "
                        "p90.", when_empty="no phase is running now (between two, or training ended)"),
        Panel("Rank skew per phase (slowest rank / median rank)", (
            _q(f"run_phase:rl_phase_duration_seconds:rank_skew{{{sel}}}", "{{run}} {{cluster}}/{{phase}}"),),
            unit="short", threshold=t.rank_skew_max,
            description=f"Mean duration over {t.rank_skew_window} of the slowest rank over the median rank's "
                        "(recording rule); RLRankSkew fires above the line for rank_skew_for."),
        Panel("Phase runs per second", (
            _q(f'sum by (cluster, phase) (rate(rl_phase_duration_seconds_count{{{sel}, part="total"}}[{RATE}]))',
               "{{cluster}}/{{phase}}"),), unit="short",
              description="Runs of each phase per second over the rate window: 0 once training ends."),
        Panel("Pipeline operations (time/rollout, time/adv, ...)", (
            _q(f"max by (operation) (rl_operation_duration_seconds{{{RUN}}})", "{{operation}}"),)),
        Panel("Time per token (Trinity timing_per_token_ms)", (
            _q(f"max by (operation) (rl_timing_per_token_seconds{{{RUN}}})", "{{operation}}"),)),
    ))


def memory(t: Thresholds) -> Dashboard:
    return Dashboard("rl-otel-memory", "RL memory", "GPU memory per device and phase stage, peak fraction of the "
                     "device, CPU memory per phase, and live gauges read at scrape time.", (
        Panel("GPU memory at end of onload (allocated, reserved)", (
            _q(f'max by (cluster, phase, kind, device_id) (rl_gpu_memory_bytes{{{DEVICE}, stage="end_onload", '
               'kind=~"allocated|reserved"})', "{{cluster}}/{{phase}} {{kind}} gpu{{device_id}}"),)),
        Panel("GPU memory per stage (allocated)", (
            _q(f'max by (cluster, phase, stage, device_id) (rl_gpu_memory_bytes{{{DEVICE}, kind="allocated"}})',
               "{{cluster}}/{{phase}} {{stage}} gpu{{device_id}}"),), kind="bargauge"),
        Panel("Peak GPU memory during a phase", (
            _q(f'max by (cluster, phase, kind, device_id) (rl_gpu_memory_bytes{{{DEVICE}, stage="end_onload", '
               'kind=~"max_allocated|max_reserved"})', "{{cluster}}/{{phase}} {{kind}} gpu{{device_id}}"),)),
        Panel("Peak fraction of device memory", (
            _q(f"max by (cluster, phase, kind) (rl_gpu_memory_peak_ratio{{{DEVICE}}})",
               "{{cluster}}/{{phase}} {{kind}}"),), threshold=t.gpu_peak_ratio_max),
        Panel("CPU memory per phase (rss)", (
            _q(f'max by (cluster, phase, stage) (rl_cpu_memory_bytes{{{PHASE}, kind="rss"}})',
               "{{cluster}}/{{phase}} {{stage}}"),)),
        Panel("Process resident memory (live)", (
            _q(f"max by (rank) (rl_process_resident_memory_bytes{{{RUN}}})", "rank {{rank}}"),)),
        Panel("GPU memory of the process (live, torch)", (
            _q(f'sum by (rank, device_id) (rl_gpu_process_memory_allocated_bytes{{{RUN}, device_id=~"$device_id"}})',
               "rank {{rank}} gpu{{device_id}} allocated"),
            _q(f'sum by (rank, device_id) (rl_gpu_process_memory_reserved_bytes{{{RUN}, device_id=~"$device_id"}})',
               "rank {{rank}} gpu{{device_id}} reserved")), needs_gpu=True),
        Panel("GPU device memory used / total (live, NVML)", (
            _q(f"max by (gpu_uuid) (rl_gpu_device_memory_used_bytes{{{RUN}}}) / "
               f"max by (gpu_uuid) (rl_gpu_device_memory_total_bytes{{{RUN}}})", "{{gpu_uuid}}"),),
            unit="percentunit", threshold=t.gpu_peak_ratio_max, needs_gpu=True),
        Panel("Peak GPU memory per step (veRL {actor,critic}/perf/)", (
            _q(f"max by (run, worker) (rl_perf_max_memory_allocated_bytes{{{RUN}}})", "{{run}} {{worker}} allocated"),
            _q(f"max by (run, worker) (rl_perf_max_memory_reserved_bytes{{{RUN}}})", "{{run}} {{worker}} reserved"),
            _q(f"max by (run) (rl_worker_max_memory_allocated_bytes{{{RUN}}})", "{{run}} allocated"),
            _q(f"max by (run) (rl_worker_max_memory_reserved_bytes{{{RUN}}})", "{{run}} reserved"))),
    ))


def rollout_eval(t: Thresholds) -> Dashboard:
    return Dashboard("rl-otel-rollout-eval", "RL rollout and eval (Trinity-RFT)",
                     "Trinity-RFT's rollout/, eval/, bench/ and experience-pipeline families.", (
        Panel("Rollout metrics (mean over tasks)", (
            _q(f'avg by (metric) (rl_rollout_metric{{{RUN}, stat="mean"}})', "{{metric}}"),)),
        Panel("Rollout metrics spread (max, min)", (
            _q(f'avg by (metric, stat) (rl_rollout_metric{{{RUN}, stat=~"max|min"}})', "{{metric}} {{stat}}"),)),
        Panel("Eval mean@k", (
            _q(f'avg by (taskset, metric, k) (rl_eval_metric{{{RUN}, stat="mean"}})',
               "{{taskset}} {{metric}} mean@{{k}}"),)),
        Panel("Eval best@k / worst@k", (
            _q(f'avg by (taskset, metric, stat, k) (rl_eval_metric{{{RUN}, stat=~"best|worst"}})',
               "{{taskset}} {{metric}} {{stat}}@{{k}}"),)),
        Panel("Eval across tasks (detailed_stats)", (
            _q(f'avg by (taskset, metric, k, across) (rl_eval_metric_across_tasks{{{RUN}, stat="mean"}})',
               "{{taskset}} {{metric}} mean@{{k}} {{across}}"),)),
        Panel("Bench mean@k", (
            _q(f'avg by (taskset, metric, k) (rl_bench_metric{{{RUN}, stat="mean"}})',
               "{{taskset}} {{metric}} mean@{{k}}"),)),
        Panel("Eval regression vs best", (
            _q(f"run_taskset:rl_eval_score:avg{{{RUN}}} - max_over_time(run_taskset:rl_eval_score:avg{{{RUN}}}"
               f"[{t.eval_window}])", "{{run}} {{taskset}} {{metric}}@{{k}}"),),
            threshold=-t.eval_drop, below=True,
            description=f"Recording rule: 0 at the best eval so far; the alert fires below -{t.eval_drop:g}."),
        Panel("Experience pipeline", (
            _q(f"max by (operator, metric, stat) (rl_experience_pipeline_metric{{{RUN}}})",
               "{{operator}} {{metric}} {{stat}}"),
            _q(f"max by (run) (rl_experience_pipeline_experiences{{{RUN}}})", "{{run}} experiences"))),
        Panel("Experience pipeline operator time", (
            _q(f"max by (operator) (rl_experience_pipeline_duration_seconds{{{RUN}}})", "{{operator}}"),)),
        Panel("Sampled model version", (
            _q(f"max by (stat) (rl_sample_model_version{{{RUN}}})", "{{stat}}"),)),
    ))


def fleet(t: Thresholds) -> Dashboard:
    sel = RUN
    return Dashboard("rl-otel-fleet", "RL fleet", "Every run and rank at once, mostly from the recording rules "
                     "(one series per run however many ranks).", (
        Panel("Ranks reporting", (_q(f"run:rl_step:count{{{sel}}}", "{{run}}"),), kind="stat"),
        Panel("Step per run", (_q(f"run:rl_step:max{{{sel}}}", "{{run}}"),)),
        Panel("Steps per second per run", (_q(f"run:rl_step:deriv5m{{{sel}}}", "{{run}}"),), unit="short"),
        Panel("Seconds since the last step", (
            _q(f"time() - run:rl_last_step_timestamp_seconds:max{{{sel}}}", "{{run}}"),), unit="s",
            threshold=t.stall_seconds),
        Panel("Step lag between ranks", (
            _q(f"run:rl_step:max{{{sel}}} - on (job, run) min by (job, run) (rl_step{{{sel}}})", "{{run}}"),),
            unit="short", description="Largest minus smallest step of a run's ranks: a straggler or a dead rank."),
        Panel("Step per rank", (_q(f"max by (run, rank) (rl_step{{{sel}}})", "{{run}} rank {{rank}}"),)),
        Panel("Max approx. KL per run (vs its baseline)", (
            _q(f"run:rl_policy_kl:max{{{sel}}}", "{{run}}"),
            _q(f"run:rl_policy_kl:max_baseline{{{sel}}}", "{{run}} baseline")),
              threshold=t.approx_kl_max, concept="policy_kl"),
        Panel("KL to the reference per run (vs its baseline)", (
            _q(f"run:rl_ref_kl:avg{{{sel}}}", "{{run}}"),
            _q(f"run:rl_ref_kl:avg_baseline{{{sel}}}", "{{run}} baseline")),
              threshold=t.ref_kl_max, concept="ref_kl"),
        Panel("Training-inference mismatch per run (vs its baseline)", (
            _q(f"run:rl_train_infer_kl:max{{{sel}}}", "{{run}}"),
            _q(f"run:rl_train_infer_kl:max_baseline{{{sel}}}", "{{run}} baseline")),
              threshold=t.mismatch_kl_max, concept="train_infer_kl"),
        Panel("Staleness per run", (_q(f"run:rl_staleness:max{{{sel}}}", "{{run}}"),), threshold=t.staleness_max,
              concept="staleness"),
        *(Panel(f"{title} per run (vs its baseline)", (
            _q(f"{concept(c).record}{{{sel}}}", "{{run}}"),
            _q(f"{concept(c).record}_baseline{{{sel}}}", "{{run}} baseline")), concept=c)
          for c, title in (("sequence_ref_kl", "KL to the reference per sequence"),
                           ("train_infer_logprob_diff", "Mean |log-prob difference| engine vs trainer"),
                           ("train_infer_ratio_deviation", "|prob ratio - 1| engine vs trainer"))),
        *(Panel(title, (_q(f"{concept(c).record}{{{sel}}}", "{{run}}"),), concept=c)
          for c, title in (("sequence_entropy", "Entropy per sequence per run"), ("mfu", "MFU per run"))),
        Panel("Phases running: seconds and usual p90", (
            _q(f"time() - run_phase:rl_phase_started_timestamp_seconds:min{{{sel}}}",
               "{{run}} {{cluster}}/{{phase}} running"),
            _q(f"run_phase:rl_phase_duration_seconds:p90{{{sel}}}", "{{run}} {{cluster}}/{{phase}} p90")), unit="s",
              description="How long each running phase has run, beside its p90 over phase_history_window "
                          "(RLPhaseStuck)."),
        Panel("Goodput per run and role (vs its baseline)", (
            _q(f"{r.GOODPUT_RATIO}{{{sel}}}", "{{run}} {{role}}"),
            _q(f"{r.GOODPUT_BASELINE}{{{sel}}}", "{{run}} {{role}} baseline")), unit="percentunit",
              description="The productive share (generation, training, inference) of each role's wall time; the "
                          "RL: where the time goes dashboard shows where the rest goes."),
        Panel("Seconds since each role's last progress", (
            _q(f"time() - {r.LAST_PROGRESS}{{{sel}}}", "{{run}} {{role}}"),), unit="s",
              threshold=t.progress_stall_min_seconds,
              description="The newest progress (a logged step, a finished phase) of any process of the role; RL: "
                          "where the time goes shows the oldest, RLProcessNoProgress fires per process."),
        Panel("Rank spread per phase (slowest minus median rank)", (
            _q(f"run_phase:rl_phase_duration_seconds:rank_spread_seconds{{{sel}}}",
               "{{run}} {{cluster}}/{{phase}}"),), unit="s", threshold=t.rank_skew_min_seconds),
        Panel("Metrics out of their possible range", (
            _q(f"{OUT_OF_RANGE}{{{sel}}}", "{{run}} {{metric}}"),), unit="short",
              description="Series of a run whose values cannot be true (fractions outside [0, 1], MFU above 1, "
                          "negative lengths or durations); RLMetricImpossible."),
        Panel("Max clip fraction per run", (_q(f"run:rl_clip_ratio:max{{{sel}}}", "{{run}}"),),
              threshold=t.clip_ratio_max, concept="clip_ratio"),
        Panel(f"Max importance ratio per run (median over {t.ratio_max_smooth}, vs its baseline)", (
            _q(f"run:rl_importance_ratio:max{{{sel}}}", "{{run}}"),
            _q(f"quantile_over_time(0.5, run:rl_importance_ratio:max{{{sel}}}[{t.ratio_max_smooth}])",
               f"{{{{run}}}} median {t.ratio_max_smooth}"),
            _q(f"run:rl_importance_ratio:max_baseline{{{sel}}}", "{{run}} baseline")),
              threshold=t.ratio_max, concept="importance_ratio_max"),
        Panel("Entropy per run", (_q(f"run:rl_entropy:avg{{{sel}}}", "{{run}}"),), threshold=t.entropy_min,
              below=True, concept="entropy"),
        Panel("Score per run", (_q(f"run:rl_reward:avg{{{sel}}}", "{{run}}"),), concept="reward"),
        Panel("Explained variance per run", (_q(f"run:rl_explained_variance:min{{{sel}}}", "{{run}}"),),
              threshold=t.explained_variance_min, below=True, concept="explained_variance"),
        Panel("Tokens per second per run (vs its average)", (
            _q(f"run:rl_tokens_per_second:sum{{{sel}}}", "{{run}}"),
            _q(f"run:rl_tokens_per_second:sum_avg{t.throughput_window}{{{sel}}}",
               f"{{{{run}}}} avg {t.throughput_window}")), concept="throughput"),
        *(Panel(title, (_q(f"{concept(c).record}{{{sel}}}", legend),), concept=c)
          for c, title, legend in (
              ("policy_loss", "Policy loss per run", "{{run}}"),
              ("response_length", "Response length per run", "{{run}}"),
              ("step_duration", "Step duration per run", "{{run}}"),
              ("learning_rate", "Learning rate per run", "{{run}}"),
              ("grad_norm", "Gradient norm per run", "{{run}}"),
              ("gpu_memory_peak", "Peak GPU memory per run", "{{run}}"),
              ("eval_score", "Eval score per run and task set", "{{run}} {{taskset}} {{metric}} @{{k}}"))),
        Panel("Peak GPU memory fraction per run and phase", (
            _q(f"run_phase:rl_gpu_memory_peak_ratio:max{{{sel}}}", "{{run}} {{cluster}}/{{phase}}"),),
            threshold=t.gpu_peak_ratio_max),
        Panel("Non-finite losses", (_q(f"run:rl_loss_non_finite:count{{{sel}}}", "{{run}}"),), kind="stat",
              unit="short", steps=(("green", None), ("red", 1)),
              description="Loss and gradient-norm series of the run that are NaN or ±Inf (0 when healthy)."),
        Panel("Telemetry errors absorbed", (
            _q(f"sum by (run, sink, reason) (rl_telemetry_errors_total{{{sel}}})", "{{run}} {{sink}} {{reason}}"),
            _q(f"sum by (run) (rl_telemetry_errors_total{{{sel}}}) or sum by (run) (0 * rl_step{{{sel}}})",
               "{{run}} total")),
            unit="short", steps=(("green", None), ("red", 1)),
            description="Failures rl_otel absorbed (rl_telemetry_errors_total by sink and reason); the total is 0 "
                        "for a run without any."),
        Panel("Scrape targets up", (_q('up{job=~"$job"}', "{{job}} {{instance}}"),), kind="stat", unit="short",
              steps=(("red", None), ("green", 1)),
              description="1 (green) when Prometheus scraped the endpoint, 0 (red) when the scrape failed; the "
                          "targets of the jobs that serve rl_step (the job dropdown's values)."),
    ))


_BUCKET = "<bucket>"


def _bucket_share(expr_of: str) -> tuple[Query, ...]:
    """One query per goodput bucket, in the order the catalog stacks them (rl_otel.catalog.goodput.BUCKETS):
    ``expr_of`` with each bucket in place of ``<bucket>``."""
    return tuple(_q(expr_of.replace(_BUCKET, b), "{{bucket}}") for b in contract.BUCKETS)


def goodput(t: Thresholds) -> Dashboard:
    share, ratio, base = r.GOODPUT_SHARE, r.GOODPUT_RATIO, r.GOODPUT_BASELINE
    bucket, wall = contract.GOODPUT_BUCKET.exposed, contract.GOODPUT_WALL.exposed
    productive = f'bucket=~"{r.PRODUCTIVE}"'
    per_rank = (f'sum by (bucket) (rate({bucket}{{{RANK}, bucket="{_BUCKET}"}}[{RATE}])) / ignoring (bucket) '
                f"group_left () sum (rate({wall}{{{RANK}}}[{RATE}]))")
    wait = contract.COLLECTIVE_WAIT.exposed
    progress, dumps = contract.LAST_PROGRESS.exposed, contract.STACK_DUMPS.exposed
    return Dashboard("rl-otel-goodput", "RL: where the time goes",
                     "Goodput and badput per run and role (the share of wall time in each bucket: generation, "
                     "training, inference are productive; startup, weight sync, offload, validation, "
                     "checkpointing, other and waiting are not), per rank on demand; stragglers (each rank's compute "
                     "against the median rank); progress and stack dumps of hung processes.", (
        Panel("Where the time goes: $role (share of wall time per bucket)",
              _bucket_share(f'avg by (bucket) ({share}{{{ROLE}, bucket="{_BUCKET}"}})'),
              unit="percentunit", stack=True, repeat="role", width=24, links=ENGINES_LINK,
              description="Seconds per second of wall time in each bucket, summed over the role's ranks and "
                          "divided by their wall time (recording rule run_role_bucket:rl_goodput_bucket_seconds:"
                          "share_rate5m; averaged over the selected runs): the shares stack to 1. Productive: "
                          f"{', '.join(contract.PRODUCTIVE)}."),
        Panel("Goodput per run and role (vs its baseline)", (
            _q(f"{ratio}{{{ROLE}}}", "{{run}} {{role}}"),
            _q(f"{base}{{{ROLE}}}", "{{run}} {{role}} baseline")), unit="percentunit",
              description="The productive share of each role's wall time over 5 minutes, beside the run's own "
                          f"baseline (its median over {t.goodput_baseline_window} ending "
                          f"{t.goodput_baseline_offset} ago); RLGoodputDrop fires when its mean over "
                          f"{t.goodput_smooth} falls below {t.goodput_drop_ratio:g} times the baseline for "
                          f"{t.goodput_for}."),
        Panel("Processes per bucket: $role (seconds per second, summed over the ranks)", (
            *_bucket_share(f'sum by (bucket) ({r.GOODPUT_BUCKET}{{{ROLE}, bucket="{_BUCKET}"}})'),
            _q(f"sum ({r.GOODPUT_WALL}{{{ROLE}}})", "wall (processes)")), unit="short", stack=True, repeat="role",
              width=24, unstacked=("wall (processes)",),
              description="How many of the role's processes are in each bucket on average (each process's wall "
                          "time advances a second per second): the buckets stack to the wall line; a bucket's "
                          "height is GPUs or workers spent on it."),
        Panel("Top badput buckets over the time range", (
            _q(f'topk(5, avg by (role, bucket) (avg_over_time({share}{{{ROLE}, bucket!~"{r.PRODUCTIVE}"}}'
               "[$__range])))", "{{role}} {{bucket}}"),), kind="bargauge", unit="percentunit",
              description="The five largest non-productive shares of a role's wall time, averaged over the "
                          "dashboard's time range and the selected runs."),
        Panel("Where the time goes: chosen ranks", _bucket_share(per_rank), unit="percentunit",
              stack=True,
              description="The same shares for the ranks chosen in the rank dropdown (one at first: choose more "
                          "to compare; their seconds are added)."),
        Panel("Goodput per rank (chosen ranks)", (
            _q(f"sum by (run, role, rank) (rate({bucket}{{{RANK}, {productive}}}[{RATE}])) / sum by (run, role, "
               f"rank) (rate({wall}{{{RANK}}}[{RATE}]))", "{{run}} {{role}} rank {{rank}}"),), unit="percentunit"),
        Panel("Compute ratio per rank (rank x time)", (
            _q(f"{r.RANK_COMPUTE_RATIO}{{{ROLE}}}", "{{role}} {{rank}}"),), kind="heatmap", rows=True,
              unit="short", width=24,
              description="Each rank's compute rate (busy in phases, less its waits in tel.collective() blocks) "
                          "over the median rank of its run and role: about 1 for every rank of a balanced role; a "
                          "straggler's row runs hot (RLRankSkew fires above "
                          f"{t.rank_skew_max:g} for {t.rank_skew_for}), the ranks waiting for it run below 1."),
        Panel("Compute and collective waits per rank (chosen ranks)", (
            _q(f"{r.RANK_COMPUTE}{{{RANK}}}", "{{role}} rank {{rank}} compute"),
            _q(f"sum by (role, rank, point) (rate({wait}{{{RANK}}}[{RATE}]))",
               "{{role}} rank {{rank}} waits at {{point}}")), unit="percentunit",
              description="Seconds per second of wall time a rank computes, and waits at each point where ranks "
                          "meet: the straggler computes more and waits less than the others."),
        Panel("Seconds since the last progress (oldest process of each role)", (
            _q(f"time() - min by (run, role) ({progress}{{{ROLE}}})", "{{run}} {{role}}"),), unit="s",
              threshold=t.progress_stall_min_seconds,
              description="How long ago the least recent process of each role logged a step or finished a phase "
                          "(RLProcessNoProgress fires for a process far beyond its own usual interval while its "
                          "endpoint answers)."),
        Panel("Stack dumps written", (
            _q(f"sum by (run, role, rank, reason) (increase({dumps}{{{ROLE}}}[$__range]))",
               "{{run}} {{role}} rank {{rank}} {{reason}}"),), kind="bargauge", unit="short",
              description="Stack dumps each process wrote over the dashboard's time range, by reason (stuck: a "
                          "phase far beyond its usual duration; signal; http)."),
        Panel("Last stack dumps (where)", (
            _q(f"{contract.STACK_DUMP_INFO.exposed}{{{ROLE}}}", ""),), kind="table", width=24,
              description="Where each process's last stack dump is (path, on the machine of its instance), for "
                          "which phase and why: open it to see the frame each thread is in."),
    ))


REPLICA = ROLE + ', replica=~"$replica"'
# why an engine panel is empty: the engine serves no metrics to this run (docs/engines.md, per framework)
_NO_ENGINE = ("no rollout engine metrics reach this run: an in-process vLLM needs disable_log_stats=False (veRL: "
              "actor_rollout_ref.rollout.disable_log_stats=False), SGLang --enable-metrics (slime forces it); an "
              "engine server is scraped once published with tel.engine(url, name=...); see docs/engines.md")


def rollout_engines(t: Thresholds) -> Dashboard:
    """The rollout engines (vLLM, SGLang) of the selected runs, per role and replica, from the engines' recording
    rules (rl_otel/ops/engines.py), beside the role's generation time."""
    from rl_otel.ops import engines as e

    def panel(title: str, queries: tuple[Query, ...], description: str, **kw: object) -> Panel:
        return Panel(title, queries, description=description, when_empty=_NO_ENGINE, **kw)  # type: ignore[arg-type]

    legend = "{{run}} {{role}} {{replica}}"
    return Dashboard("rl-otel-engines", "Rollout engines",
                     "vLLM and SGLang engines of the selected runs, per role and replica: tokens per second (per "
                     "GPU, per second of generation), KV cache and preemptions, requests running and waiting, "
                     "queue time, time to first token, inter-token latency; in-process engines served by the "
                     "rank's rl_otel endpoint and engine servers published with tel.engine() alike.", (
        panel("Generation tokens/s per replica", (
            _q(f"{e.GENERATION}{{{REPLICA}}}", legend), _q(f"{e.PROMPT}{{{REPLICA}}}", legend + " prompt")),
            "Tokens generated (and prompt tokens prefilled) per second by each replica, over 1 minute; a "
            "replica's tensor-parallel ranks are counted once.", unit="short"),
        panel("Generation tokens/s per GPU", (_q(f"{e.PER_GPU}{{{REPLICA}}}", legend),),
              "A replica's generation tokens/s over its GPUs: the ranks and SGLang tp_rank series it shows (1 for a "
              "server that shows none: per replica then).", unit="short"),
        panel("Generation tokens per second of generation (role)", (
            _q(f"{e.PER_GENERATION_SECOND}{{{ROLE}}}", "{{run}} {{role}}"),),
            "The role's generation tokens over the seconds its ranks spent in generation phases (rl_otel's goodput "
            "bucket generation), over 5 minutes: a colocated engine's speed while it generates.", unit="short"),
        panel("KV cache usage", (_q(f"{e.KV}{{{REPLICA}}}", legend),),
              f"vLLM's kv_cache_usage_perc (gpu_cache_usage_perc before 0.9), SGLang's token_usage; "
              f"RLEngineKVCacheSaturated fires above {t.engine_kv_usage_max:g} while requests are preempted.",
              unit="percentunit", threshold=t.engine_kv_usage_max),
        panel("Preemptions per second", (_q(f"{e.PREEMPTIONS}{{{REPLICA}}}", legend),),
              "Requests preempted (vLLM) or retracted (SGLang) per second, over 5 minutes: their KV cache was "
              "freed and they run again.", unit="short", threshold=t.engine_preemptions_min),
        panel("Requests running and waiting", (
            _q(f"{e.RUNNING}{{{REPLICA}}}", legend + " running"), _q(f"{e.WAITING}{{{REPLICA}}}", legend + " waiting")),
            "Requests in the engine's batch and in its queue (seen every scrape: a shorter gap is invisible).",
            unit="short"),
        panel("Time to first token p50 / p95", (
            _q(f"{e.TTFT.format(q='50')}{{{REPLICA}}}", legend + " p50"),
            _q(f"{e.TTFT.format(q='95')}{{{REPLICA}}}", legend + " p95")),
            "From the engine's own histogram over 5 minutes.", unit="s"),
        panel("Queue time p50 / p95", (
            _q(f"{e.QUEUE.format(q='50')}{{{REPLICA}}}", legend + " p50"),
            _q(f"{e.QUEUE.format(q='95')}{{{REPLICA}}}", legend + " p95")),
            "Time a request waited before it ran (vLLM request_queue_time_seconds, SGLang queue_time_seconds).",
            unit="s"),
        panel("Inter-token latency p50 / p95", (
            _q(f"{e.ITL.format(q='50')}{{{REPLICA}}}", legend + " p50"),
            _q(f"{e.ITL.format(q='95')}{{{REPLICA}}}", legend + " p95")),
            "vLLM inter_token_latency_seconds (time_per_output_token_seconds before), SGLang "
            "inter_token_latency_seconds.", unit="s"),
        panel("Generation share of wall time vs requests running (role)", (
            _q(f"sum without (bucket) ({e.GENERATION_SHARE.replace('{', '{' + ROLE + ', ', 1)})",
               "{{run}} {{role}} in generation"),
            _q(f"{e.ROLE_RUNNING}{{{ROLE}}} > bool 0", "{{run}} {{role}} engines busy")),
            "The share of the role's wall time in generation phases beside whether any of its engines runs a "
            "request (1) or none (0): a generation share near 1 with idle engines is the tail "
            f"(RLEngineIdleDuringGeneration, after {t.engine_idle_for}).", unit="percentunit"),
        panel("Engine targets up", (
            _q(f'up{{{RUN}, {e.TARGET_LABEL}="engine"}}', "{{run}} {{replica}} {{instance}}"),),
            "Engine servers published with tel.engine(): 1 while Prometheus scrapes them (RLEngineTargetDown "
            "fires at 0 while the run lives).", unit="short"),
    ))


BUILDERS = (training, phases, memory, rollout_eval, fleet, goodput, rollout_engines)


def dashboards(t: Thresholds = DEFAULT) -> tuple[Dashboard, ...]:
    return tuple(dataclasses.replace(build(t), thresholds=t) for build in BUILDERS)


# -- catalog lookups -------------------------------------------------------------------------------------------

def grafana_unit(spec: MetricSpec) -> str:
    """Seconds, bytes, percent for fractions (``*_ratio``, 0-1), else a plain number: an importance ratio
    (exp(logp - logp_old), around 1 and unbounded) is a ratio, not a fraction: 1.62 must not read "162%"."""
    if spec.unit == "s":
        return "s"
    if spec.unit == "By":
        return "bytes"
    if "importance_ratio" in spec.name:
        return "short"
    if spec.name.endswith("_ratio"):
        return "percentunit"
    return "short"


def _first_spec(panel: Panel) -> MetricSpec | None:
    for query in panel.queries:
        for name in sorted(metric_names(query.expr)):
            spec = spec_for(name.split(":")[1] if name.count(":") == 2 else name)
            if spec is not None:
                return spec
    return None


# -- JSON --------------------------------------------------------------------------------------------------------

def chain(name: str) -> tuple[str, ...]:
    """``name`` and the variables it narrows on, from the root: ``rank`` -> job, run, role, rank."""
    out = [name]
    while out[-1] in PARENTS:
        out.append(PARENTS[out[-1]])
    return tuple(reversed(out))


def used_variables(dashboard: Dashboard) -> tuple[str, ...]:
    """The variables a panel of ``dashboard`` uses (in a query or a title, or repeats over) and those they narrow
    on, in :data:`VARIABLES` order; at least job and run."""
    names = [name for name, _ in VARIABLES]
    text = [q.expr for p in dashboard.panels for q in p.queries] + [p.title for p in dashboard.panels]
    used = {name for name in names if any(re.search(r"\$" + name + r"\b", x) for x in text)}
    used |= {p.repeat for p in dashboard.panels if p.repeat} | {"run"}
    shown = {v for name in used for v in chain(name)}
    return tuple(name for name in names if name in shown)


def _variables(dashboard: Dashboard) -> list[dict[str, object]]:
    out: list[dict[str, object]] = [{"name": "datasource", "label": "Data source", "type": "datasource",
                                     "query": "prometheus", "refresh": 1, "hide": 0, "current": {}}]
    shown = used_variables(dashboard)
    for name, query in VARIABLES:
        if name not in shown:
            continue
        # (no "definition": Grafana's UI writes that display copy of the query, the schema has no such field)
        var: dict[str, object] = {"name": name, "label": name, "type": "query", "datasource": DS, "query": query,
                                  "refresh": 2, "includeAll": True, "multi": True,
                                  "current": {"selected": True, "text": ["All"], "value": ["$__all"]}, "sort": 1,
                                  "hide": 0}
        # "All" of a job is the listed jobs (those serving rl_step): `up{job=~"$job"}` must not list every
        # target of a shared Prometheus. The others match anything (short queries however many runs there are).
        if name != "job":
            var["allValue"] = ".*"
        if name in ON_DEMAND:  # no "All": Grafana selects the first value, the user adds more
            var.update(includeAll=False, current={})
            del var["allValue"]
        out.append(var)
    return out


def no_data(panel: Panel, t: Thresholds = DEFAULT) -> nodata.NoData:
    """Why ``panel`` may be empty (:mod:`rl_otel.ops.nodata`): its "no data" text and its description's end."""
    return nodata.explain((q.expr for q in panel.queries), t, panel.needs_gpu, panel.when_empty)


def _panel_json(panel: Panel, panel_id: int, x: int, y: int, t: Thresholds) -> dict[str, object]:
    spec = _first_spec(panel)
    unit = panel.unit or (_UNITS.get(concept(panel.concept).unit, "") if panel.concept else "") or (
        grafana_unit(spec) if spec else "short")
    description = panel.description or (concept(panel.concept).description if panel.concept else "") or (
        spec.description if spec else "")
    why = no_data(panel, t)
    description = f"{description} {why.detail}" if description else why.detail
    defaults: dict[str, object] = {"unit": unit, "noValue": why.text}
    if panel.steps:
        steps: list[dict[str, object]] = [{"color": color, "value": value} for color, value in panel.steps]
    elif panel.threshold is not None:
        good, bad = ("red", "green") if panel.below else ("green", "red")
        steps = [{"color": good, "value": None}, {"color": bad, "value": panel.threshold}]
    else:
        steps = [{"color": "green", "value": None}]
    defaults["thresholds"] = {"mode": "absolute", "steps": steps}
    if panel.kind == "timeseries":
        defaults["custom"] = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10 if panel.stack else 0,
                              "spanNulls": True, "stacking": {"mode": "normal" if panel.stack else "none"},
                              "thresholdsStyle": {"mode": "line" if len(steps) > 1 else "off"}}
    targets = []
    for i, query in enumerate(panel.queries):
        target: dict[str, object] = {"refId": chr(ord("A") + i), "datasource": DS, "expr": query.expr,
                                     "legendFormat": query.legend or "__auto", "range": True}
        if query.exemplar:
            target["exemplar"] = True
        if panel.kind == "heatmap" and not panel.rows:
            target["format"] = "heatmap"
        elif panel.kind in ("stat", "bargauge", "piechart"):
            target.update(range=False, instant=True)
        elif panel.kind == "table":
            target.update(range=False, instant=True, format="table")
        targets.append(target)
    options: dict[str, object] = {"tooltip": {"mode": "multi", "sort": "desc"},
                                  "legend": {"showLegend": True, "displayMode": "list", "placement": "bottom"}}
    if panel.kind == "heatmap" and panel.rows:  # a row per series (rank), coloured by value
        options = {"calculate": False, "rowsFrame": {"layout": "auto"}, "yAxis": {"unit": "short"},
                   "cellGap": 1, "color": {"mode": "scheme", "scheme": "RdYlBu", "reverse": True},
                   "cellValues": {"unit": unit}}
    elif panel.kind == "heatmap":
        options = {"calculate": False, "yAxis": {"unit": unit}, "cellGap": 1,
                   "color": {"mode": "scheme", "scheme": "Spectral"}}
    elif panel.kind == "table":
        options = {"showHeader": True, "cellHeight": "sm"}
    elif panel.kind in ("stat", "bargauge"):
        options = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                   "orientation": "horizontal"}
    elif panel.kind == "piechart":
        options = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                   "legend": {"showLegend": True, "displayMode": "table", "placement": "right"}}
    overrides = [{"matcher": {"id": "byName", "options": name},
                  "properties": [{"id": "custom.stacking", "value": {"mode": "none", "group": "A"}},
                                 {"id": "custom.fillOpacity", "value": 0}]} for name in panel.unstacked]
    out: dict[str, object] = {"id": panel_id, "type": panel.kind, "title": panel.title, "description": description,
                              "datasource": DS, "gridPos": {"h": 8, "w": panel.width, "x": x, "y": y},
                              "fieldConfig": {"defaults": defaults, "overrides": overrides}, "options": options,
                              "targets": targets}
    if panel.links:  # the same run, roles and time range on the other dashboard
        out["links"] = [{"title": title, "url": f"/d/{uid}/{uid}?${{__url_time_range}}&${{__all_variables}}"}
                        for title, uid in panel.links]
    if panel.repeat:  # side by side, two a row (the panel's full width shared among them)
        out.update(repeat=panel.repeat, repeatDirection="h", maxPerRow=2)
    if panel.kind == "table":  # the dump's labels as columns, its constant value and timestamp hidden
        out["transformations"] = [{"id": "organize", "options": {
            "excludeByName": {"Time": True, "Value": True, "__name__": True, "job": True},
            "indexByName": {name: i for i, name in enumerate(("run", "role", "rank", "instance", "path", "cluster",
                                                              "phase", "reason"))}}}]
    return out


# Explore on the Tempo data source (uid "tempo", grafana/provisioning), a TraceQL search of the run's step spans
_TRACEQL = '{ name = "step" && resource.rl.run =~ "${run:regex}" }'
TRACES_URL = "/explore?schemaVersion=1&panes=" + urllib.parse.quote(json.dumps({"traces": {
    "datasource": "tempo", "queries": [{"refId": "A", "datasource": {"type": "tempo", "uid": "tempo"},
                                        "queryType": "traceql", "query": _TRACEQL, "limit": 50}],
    "range": {"from": "now-1h", "to": "now"}}}, separators=(",", ":")), safe="${}:")


def to_json(dashboard: Dashboard) -> dict[str, object]:
    panels, x, y = [], 0, 0
    for i, panel in enumerate(dashboard.panels, start=1):
        if x + panel.width > 24:
            x, y = 0, y + 8
        panels.append(_panel_json(panel, i, x, y, dashboard.thresholds))
        x += panel.width
    links = [{"title": "RL dashboards", "type": "dashboards", "tags": ["rl_otel"], "asDropdown": True,
              "includeVars": True, "keepTime": True}]
    if dashboard.traces:
        links.append({"title": "Step traces (Tempo)", "type": "link", "url": TRACES_URL, "keepTime": True,
                      "targetBlank": True, "tooltip": "The run's steps in Tempo: one trace per step, every "
                                                     "process's phases under it (docs/tracing.md)"})
    return {"uid": dashboard.uid, "title": dashboard.title, "description": dashboard.description,
            "tags": ["rl_otel"], "timezone": "browser", "editable": True, "graphTooltip": 1,
            "schemaVersion": 39, "version": 1, "refresh": "10s", "time": {"from": "now-1h", "to": "now"},
            "links": links, "annotations": {"list": []}, "templating": {"list": _variables(dashboard)},
            "panels": panels}


def render(dashboard: Dashboard) -> str:
    """The committed bytes of a dashboard file (stable key order, trailing newline)."""
    return json.dumps(to_json(dashboard), indent=2, ensure_ascii=False) + "\n"
