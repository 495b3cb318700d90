"""End to end: the demo's PPO training step with rl_otel fully on, against the same loop with telemetry off.

    python benchmarks/bench_demo.py [--steps 12] [--rounds 8] [--big]

"Fully on" is what the README's main job runs: a Prometheus endpoint scraped once a second over HTTP, five
phases a step with real onload/offload and memory snapshots, ``ppo_stats`` with 15 distributions, Trinity-style
rollout and eval aggregation, ``log()`` of ~100 keys, and a TensorBoard tracker. "Off" is
``rl_otel.demo.run(telemetry=False)``: the same math (identical scores, a test checks it) with no rl_otel call.
Each round runs both, alternating which goes first; the figure is the median whole-iteration time over every
round (the first two steps of a run, warm-up, are left out). ``--big`` also runs a heavier configuration (batch
512, hidden 1024), closer to a real step's length, to show how the cost scales.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's rl_otel, not an installed one
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import Row  # noqa: E402

TARGET = 0.01  # overhead under 1% of step time


def _scraper(url: str, stop: threading.Event, period: float = 1.0) -> None:
    while not stop.wait(period):
        try:
            urllib.request.urlopen(url, timeout=5).read()
        except OSError:
            pass


def iteration_seconds(config, telemetry: bool, logging: list[float] | None = None) -> list[float]:
    """One demo run's whole-iteration times, telemetry fully on (endpoint + scraper + TensorBoard) or off;
    ``logging`` collects, for the "on" run, each step's statistics + ``log()`` time (iteration minus training)."""
    import rl_otel
    from rl_otel.demo.ppo import run

    if not telemetry:
        return run(config, telemetry=False).iteration_seconds[2:]
    with tempfile.TemporaryDirectory(prefix="bench_demo_") as log_dir:
        tel = rl_otel.init(run="bench-demo", prometheus={"host": "127.0.0.1", "port": 0},
                           trackers={"tensorboard": {"log_dir": log_dir}})
        stop = threading.Event()
        scraper = threading.Thread(target=_scraper, args=(tel.metrics_url, stop), daemon=True)
        scraper.start()
        try:
            result = run(config, telemetry=tel)
            if logging is not None:
                logging.extend(i - s for i, s in zip(result.iteration_seconds[2:], result.step_seconds[2:]))
            return result.iteration_seconds[2:]
        finally:
            stop.set()
            scraper.join()
            tel.close()


def measure(config, rounds: int) -> tuple[float, float, float]:
    """Median iteration seconds (on, off) over ``rounds`` alternating pairs of short runs (a shared machine's
    speed drifts: short alternating runs expose both sides to it alike), and the median statistics + log() time
    of an "on" step."""
    on: list[float] = []
    off: list[float] = []
    logging: list[float] = []
    for r in range(rounds):
        order = (True, False) if r % 2 == 0 else (False, True)
        for telemetry in order:
            (on if telemetry else off).extend(iteration_seconds(config, telemetry, logging))
    return statistics.median(on), statistics.median(off), statistics.median(logging)


def rows(quick: bool = False, big: bool = False, steps: int | None = None, rounds: int | None = None) -> list[Row]:
    from rl_otel.demo.ppo import DemoConfig

    steps = steps or (8 if quick else 12)
    rounds = rounds or (2 if quick else 8)
    configs = [("demo step (B=128, hidden 256)", DemoConfig(steps=steps, eval_every=5))]
    if big:
        configs.append(("demo step (B=512, hidden 1024)",
                        DemoConfig(steps=max(4, steps // 3), eval_every=5, batch_size=512, minibatch_size=256,
                                   hidden=1024)))
    out = []
    for name, config in configs:
        on, off, logging = measure(config, rounds)
        out.append(Row(f"{name}, rl_otel fully on", on * 1e3, off * 1e3, "ms", f"overhead < {TARGET:.0%}",
                       on / off - 1 < TARGET, "the same loop, telemetry off"))
        out.append(Row(f"{name}: ppo_stats + rollout/eval aggregation + log() in it", logging * 1e3, off * 1e3,
                       "ms", "-", None, "the step, telemetry off"))
    return out


def main() -> None:
    from common import table

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--big", action="store_true", help="also a heavier configuration (batch 512, hidden 1024)")
    args = parser.parse_args()
    result = rows(big=args.big, steps=args.steps, rounds=args.rounds)
    print(table(result))
    for r in result[::2]:
        print(f"{r.name}: {r.measured:.1f} ms on vs {r.baseline:.1f} ms off -> overhead {r.ratio - 1:+.2%}")


if __name__ == "__main__":
    main()
