"""Cost of one ``Telemetry.phase()`` (4 spans, CPU snapshots, ROLL keys through the catalog, histogram) against an
empty ``with`` block, on CPU, measured in one run.

    python benchmarks/bench_phase.py [--n 20000]
"""

from __future__ import annotations

import argparse
import contextlib
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the checkout's rl_otel, not an install

import rl_otel  # noqa: E402


def per_call_us(make, n: int) -> float:
    for _ in range(min(n, 1000)):  # warm up caches (router, series)
        with make():
            pass
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            with make():
                pass
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20_000, help="phases per timing round (best of 5)")
    args = parser.parse_args()
    tel = rl_otel.init(run="bench", prometheus={"host": "127.0.0.1", "port": 0})
    try:
        empty = per_call_us(contextlib.nullcontext, args.n)
        phase = per_call_us(lambda: tel.phase("actor_train", "train_step", onload=lambda: None,
                                              offload=lambda: None), args.n)
        tel.take_phase_metrics()
    finally:
        tel.close()
    print(f"empty with block : {empty:8.3f} us")
    print(f"tel.phase()      : {phase:8.3f} us per phase (spans + snapshots + metrics, CPU, no span exporter)")
    print(f"ratio            : {phase / empty:8.0f}x   (+{phase - empty:.1f} us per phase)")


if __name__ == "__main__":
    main()
