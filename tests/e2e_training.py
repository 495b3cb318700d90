"""The training that feeds the dashboards' and rules' end-to-end test: a small PPO loop driving rl_otel as a real
one does (phases with onload/offload, ppo_stats on torch tensors with distributions, ROLL time/ and memory/ keys,
TRL keys, Trinity-RFT rollout/eval/bench keys), for several ranks. ``rl-otel demo`` can replace it: the test only
needs every dashboard query to find data after it ran.
"""

from __future__ import annotations

import math
import time

import torch

import rl_otel
from rl_otel.stats import eval_step_metrics, ppo_stats, rollout_step_metrics

GIB_TOTAL = 80.0  # the device size the logged ROLL memory keys pretend (no GPU here: phases log no GPU keys)


def _memory_keys(infix: str, step: int, rank: int) -> dict[str, float]:
    """ROLL's state_offload_manager keys (GiB) as a GPU worker logs them, with the *_frac keys at end/onload."""
    base = 20.0 + 2 * rank + 0.1 * step
    out = {}
    for stage, factor in (("start/offload", 0.1), ("start/onload", 0.8), ("end/onload", 1.0), ("end/offload", 0.1)):
        for kind, extra in (("allocated", 0.0), ("reserved", 2.0), ("max_allocated", 6.0), ("max_reserved", 8.0)):
            out[f"memory/{infix}/{stage}/{kind}/0"] = base * factor + extra
    out[f"memory/{infix}/end/onload/max_allocated_frac/0"] = (base + 6.0) / GIB_TOTAL
    out[f"memory/{infix}/end/onload/max_reserved_frac/0"] = (base + 8.0) / GIB_TOTAL
    return out


def _batch(gen: torch.Generator, step: int, batch: int = 8, tokens: int = 16) -> dict[str, torch.Tensor]:
    lengths = torch.randint(4, tokens + 1, (batch,), generator=gen)
    mask = (torch.arange(tokens)[None, :] < lengths[:, None]).float()
    old = -torch.rand(batch, tokens, generator=gen) * 3
    drift = 0.02 + 0.01 * math.sin(step)
    returns = torch.randn(batch, tokens, generator=gen)
    return {
        "log_probs": old + drift * torch.randn(batch, tokens, generator=gen), "old_log_probs": old,
        "response_mask": mask,
        "ref_log_probs": old + 0.05 * torch.randn(batch, tokens, generator=gen),
        "advantages": torch.randn(batch, tokens, generator=gen),
        # a critic that has learned something: explained variance near 0.9
        "values": returns + 0.3 * torch.randn(batch, tokens, generator=gen), "returns": returns,
        "vpreds": returns + 0.3 * torch.randn(batch, tokens, generator=gen),
        "scores": torch.rand(batch, generator=gen) * (0.3 + 0.05 * step),
        "entropy": torch.rand(batch, tokens, generator=gen) + 0.5,
        "prompt_mask": torch.ones(batch, 12)}


def _trinity(step: int) -> dict[str, float]:
    tasks = [[{"accuracy": float((step + t + r) % 3 != 0), "response_length": 100.0 + 10 * r} for r in range(4)]
             for t in range(6)]
    return {**rollout_step_metrics(tasks), **eval_step_metrics(tasks, "gsm8k"),
            **eval_step_metrics(tasks, "gsm8k", detailed_stats=True),
            **eval_step_metrics(tasks, "math500", prefix="bench"),
            "experience_pipeline/experience_count": 48.0,
            "experience_pipeline/group_advantages/reward_mean/mean": 0.1 * step,
            "experience_pipeline/experience_pipeline/time/operator/0_GroupAdvantages": 0.01,
            "sample/model_version/mean": float(step), "sample/model_version/max": float(step),
            "sample/task_count": 6.0}


# healthy levels of the concepts the keys above do not carry: training-inference mismatch, staleness, MFU, the
# per-sequence KL and entropy (sums over a sequence, never mixed with the per-token ones)
HEALTHY = {"train_infer_kl": 1e-3, "train_infer_logprob_diff": 0.01, "train_infer_ratio_deviation": 0.01,
           "staleness": 1.0, "mfu": 0.4, "sequence_ref_kl": 2.0, "sequence_entropy": 50.0}


def hazard_keys() -> dict[str, float]:
    """One key of the shared catalog per concept of :data:`HEALTHY`, at its healthy level (a ratio where the
    concept is ``|ratio - 1|``)."""
    from rl_otel.catalog import default_catalog
    from rl_otel.catalog.concepts import concept
    from tests.frameworks import _matches

    catalog, out = default_catalog(), {}
    for name, value in HEALTHY.items():
        for source in concept(name).sources:
            example = next((e for s in catalog if s.prometheus_name == source.metric for e in s.examples
                            if _matches(source, catalog.resolve(e))), None)
            if example is not None:
                out[example] = 1 + value if source.transform.replace(" ", "") == "abs({}-1)" else value
                break
    assert len(out) == len(HEALTHY), out
    return out


def train(tels: list[rl_otel.Telemetry], steps: int = 12, step_seconds: float = 0.3) -> None:
    """``steps`` PPO steps on every rank's Telemetry (``tels[i]`` is rank i), ``step_seconds`` apart."""
    gens = [torch.Generator().manual_seed(rank) for rank in range(len(tels))]
    hazards = hazard_keys()
    samples = 0
    for step in range(steps):
        started = time.monotonic()
        samples += 64
        for rank, tel in enumerate(tels):
            with tel.phase("actor_infer", "generate"):
                batch = _batch(gens[rank], step)
            with tel.phase("actor_train", "train_step", onload=lambda: torch.zeros(64).sum(),
                           offload=lambda: None):
                stats = ppo_stats(**batch, kl_coef=0.05, names=("roll", "trl"), distributions=True)
                loss = -(batch["advantages"] * batch["response_mask"]).mean()
            with tel.phase("critic", "train_step"):
                value_loss = ((batch["vpreds"] - batch["returns"]) ** 2).mean()
            elapsed = time.monotonic() - started
            metrics: dict[str, object] = {
                **stats,
                **_memory_keys("actor_train/train_step", step, rank),
                **_memory_keys("actor_infer/generate", step, rank),
                "actor/pg_loss": loss, "critic/loss": value_loss, "actor/lr": 1e-6, "critic/lr": 5e-6,
                "ppo/learning_rate": 1e-6, "ppo/loss/policy": loss, "ppo/loss/value": value_loss,
                "ppo/loss/total": loss + 0.1 * value_loss, "actor/grad_norm": 0.5,
                "system/tps": 4096 / max(elapsed, 1e-3), "system/samples": samples,
                "perf/throughput": 2048 / max(elapsed, 1e-3), "perf/max_memory_allocated_gb": 30.0 + rank,
                "perf/max_memory_reserved_gb": 34.0 + rank,
                "time/rollout": 0.05, "time/adv": 0.01, "timing_per_token_ms/update_actor": 0.02,
                "perf/time_per_step": elapsed, "timing_s/step": elapsed,
                "actor/perf/max_memory_allocated_gb": 30.0 + rank, "actor/perf/max_memory_reserved_gb": 34.0 + rank,
                **hazards,
            }
            if rank == 0:
                metrics.update(_trinity(step))
                if step == 0:
                    metrics["checkpoint/path"] = "/ckpt/step_0"  # a string: skipped, counted as a telemetry error
            tel.log(metrics, step=step)
        time.sleep(max(0.0, step_seconds - (time.monotonic() - started)))
