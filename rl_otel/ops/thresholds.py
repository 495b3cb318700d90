"""Every alert threshold and window in one place: rules, promtool tests, dashboards and the runbook read these.

Change a value here, run ``python3 -m rl_otel.ops``, commit the regenerated files; ``tests/test_ops_*.py`` fail if
the committed files are stale. Ratios are 0-1 (Prometheus base units), durations are Prometheus duration strings.

Where an absolute value does not carry across models, tasks and frameworks (KL, entropy, mismatch), an alert
compares the run with itself: its *baseline* is the median of its own recorded series over ``baseline_window``
ending ``baseline_offset`` ago (so the excursion being judged is not yet in it), and the alert fires on ``ratio``
times that baseline *and* above a ``floor`` (tiny absolute changes of a tiny quantity are noise). A ``max``
(ceiling) fires whatever the baseline, also in a run's first ``baseline_offset`` when there is none yet.
docs/runbook.md explains how to tune each.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields

_DURATION = re.compile(r"(0|[1-9][0-9]*)[smhd]")  # what the generators read (duration_minutes): one number, one unit


@dataclass(frozen=True)
class Thresholds:
    """Alert thresholds. Defaults suit PPO/GRPO on LLMs (ROLL's and TRL's defaults: clip 0.2, KL ~1e-3)."""

    # Liveness
    stall_seconds: float = 900            # no log() call for 15 min: the trainer is hung (or finished)
    stall_for: str = "5m"
    target_down_for: str = "3m"
    target_absent_for: str = "10m"
    # Numerics
    nan_loss_for: str = "1m"
    # The run's own baseline: median of its recorded series over the window, ending `offset` ago
    baseline_window: str = "1h"
    baseline_offset: str = "15m"
    # PPO health (old vs new policy)
    approx_kl_ratio: float = 4.0          # KL old -> new above 4x its own baseline ...
    approx_kl_floor: float = 0.02         # ... and above this (nats per token)
    approx_kl_max: float = 1.0            # ceiling: above it whatever the baseline (a toy task's KL is ~0.1)
    approx_kl_for: str = "10m"
    # The largest importance ratio exp(logp - logp_old) of a batch is one token's: heavy-tailed (the healthy demo's
    # reach 20-800 on single steps), so the alert reads its median over ratio_max_smooth, never one batch (nor the
    # value a finished run holds while it lingers)
    ratio_max_smooth: str = "10m"
    ratio_max_ratio: float = 4.0          # that median above 4x the run's own baseline ...
    ratio_max_floor: float = 10.0         # ... and above this
    ratio_max: float = 100.0              # ceiling: above it whatever the baseline
    ratio_max_for: str = "5m"
    clip_ratio_max: float = 0.3           # fraction of tokens clipped by the PPO ratio clip
    clip_ratio_for: str = "15m"
    entropy_ratio_min: float = 0.05       # entropy below 5% of its own max over entropy_window ...
    entropy_window: str = "6h"
    entropy_min: float = 0.01             # ... or below this (nats per token: a deterministic policy)
    entropy_for: str = "15m"
    # KL to the reference model (per token; the per-sequence sum is compared with itself only)
    ref_kl_ratio: float = 4.0             # runaway: above 4x its own baseline ...
    ref_kl_floor: float = 0.05            # ... and above this (nats per token)
    ref_kl_max: float = 2.0               # ceiling, nats per token
    ref_kl_for: str = "10m"
    ref_kl_drift_ratio: float = 3.0       # drift: its median over the last drift_window is 3x the window's before
    ref_kl_drift_window: str = "6h"
    ref_kl_drift_for: str = "1h"
    sequence_floor: float = 1.0           # floors of the per-sequence sums (KL, entropy), nats per sequence
    # Training-inference mismatch (the engine's log-probs vs the trainer's, same weights)
    mismatch_kl_max: float = 0.05         # level: per-token KL engine vs trainer (bf16 engines: ~1e-3)
    mismatch_logprob_diff_max: float = 0.2  # level: mean |logp_engine - logp_trainer| per token
    mismatch_ratio_deviation_max: float = 0.1  # level: |mean prob ratio - 1|
    mismatch_ratio: float = 4.0           # trend: above 4x its own baseline ...
    mismatch_floor: float = 0.005         # ... and above this
    mismatch_for: str = "15m"
    # Off-policy staleness of asynchronous RL (policy versions between generation and training)
    staleness_max: float = 8.0
    staleness_for: str = "10m"
    # Outcomes
    reward_drop: float = 0.3              # mean score below its peak of the last reward_window
    reward_window: str = "1h"
    reward_for: str = "15m"
    explained_variance_min: float = 0.0   # value function explains less than a constant would
    explained_variance_for: str = "30m"
    eval_drop: float = 0.05               # eval mean@k (averaged over eval_smooth) below its best of eval_window
    eval_window: str = "6h"
    eval_smooth: str = "30m"              # one eval is noisy (binomial std ~0.01-0.02): compare ~3 evals' mean
    eval_resolution: str = "5m"           # the step at which the best smoothed average of eval_window is sought
    eval_for: str = "5m"                  # the eval gauge holds its value until the next eval
    # Phases: a phase running much longer than it usually takes; ranks much slower than the others
    phase_stuck_ratio: float = 5.0        # running for 5x its own p90 over phase_history_window ...
    phase_stuck_min_seconds: float = 600  # ... and for at least 10 min (no p90 yet: stall_seconds)
    phase_history_window: str = "6h"
    phase_stuck_for: str = "2m"
    rank_skew_max: float = 1.5            # slowest rank's mean phase duration over the median rank's ...
    rank_skew_min_seconds: float = 10     # ... and slower by at least this many seconds
    rank_skew_window: str = "15m"
    rank_skew_for: str = "30m"            # persistent, not one slow step
    # ... and, where ranks serve rl_rank_compute_seconds_total, a rank computing rank_skew_max times the median
    # rank of its run and role, and this much more of its wall time (a rank that computes 2% of the time is no
    # straggler at 4%)
    rank_skew_min_share: float = 0.05
    # Goodput: the productive share (generation, training, inference) of a role's wall time against the run's own
    # baseline, the median of its 5-minute goodput over goodput_baseline_window ending goodput_baseline_offset ago
    # (longer than the smoothing plus `for`, so the drop being judged is not yet in it)
    goodput_smooth: str = "30m"           # the alert reads the mean goodput over this window ...
    goodput_drop_ratio: float = 0.5       # ... below half the baseline ...
    goodput_drop_min: float = 0.1         # ... and at least 10 points of wall time below it ...
    goodput_for: str = "20m"              # ... for this long: a checkpoint or an eval shorter than this never pages
    goodput_baseline_window: str = "6h"
    goodput_baseline_offset: str = "1h"
    goodput_baseline_min_history: str = "30m"  # the baseline needs this much of the run's goodput before it counts
    # Alive but no progress: a process whose last progress (a logged step, a finished phase) is far older than its
    # own usual interval between progress, while its endpoint answers
    progress_stall_ratio: float = 10.0    # older than 10x its mean interval over progress_history_window ...
    progress_stall_min_seconds: float = 900  # ... and than 15 min (no interval known yet: stall_seconds)
    progress_history_window: str = "6h"
    progress_stall_for: str = "5m"
    # A hang, the rank named: the ranks of a torch.distributed process group wait in a collective for this long,
    # and a rank issued fewer collectives in that group than they did (it never entered it); a rank whose endpoint
    # stopped answering (the GIL held in C, a dead process) keeps its last count for collective_hang_lookback
    collective_hang_seconds: float = 300
    collective_hang_for: str = "2m"
    collective_hang_lookback: str = "30m"
    # Metrics that cannot be true (fractions outside [0, 1], MFU above 1, negative lengths or durations)
    sanity_for: str = "5m"
    # Resources and speed
    gpu_peak_ratio_max: float = 0.95      # peak allocated/reserved over device total during a phase
    gpu_peak_for: str = "10m"
    throughput_ratio_min: float = 0.5     # tokens/s below half of its own average over throughput_window
    throughput_window: str = "1h"
    throughput_for: str = "15m"
    telemetry_errors_window: str = "15m"  # errors counted in this window (or since the series appeared)
    telemetry_errors_for: str = "1m"
    # Rollout engines (vLLM, SGLang; rl_otel/ops/engines.py)
    engine_kv_usage_max: float = 0.95     # KV cache usage above this ...
    engine_preemptions_min: float = 0.05  # ... while requests are preempted (SGLang: retracted) at this rate, /s
    engine_kv_for: str = "10m"
    engine_throughput_ratio_min: float = 0.5  # tokens/s while generating below half the run's own baseline ...
    engine_throughput_smooth: str = "15m"  # ... (its median over this window) ...
    engine_throughput_baseline_window: str = "1h"  # ... (the median over this window, ending offset ago)
    engine_throughput_baseline_offset: str = "30m"
    engine_throughput_min_history: float = 0.5  # the baseline needs tokens in this share of its window's minutes
    engine_throughput_for: str = "10m"
    engine_idle_generation_share: float = 0.9  # a role this much in generation (goodput) while its engines idle
    engine_idle_for: str = "3m"           # longer than a healthy tail of the last requests

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type in ("str", str):
                if not isinstance(value, str) or not _DURATION.fullmatch(value):
                    raise ValueError(f"threshold {f.name} must be a Prometheus duration of one unit (e.g. '90s', "
                                     f"'15m', '1h'), got {value!r}")
            elif isinstance(value, bool) or not isinstance(value, (int, float)) or value != value \
                    or value in (float("inf"), float("-inf")):
                raise ValueError(f"threshold {f.name} must be a finite number, got {value!r}")
            elif value < 0 and f.name not in _SIGNED:
                raise ValueError(f"threshold {f.name} must not be negative, got {value!r}")

    def to_dict(self) -> dict[str, float | str]:
        return asdict(self)

    def replaced(self, overrides: dict[str, str]) -> Thresholds:
        """A copy with ``overrides`` (``{name: text}``, as the command line gives them) parsed by each field's type;
        a ValueError names an unknown threshold or a bad value."""
        known = {f.name: f for f in fields(self)}
        values: dict[str, float | str] = {}
        for name, text in overrides.items():
            if name not in known:
                raise ValueError(f"unknown threshold {name!r}; known: {', '.join(known)}")
            if known[name].type in ("str", str):
                values[name] = text
                continue
            try:
                values[name] = float(text)
            except ValueError:
                raise ValueError(f"threshold {name} must be a number, got {text!r}") from None
        return Thresholds(**{**self.to_dict(), **values})  # type: ignore[arg-type]  # each parsed by its type


_SIGNED = frozenset({"explained_variance_min"})  # thresholds that may be below zero


DEFAULT = Thresholds()
