"""No leak: after a warm-up, thousands of full-catalog steps (Prometheus scraped, mirrored through the bridge)
leave the resident memory flat and the thread and file-descriptor counts unchanged; close() gives the threads and
files back. The tracker here keeps only the last step, so that the test measures rl_otel rather than a tracker's
own buffers and stays fast; the 100,000-step runs with TensorBoard and stdout are ``benchmarks/bench_memory.py``.
"""

from __future__ import annotations

import os
import threading
import urllib.request

import pytest

import rl_otel
from rl_otel.sinks import register_sink
from tests._footprint import Footprint
from tests._workload import FullStep

pytestmark = pytest.mark.slow  # the slow layer (tests/conftest.py)


class LastStep:
    """A tracker that keeps only the step it got last."""

    def __init__(self, *, run: str) -> None:
        self.last: tuple[int, dict] | None = None

    def log(self, metrics, step) -> None:
        self.last = (step, metrics)

    def close(self) -> None:
        self.last = None


register_sink("last_step", lambda **kw: LastStep(**kw))

WARM_UP, STEPS, SCRAPE_EVERY = 1_000, 5_000, 500
RSS_SLACK = 8 * 2**20  # allocator noise; a leak of 2 kB per step would be 8 MiB here


def test_steps_leave_memory_threads_and_fds_flat():
    workload = FullStep()
    before = Footprint.now()
    threads_before = set(threading.enumerate())
    fds_before = set(os.listdir("/proc/self/fd"))
    tel = rl_otel.init("memory", prometheus={"host": "127.0.0.1", "port": 0}, handle_sigterm=False,
                       trackers=["last_step"], sink_queue_size=STEPS)  # no step dropped: all cross the bridge
    for step in range(STEPS):
        tel.log(workload.step(step), step=step)
        if step % SCRAPE_EVERY == 0:
            urllib.request.urlopen(tel.metrics_url, timeout=30).read()
        if step == WARM_UP:
            assert tel.flush(30)
            warm = Footprint.now()
    assert tel.flush(30)
    end = Footprint.now()
    tel.close()
    closed = Footprint.now()
    assert end.rss - warm.rss < RSS_SLACK, f"after warm-up: {warm}; after {STEPS} steps: {end}"
    # none grows (one may end meanwhile: a thread an earlier test of the process left finishing its work)
    assert end.threads <= warm.threads and end.fds <= warm.fds, f"{warm} -> {end}"
    # nothing this Telemetry made is left (counted by identity: an earlier test's thread may end meanwhile)
    assert [t.name for t in set(threading.enumerate()) - threads_before if t.is_alive()] == [], f"{before} -> {closed}"
    left = set(os.listdir("/proc/self/fd")) - fds_before
    assert not [fd for fd in left if os.path.exists(f"/proc/self/fd/{fd}")], f"{before} -> {closed}"
