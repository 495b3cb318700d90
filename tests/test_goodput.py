"""Where the time goes (``rl_otel/_internal/pipeline/goodput.py``, ``timing_keys.py``): the goodput buckets of a
process's phases (exclusive time, parts, collectives, waiting), of its start-up and of the frameworks' timing keys,
read back as the endpoint serves them. The accounting's clock is a fake one the tests move, so every number is
exact; the demo's real run checks the buckets against the process's own wall time."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

import rl_otel
from rl_otel._internal.pipeline import goodput as goodput_module
from rl_otel._internal.pipeline.goodput import Goodput
from rl_otel._internal.probes import live as live_probes
from rl_otel._internal.runtime.assembly import Pipeline, pipeline
from rl_otel.catalog import default_catalog
from rl_otel.catalog.goodput import BUCKETS
from tests.promtools import promtool_check, samples, scrape

ROOT = Path(__file__).resolve().parent.parent
BUCKET = "rl_goodput_bucket_seconds_total"
WALL = "rl_goodput_wall_seconds_total"


class Clock:
    """The accounting's clocks: ``perf_counter`` and ``time`` (Unix time, the real one when made) move together,
    only when a test advances them."""

    def __init__(self) -> None:
        self.t = 1_000.0
        self.unix_offset = time.time() - self.t

    def perf(self) -> float:
        return self.t

    def unix(self) -> float:
        return self.t + self.unix_offset

    def advance(self, seconds: float) -> None:
        self.t += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(goodput_module, "perf_counter", fake.perf)
    monkeypatch.setattr(goodput_module, "time", fake.unix)
    return fake


def _buckets(read) -> dict[str, float]:
    return {b: read(BUCKET, bucket=b) for b in BUCKETS}


def _tel(**kwargs):
    return rl_otel.init(run="goodput", prometheus=False, handle_sigterm=False, **kwargs)


# ------------------------------------------------------------------------------------------------ phases


def test_phases_count_exclusive_time_parts_collectives_and_the_time_between(clock):
    tel = _tel()
    try:
        read = tel.value
        startup = read(BUCKET, bucket="startup")
        assert startup > 0 and read(WALL) == startup  # start-up served as it runs, before any phase
        clock.advance(2.0)
        assert read(BUCKET, bucket="startup") == pytest.approx(startup + 2.0)
        with tel.phase("actor_train", "train_step", onload=lambda: clock.advance(1.0),
                       offload=lambda: clock.advance(0.5)):
            clock.advance(3.0)
            with tel.phase("actor_infer", "generate"):  # nested: its time is its own, not the outer phase's
                clock.advance(4.0)
                assert read(BUCKET, bucket="generation") == pytest.approx(4.0)  # a running phase, served live
                with tel.collective("allreduce"):  # inside a phase: waiting, not the phase's work
                    clock.advance(2.0)
                    assert read("rl_collective_wait_seconds_total", point="allreduce") == pytest.approx(2.0)
            clock.advance(1.0)
        clock.advance(5.0)  # in no phase
        got = _buckets(read)
        assert got == pytest.approx({**dict.fromkeys(BUCKETS, 0.0), "startup": startup + 2.0, "offload": 1.5,
                                     "training": 4.0, "generation": 4.0, "waiting": 2.0 + 5.0})
        assert read(WALL) == pytest.approx(startup + 2.0 + 16.5)
        assert read(WALL) == pytest.approx(sum(got.values()))
        assert read("rl_rank_compute_seconds_total") == pytest.approx(1.5 + 4.0 + 4.0)
        assert read("rl_collective_wait_seconds_total", point="allreduce") == pytest.approx(2.0)
    finally:
        tel.close()


def test_bucket_names_a_phase_s_bucket_and_a_bad_one_is_counted(clock):
    tel = _tel()
    try:
        with tel.phase("learner", "my_update", bucket="training"):  # a name the table does not know
            clock.advance(2.0)
        with tel.phase("learner", "my_update"):  # without bucket=: measured work of no named kind
            clock.advance(1.0)
        with tel.phase("learner", "generate", bucket="trainning"):  # a typo: counted, the name decides
            clock.advance(3.0)
        assert tel.value(BUCKET, bucket="training") == pytest.approx(2.0)
        assert tel.value(BUCKET, bucket="other") == pytest.approx(1.0)
        assert tel.value(BUCKET, bucket="generation") == pytest.approx(3.0)
        assert tel.value("rl_telemetry_errors_total", sink="phase", reason="bad_bucket") == 1.0
    finally:
        tel.close()


def test_a_phase_whose_body_raises_leaves_the_timeline(clock):
    tel = _tel()
    try:
        with pytest.raises(ZeroDivisionError), tel.phase("actor_train", "train_step"):
            clock.advance(2.0)
            1 / 0  # noqa: B018
        clock.advance(3.0)
        assert tel.value(BUCKET, bucket="training") == pytest.approx(2.0)
        assert tel.value(BUCKET, bucket="waiting") == pytest.approx(3.0)
    finally:
        tel.close()


def test_phases_on_two_threads_at_once_share_the_time_and_still_add_up(clock):
    g = Goodput()
    g.begin(clock.unix() - 10.0)
    outer = g.enter("training")
    other: list = []
    thread = threading.Thread(target=lambda: other.append(g.enter("generation")))  # a frame of another thread
    thread.start()
    thread.join()
    clock.advance(4.0)  # both open: 2 s each
    g.leave(other[0])
    clock.advance(1.0)
    g.leave(outer)
    got = {labels[0][1]: value for spec, labels, value in g.collect() if spec.name == "rl_goodput_bucket_seconds"}
    assert got["training"] == pytest.approx(3.0) and got["generation"] == pytest.approx(2.0)
    wall = next(value for spec, _, value in g.collect() if spec.name == "rl_goodput_wall_seconds")
    assert wall == pytest.approx(10.0 + 5.0) == pytest.approx(sum(got.values()))


def test_no_counter_ever_goes_back_and_the_buckets_always_add_up_to_the_wall(clock, monkeypatch):
    """Random phases, parts, collectives and nesting on three threads, blocks ending out of order, read after
    every event: a counter that went back would read as a reset in Prometheus."""
    ident = [0]
    monkeypatch.setattr(goodput_module, "get_ident", lambda: ident[0])
    rng = random.Random(7)
    g = Goodput()
    g.begin(clock.unix() - 3.0)
    open_frames: list = []
    before: dict = {}
    for _ in range(2_000):
        action = rng.random()
        clock.advance(rng.choice([0.0, 0.001, 0.5, 2.0]))
        ident[0] = rng.randrange(3)
        if action < 0.35 or not open_frames:
            point = rng.choice([None, None, "allreduce", "barrier"])
            frame = g.enter("waiting" if point else rng.choice(BUCKETS[1:]), point)
            open_frames.append(frame)
        elif action < 0.55:
            g.switch(rng.choice(open_frames), rng.choice(BUCKETS[1:]))
        else:
            g.leave(open_frames.pop(rng.randrange(len(open_frames))))
        now = {(spec.name, labels): value for spec, labels, value in g.collect()}
        for key, value in now.items():
            assert value >= before.get(key, 0.0) - 1e-9, key
        buckets = sum(v for (name, _), v in now.items() if name == "rl_goodput_bucket_seconds")
        assert buckets == pytest.approx(now[("rl_goodput_wall_seconds", ())], rel=1e-9)
        before = now
    assert before[("rl_goodput_wall_seconds", ())] == pytest.approx(clock.t - 1_000.0 + 3.0)


def test_a_failing_accounting_is_counted_and_the_phase_goes_on(clock, monkeypatch):
    tel = _tel()
    try:
        with tel.phase("actor_train", "train_step"):
            clock.advance(1.0)

        def broken(*args):
            raise RuntimeError("boom")

        monkeypatch.setattr(Goodput, "_spread", broken)
        ran = []
        with tel.phase("actor_train", "train_step"):
            clock.advance(1.0)
            ran.append(True)
        assert ran == [True]
        assert tel.value("rl_telemetry_errors_total", sink="live", reason="goodput") >= 1
    finally:
        tel.close()


def test_a_bug_in_the_step_accounting_raises_there_and_log_still_goes_on(monkeypatch):
    """The timing keys' accounting is rl_otel's own bookkeeping, with no guard of its own: a bug there raises (no
    counter hides it), and the facade's guard keeps it from the training step (counted ``input``/``internal``)."""
    from rl_otel._internal.pipeline.timing_keys import TimingKeys

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(TimingKeys, "account", broken)
    with pytest.raises(RuntimeError, match="boom"):
        Goodput().step([], 0, time.time())
    tel = _tel()
    try:
        tel.log({"timing_s/step": 1.0}, step=0)
        assert tel.value("rl_telemetry_errors_total", sink="input", reason="internal") == 1
        assert tel.value("rl_telemetry_errors_total", sink="live", reason="goodput") is None
    finally:
        tel.close()


def test_the_process_start_from_proc_matches_psutil(monkeypatch):
    with_psutil = live_probes.process_start_time()
    assert with_psutil == psutil.Process().create_time()
    monkeypatch.setitem(sys.modules, "psutil", None)  # no psutil: /proc/self/stat and the boot time
    from_proc = live_probes.process_start_time()
    assert from_proc == pytest.approx(with_psutil, abs=1.0)


# ------------------------------------------------------------------------------------------------ timing keys


def _keyed(framework: str | None = None, *, live_started: float | None = None) -> tuple[Pipeline, Goodput]:
    """A recorder of ``framework``'s catalog; its start-up measured from ``live_started`` (a live process) or not
    at all (a watched run)."""
    recorder = pipeline(default_catalog(framework), {"run": "keys", "role": "trainer", "rank": "0"},
                        started=live_started)
    return recorder, recorder.goodput


def _step(recorder: Pipeline, values: dict[str, float], at: float) -> None:
    recorder.goodput.step(recorder.ingest.route(values.items()).measurements, recorder.steps.steps.advance(None), at)


def _read(g: Goodput) -> tuple[dict[str, float], float]:
    items = g.collect()
    buckets = {labels[0][1]: value for spec, labels, value in items if spec.name == "rl_goodput_bucket_seconds"}
    wall = next(value for spec, _, value in items if spec.name == "rl_goodput_wall_seconds")
    assert sum(buckets.values()) == pytest.approx(wall)
    return {b: v for b, v in buckets.items() if v}, wall


def test_verl_steps_divide_their_step_key_and_testing_adds_its_own_time(clock):
    t0 = clock.unix()
    recorder, g = _keyed(live_started=t0 - 30.0)  # a live process started 30 s ago
    assert _read(g) == ({"startup": 30.0}, 30.0)
    step = {"timing_s/step": 10.0, "timing_s/gen": 4.0, "timing_s/old_log_prob": 1.0, "timing_s/update_actor": 3.0,
            "timing_s/agent_loop/generate_sequences/max": 3.9,  # a per-sample statistic inside gen: not counted
            "timing_s/testing": 5.0, "actor/pg_loss": 0.1}  # testing runs outside the step
    _step(recorder, step, t0 + 100.0)  # the first step ended 130 s after the start: start-up took 130 - 15
    assert _read(g) == ({"startup": 115.0, "generation": 4.0, "inference": 1.0, "training": 3.0,
                         "validation": 5.0, "waiting": 2.0}, 130.0)
    _step(recorder, {"timing_s/step": 6.0, "timing_s/gen": 7.0}, t0 + 106.0)  # gen logged past its step: clamped
    buckets, wall = _read(g)
    assert buckets["generation"] == 11.0 and buckets["waiting"] == 2.0 and wall == 137.0


def test_a_step_logged_again_with_the_same_timers_is_a_replay_and_other_timers_at_its_step_count(clock):
    recorder, g = _keyed()
    step = {"timing_s/step": 10.0, "timing_s/gen": 4.0}
    routed = recorder.ingest.route(step.items()).measurements
    g.step(routed, 7, 100.0)
    g.step(routed, 7, 100.5)  # rl-otel watch's restore of the values it read, then the values again
    assert _read(g) == ({"generation": 4.0, "waiting": 6.0}, 10.0)
    g.step(recorder.ingest.route({"timing_s/step": 3.0, "timing_s/update_actor": 3.0}.items()).measurements, 7, 101.0)
    assert _read(g) == ({"generation": 4.0, "training": 3.0, "waiting": 6.0}, 13.0)


def test_nemo_rl_s_logged_setup_counts_only_where_start_up_is_not_measured(clock):
    step = {"timing/train/total_step_time": 10.0, "timing/train/generation": 6.0,
            "timing/train/policy_training": 3.0, "timing/setup/total_setup_time_s": 40.0}
    watched, g = _keyed("nemo_rl")
    _step(watched, step, clock.unix())
    assert _read(g) == ({"startup": 40.0, "generation": 6.0, "training": 3.0, "waiting": 1.0}, 50.0)
    live, g = _keyed("nemo_rl", live_started=clock.unix() - 60.0)
    _step(live, step, clock.unix())
    assert _read(g) == ({"startup": 50.0, "generation": 6.0, "training": 3.0, "waiting": 1.0}, 60.0)


def test_step_less_frameworks_take_the_interval_between_their_timed_steps(clock):
    recorder, g = _keyed("areal")
    step = {"timeperf/rollout": 4.0, "timeperf/train_step": 3.0}
    _step(recorder, step, 100.0)  # the first step: its timers only
    _step(recorder, step, 110.0)
    assert _read(g) == ({"generation": 8.0, "training": 6.0, "waiting": 3.0}, 17.0)
    _step(recorder, {"actor/loss": 0.1}, 120.0)  # an untimed step: no interval runs across it
    _step(recorder, step, 130.0)  # starts a new interval, counts nothing
    _step(recorder, step, 131.0)  # shorter than its timers: the timers stand, the wall grows with them
    assert _read(g) == ({"generation": 12.0, "training": 9.0, "waiting": 3.0}, 24.0)


def test_trl_s_evaluation_between_untimed_steps_is_not_counted(clock):
    recorder, g = _keyed("trl", live_started=clock.unix() - 5.0)
    for i in range(6):
        _step(recorder, {"loss": 1.0 / (i + 1), **({"eval_runtime": 30.0} if i in (2, 5) else {})},
              clock.unix() + i)
    assert _read(g) == ({"startup": 5.0}, 5.0)  # TRL's synchronous trainers are accounted by their phases only


def test_trinity_s_explorer_steps_wait_for_the_sync_interval_covering_them(clock):
    recorder, g = _keyed()
    for i, wait in enumerate((2.0, 3.0)):
        _step(recorder, {"explorer/time/wait_explore_step": wait}, 100.0 + i)
        assert _read(g) == ({}, 0.0)  # covered by the sync interval still to come
    _step(recorder, {"explorer/time/wait_explore_step": 2.0, "explore/time/sync_interval": 10.0}, 110.0)
    assert _read(g) == ({"generation": 7.0, "waiting": 3.0}, 10.0)


def test_roll_s_first_step_total_is_the_previous_step_s(clock):
    recorder, g = _keyed()
    _step(recorder, {"time/step_total": 0.0, "time/step_generate": 5.0, "time/step_train": 3.0,
                     "time/actor_train/train_step/total": 2.9}, 100.0)  # a worker phase inside step_train
    assert _read(g) == ({"generation": 5.0, "training": 3.0}, 8.0)


def test_prime_rl_s_orchestrator_leaves_its_rest_to_generation(clock):
    recorder, g = _keyed("prime_rl")
    _step(recorder, {"orchestrator/time/step": 10.0, "orchestrator/time/wait_for_policy": 2.0,
                     "orchestrator/time/pack": 1.0}, 100.0)
    assert _read(g) == ({"waiting": 2.0, "other": 1.0, "generation": 7.0}, 10.0)


def test_a_process_with_phases_counts_its_phases_and_not_its_timing_keys(clock):
    """ROLL's keys of a phase this process ran (and the driver's step timers, were they logged here too) would
    count its time twice: from its first phase on only the phases count."""
    tel = _tel()
    try:
        with tel.phase("actor_train", "train_step"):
            clock.advance(2.0)
        before = _buckets(tel.value)
        tel.log({"time/step_total": 100.0, "time/step_train": 90.0, "time/actor_train/train_step/total": 2.0,
                 "time/actor_train/do_checkpoint/total": 7.0, "timing_s/step": 50.0, "timing_s/gen": 40.0})
        after = _buckets(tel.value)
        assert after == before and after["training"] == pytest.approx(2.0)
    finally:
        tel.close()


def test_start_up_served_during_the_first_step_never_goes_back(clock):
    """A scrape while the first step runs serves the start-up so far; the step's own timers then end it no lower
    than that (a counter that went back would read as a reset)."""
    recorder, g = _keyed(live_started=clock.unix() - 10.0)
    clock.advance(5.0)
    served = _read(g)[0]["startup"]
    assert served == 15.0
    _step(recorder, {"timing_s/step": 8.0, "timing_s/gen": 8.0}, clock.unix())  # ran from 7 s to 15 s
    buckets, wall = _read(g)
    assert buckets == {"startup": 15.0, "generation": 8.0} and wall == 23.0


# ------------------------------------------------------------------------------------------------ the demo


# a real demo run (torch, ~10 s on a loaded machine): the slow layer; the fast one keeps the promise with a fake
# clock (test_no_counter_ever_goes_back_and_the_buckets_always_add_up_to_the_wall)
@pytest.mark.slow
def test_the_demo_s_buckets_add_up_to_its_wall_time(tmp_path):
    """A real demo run, read from its endpoint after training: every bucket it serves (start-up, the phases,
    waiting) adds up to the wall time it serves, and that is the process's own, process start to now, within
    5%."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "rl_otel.cli", "demo", "--steps", "12", "--port", "0", "--host", "127.0.0.1",
         "--linger", "120", "--no-progress", "--no-trackers"], cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        for line in proc.stderr:  # type: ignore[union-attr]
            lines.append(line)
            if "more (Ctrl-C stops)" in line:
                break
        url = next((m.group(1) for s in lines if (m := re.search(r"metrics:\s+(\S+)", s))), None)
        assert url is not None, "".join(lines)
        started = psutil.Process(proc.pid).create_time()
        before = time.time()
        text = scrape(url)
        elapsed = (before + time.time()) / 2 - started
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    assert promtool_check(text) == ""
    buckets = {dict(k)["bucket"]: v for k, v in samples(text, BUCKET).items()}
    (wall,) = samples(text, WALL).values()
    assert set(buckets) == set(BUCKETS)
    assert sum(buckets.values()) == pytest.approx(wall, rel=0.05)
    assert wall == pytest.approx(elapsed, rel=0.05), (wall, elapsed)
    for bucket in ("startup", "generation", "training", "inference", "offload", "validation", "other", "waiting"):
        assert buckets[bucket] > 0, (bucket, buckets)
    productive = buckets["generation"] + buckets["training"] + buckets["inference"]
    # training ran in phases; what the demo does outside them (submit, log, the loop) is a small part of a step
    assert productive > buckets["other"] and productive > buckets["offload"], buckets
