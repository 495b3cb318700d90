"""Issue 41 item 10: goodput durations run on the monotonic clock (a wall clock set forward or back between init()
and a step moves no counter) and a timer value no clock can produce (NaN, inf, negative, absurd) is refused and
counted; the hang watchdog ages a phase on the monotonic clock too."""

from __future__ import annotations

import math
import time

import pytest

from rl_otel._internal.probes import hangs as hangs_module
from rl_otel._internal.probes.hangs import HangWatch
from rl_otel._internal.probes.live import RunningPhases
from tests.test_goodput import _keyed, _read, _step, clock  # noqa: F401  # clock: the fixture

STEP = {"timing_s/step": 10.0, "timing_s/gen": 4.0}


@pytest.mark.parametrize("jump", [3600.0, -3600.0])
def test_a_wall_clock_set_between_init_and_a_step_moves_no_duration(clock, jump):  # noqa: F811
    """Before: +1 h made the wall time 3,611.8 s then 12.1 s (a counter reset to Prometheus); -1 h added an hour of
    made-up waiting."""
    recorder, g = _keyed(live_started=clock.unix() - 2.0)  # a live process started 2 s ago
    clock.advance(10.0)
    clock.unix_offset += jump  # NTP, or an operator, sets the wall clock
    _step(recorder, STEP, clock.unix())  # the recorder stamps the step with the wall clock
    first = _read(g)
    assert first == ({"startup": 2.0, "generation": 4.0, "waiting": 6.0}, 12.0)
    clock.advance(10.0)
    _step(recorder, STEP, clock.unix())
    buckets, wall = _read(g)
    assert wall == 22.0 and buckets["waiting"] == 12.0
    assert all(buckets.get(b, 0.0) >= v for b, v in first[0].items())  # no counter went back


@pytest.mark.parametrize("bad", [math.inf, math.nan, -1.0, 1e300, 31 * 86_400.0])
def test_a_timer_value_no_clock_can_produce_is_refused_and_counted(clock, bad):  # noqa: F811
    """Before: one inf made the counters inf (or NaN) for the rest of the run, 1e300 froze them; none counted."""
    recorder, g = _keyed()
    _step(recorder, {"timing_s/step": 10.0, "timing_s/gen": bad}, 100.0)
    _step(recorder, STEP, 110.0)
    buckets, wall = _read(g)
    assert buckets == {"generation": 4.0, "waiting": 16.0} and wall == 20.0
    assert all(math.isfinite(v) for v in buckets.values())
    errors = recorder.diagnostics.family((("run", "keys"),))
    counted = {dict(p.labels)["reason"]: p.value for p in errors.points} if errors is not None else {}
    assert counted.get("bad_duration") == 1.0, counted


def test_the_longest_timer_value_taken_is_thirty_days():
    from rl_otel._internal.pipeline.timing_keys import MAX_STEP_SECONDS

    assert MAX_STEP_SECONDS == 30 * 86_400.0


def test_a_phase_s_age_runs_on_the_monotonic_clock(tmp_path, monkeypatch):
    """Before: an 8 s phase across a +1 h step of the wall clock got a "stuck" dump."""
    running = RunningPhases()
    watch = HangWatch(base={"run": "r", "role": "trainer", "rank": "0"}, factor=5.0, quantile=0.9, min_s=60.0,
                      directory=str(tmp_path), count=lambda reason: None)
    watch.watch(running, start=False)
    started = running.enter("actor_train", "train_step")
    watch.check()  # first seen: 0 s old
    real = time.time
    monkeypatch.setattr(hangs_module.time, "time", lambda: real() + 3600.0)  # the wall clock set forward an hour
    watch.check()
    assert list(tmp_path.glob("stacks-*.txt")) == []
    running.leave("actor_train", "train_step", started)
    watch.close()
