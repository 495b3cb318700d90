"""The ROLL integration through ROLL's documented tracker interface (roll.md §1-2): the registry and
``track_with``, ``resume_metrics`` replaying the history from a thread pool after a restart, and a pipeline that
never calls ``finish()``."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rl_otel import ConfigurationError
from tests._readers import tensorboard_scalars
from tests._sinks import Recorder
from tests.promtools import key_samples, samples, scrape

pytestmark = pytest.mark.slow  # the slow layer (tests/conftest.py)

ROOT = Path(__file__).resolve().parent.parent
LOCAL = {"prometheus": {"host": "127.0.0.1", "port": 0}}


def test_roll_tracker_from_the_registry_by_track_with():
    from rl_otel.integrations.roll import RLOtelTracker, register

    tracker_registry: dict = {}  # ROLL's roll.utils.tracking.tracker_registry: name -> class
    register(tracker_registry)
    tracker = tracker_registry["rl_otel"]({"exp_name": "roll-exp", "track_with": "rl_otel"}, **LOCAL)
    assert isinstance(tracker, RLOtelTracker)
    tracker.log({"actor/pg_loss@sum": 0.5, "critic/score/mean": 0.25}, step=3, extra="ignored")
    url = tracker.telemetry.metrics_url
    assert key_samples(url, "actor/pg_loss", "roll-exp") == {frozenset(): 0.5}
    assert key_samples(url, "critic/score/mean", "roll-exp") == {frozenset({("stat", "mean")}): 0.25}
    # ROLL's BaseTracker.log_traces (trace records, not metrics) is accepted and changes no series
    def series(text: str) -> set[str]:
        return {line.rsplit(" ", 1)[0] for line in text.splitlines() if line and not line.startswith("#")}

    before = series(scrape(url))
    tracker.log_traces("rollout_traces", [{"messages": [{"role": "user", "content": "hi"}]}], step=3)
    assert series(scrape(url)) == before
    tracker.finish()
    tracker.finish()  # idempotent


def test_roll_tracker_refuses_an_unknown_option_by_name():
    from rl_otel.integrations.roll import RLOtelTracker

    with pytest.raises(ConfigurationError, match="log_dirr"):
        RLOtelTracker({}, log_dirr="x")


def roll_step(step: int) -> dict:
    """One step's dict as ROLL logs it and keeps in ``log_history``: reducer tags, a cumulative counter."""
    return {"system/step": step, "critic/score/mean": step / 1000, "actor/pg_loss@sum": 1.0 / (step + 1),
            "system/samples": (step + 1) * 8, "time/step_total": 0.5}


def make_tracker(run: str):
    from rl_otel.integrations.roll import register

    registry: dict = {}
    register(registry)
    Recorder.instances.clear()
    tracker = registry["rl_otel"]({"exp_name": run}, trackers=["recorder"], handle_sigterm=False, **LOCAL)
    (recorder,) = Recorder.instances
    return tracker, recorder


def replay(tracker, history: list[dict]) -> None:
    """ROLL's ``BasePipeline.resume_metrics`` (base_pipeline.py:79-81)."""
    for metrics in history:
        tracker.log(values=metrics, step=metrics["system/step"])


def test_replay_from_a_thread_never_moves_the_endpoint_back_and_trackers_get_the_history():
    """The DPO ordering: the first new steps are logged while the executor still replays the history (roll.md
    §2). rl_step and the counter seen by a scraper never decrease; the endpoint ends at the newest step; the
    trackers get every replayed step with its own values."""
    tracker, recorder = make_tracker("roll-resume")
    url = tracker.telemetry.metrics_url
    run = frozenset({("run", "roll-resume"), ("role", "trainer"), ("rank", "0")})
    history = [roll_step(s) for s in range(100)]
    tracker.log(roll_step(100), step=100)  # the first resumed step, before the replay runs

    seen: list[tuple[float, float]] = []
    done = threading.Event()

    def scraper() -> None:  # what Prometheus would record while the replay and the new steps interleave
        while not done.is_set():
            text = scrape(url)
            seen.append((samples(text, "rl_step")[run], samples(text, "rl_system_samples_total")[run]))

    watcher = threading.Thread(target=scraper)
    watcher.start()
    try:
        with ThreadPoolExecutor(max_workers=5) as executor:  # ROLL's self.executor
            replaying = executor.submit(replay, tracker, history)
            for step in range(101, 111):
                tracker.log(roll_step(step), step=step)
            replaying.result(timeout=60)
    finally:
        done.set()
        watcher.join(timeout=60)
    text = scrape(url)
    seen.append((samples(text, "rl_step")[run], samples(text, "rl_system_samples_total")[run]))
    assert all(a <= b for a, b in itertools.pairwise(seen)), "rl_step or a counter went back"
    assert seen[-1] == (110.0, (110 + 1) * 8)
    assert key_samples(url, "critic/score/mean", "roll-resume") == {frozenset({("stat", "mean")}): 0.11}
    assert tracker.telemetry.flush(30)
    assert sorted(step for step, _ in recorder.steps) == list(range(111))
    logged = dict(recorder.steps)
    assert logged[42]["critic/score/mean"] == 0.042 and logged[42]["system/samples"] == 43 * 8
    tracker.finish()


def test_a_replay_before_the_first_new_step_ends_at_the_checkpoint():
    """The RLVR / agentic ordering: do_checkpoint waits for the replay before the first new step is logged, so
    the history arrives in step order and the endpoint ends at the checkpoint's step."""
    tracker, recorder = make_tracker("roll-rlvr")
    with ThreadPoolExecutor(max_workers=5) as executor:
        executor.submit(replay, tracker, [roll_step(s) for s in range(50)]).result(timeout=60)
    url = tracker.telemetry.metrics_url
    run = frozenset({("run", "roll-rlvr"), ("role", "trainer"), ("rank", "0")})
    assert samples(scrape(url), "rl_step") == {run: 49.0}
    tracker.log(roll_step(50), step=50)
    assert samples(scrape(url), "rl_step") == {run: 50.0}
    assert samples(scrape(url), "rl_system_samples_total") == {run: 51 * 8}
    assert tracker.telemetry.flush(30) and [s for s, _ in recorder.steps] == list(range(51))
    tracker.finish()


# A ROLL driver: the tracker from the registry, steps logged, and no finish() - ROLL never calls it.
NO_FINISH = """
import sys
from rl_otel.integrations.roll import register
registry = {}
register(registry)
tracker = registry["rl_otel"]({"exp_name": "roll-exit"}, prometheus={"host": "127.0.0.1", "port": 0},
                              trackers={"tensorboard": {"log_dir": sys.argv[1]}})
for step in range(5):
    tracker.log({"critic/score/mean": step / 10, "actor/pg_loss@sum": 1.0}, step=step)
print("logged", flush=True)
"""


def test_without_finish_the_exit_hook_flushes_the_trackers(tmp_path):
    proc = subprocess.run([sys.executable, "-c", NO_FINISH, str(tmp_path)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0 and proc.stdout.strip() == "logged", proc.stderr[-3000:]
    scalars = tensorboard_scalars(str(tmp_path))
    assert scalars["critic/score/mean"] == [(s, pytest.approx(s / 10)) for s in range(5)]
