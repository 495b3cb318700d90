"""Step overhead of full telemetry against a bare training loop, at 50, 200 and 1000 ms steps, and of the
TensorBoard way (what a ROLL-style trainer does without rl_otel) against the same loop.

    python benchmarks/bench_overhead.py [--steps-ms 50 200 1000] [--rounds 9]

A step is three phases whose bodies wait (``time.sleep``, the GIL released: a GPU step as its host thread sees
it, waiting on kernels) for a third of the step each. The four loops run the same steps:

- bare: the three waits, nothing else;
- rl_otel (the target rows): each wait inside ``tel.phase()``; then ``tel.submit(ppo_stats, ...)`` (ROLL keys) of a
  64x512 batch - the statistics on the metrics worker, as the README shows them, computed while the next step
  runs - and ``tel.log()`` of the ROLL reference's other step keys (``bench_bridge.roll_step_keys``, ~280 keys
  with the statistics), with the Prometheus endpoint scraped over HTTP once a second of rl_otel steps (each scrape
  starts during a step, on a thread of its own, and competes with it);
- rl_otel with the statistics on the training thread (for information): the same, with
  ``tel.log({**keys, **ppo_stats(...)})``: the statistics' ~1.7 ms of small CPU tensor ops are then in the step;
- the TensorBoard way: each wait inside ROLL-style bookkeeping (perf_counter timings + psutil snapshots), ROLL's
  own per-metric code for the same batch (``baselines.roll``), and ``SummaryWriter.add_scalar`` for every key.

Method: interleaved rounds (the loops' order alternating), each running the same number of steps of every loop;
the overhead is the median over rounds of (loop's time / bare loop's time) - 1. One torch thread.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's rl_otel, not an installed one
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
from bench_bridge import roll_step_keys
from bench_phase import PHASES, roll_style
from common import Row, torch_threads

from rl_otel.stats import ppo_stats

TARGETS = {50: 0.03, 200: 0.01}  # the issue's: <= 3% at 50 ms, <= 1% at 200 ms


class Scraper:
    """Scrapes ``url`` on its own thread when asked (``due()``), as Prometheus would once a second."""

    def __init__(self, url: str) -> None:
        self.url, self.asked, self.stop, self.count = url, threading.Event(), threading.Event(), 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            if self.asked.wait(0.1):
                self.asked.clear()
                urllib.request.urlopen(self.url, timeout=30).read()
                self.count += 1

    def close(self) -> None:
        self.stop.set()
        self.thread.join(30)


class Loops:
    def __init__(self, tel, log_dir: str) -> None:
        import bench_stats
        from baselines import roll as roll_baseline
        from torch.utils.tensorboard import SummaryWriter

        self.tel = tel
        self.case = bench_stats.Case("roll", 64, 512)
        self.roll_baseline = roll_baseline
        keys = roll_step_keys(8)
        rng = np.random.default_rng(0)
        self.steps = [dict(zip(keys, rng.random(len(keys)).tolist(), strict=True)) for _ in range(16)]
        self.writer = SummaryWriter(log_dir=log_dir)
        self.rolls = {f"{c}/{p}": roll_style({}, f"{c}/{p}") for c, p in PHASES}
        self.scraper = Scraper(tel.metrics_url)
        self.on_time, self.next_scrape, self.i = 0.0, 1.0, 0
        self.keys = len({**self.steps[0], **self.case.ours()})

    def bare(self, wait: float) -> None:
        for _ in PHASES:
            time.sleep(wait)

    def ours(self, wait: float) -> None:
        self._telemetry_step(wait, inline=False)

    def inline(self, wait: float) -> None:
        """As ``ours``, with the statistics computed on the training thread: ``log(ppo_stats(...))``."""
        self._telemetry_step(wait, inline=True)

    def _telemetry_step(self, wait: float, inline: bool) -> None:
        t0 = time.perf_counter()
        if self.on_time >= self.next_scrape:  # one scrape a second of rl_otel steps, during a step
            self.next_scrape += 1.0
            self.scraper.asked.set()
        tel = self.tel
        for cluster, phase in PHASES:
            with tel.phase(cluster, phase):
                time.sleep(wait)
        self.i += 1
        keys = self.steps[self.i % len(self.steps)]
        if inline:
            tel.log({**keys, **self.case.ours()}, step=self.i)
        else:
            # the statistics off the training thread, as the README shows: the metrics worker computes them while
            # the next step runs; the step's other keys are logged at the same step (queued behind the job)
            tel.submit(ppo_stats, **self.case.kwargs, step=self.i)
            tel.log(keys, step=self.i)
        self.on_time += time.perf_counter() - t0

    def tensorboard(self, wait: float) -> None:
        for cluster, phase in PHASES:
            with self.rolls[f"{cluster}/{phase}"](lambda: None, lambda: None):
                time.sleep(wait)
        self.i += 1
        c = self.case
        stats = self.roll_baseline.step_metrics(c.batch, pg_clip_low=0.2, pg_clip_high=0.28, value_clip=0.2)
        for key, value in {**self.steps[self.i % len(self.steps)], **stats}.items():
            self.writer.add_scalar(key, value, self.i)

    def close(self) -> None:
        self.scraper.close()
        self.writer.close()


def measure(steps_ms: list[int], rounds: int, seconds_per_round: float) -> dict[int, dict[str, float]]:
    import rl_otel

    out: dict[int, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp, torch_threads(1):
        tel = rl_otel.init("bench-overhead", prometheus={"host": "127.0.0.1", "port": 0}, handle_sigterm=False)
        loops = Loops(tel, tmp)
        try:
            names = ("bare", "ours", "inline", "tensorboard")
            for _ in range(3):  # warm-up: series, caches, the writer's thread
                for name in names:
                    getattr(loops, name)(0.001)
            for ms in steps_ms:
                wait = ms / 1e3 / len(PHASES)
                n = max(2, round(seconds_per_round / (ms / 1e3)))
                times: dict[str, list[float]] = {name: [] for name in names}
                for r in range(rounds):
                    for name in (names if r % 2 == 0 else names[::-1]):
                        step = getattr(loops, name)
                        t0 = time.perf_counter()
                        for _ in range(n):
                            step(wait)
                        times[name].append((time.perf_counter() - t0) / n)
                res = {name: statistics.median(v) * 1e3 for name, v in times.items()}
                for name in ("ours", "inline", "tensorboard"):
                    res[f"{name}_overhead"] = statistics.median(
                        a / b for a, b in zip(times[name], times["bare"], strict=True)) - 1.0
                res["steps"] = n * rounds
                out[ms] = res
            out[0] = {"keys": loops.keys, "scrapes": loops.scraper.count}
        finally:
            loops.close()
            tel.close()
    return out


def rows_from(m: dict[int, dict[str, float]]) -> list[Row]:
    out = []
    for ms, r in sorted(m.items()):
        if not ms:
            continue
        target = TARGETS.get(ms)
        out.append(Row(f"step overhead, full telemetry ({m[0]['keys']:.0f} keys, 3 phases, ppo_stats 64x512, "
                       f"1 scrape/s), {ms} ms step", r["ours"], r["bare"], "ms",
                       f"ratio <= {1 + target:.2f} (+{target:.0%})" if target else "-",
                       r["ours_overhead"] <= target if target else None, "bare loop",
                       paired_ratio=1.0 + r["ours_overhead"]))
        out.append(Row(f"step overhead, full telemetry with ppo_stats on the training thread, {ms} ms step",
                       r["inline"], r["bare"], "ms", "-", None, "bare loop", paired_ratio=1.0 + r["inline_overhead"]))
        out.append(Row(f"step overhead, the TensorBoard way (same keys), {ms} ms step", r["tensorboard"], r["bare"],
                       "ms", "-", None, "bare loop", paired_ratio=1.0 + r["tensorboard_overhead"]))
    return out


def rows(quick: bool = False) -> list[Row]:
    if quick:
        return rows_from(measure([50, 200], 3, 0.6))
    return rows_from(measure([50, 200, 1000], 9, 1.0))


def main() -> None:
    from common import table

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps-ms", type=int, nargs="+", default=[50, 200, 1000])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--seconds", type=float, default=1.0, help="seconds of each loop per round")
    args = parser.parse_args()
    m = measure(args.steps_ms, args.rounds, args.seconds)
    print(f"{args.rounds} interleaved rounds; {m[0]['scrapes']:.0f} scrapes; ratio = 1 + overhead")
    print(table(rows_from(m)))


if __name__ == "__main__":
    main()
