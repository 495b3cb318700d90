"""A watched run's goodput, from its timing keys: ``rl-otel watch`` reads each training loop's steps (built from the
loop's containment facts, ``tests.frameworks.step_values``, in the keys the framework's code logs) from a
``metrics.jsonl`` and serves, per run, buckets that hold every counted timer and add up to the wall time, which
covers every logged step (the watcher records a run's first step once more when it starts serving it: a replay,
counted once)."""

from __future__ import annotations

import json
import random

import pytest

from rl_otel.catalog import default_catalog
from rl_otel.catalog.goodput import BUCKETS, bucket_of, step_key_of
from rl_otel.catalog.goodput_nesting import LOOPS, Loop
from tests.frameworks import ALL_FRAMEWORKS, step_values
from tests.promtools import samples, scrape
from tests.test_watch_support import ThreadedWatcher, wait_for

STEPS = 3
_PRIME_COMPONENTS = ("trainer/", "orchestrator/")  # prime-rl's writers, as the watcher names their time/* keys


def _line_keys(framework: str, values: dict[str, float]) -> dict[str, float]:
    """The keys as the framework writes them: prime-rl's trainer and orchestrator write plain ``time/*`` (the
    watcher tells them apart by the keys only one of them writes)."""
    if framework != "prime_rl":
        return values
    return {next((key[len(c):] for c in _PRIME_COMPONENTS if key.startswith(c)), key): v for key, v in values.items()}


def _counted(loop: Loop, key: str) -> str | None:
    res = default_catalog(loop.framework).resolve(key)
    return bucket_of(res.spec, res.labels)


def _seconds(loop: Loop, key: str, value: float) -> float:
    """A logged value in seconds (ROLL's ``expand/expand_duration_ms`` is logged in milliseconds)."""
    return value * default_catalog(loop.framework).resolve(key).spec.scale


@pytest.mark.parametrize("framework", ALL_FRAMEWORKS)
def test_a_watched_run_s_buckets_hold_its_timers_and_add_up_to_its_steps(tmp_path, framework):
    rng = random.Random(framework)
    loops = [loop for loop in LOOPS if loop.framework == framework
             and any(_counted(loop, key) for key in loop.all_keys())]
    expected: dict[str, tuple[Loop, dict[str, float], float]] = {}
    for i, loop in enumerate(loops):
        run = f"{framework}-{i}"
        leaves = dict.fromkeys(BUCKETS, 0.0)
        steps_wall = 0.0
        lines = []
        for step in range(STEPS):
            values = step_values(loop, rng)
            for key, value in values.items():
                bucket = _counted(loop, key)
                if bucket is not None:
                    leaves[bucket] += _seconds(loop, key, value)
            steps_wall += _seconds(loop, loop.step, values[loop.step]) if loop.step else 0.0
            lines.append(json.dumps({"step": step, **_line_keys(framework, values)}))
        (tmp_path / "runs" / run).mkdir(parents=True)
        (tmp_path / "runs" / run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
        expected[run] = (loop, leaves, steps_wall)
    assert expected, framework
    watcher = ThreadedWatcher([str(tmp_path / "runs")], framework=framework)
    try:
        for run, (loop, leaves, steps_wall) in expected.items():
            url = watcher.url(run)

            def read(url: str = url, run: str = run) -> tuple[dict[str, float], float] | None:
                text = scrape(url)  # every run the watcher follows, on one endpoint: this run's series
                ours = ("run", run)
                if [v for k, v in samples(text, "rl_step").items() if ours in k] != [STEPS - 1.0]:
                    return None  # not every line read yet
                buckets = {dict(k)["bucket"]: v for k, v in samples(text, "rl_goodput_bucket_seconds_total").items()
                           if ours in k}
                (wall,) = [v for k, v in samples(text, "rl_goodput_wall_seconds_total").items() if ours in k]
                return buckets, wall

            buckets, wall = wait_for(read, what=f"{run}'s steps served")
            assert sum(buckets.values()) == pytest.approx(wall), (loop.name, buckets, wall)
            assert wall >= steps_wall - 1e-6 and wall >= sum(leaves.values()) - 1e-6 > 0, (loop.name, wall)
            step_res = default_catalog(framework).resolve(loop.step) if loop.step else None
            rest = step_key_of(step_res.spec, step_res.labels).rest if step_res else "waiting"  # type: ignore[union-attr]
            for bucket in BUCKETS:
                if bucket == rest:  # the step time the timers leave over goes here too
                    assert buckets[bucket] >= leaves[bucket] - 1e-6, (loop.name, bucket, buckets, leaves)
                else:
                    assert buckets[bucket] == pytest.approx(leaves[bucket], abs=1e-6), (loop.name, bucket, buckets,
                                                                                         leaves)
    finally:
        watcher.close()
