"""Per-step cost of one full ROLL step: rl_otel (Prometheus + TensorBoard) against a ROLL-style add_scalar loop.

The ROLL-style tracker calls ``torch.utils.tensorboard.SummaryWriter.add_scalar`` once per key. rl_otel's
``log()`` writes the series store that Prometheus scrapes and hands the step to the TensorBoard sink's worker
thread, which writes one event per step. Both sides are timed end to end - every step logged, then everything
flushed to disk - so work moved to a background thread is still counted. Optionally one scrape of /metrics per
step is added (a worst case: Prometheus scrapes every 15 s, a step usually lasts longer).

    python benchmarks/bench_bridge.py [--steps 300] [--devices 8] [--scrape-every 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import urllib.request

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import Row, metrics_url

MMM = ("mean", "max", "min")
PHASES = ("actor_train/train_step", "actor_infer/generate", "reference/compute_log_probs",
          "actor_train/compute_log_probs", "critic/compute_values", "reward/compute_rewards",
          "actor_train/model_update", "actor_train/do_checkpoint")


def roll_step_keys(devices: int) -> list[str]:
    """The ROLL reference's keys: ~150 scalars, plus GPU memory keys of one phase on ``devices`` devices."""
    keys = [f"val/score/{s}" for s in MMM]
    keys += ["critic/lr", "critic/loss", "critic/value", "critic/vpred", "critic/clipfrac", "critic/error",
             "critic/reward_clip_frac"]
    for group in ("score", "rewards", "advantages", "returns", "values", "ref_log_prob", "old_log_prob", "entropy"):
        keys += [f"critic/{group}/{s}" for s in MMM]
    keys += [f"tokens/{t}/{s}" for t in ("response_length", "prompt_length") for s in MMM]
    keys += ["actor/lr", "actor/ppo_ratio_high_clipfrac", "actor/ppo_ratio_low_clipfrac", "actor/ppo_ratio_clipfrac",
             "actor/clipfrac", "actor/kl_loss", "actor/total_loss", "actor/approxkl", "actor/policykl",
             "actor/pg_loss", "actor/weighted_pg_loss", "actor/valid_samples", "actor/total_samples",
             "actor/valid_sample_ratio", "actor/sft_loss", "actor/positive_sft_loss", "actor/negative_sft_loss"]
    keys += [f"actor/ratio_{s}" for s in MMM] + [f"actor/sample_weights_{s}" for s in MMM]
    keys += ["system/tps", "system/samples", "time/rollout", "time/ref_log_probs_values_reward",
             "time/old_log_probs_values", "time/adv"]
    for phase in PHASES:
        keys += [f"time/{phase}/{p}" for p in ("total", "execute", "onload", "offload")]
        keys += [f"memory/cpu/{phase}/{st}/{k}" for st in ("start", "end") for k in ("rss", "vms")]
    for d in range(devices):
        for stage in ("start/offload", "start/onload", "end/onload", "end/offload"):
            keys += [f"memory/actor_train/train_step/{stage}/{k}/{d}"
                     for k in ("allocated", "reserved", "max_allocated", "max_reserved")]
        keys += [f"memory/actor_train/train_step/end/onload/{k}_frac/{d}" for k in ("max_allocated", "max_reserved")]
    return keys


def roll_style(keys: list[str], steps: list[dict[str, float]], log_dir: str) -> float:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=log_dir)
    t0 = time.perf_counter()
    for step, metrics in enumerate(steps):
        for k, v in metrics.items():
            writer.add_scalar(k, v, step)
    writer.close()
    return (time.perf_counter() - t0) / len(steps)


def rl_otel_side(steps: list[dict[str, float]], log_dir: str, scrape_every: int) -> tuple[float, float]:
    import rl_otel

    tel = rl_otel.init("bench", prometheus={"host": "127.0.0.1", "port": 0}, handle_sigterm=False,
                       trackers={"tensorboard": {"log_dir": log_dir}}, sink_queue_size=len(steps) + 1)
    url = metrics_url(tel)
    in_log = 0.0
    t0 = time.perf_counter()
    for step, metrics in enumerate(steps):
        t = time.perf_counter()
        tel.log(metrics, step=step)
        in_log += time.perf_counter() - t
        if scrape_every and step % scrape_every == 0:
            urllib.request.urlopen(url).read()
    tel.close()
    return (time.perf_counter() - t0) / len(steps), in_log / len(steps)


def measure(steps: int, devices: int, scrape_every: int, rounds: int = 5) -> dict[str, float]:
    """Seconds per step: the add_scalar loop, rl_otel end to end, and rl_otel's time inside log() (medians over
    interleaved rounds, the order alternating), and the medians of the per-round ratios."""
    keys = roll_step_keys(devices)
    rng = np.random.default_rng(0)
    data = [dict(zip(keys, rng.random(len(keys)).tolist(), strict=True)) for _ in range(steps)]
    base, ours, in_log = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        rl_otel_side(data[:20], os.path.join(tmp, "warm"), 0)  # imports, first-route caches of a fresh process
        roll_style(keys, data[:20], os.path.join(tmp, "warm_roll"))
        for r in range(rounds):
            if r % 2:
                base.append(roll_style(keys, data, os.path.join(tmp, f"roll{r}")))
            end_to_end, log_only = rl_otel_side(data, os.path.join(tmp, f"rl_otel{r}"), scrape_every)
            ours.append(end_to_end)
            in_log.append(log_only)
            if not r % 2:
                base.append(roll_style(keys, data, os.path.join(tmp, f"roll{r}")))
    return {"keys": len(keys), "roll": statistics.median(base), "ours": statistics.median(ours),
            "in_log": statistics.median(in_log),
            "ours_ratio": statistics.median(a / b for a, b in zip(ours, base, strict=True)),
            "in_log_ratio": statistics.median(a / b for a, b in zip(in_log, base, strict=True))}


def rows(quick: bool = False) -> list[Row]:
    m = measure(60 if quick else 100, 8, 0, 3 if quick else 7)
    base = "ROLL-style add_scalar loop"
    return [
        Row(f"log() of a ROLL step ({m['keys']} keys, 8 devices) + TensorBoard, time in log()", m["in_log"] * 1e3,
            m["roll"] * 1e3, "ms", "ratio <= 0.25", m["in_log_ratio"] <= 0.25, base, paired_ratio=m["in_log_ratio"]),
        Row("log() of a ROLL step + TensorBoard, end to end (flushed, closed)", m["ours"] * 1e3,
            m["roll"] * 1e3, "ms", "ratio <= 1", m["ours_ratio"] <= 1.0, base, paired_ratio=m["ours_ratio"]),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--scrape-every", type=int, default=0, help="scrape /metrics every N steps (0: never)")
    args = parser.parse_args()
    m = measure(args.steps, args.devices, args.scrape_every)
    print(f"keys per step: {m['keys']} ({args.devices} devices), steps: {args.steps}, "
          f"scrape every: {args.scrape_every or 'never'}")
    print(f"ROLL-style add_scalar loop (TensorBoard only): {m['roll'] * 1e3:8.3f} ms/step")
    print(f"rl_otel Prometheus + TensorBoard, end to end:  {m['ours'] * 1e3:8.3f} ms/step "
          f"(in log() on the training thread: {m['in_log'] * 1e3:.3f} ms)")
    print(f"ratio rl_otel / add_scalar loop: {m['ours'] / m['roll']:.3f}")


if __name__ == "__main__":
    main()
