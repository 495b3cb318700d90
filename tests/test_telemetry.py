from __future__ import annotations

import logging
import math
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

import rl_otel
from rl_otel import ConfigurationError, PortInUseError
from tests.promtools import scrape

ROOT = Path(__file__).resolve().parent.parent


def samples(tel) -> dict[tuple, float]:
    """Every sample of a scrape: (name, frozenset(labels)) -> value."""
    out = {}
    for family in text_string_to_metric_families(scrape(tel.metrics_url)):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(tel, name, **labels):
    labels = {"run": "test", "role": "trainer", "rank": "0", **labels}
    return samples(tel).get((name, frozenset(labels.items())))


def test_issue_example(tel):
    tel.log({"critic/score/mean": 0.41, "actor/approxkl": 0.003, "eval/gsm8k/accuracy/mean@4": 0.7}, step=12)
    assert tel.metrics_url.startswith("http://127.0.0.1:") and tel.metrics_url.endswith("/metrics")
    assert value(tel, "rl_critic_score", stat="mean") == 0.41
    assert value(tel, "rl_actor_approx_kl") == 0.003
    assert value(tel, "rl_eval_metric", taskset="gsm8k", metric="accuracy", stat="mean", k="4") == 0.7
    assert value(tel, "rl_step") == 12


def test_values_are_converted_to_base_units(tel):
    tel.log({"memory/actor_train/train_step/end/onload/max_allocated/3": 1.5,
             "memory/cpu/actor_train/train_step/start/rss": 0.25, "timing_per_token_ms/adv": 2.0}, step=1)
    assert value(tel, "rl_gpu_memory_bytes", cluster="actor_train", phase="train_step", stage="end_onload",
                 kind="max_allocated", device_id="3") == 1.5 * 2**30
    assert value(tel, "rl_cpu_memory_bytes", cluster="actor_train", phase="train_step", stage="start",
                 kind="rss") == 0.25 * 2**30
    assert value(tel, "rl_timing_per_token_seconds", operation="adv") == pytest.approx(0.002)


def test_nan_and_inf_reach_prometheus_none_is_skipped(tel):
    tel.log({"actor/pg_loss": float("nan"), "critic/loss": float("inf"), "actor/kl_loss": None}, step=3)
    assert math.isnan(value(tel, "rl_actor_pg_loss"))
    assert value(tel, "rl_critic_loss") == math.inf
    assert value(tel, "rl_actor_kl_loss") is None


def test_tensors_numpy_nested_and_reducer_tags(tel):
    tel.log({"actor": {"pg_loss@sum": torch.tensor(0.5), "clipfrac": np.float32(0.125)},
             "critic/error": np.float64(2.0), "actor/valid_samples": True}, step=4)
    assert value(tel, "rl_actor_pg_loss") == 0.5
    assert value(tel, "rl_actor_clip_ratio") == 0.125
    assert value(tel, "rl_critic_error") == 2.0
    assert value(tel, "rl_actor_valid_samples") == 1.0


def test_distributions_become_histograms_with_exact_counts(tel):
    tel.log({"ppo/policy/ratio": torch.tensor([0.5, 1.0, 1.01, 3.0, 200.0])}, step=1)
    tel.log({"ppo/policy/ratio": [1.0]}, step=2)
    got = samples(tel)
    base = {"run": "test", "role": "trainer", "rank": "0"}

    def bucket(le):
        return got[("rl_ppo_policy_ratio_dist_bucket", frozenset({**base, "le": le}.items()))]

    assert bucket("0.5") == 1 and bucket("1.0") == 3 and bucket("1.02") == 4 and bucket("5.0") == 5
    assert bucket("+Inf") == 6
    assert got[("rl_ppo_policy_ratio_dist_count", frozenset(base.items()))] == 6
    assert got[("rl_ppo_policy_ratio_dist_sum", frozenset(base.items()))] == pytest.approx(206.51)


def test_bad_values_are_skipped_with_one_warning_per_key_and_counted(tel, caplog):
    with caplog.at_level(logging.WARNING, logger="rl_otel"):
        for step in range(3):
            tel.log({"actor/lr": "1e-5", "critic/lr": object(), "actor/clipfrac": [0.1, 0.2], "val/score/mean": 1},
                    step=step)
    warnings = [r.getMessage() for r in caplog.records]
    assert sum("'actor/lr'" in w for w in warnings) == 1
    assert sum("'critic/lr'" in w for w in warnings) == 1
    assert sum("'actor/clipfrac'" in w for w in warnings) == 1
    assert value(tel, "rl_telemetry_errors_total", sink="input", reason="bad_value") == 9
    assert value(tel, "rl_val_score", stat="mean") == 1


def test_log_never_raises(tel):
    loop: dict = {}
    loop["self"] = loop  # infinitely nested
    tel.log(loop, step=1)
    tel.log(["not", "a", "dict"], step=2)  # type: ignore[arg-type]
    tel.log({"x": 1}, step="nope")  # type: ignore[arg-type]
    tel.log({("tuple", "key"): 1.0}, step=4)  # type: ignore[dict-item]
    assert value(tel, "rl_step") == 4


def test_step_defaults_to_previous_plus_one(tel):
    tel.log({"actor/lr": 1.0})
    tel.log({"actor/lr": 1.0})
    assert tel.step == 1
    tel.log({"actor/lr": 1.0}, step=torch.tensor(10))
    tel.log({"actor/lr": 1.0})
    assert tel.step == 11 and value(tel, "rl_step") == 11
    assert value(tel, "rl_last_step_timestamp_seconds") > 1.7e9


def test_an_absurd_step_costs_only_its_own_call():
    """A step that is no int in [0, 2**63-1] is refused for its call (counted as bad_step) and replaced by the
    previous valid step + 1, for the trackers and Prometheus alike; the automatic steps after it go on (before:
    step=10**400 overflowed and every later step=None log() was dropped too; 2**63 vanished from TensorBoard)."""
    from tests._sinks import Recorder, tel_errors

    Recorder.instances.clear()
    t = rl_otel.init(run="test", prometheus={"host": "127.0.0.1", "port": 0}, trackers=["recorder"],
                     handle_sigterm=False)
    try:
        t.log({"actor/lr": 0.0}, step=5)
        for bad in (10**400, -1, 2**63, float("inf"), True):
            t.log({"actor/lr": 1.0}, step=bad)
            t.log({"actor/lr": 2.0})  # automatic: continues normally
        t.log({"actor/lr": 3.0}, step=2**63 - 1)  # the highest valid step
        errors = tel_errors(t)[("input", "bad_step")]
        served = value(t, "rl_step")
        [recorder] = Recorder.instances
        assert t.flush(30)
    finally:
        t.close()
    assert errors == 5 and served == float(2**63 - 1) and t.step == 2**63 - 1
    assert [step for step, _ in recorder.steps] == [*range(5, 16), 2**63 - 1]


def test_run_and_rank_from_arguments_or_environment(monkeypatch):
    monkeypatch.setenv("RANK", "5")
    with rl_otel.init(run="r1", prometheus={"host": "127.0.0.1", "port": 0}) as t:
        t.log({"actor/lr": 0.1}, step=0)
        labels = frozenset({"run": "r1", "role": "trainer", "rank": "5"}.items())
        assert ("rl_actor_learning_rate", labels) in samples(t)
    with rl_otel.init(run="r2", rank=2, prometheus={"host": "127.0.0.1", "port": 0}) as t:
        t.log({"actor/lr": 0.1}, step=0)
        families = list(text_string_to_metric_families(scrape(t.metrics_url)))
        for family in families:
            for s in family.samples:
                if family.name not in ("target", "target_info"):
                    assert s.labels["run"] == "r2" and s.labels["rank"] == "2", s


def test_unknown_keys_use_a_capped_fallback(caplog):
    with rl_otel.init(run="test", rank=0, prometheus={"host": "127.0.0.1", "port": 0}, max_unknown_keys=3) as t:
        with caplog.at_level(logging.WARNING, logger="rl_otel"):
            for step in range(2):
                t.log({f"custom/m{i}": float(i) for i in range(10)}, step=step)
        got = samples(t)
        names = {name for name, _ in got if name.startswith("rl_custom_m")}
        assert names == {"rl_custom_m0", "rl_custom_m1", "rl_custom_m2"}
        assert got[("rl_telemetry_dropped_series_total",
                    frozenset({"run": "test", "role": "trainer", "rank": "0", "metric": "unknown_keys"}.items()))] == 14
        assert sum("past the cap" in r.getMessage() for r in caplog.records) == 7  # once per refused key


def test_colliding_fallback_names_are_refused(tel, caplog):
    with caplog.at_level(logging.WARNING, logger="rl_otel"):
        tel.log({"custom/x-y": 1.0, "custom/x_y": 2.0, "rl_critic/loss": 3.0}, step=0)
    assert value(tel, "rl_custom_x_y") == 1.0
    assert value(tel, "rl_critic_loss") is None  # 'rl_critic/loss' may not write the catalog's series
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "already used by key 'custom/x-y'" in messages and "a name of the catalog" in messages
    assert "max_series_per_metric" not in messages
    assert value(tel, "rl_telemetry_dropped_series_total", metric="rl_custom_x_y") == 1


def test_series_per_metric_are_capped():
    with rl_otel.init(run="test", rank=0, prometheus={"host": "127.0.0.1", "port": 0},
                      max_series_per_metric=4) as t:
        t.log({f"time/op{i}": 1.0 for i in range(10)}, step=0)
        got = samples(t)
        assert sum(1 for name, _ in got if name == "rl_operation_duration_seconds") == 4
        assert got[("rl_telemetry_dropped_series_total", frozenset(
            {"run": "test", "role": "trainer", "rank": "0", "metric": "rl_operation_duration_seconds"}.items()))] == 6


def test_series_expire_after_ttl_but_liveness_does_not(monkeypatch):
    import time as _time

    with rl_otel.init(run="test", rank=0, prometheus={"host": "127.0.0.1", "port": 0}, series_ttl_s=60) as t:
        t.log({"actor/lr": 1.0}, step=0)
        assert value(t, "rl_actor_learning_rate") == 1.0
        real = _time.time_ns
        monkeypatch.setattr(_time, "time_ns", lambda: real() + 120 * 10**9)
        assert value(t, "rl_actor_learning_rate") is None
        assert value(t, "rl_step") == 0


def test_concurrent_log_calls_lose_nothing(tel):
    def worker(i):
        for step in range(200):
            tel.log({f"time/op{i}": float(step), "system/samples": 1.0})

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for i in range(8):
        assert value(tel, "rl_operation_duration_seconds", operation=f"op{i}") == 199.0
    assert tel.step == 8 * 200 - 1


def test_close_is_idempotent_and_stops_serving():
    t = rl_otel.init(run="test", prometheus={"host": "127.0.0.1", "port": 0})
    url = t.metrics_url
    t.log({"actor/lr": 1.0}, step=0)
    t.close()
    t.close()
    t.log({"actor/lr": 2.0}, step=1)  # ignored, never raises
    with pytest.raises(OSError):
        scrape(url)


@pytest.mark.parametrize("kwargs,match", [
    ({"prometheus": {"port": 70000}}, "port must be an int in 0..65535"),
    ({"prometheus": {"port": "9464"}}, "port must be an int"),
    ({"prometheus": {"hots": "x"}}, "unknown prometheus option"),
    ({"prometheus": "yes"}, "prometheus must be a dict"),
    ({"rank": -1}, "rank must be an int >= 0"),
    ({"run": ""}, "run must be a non-empty str"),
    ({"max_series_per_metric": 0}, "max_series_per_metric must be a positive int"),
    ({"series_ttl_s": -1}, "series_ttl_s must be a positive number"),
])
def test_bad_configuration_fails_at_init_naming_the_value(kwargs, match):
    with pytest.raises(ConfigurationError, match=match):
        rl_otel.init(**kwargs)


def test_bad_rank_environment_variable(monkeypatch):
    monkeypatch.setenv("RANK", "zero")
    with pytest.raises(ConfigurationError, match="RANK environment variable"):
        rl_otel.init(prometheus=False)


def test_port_in_use_is_a_clear_error(tel):
    port = int(tel.metrics_url.split(":")[2].split("/")[0])
    with pytest.raises(PortInUseError, match=f"port {port} .* already in use"):
        rl_otel.init(run="other", prometheus={"host": "127.0.0.1", "port": port})


def test_default_endpoint_binds_all_interfaces_on_9464():
    from rl_otel._internal.runtime.options import DEFAULT_HOST, DEFAULT_PORT, build_config

    config = build_config(run="r", rank=0, role="trainer", prometheus=True, max_series_per_metric=1,
                          max_unknown_keys=1, series_ttl_s=None)
    assert (config.prometheus.host, config.prometheus.port) == (DEFAULT_HOST, DEFAULT_PORT) == ("0.0.0.0", 9464)


def test_without_prometheus_log_still_works():
    with rl_otel.init(run="test", prometheus=False) as t:
        t.log({"actor/lr": 1.0}, step=0)
        assert t.metrics_url is None and t.step == 0


def test_histogram_values_ignore_nan_and_count_it(tel):
    tel.log({"env/reward_dist": np.array([0.5, np.nan, 1.5])}, step=0)
    assert value(tel, "rl_env_reward_dist_bucket", le="+Inf") == 2
    assert value(tel, "rl_telemetry_errors_total", sink="input", reason="non_finite_in_distribution") == 1


def test_a_failing_close_step_is_counted_and_the_later_steps_still_run(caplog, monkeypatch):
    from tests._sinks import Recorder, tel_errors

    Recorder.instances.clear()
    t = rl_otel.init(run="test", prometheus={"host": "127.0.0.1", "port": 0}, trackers=["recorder"],
                     tracing={"exporter": "console"}, handle_sigterm=False)
    url = t.metrics_url

    def fail():
        raise RuntimeError("shutdown exploded")

    from rl_otel._internal.probes.live import LiveGauges
    from rl_otel._internal.probes.memory import CpuProbe

    monkeypatch.setattr(LiveGauges, "close", lambda self: fail())  # an early step and a later one raise
    monkeypatch.setattr(CpuProbe, "close", lambda self: fail())
    with caplog.at_level(logging.WARNING, logger="rl_otel"):
        t.close()  # never raises
    (rec,) = Recorder.instances
    assert rec.closed  # the steps after the failing ones ran: trackers closed, endpoint stopped
    with pytest.raises(OSError):
        scrape(url)
    assert t.tracer_provider._atexit_handler is None  # the tracer provider was shut down, the last step
    errors = tel_errors(t)
    assert errors[("close", "live")] == 1 and errors[("close", "cpu_probe")] == 1
    assert "closing cpu_probe failed (RuntimeError: shutdown exploded)" in caplog.text


def test_a_failing_init_step_closes_what_was_already_built(tmp_path, monkeypatch):
    import rl_otel._internal.runtime.components as components_module

    def broken_live_gauges(*args, **kwargs):
        raise RuntimeError("live gauges exploded")

    # a step after the tracer provider (jsonl file + span thread) and the metric readers, before the endpoint
    monkeypatch.setattr(components_module, "LiveGauges", broken_live_gauges)
    threads_before = set(threading.enumerate())
    with pytest.raises(RuntimeError, match="live gauges exploded"):
        rl_otel.init(run="test", prometheus={"host": "127.0.0.1", "port": 0},
                     tracing={"exporter": "jsonl", "path": str(tmp_path / "spans.jsonl")}, handle_sigterm=False)
    left = [t.name for t in threading.enumerate() if t not in threads_before and t.is_alive()]
    assert left == []  # the tracer provider's span thread was shut down, not leaked


def test_store_removes_a_gone_series_and_a_step_never_goes_back():
    from rl_otel._internal.pipeline.records import Batch, Measurement
    from rl_otel._internal.pipeline.snapshot import Snapshot
    from rl_otel._internal.pipeline.store import SeriesStore
    from rl_otel.catalog import meta

    store = SeriesStore({"run": "r", "rank": "0"}, max_series_per_metric=10, ttl_s=None)
    spec = rl_otel.default_catalog().resolve("critic/score/mean").spec
    store.write(Batch([Measurement(spec, (("stat", "mean"),), 1.0), Measurement(spec, (("stat", "max"),), 2.0)]))
    before = store.freeze()
    version = store.version
    assert store.freeze() is before and store.version == version  # a read changes nothing
    store.write(Batch([], gone=[(spec, (("stat", "mean"),))]))
    after = store.freeze()
    assert after.version > before.version and after.layout != before.layout
    assert Snapshot(after).value(spec.name, {"stat": "mean"}) is None
    assert Snapshot(after).value(spec.name, {"stat": "max"}) == 2.0
    assert Snapshot(before).value(spec.name, {"stat": "mean"}) == 1.0  # a snapshot never changes once taken
    store.write(Batch([], gone=[(spec, (("stat", "mean"),)), (meta.STEP, ())]))  # gone already; never written
    assert store.freeze().layout == after.layout
    # with a step, a series keeps the newest step's value; without one, a write always lands
    store.write(Batch([Measurement(spec, (("stat", "max"),), 5.0)], step=5))
    store.write(Batch([Measurement(spec, (("stat", "max"),), 3.0), Measurement(spec, (("stat", "min"),), 3.0)],
                      step=3))
    snap = Snapshot(store.freeze())
    assert snap.value(spec.name, {"stat": "max"}) == 5.0 and snap.value(spec.name, {"stat": "min"}) == 3.0
    store.write(Batch([Measurement(spec, (("stat", "max"),), 1.0)]))
    assert Snapshot(store.freeze()).value(spec.name, {"stat": "max"}) == 1.0


def test_none_removes_a_gauge_series_instead_of_leaving_it_stale(tel):
    """TRL logs None for a window whose values were all NaN: the last value must not look current."""
    tel.log({"rewards/flaky/mean": 0.5, "critic/score/mean": 0.25, "system/samples": 10, "my/new_key": 1.0}, step=1)
    tel.log({"rewards/flaky/mean": None, "critic/score/mean": 0.5, "system/samples": None, "my/new_key": None,
             "never/seen_before": None}, step=2)
    got = samples(tel)
    assert value(tel, "rl_function_reward", reward_func="flaky", stat="mean") is None  # removed, not 0.5
    assert not any(name == "rl_my_new_key" for name, _ in got)  # a fallback gauge too
    assert not any(name == "rl_never_seen_before" for name, _ in got)  # nothing created for it
    assert value(tel, "rl_critic_score", stat="mean") == 0.5
    assert value(tel, "rl_system_samples_total") == 10  # a counter keeps its total
    tel.log({"rewards/flaky/mean": 0.75}, step=3)  # the next value brings the series back
    assert value(tel, "rl_function_reward", reward_func="flaky", stat="mean") == 0.75


def test_an_older_step_sets_no_series_back_and_reaches_the_trackers():
    """A step below the highest one logged (a replay after a restart, racing new steps): rl_step, gauges,
    counters and histograms keep the newer step's values, a None removes nothing, a key only the old step has
    is stored; the trackers get the step. An equal step is current."""
    from tests._sinks import Recorder

    Recorder.instances.clear()
    with rl_otel.init(run="test", prometheus={"host": "127.0.0.1", "port": 0}, trackers=["recorder"],
                      handle_sigterm=False) as t:
        t.log({"critic/score/mean": 0.9, "system/samples": 500, "env/reward_dist": [1.0], "actor/kl_loss": 0.5},
              step=5)
        t.log({"critic/score/mean": 0.1, "system/samples": 100, "env/reward_dist": [1.0, 2.0], "actor/kl_loss": None,
               "actor/pg_loss": 3.0}, step=3)  # history
        assert value(t, "rl_step") == 5 and t.step == 5
        assert value(t, "rl_critic_score", stat="mean") == 0.9
        assert value(t, "rl_system_samples_total") == 500  # a counter never decreases
        assert value(t, "rl_env_reward_dist_bucket", le="+Inf") == 1
        assert value(t, "rl_actor_kl_loss") == 0.5  # a replayed None does not remove step 5's value
        assert value(t, "rl_actor_pg_loss") == 3.0  # no newer value: the old step's is the latest known
        t.log({"eval/gsm8k/accuracy/mean@4": 0.5, "critic/score/mean": 0.8}, step=5)  # equal: current
        assert value(t, "rl_eval_metric", taskset="gsm8k", metric="accuracy", stat="mean", k="4") == 0.5
        assert value(t, "rl_critic_score", stat="mean") == 0.8
        t.log({"critic/score/mean": 0.7})  # step=None continues from the highest step
        assert value(t, "rl_step") == 6 and t.step == 6 and value(t, "rl_critic_score", stat="mean") == 0.7
        assert t.flush(10)
        (rec,) = Recorder.instances
        assert [step for step, _ in rec.steps] == [5, 3, 5, 6]
        assert rec.steps[1][1] == {"critic/score/mean": 0.1, "system/samples": 100.0,
                                   "env/reward_dist": pytest.approx(np.array([1.0, 2.0])), "actor/pg_loss": 3.0}


def test_telemetry_closes_itself_at_exit_without_close(tmp_path):
    """A framework that never closes (ROLL never calls finish()): the exit hook flushes the trackers, including
    steps still queued behind a submitted job."""
    script = f"""
import threading, rl_otel
tel = rl_otel.init(run="exit", prometheus={{"host": "127.0.0.1", "port": 0}},
                   trackers={{"tensorboard": {{"log_dir": {str(tmp_path)!r}}}}})
for step in range(3):
    tel.log({{"critic/score/mean": float(step)}}, step=step)
gate = threading.Event()
tel.submit(lambda: gate.wait(10) and {{}}, step=3)
tel.log({{"critic/score/mean": 4.0}}, step=4)  # queued behind the job
gate.set()
print("logged", flush=True)
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0 and "logged" in proc.stdout, proc.stderr
    from tests._readers import tensorboard_scalars

    assert tensorboard_scalars(str(tmp_path))["critic/score/mean"] == [(0, 0.0), (1, 1.0), (2, 2.0), (4, 4.0)]


def test_trackers_get_every_logged_key_before_any_prometheus_rule(tmp_path, caplog):
    """The trackers' view of a step is the step as logged: keys the endpoint refuses (past max_unknown_keys, a
    fallback name collision, a name taken by rl_otel's own series, a distribution for a gauge) still reach
    TensorBoard (read back with its own reader) and stdout."""
    import json

    from tests._readers import tensorboard_scalars

    out = tmp_path / "stdout.log"
    with rl_otel.init(run="test", prometheus={"host": "127.0.0.1", "port": 0}, max_unknown_keys=3,
                      trackers={"tensorboard": {"log_dir": str(tmp_path / "tb")}, "stdout": {"file": str(out)}},
                      handle_sigterm=False) as t:
        with caplog.at_level(logging.WARNING, logger="rl_otel"):
            t.log({f"custom/m{i}": float(i) for i in range(8)}, step=0)  # 3 fallbacks, 5 past the cap
        with rl_otel.init(run="test", prometheus=False, trackers={"tensorboard": {"log_dir": str(tmp_path / "tb2")}},
                          handle_sigterm=False) as t2, caplog.at_level(logging.WARNING, logger="rl_otel"):
            t2.log({"custom/my-loss": 1.0, "custom/my_loss": 2.0}, step=0)  # one fallback name for both
        t.log({"step": 7.0, "critic/loss": np.ones(3), "actor/pg_loss": 0.5}, step=1)
        assert t.flush(10)
        served = samples(t)
    scalars = tensorboard_scalars(str(tmp_path / "tb"))
    assert {key: scalars[key] for key in scalars if key.startswith("custom/")} == {
        f"custom/m{i}": [(0, float(i))] for i in range(8)}
    assert scalars["step"] == [(1, 7.0)] and scalars["actor/pg_loss"] == [(1, 0.5)]
    collided = tensorboard_scalars(str(tmp_path / "tb2"))
    assert collided["custom/my-loss"] == [(0, 1.0)] and collided["custom/my_loss"] == [(0, 2.0)]
    lines = [json.loads(line[len("metrics_tag: "):]) for line in out.read_text().splitlines()]
    assert [line["step"] for line in lines] == [0, 1]
    assert lines[0]["metrics"] == {f"custom/m{i}": float(i) for i in range(8)}
    assert lines[1]["metrics"]["step"] == 7.0 and lines[1]["metrics"]["actor/pg_loss"] == 0.5
    assert lines[1]["metrics"]["critic/loss"]["count"] == 3  # a distribution for a gauge: a tracker can draw it
    # Prometheus still applies its rules: 3 fallback families, rl_step is the step, no gauge for a distribution
    base = frozenset({"run": "test", "role": "trainer", "rank": "0"}.items())
    assert len({name for name, _ in served if name.startswith("rl_custom_m")}) == 3
    assert served[("rl_step", base)] == 1.0 and served[("rl_actor_pg_loss", base)] == 0.5
    assert ("rl_critic_loss", base) not in served
    assert "is past the cap of 3 keys" in caplog.text and "already used by key 'custom/my-loss'" in caplog.text


def test_value_reads_back_what_the_endpoint_serves(tel):
    """Telemetry.value: a logged key (its labels from the key, base units) or a served family's name with labels;
    the same numbers a scrape gives."""
    tel.log({"critic/score/mean": 0.41, "memory/cpu/actor_train/train_step/start/rss": 1.5, "system/samples": 64,
             "env/reward_dist": [0.5, 2.0, float("nan")], "custom/myLoss": 3.0, "custom/my-loss": 4.0,
             "actor/kl_loss": "bad"}, step=3)
    assert tel.value("critic/score/mean") == 0.41 == value(tel, "rl_critic_score", stat="mean")
    assert tel.value("rl_critic_score", stat="mean") == 0.41
    assert tel.value("memory/cpu/actor_train/train_step/start/rss") == 1.5 * 2**30  # bytes; the trackers got GiB
    assert tel.value("system/samples") == 64.0 == tel.value("rl_system_samples_total")  # a counter, either name
    assert tel.value("custom/myLoss") == 3.0 == tel.value("rl_custom_my_loss")  # the fallback gauge
    assert tel.value("custom/my-loss") is None  # refused on the endpoint (its fallback name is taken)
    assert tel.value("rl_telemetry_dropped_series_total", metric="rl_custom_my_loss") == 1.0
    assert tel.value("rl_telemetry_errors_total", sink="input", reason="bad_value") == 1.0
    assert tel.value("rl_step") == 3.0 == value(tel, "rl_step")
    hist = tel.value("env/reward_dist")
    assert isinstance(hist, rl_otel.HistogramValue)
    assert (hist.count, hist.sum, hist.min, hist.max, sum(hist.counts)) == (2, 2.5, 0.5, 2.0, 2)
    assert value(tel, "rl_env_reward_dist_bucket", le="+Inf") == 2.0
    assert tel.value("rl_process_resident_memory_bytes") > 0  # a live gauge, sampled now
    assert tel.value("actor/pg_loss") is None and tel.value("no/such/key") is None
    assert tel.value("rl_critic_score", stat="max") is None
    tel.log({"critic/score/mean": None}, step=4)  # no value this step: the series leaves the endpoint
    assert tel.value("critic/score/mean") is None and value(tel, "rl_critic_score", stat="mean") is None
    with rl_otel.init(run="quiet", prometheus=False) as t:  # no endpoint: the store is read all the same
        t.log({"actor/lr": 1e-6}, step=0)
        assert t.value("actor/lr") == 1e-6
