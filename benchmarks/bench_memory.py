"""Resident memory, threads and file descriptors over a long run: 100,000 steps of the full catalog (438 seed
keys, 8 of them distributions), scraped every ``--scrape-every`` steps, mirrored to a tracker. Prints the
footprint at checkpoints and the growth after the warm-up (1,000 steps: every series, cache and buffer exists).

    python benchmarks/bench_memory.py [--steps 100000] [--tracker tensorboard|stdout|none] [--scrape-every 1000]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's rl_otel, not an install

import rl_otel
from tests._footprint import Footprint
from tests._workload import FullStep

WARM_UP = 1_000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--tracker", choices=["tensorboard", "stdout", "none"], default="tensorboard")
    ap.add_argument("--scrape-every", type=int, default=1_000)
    args = ap.parse_args()
    workload = FullStep()
    checkpoints = sorted({WARM_UP, *(args.steps * k // 10 for k in range(1, 11))})
    with tempfile.TemporaryDirectory() as tmp:
        trackers = {"none": {}, "stdout": {"stdout": {"file": f"{tmp}/out.log"}},
                    "tensorboard": {"tensorboard": {"log_dir": f"{tmp}/tb"}}}[args.tracker]
        before = Footprint.now()
        print(f"before init        {before}")
        tel = rl_otel.init("bench-memory", prometheus={"host": "127.0.0.1", "port": 0}, handle_sigterm=False,
                           trackers=trackers)
        url = tel.metrics_url
        assert url is not None
        t0 = time.perf_counter()
        seen: dict[int, Footprint] = {}
        for step in range(args.steps):
            tel.log(workload.step(step), step=step)
            if step % args.scrape_every == 0:
                urllib.request.urlopen(url, timeout=30).read()
            if step + 1 in checkpoints:
                tel.flush(60)
                seen[step + 1] = now = Footprint.now()
                print(f"after {step + 1:7d} steps {now}  ({(step + 1) / (time.perf_counter() - t0):.0f} steps/s)",
                      flush=True)
        tel.close()
        closed = Footprint.now()
    print(f"after close        {closed}")
    end = seen[args.steps]
    for start in (WARM_UP, checkpoints[1]):  # a tracker's own buffers and malloc arenas may still grow at 1,000
        growth = end.rss - seen[start].rss
        print(f"RSS growth from step {start} to {args.steps}: {growth / 2**20:+.1f} MiB "
              f"({growth / (args.steps - start):+.1f} B/step)")
    print(f"{len(workload.keys)} keys/step, tracker {args.tracker}: threads {seen[WARM_UP].threads} -> {end.threads}, "
          f"fds {seen[WARM_UP].fds} -> {end.fds}; after close: threads {closed.threads} (before init "
          f"{before.threads}), fds {closed.fds} (before init {before.fds})")


if __name__ == "__main__":
    main()
