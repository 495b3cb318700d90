"""A realistic node for the scrape benchmarks: 8 GPUs, 5 clusters x 7 phases, the PPO and rollout families.

One training step of such a node, as ROLL writes it, is :func:`step_metrics` (GPU/CPU memory and time keys of
every cluster's phases on 8 devices, ``ppo_stats(distributions=True)`` with its histograms, rollout and eval
keys); :func:`feed` logs it through ``Telemetry.log`` and runs every phase once through ``Telemetry.phase`` so
the ``rl_phase_duration_seconds`` histograms exist too. Shared by ``bench_scrape.py`` and the profiling recipe.
"""

from __future__ import annotations

import numpy as np

CLUSTERS = ("actor_train", "actor_infer", "reference", "critic", "reward")
PHASES = ("train_step", "generate", "compute_log_probs", "compute_values", "compute_rewards", "model_update",
          "do_checkpoint")
DEVICES = 8
GPU_STAGES = ("start/offload", "start/onload", "end/onload", "end/offload")
GPU_KINDS = ("allocated", "reserved", "max_allocated", "max_reserved")


def node_keys(devices: int = DEVICES) -> list[str]:
    """Every scalar key of one step of the node (memory and time of 35 phases, rollout, eval, system)."""
    keys = []
    for cluster in CLUSTERS:
        for phase in PHASES:
            infix = f"{cluster}/{phase}"
            keys += [f"time/{infix}/{part}" for part in ("total", "execute", "onload", "offload")]
            keys += [f"memory/cpu/{infix}/{stage}/{kind}" for stage in ("start", "end") for kind in ("rss", "vms")]
            for d in range(devices):
                keys += [f"memory/{infix}/{stage}/{kind}/{d}" for stage in GPU_STAGES for kind in GPU_KINDS]
                keys += [f"memory/{infix}/end/onload/{kind}_frac/{d}" for kind in ("max_allocated", "max_reserved")]
    keys += [f"rollout/{m}/{s}" for m in ("accuracy", "format_score", "length") for s in ("mean", "max", "min")]
    keys += [f"eval/gsm8k-eval/accuracy/{s}@4" for s in ("mean", "std", "best", "worst")]
    keys += [f"val/score/{s}" for s in ("mean", "max", "min")]
    keys += ["time/rollout", "time/adv", "time/eval", "system/tps", "actor/lr", "critic/lr", "critic/loss",
             "actor/pg_loss", "actor/total_loss"]
    return keys


def ppo_batch(seed: int = 0, batch: int = 64, tokens: int = 256) -> dict:
    """``ppo_stats(distributions=True)`` of a random batch: the PPO scalars and their histograms."""
    import torch

    from rl_otel.stats import ppo_stats

    g = torch.Generator().manual_seed(seed)
    lp = -torch.rand(batch, tokens, generator=g) * 3
    mask = (torch.arange(tokens)[None, :] < torch.randint(1, tokens + 1, (batch,), generator=g)[:, None]).long()
    return ppo_stats(log_probs=lp, old_log_probs=lp + 0.1 * torch.randn(batch, tokens, generator=g),
                     ref_log_probs=lp + 0.1 * torch.randn(batch, tokens, generator=g), response_mask=mask,
                     advantages=torch.randn(batch, tokens, generator=g), values=torch.randn(batch, tokens, generator=g),
                     returns=torch.randn(batch, tokens, generator=g), rewards=torch.randn(batch, generator=g),
                     scores=torch.randn(batch, generator=g), entropy=torch.rand(batch, tokens, generator=g),
                     distributions=True)


def step_metrics(keys: list[str], rng: np.random.Generator, ppo: dict | None = None) -> dict:
    metrics: dict = dict(zip(keys, rng.random(len(keys)).tolist(), strict=True))
    if ppo is not None:
        metrics.update(ppo)
    return metrics


def feed(tel, steps: int = 1, devices: int = DEVICES, seed: int = 0) -> dict:
    """Log ``steps`` steps of the node into ``tel`` (and run each phase once a step); return the last step."""
    keys, rng, ppo = node_keys(devices), np.random.default_rng(seed), ppo_batch(seed)
    metrics = {}
    for step in range(steps):
        for cluster in CLUSTERS:
            for phase in PHASES:
                with tel.phase(cluster, phase):
                    pass
        metrics = step_metrics(keys, rng, ppo)
        tel.log(metrics, step=step)
    return metrics
