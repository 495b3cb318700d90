"""``Telemetry.log()`` per key: one ROLL step of scalars (no trackers) against the code a user would otherwise run.

    python benchmarks/bench_log.py [--rounds 15] [--devices 8]

Three sides log the same steps (the ROLL reference's keys, ``bench_bridge.roll_step_keys``: ~150 scalars plus the
GPU memory keys of one phase on 8 devices; fresh values every step, built beforehand):

- rl_otel: ``tel.log(step_metrics, step=i)``, the Prometheus endpoint on, no trackers;
- prometheus_client written by hand, the fastest way it offers: one ``Gauge`` per key, its labelled child
  (``run``, ``rank``) looked up once and cached in a dict, then ``children[key].set(value)`` per key;
- a minimal Python series store, the floor of any Python implementation: a dict lookup, a float check, a unit
  scale and a timestamp per key (``MinimalStore``).

Method: interleaved A/B rounds (``common.ab_rounds``; every round logs the same number of steps on each side), the
median of the per-round ratios. Figures are ns per key.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's rl_otel, not an installed one
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
from bench_bridge import roll_step_keys
from common import Row, ab_rounds

STEPS = 40  # distinct step dicts, cycled


class CachedChildren:
    """prometheus_client as a user writes it for speed: a Gauge per key, the labelled child cached."""

    def __init__(self, keys: list[str]) -> None:
        from prometheus_client import CollectorRegistry, Gauge

        self.registry = CollectorRegistry(auto_describe=False)
        self.children = {}
        for key in keys:
            name = "rl_" + re.sub(r"[^a-zA-Z0-9_]", "_", key)
            self.children[key] = Gauge(name, key, ["run", "rank"], registry=self.registry).labels(run="bench",
                                                                                                  rank="0")

    def log(self, metrics: dict[str, float], step: int) -> None:
        children = self.children
        for key, value in metrics.items():
            children[key].set(value)


class _Series:
    __slots__ = ("scale", "ts", "value")

    def __init__(self, scale: float) -> None:
        self.scale, self.value, self.ts = scale, 0.0, 0.0


class MinimalStore:
    """The floor: per key a dict lookup, a float check, a unit scale, a timestamp (no labels, no exposition)."""

    def __init__(self) -> None:
        self.series: dict[str, _Series] = {}

    def log(self, metrics: dict[str, float], step: int) -> None:
        now = time.time()
        series = self.series
        for key, value in metrics.items():
            s = series.get(key)
            if s is None:
                s = series[key] = _Series(2.0 ** -30 if key.startswith("memory/") else 1.0)
            if type(value) is not float:
                value = float(value)
            s.value = value * s.scale
            s.ts = now


def measure(rounds: int, devices: int = 8) -> dict[str, float]:
    import rl_otel

    keys = roll_step_keys(devices)
    rng = np.random.default_rng(0)
    steps = [dict(zip(keys, rng.random(len(keys)).tolist(), strict=True)) for _ in range(STEPS)]
    tel = rl_otel.init("bench-log", prometheus={"host": "127.0.0.1", "port": 0}, handle_sigterm=False)
    try:
        prom, floor = CachedChildren(keys), MinimalStore()
        counters = [0, 0, 0]

        def side(i: int, log, finish=None):
            def run() -> None:
                for metrics in steps:
                    counters[i] += 1
                    log(metrics, step=counters[i])
                if finish is not None:
                    finish()  # work log() handed to another thread is counted too
            return run

        timing = ab_rounds([side(0, tel.log, tel.flush), side(1, prom.log), side(2, floor.log)], rounds, inner=1,
                           budget_s=3.0)
    finally:
        tel.close()
    per_key = 1e9 / (STEPS * len(keys))
    return {"keys": len(keys), "ours": timing.median(0) * per_key, "prom": timing.median(1) * per_key,
            "floor": timing.median(2) * per_key, "vs_prom": timing.ratio(0, 1), "vs_floor": timing.ratio(0, 2)}


def rows_from(m: dict[str, float]) -> list[Row]:
    name = f"log() per key, ROLL step of {m['keys']} keys (no trackers)"
    return [Row(name, m["ours"], m["prom"], "ns/key", "ratio <= 1", m["vs_prom"] <= 1.0,
                "prometheus_client by hand, cached children", paired_ratio=m["vs_prom"]),
            Row(name, m["ours"], m["floor"], "ns/key", "ratio <= 3", m["vs_floor"] <= 3.0,
                "minimal Python series store", paired_ratio=m["vs_floor"])]


def rows(quick: bool = False) -> list[Row]:
    return rows_from(measure(7 if quick else 21))


def main() -> None:
    from common import table

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--devices", type=int, default=8)
    args = parser.parse_args()
    m = measure(args.rounds, args.devices)
    print(f"{m['keys']} keys a step; {args.rounds} interleaved rounds of {STEPS} steps each side; ns per key")
    print(table(rows_from(m)))


if __name__ == "__main__":
    main()
