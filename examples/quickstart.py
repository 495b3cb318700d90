"""A small training-shaped loop that logs ROLL, TRL and Trinity-RFT metrics through rl_otel.

Run it and scrape the printed URL (or point Prometheus at it). It stands in for `rl-otel demo` (a real PPO run)
until that lands.
"""

from __future__ import annotations

import argparse
import math
import random
import time

import rl_otel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--port", type=int, default=9464, help="0 picks a free port")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between steps")
    parser.add_argument("--linger", type=float, default=0.0, help="keep serving this long after the last step")
    args = parser.parse_args()

    rng = random.Random(0)
    with rl_otel.init(run="quickstart", prometheus={"port": args.port}) as tel:
        print(f"serving metrics on {tel.metrics_url}", flush=True)
        for step in range(args.steps):
            progress = step / max(1, args.steps - 1)
            score = 0.2 + 0.6 * progress + rng.gauss(0, 0.05)
            tel.log({
                "critic/score": {"mean": score, "max": min(1.0, score + 0.2), "min": max(0.0, score - 0.2)},
                "actor/approxkl": 0.002 + 0.001 * rng.random(),
                "actor/clipfrac": 0.05 + 0.02 * rng.random(),
                "actor/pg_loss@sum": -0.1 * math.exp(-progress),
                "critic/entropy/mean": 1.5 * (1 - 0.3 * progress),
                "tokens/response_length/mean": 200 + 50 * progress,
                "system/tps": 1000 + 50 * rng.random(),
                "system/samples": 64 * (step + 1),
                "time/actor_train/train_step/total": 0.8 + 0.1 * rng.random(),
                "memory/actor_train/train_step/end/onload/max_allocated/0": 10.5,
                "env/reward_dist": [rng.gauss(score, 0.3) for _ in range(64)],
                "rollout/accuracy/mean": score,
                "eval/gsm8k/accuracy/mean@4": score - 0.05,
            }, step=step)
            print(f"step {step:4d}  score {score:.3f}", flush=True)
            time.sleep(args.interval)
        if args.linger > 0:
            print(f"training done; serving {tel.metrics_url} for {args.linger:.0f}s more", flush=True)
            time.sleep(args.linger)


if __name__ == "__main__":
    main()
