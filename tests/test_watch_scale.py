"""``rl-otel watch`` beside a shared log directory (issue 35): one endpoint serves every run, so threads and
descriptors stay bounded whatever the number of runs, and a new training is served though hundreds of finished
runs sit beside it under a small ``ulimit -n`` (before: a port and two server threads per run; with
``ulimit -n 1024`` and 400 finished runs a new training was never served). The figures at 5,000 runs:
``benchmarks/bench_watch_scale.py``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from bench_watch_scale import measure

pytestmark = pytest.mark.slow  # the slow layer (tests/conftest.py)


def test_hundreds_of_runs_hold_a_few_threads_and_descriptors_and_a_new_run_is_served():
    # 300 runs of 3 files: 128 descriptors would not even hold the old watcher's sockets for 40 runs
    figures = measure(runs=300, files=3, nofile=128, timeout_s=600)  # raises if a run or the new one is not served
    assert figures["threads"] <= 6, figures  # the poll loop and the endpoint's two threads, whatever the runs
    assert figures["fds"] <= 40, figures
