"""Every alert threshold and window in one place: rules, promtool tests, dashboards and the runbook read these.

Change a value here, run ``python3 -m rl_otel.ops``, commit the regenerated files; ``tests/test_ops_*.py`` fail if
the committed files are stale. Ratios are 0-1 (Prometheus base units), durations are Prometheus duration strings.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


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
    # PPO health (old vs new policy)
    approx_kl_max: float = 0.05           # k2 KL between old and new policy per update
    approx_kl_for: str = "10m"
    ratio_max: float = 10.0               # largest importance ratio exp(logp - logp_old) in a batch
    ratio_max_for: str = "10m"
    clip_ratio_max: float = 0.3           # fraction of tokens clipped by the PPO ratio clip
    clip_ratio_for: str = "15m"
    entropy_min: float = 0.05             # mean per-token policy entropy (nats)
    entropy_for: str = "15m"
    # Outcomes
    reward_drop: float = 0.3              # mean score below its peak of the last reward_window
    reward_window: str = "1h"
    reward_for: str = "15m"
    explained_variance_min: float = 0.0   # value function explains less than a constant would
    explained_variance_for: str = "30m"
    eval_drop: float = 0.05               # eval mean@k below its best of the last eval_window
    eval_window: str = "6h"
    eval_for: str = "5m"                  # the eval gauge holds its value until the next eval
    # Resources and speed
    gpu_peak_ratio_max: float = 0.95      # peak allocated/reserved over device total during a phase
    gpu_peak_for: str = "10m"
    throughput_ratio_min: float = 0.5     # tokens/s below half of its own average over throughput_window
    throughput_window: str = "1h"
    throughput_for: str = "15m"
    telemetry_errors_window: str = "15m"  # errors counted in this window (or since the series appeared)
    telemetry_errors_for: str = "1m"

    def to_dict(self) -> dict[str, float | str]:
        return asdict(self)


DEFAULT = Thresholds()
