"""Step rate of a full-catalog loop (438 seed keys) with and without 4 clients scraping /metrics at 20 Hz each.

Both phases run in the same process against the same Telemetry, alternating (quiet, scraped, quiet, scraped, ...)
so drift on a shared machine hits both alike; the ratio of the medians is printed. A scrape renders every series
on a server thread that competes with the loop for the GIL, so the ratio is the price of being scraped that hard
(Prometheus itself scrapes every 15 s, 300x less often). ``--work-ms`` adds a GIL-free wait per step (a GPU step
the host waits on): the default 0 is the worst case, a loop that does nothing but log.

    python benchmarks/bench_load.py [--steps 1000] [--rounds 3] [--clients 4] [--hz 20] [--work-ms 0]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's rl_otel, not an install

import rl_otel
from tests._workload import FullStep


def scrape_loop(url: str, hz: float, stop: threading.Event, counts: list[int], errors: list[str]) -> None:
    next_at = time.monotonic()
    while not stop.is_set():
        try:
            urllib.request.urlopen(url, timeout=30).read()
            counts[0] += 1
        except Exception as exc:
            errors.append(repr(exc))
        next_at += 1 / hz
        stop.wait(max(0.0, next_at - time.monotonic()))


def run_steps(tel, workload: FullStep, first: int, n: int, work_s: float = 0.0) -> float:
    """Steps per second over ``n`` steps (the step dicts are built beforehand: only ``log()`` and the wait are
    timed)."""
    steps = [workload.step(s) for s in range(first, first + n)]
    t0 = time.perf_counter()
    for i, metrics in enumerate(steps):
        if work_s:
            time.sleep(work_s)
        tel.log(metrics, step=first + i)
    return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--hz", type=float, default=20.0)
    ap.add_argument("--work-ms", type=float, default=0.0)
    args = ap.parse_args()
    workload = FullStep()
    tel = rl_otel.init("bench-load", prometheus={"host": "127.0.0.1", "port": 0}, handle_sigterm=False)
    quiet: list[float] = []
    loaded: list[float] = []
    errors: list[str] = []
    scrapes = 0
    step = 0
    run_steps(tel, workload, step, 200)  # warm up: every series exists, the router's cache is full
    step += 200
    for _ in range(args.rounds):
        quiet.append(run_steps(tel, workload, step, args.steps, args.work_ms / 1e3))
        step += args.steps
        stop, counts = threading.Event(), [0]
        threads = [threading.Thread(target=scrape_loop, args=(tel.metrics_url, args.hz, stop, counts, errors),
                                    daemon=True) for _ in range(args.clients)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        loaded.append(run_steps(tel, workload, step, args.steps, args.work_ms / 1e3))
        elapsed = time.perf_counter() - t0
        stop.set()
        for t in threads:
            t.join(30)
        step += args.steps
        scrapes += counts[0]
        print(f"round: quiet {quiet[-1]:7.1f} steps/s, scraped {loaded[-1]:7.1f} steps/s, "
              f"{counts[0]} scrapes in {elapsed:.2f} s ({counts[0] / elapsed:.1f}/s)")
    tel.close()
    q, s = statistics.median(quiet), statistics.median(loaded)
    print(f"{len(workload.keys)} keys/step, {args.clients} clients x {args.hz:g} Hz, {args.steps} steps x "
          f"{args.rounds} rounds, {args.work_ms:g} ms of work/step, {scrapes} scrapes, {len(errors)} scrape errors")
    print(f"step rate: quiet {q:.1f} steps/s, scraped {s:.1f} steps/s, ratio scraped/quiet {s / q:.3f} "
          f"(a {100 * (1 - s / q):.1f}% drop)")


if __name__ == "__main__":
    main()
