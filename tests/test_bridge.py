"""The bridge: one data path with Prometheus, fault isolation, close/SIGTERM flushing, secrets never written."""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import time

import numpy as np
import pytest
import torch

import rl_otel
from rl_otel.catalog import Kind, default_catalog
from tests._readers import scrape_series, tensorboard_scalars
from tests._sinks import Recorder, run_script, tel_errors

pytestmark = pytest.mark.slow  # the slow layer (tests/conftest.py)

# rl_otel's own series (liveness, self-monitoring, live gauges sampled at scrape time) are not step values
META = ("target_info", *(name for spec in default_catalog() if spec.key.startswith("rl_otel/")
                         for name in spec.exposed_names))


def _errors(url: str) -> dict[tuple[str, str], float]:
    return {(dict(lbl)["sink"], dict(lbl)["reason"]): v for (name, lbl), v in scrape_series(url).items()
            if name == "rl_telemetry_errors_total"}


def test_trackers_and_prometheus_see_the_same_values():
    """Two views of one step: the trackers get every key as logged; each key Prometheus accepts is one series (in
    base units), and nothing else is exported."""
    Recorder.instances.clear()
    tel = rl_otel.init("same", prometheus={"host": "127.0.0.1", "port": 0}, trackers={"recorder": {}},
                       max_unknown_keys=2, handle_sigterm=False)
    with tel:
        tel.log({
            "actor/pg_loss": 0.5, "critic/score/mean": 1.25, "system/samples": 640,
            "memory/actor_train/train_step/end/onload/allocated/3": 1.5,  # GiB for trackers, bytes for Prometheus
            "time/actor_train/train_step/execute": 2.0,
            "my/custom_metric": 7.0, "my.custom.metric": 8.0,  # an unknown key, and one colliding with it
            "unknown/a": 1.0, "unknown/b": 2.0,  # past max_unknown_keys=2
            "env/reward_dist": np.array([0.1, 0.2, 0.9]),
            "actor/kl_loss": "not a number", "critic/loss": np.ones((2, 2)), "actor/lr": None,
            "actor": {"clipfrac": 0.125},  # nested: flattened to actor/clipfrac
        }, step=4)
        tel.flush()
        (rec,) = Recorder.instances
        [(step, mirrored)] = rec.steps
        series = {k: v for k, v in scrape_series(tel.metrics_url).items() if not k[0].startswith(META)}
    assert step == 4
    refused = {"my.custom.metric", "unknown/b"}  # a collision, and past the cap: trackers only
    assert set(mirrored) == {"actor/pg_loss", "critic/score/mean", "system/samples",
                             "memory/actor_train/train_step/end/onload/allocated/3",
                             "time/actor_train/train_step/execute", "my/custom_metric", "unknown/a",
                             "env/reward_dist", "actor/clipfrac", *refused}
    assert mirrored["my.custom.metric"] == 8.0 and mirrored["unknown/b"] == 2.0
    base = (("rank", "0"), ("role", "trainer"), ("run", "same"))
    expected: dict = {}
    sums: dict = {}
    for key, value in mirrored.items():
        if key in refused:
            continue
        res = default_catalog().resolve(key)
        labels = tuple(sorted(base + res.labels))
        if res.spec.kind is Kind.HISTOGRAM:  # one series per key: its +Inf bucket is the count
            expected[(res.spec.name + "_bucket", tuple(sorted((*labels, ("le", "+Inf")))))] = float(len(value))
            sums[(res.spec.name + "_sum", labels)] = float(np.sum(value)) * res.spec.scale
        else:
            expected[(res.spec.prometheus_name, labels)] = value * res.spec.scale
    histogram_parts = {k for k in series if (k[0].endswith("_bucket") and ("le", "+Inf") not in k[1])
                       or k[0].endswith(("_sum", "_count"))}
    assert set(series) - histogram_parts == set(expected)
    for k, v in expected.items():
        assert series[k] == pytest.approx(v), k
    for k, v in sums.items():  # prometheus_client writes no _sum/_count when a bucket bound is negative
        if k in series:
            assert series[k] == pytest.approx(v), k
    assert mirrored["memory/actor_train/train_step/end/onload/allocated/3"] == 1.5
    assert [v for (name, _), v in series.items() if name == "rl_gpu_memory_bytes"] == [1.5 * 2**30]


def test_tracker_gets_a_copy_of_arrays():
    Recorder.instances.clear()
    with rl_otel.init(prometheus=False, trackers=["recorder"], handle_sigterm=False) as tel:
        values = np.array([1.0, 2.0])
        tel.log({"env/reward_dist": values}, step=0)
        values[:] = 99.0
    assert Recorder.instances[0].steps[0][1]["env/reward_dist"].tolist() == [1.0, 2.0]


def test_raising_sink_is_counted_logged_once_and_isolated(caplog):
    Recorder.instances.clear()
    with caplog.at_level(logging.WARNING, logger="rl_otel"):
        tel = rl_otel.init(prometheus={"host": "127.0.0.1", "port": 0}, trackers={"boom": {"secret": "sk-boom"},
                           "recorder": {}}, handle_sigterm=False)
        for step in range(5):
            tel.log({"actor/pg_loss": float(step)}, step=step)
        tel.flush()
        errors = _errors(tel.metrics_url)
        tel.close()
    good = next(r for r in Recorder.instances if r.fail is None)
    assert [s for s, _ in good.steps] == [0, 1, 2, 3, 4] and good.closed
    assert errors[("boom", "exception")] == 5
    assert caplog.text.count("tracker 'boom' failed") == 1
    assert "sk-boom" not in caplog.text and "tracker exploded (key ***)" in caplog.text


def test_hung_sink_never_blocks_training_and_close_has_a_deadline():
    Recorder.instances.clear()
    tel = rl_otel.init(prometheus={"host": "127.0.0.1", "port": 0}, trackers=["hang", "recorder"],
                       sink_queue_size=4, close_timeout_s=0.5, handle_sigterm=False)
    hung, good = Recorder.instances
    for step in range(50):  # would never return if the hung sink blocked log()
        tel.log({"actor/pg_loss": float(step)}, step=step)
        assert good.wait_for_steps(step + 1)  # the healthy sink keeps up while the other hangs
    url = tel.metrics_url
    assert tel.flush(timeout_s=0.2) is False
    before = _errors(url)
    tel.close()  # returns: the hung worker is abandoned after close_timeout_s
    hung.release.set()
    assert [s for s, _ in good.steps] == list(range(50))
    assert before[("hang", "queue_full")] >= 40 and ("recorder", "queue_full") not in before
    assert tel_errors(tel)[("hang", "close_timeout")] == 1


def test_wait_for_trackers_loses_no_step_of_a_burst_and_never_waits_for_a_hung_sink():
    """A burst logged with wait_for_trackers=True (ROLL's history replay) waits for a slow sink instead of losing
    steps; a sink hung past close_timeout_s is not waited for: the burst goes on, dropping as always."""
    import threading

    Recorder.instances.clear()
    tel = rl_otel.init(prometheus=False, trackers=["hang"], sink_queue_size=4, close_timeout_s=30,
                       handle_sigterm=False)
    (slow,) = Recorder.instances

    def burst(n: int) -> None:
        for step in range(n):
            tel.log({"actor/pg_loss": float(step)}, step=step, wait_for_trackers=True)

    thread = threading.Thread(target=burst, args=(20,))
    thread.start()
    # the sink holds step 0, half the queue (steps 1, 2) waits behind it: step 3 waits for room (without the wait,
    # 20 steps into a queue of 4 behind a held sink would drop, which the last assertion rules out)
    deadline = time.monotonic() + 30
    while tel.step != 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert tel.step == 3
    slow.release.set()
    thread.join(timeout=60)
    assert not thread.is_alive() and tel.flush(30)
    assert [s for s, _ in slow.steps] == list(range(20)) and ("hang", "queue_full") not in tel_errors(tel)
    tel.close()

    Recorder.instances.clear()
    tel = rl_otel.init(prometheus=False, trackers=["hang"], sink_queue_size=4, close_timeout_s=0.3,
                       handle_sigterm=False)
    (hung,) = Recorder.instances
    thread = threading.Thread(target=burst, args=(20,))
    thread.start()
    thread.join(timeout=60)  # one wait for the sink to count as hung, then no more
    assert not thread.is_alive() and tel_errors(tel)[("hang", "queue_full")] >= 10
    tel.close()
    hung.release.set()


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_full_disk_is_counted_and_training_goes_on(tmp_path):
    Recorder.instances.clear()
    with rl_otel.init(prometheus=False, handle_sigterm=False,
                      trackers={"stdout": {"file": "/dev/full"}, "tensorboard": {"log_dir": str(tmp_path)}}) as tel:
        for step in range(3):
            tel.log({"actor/pg_loss": float(step)}, step=step)
        tel.flush()
        errors = tel_errors(tel)
    assert errors[("stdout", "disk_full")] >= 3
    assert [s for s, _ in tensorboard_scalars(str(tmp_path))["actor/pg_loss"]] == [0, 1, 2]


def test_close_is_idempotent_and_log_after_close_is_ignored(tmp_path):
    Recorder.instances.clear()
    tel = rl_otel.init(prometheus=False, trackers=["recorder"], handle_sigterm=False)
    tel.log({"a": 1.0}, step=0)
    tel.close()
    tel.close()
    tel.log({"a": 2.0}, step=1)
    (rec,) = Recorder.instances
    assert [s for s, _ in rec.steps] == [0] and rec.closed


def test_flush_after_close_reports_done_instead_of_waiting_for_the_timeout():
    Recorder.instances.clear()
    tel = rl_otel.init(prometheus=False, trackers=["recorder"], handle_sigterm=False, close_timeout_s=600)
    tel.log({"a": 1.0}, step=0)
    tel.close()
    (rec,) = Recorder.instances
    # the worker has ended; nothing is left queued, so the flush is done (it used to wait 600 s, then say False)
    assert tel.flush(timeout_s=0.5) is True
    assert [s for s, _ in rec.steps] == [0] and rec.closed


def test_sigterm_flushes_every_finished_step(tmp_path):
    code = """
        import os, signal, time, rl_otel
        tel = rl_otel.init(prometheus=False, trackers={"tensorboard": {"log_dir": "tb", "flush_secs": 3600},
                                                         "stdout": {"file": "out.log"}})
        for step in range(40):
            tel.log({f"actor/k{i}": float(step) for i in range(100)}, step=step)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)
        raise SystemExit("SIGTERM did not end the run")
    """
    proc = run_script(code, {}, tmp_path)
    assert proc.returncode == -signal.SIGTERM, proc.stderr
    scalars = tensorboard_scalars(str(tmp_path / "tb"))
    assert len(scalars) == 100 and all([s for s, _ in v] == list(range(40)) for v in scalars.values())
    assert len((tmp_path / "out.log").read_text().splitlines()) == 40


def test_sigterm_chains_the_previous_handler(tmp_path):
    code = """
        import signal, os, sys, rl_otel
        signal.signal(signal.SIGTERM, lambda *a: (print("previous handler ran"), sys.exit(7)))
        tel = rl_otel.init(prometheus=False, trackers={"stdout": {"file": "out.log"}})
        tel.log({"a": 1.0}, step=0)
        os.kill(os.getpid(), signal.SIGTERM)
    """
    proc = run_script(code, {}, tmp_path)
    assert proc.returncode == 7 and "previous handler ran" in proc.stdout
    assert (tmp_path / "out.log").read_text().count("metrics_tag: ") == 1


def test_sigterm_with_the_applications_graceful_handler_loses_no_final_step(tmp_path):
    """The application stops gracefully on SIGTERM (a framework checkpointing and logging its last steps): rl_otel
    writes what is logged, runs the application's handler and stays open - the final steps reach the tracker and
    the endpoint serves until the application exits (before: rl_otel closed first; the 50 final steps were lost)."""
    code = """
        import os, signal, urllib.request, rl_otel
        stop = []
        signal.signal(signal.SIGTERM, lambda *a: stop.append(True))
        tel = rl_otel.init(prometheus={"host": "127.0.0.1", "port": 0}, trackers={"stdout": {"file": "out.log"}})
        step = 0
        while not stop:
            tel.log({"actor/pg_loss": float(step)}, step=step)
            step += 1
            if step == 10:
                os.kill(os.getpid(), signal.SIGTERM)
        served = 0
        for _ in range(50):  # checkpointing: the final steps
            tel.log({"actor/pg_loss": float(step)}, step=step)
            step += 1
            served += b"rl_actor_pg_loss" in urllib.request.urlopen(tel.metrics_url, timeout=10).read()
        print("steps", step, "served", served)
    """
    proc = run_script(code, {}, tmp_path)
    assert proc.returncode == 0, proc.stderr
    steps = int(proc.stdout.split()[1])
    assert proc.stdout.split()[2:] == ["served", "50"]
    assert (tmp_path / "out.log").read_text().count("metrics_tag: ") == steps


def test_sigterm_without_trackers_removes_the_file_sd_target(tmp_path):
    """No tracker, but a file_sd target: a SIGTERM'd rank must not leave its target behind (a critical "target
    down" alert would fire until someone deleted it); before, no handler was installed without trackers."""
    code = """
        import os, signal, time, rl_otel
        tel = rl_otel.init(run="sd", prometheus={"host": "127.0.0.1", "port": 0, "file_sd": "sd"})
        tel.log({"actor/pg_loss": 1.0}, step=0)
        print(sorted(os.listdir("sd")), flush=True)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)
        raise SystemExit("SIGTERM did not end the run")
    """
    proc = run_script(code, {}, tmp_path)
    assert proc.returncode == -signal.SIGTERM, proc.stderr
    assert "json" in proc.stdout  # the target was published...
    assert os.listdir(tmp_path / "sd") == []  # ...and removed by the SIGTERM


def test_secrets_never_written_anywhere(tmp_path):
    """Every tracker at once, secrets in tracker_kwargs, login_kwargs and the uploaded config: grep every file."""
    pytest.importorskip("wandb")
    pytest.importorskip("swanlab")
    secret_w, secret_s, secret_r = "WANDB-SECRET-7f3a9", "SWAN-SECRET-b41c2", "RECORDER-SECRET-99"
    code = f"""
        import logging, numpy as np, rl_otel
        from rl_otel.sinks import register_sink
        class Boom:
            def __init__(self, *, run, api_key): self.k = api_key
            def log(self, m, s): raise RuntimeError("rejected api_key " + self.k)
            def close(self): pass
        register_sink("boom", lambda **kw: Boom(**kw))
        logging.basicConfig(level=logging.DEBUG)
        trackers = {{
            "tensorboard": {{"log_dir": "tb"}},
            "wandb": {{"api_key": "{secret_w}", "project": "p", "dir": "wb",
                       "config": {{"lr": 1e-6, "api_key": "{secret_w}",
                                  "tracker_kwargs": {{"api_key": "{secret_w}"}}}}}},
            "swanlab": {{"login_kwargs": {{"api_key": "{secret_s}"}}, "project": "p", "logdir": "swanlog",
                         "mode": "offline", "config": {{"login_kwargs": {{"api_key": "{secret_s}"}}}}}},
            "stdout": {{"table": True}},
            "boom": {{"api_key": "{secret_r}"}},
        }}
        tel = rl_otel.init("secrets", prometheus={{"host": "127.0.0.1", "port": 0}}, trackers=trackers)
        print(repr(tel.config))
        for step in range(3):
            tel.log({{"actor/pg_loss": 0.5, "env/reward_dist": np.arange(4.0)}}, step=step)
        import urllib.request
        open("scrape.txt", "w").write(urllib.request.urlopen(tel.metrics_url).read().decode())
        tel.close()
    """
    env = {"HOME": str(tmp_path / "home"), "WANDB_MODE": "offline", "WANDB_SILENT": "true",
           "WANDB_DIR": str(tmp_path / "wb"), "WANDB_CONFIG_DIR": str(tmp_path / "home" / ".config" / "wandb"),
           "WANDB_CACHE_DIR": str(tmp_path / "home" / ".cache")}
    proc = run_script(code, env, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rejected api_key ***" in proc.stderr
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.suffix == ".wandb" for p in files) and any(p.suffix == ".swanlab" for p in files)
    assert any("tfevents" in p.name for p in files) and (tmp_path / "scrape.txt").exists()
    for secret in (secret_w, secret_s, secret_r):
        assert secret not in proc.stdout and secret not in proc.stderr
        leaked = [str(p) for p in files if secret.encode() in p.read_bytes()]
        assert not leaked, f"{secret} written to {leaked}"


def test_a_float64_cpu_tensor_changed_after_log_reaches_the_trackers_as_logged():
    """float64 CPU tensors convert to numpy without a copy: the tracker (here held until released) must still get
    the values of the log() call, not the caller's later in-place change."""
    with rl_otel.init(prometheus=False, trackers=["hang"], handle_sigterm=False) as tel:
        rec = Recorder.instances[-1]
        values = torch.tensor([0.5, 1.5, 2.5], dtype=torch.float64)
        tel.log({"actor/ratio_dist": values}, step=1)
        values.fill_(9.0)
        rec.release.set()
        assert tel.flush(10)
        assert rec.steps[0][1]["actor/ratio_dist"].tolist() == [0.5, 1.5, 2.5]


def _in_forked_child(child) -> bytes:
    """Run ``child()`` (returns bytes) in a forked child; its answer, or b"" if it gave none within 60 s."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.write(write, child())
        finally:
            os._exit(0)
    os.close(write)
    try:
        answered, _, _ = select.select([read], [], [], 60)
        return os.read(read, 1 << 16) if answered else b""
    finally:
        os.close(read)
        if not answered:
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX-only")
def test_a_forked_child_mirrors_its_own_steps_to_the_trackers(tmp_path):
    """A forked child (a dataloader or rollout worker) logs through the inherited Telemetry: its tracker workers
    start over with threads of their own, its flush() finishes, and TensorBoard and the stdout file get its steps."""
    tb, out = tmp_path / "tb", tmp_path / "out.log"
    tel = rl_otel.init("fork", prometheus=False, handle_sigterm=False,
                       trackers={"tensorboard": {"log_dir": str(tb), "flush_secs": 3600}, "stdout": {"file": str(out)}})
    try:
        for step in range(3):
            tel.log({"actor/pg_loss": float(step)}, step=step)
        assert tel.flush(30)

        def child() -> bytes:
            for step in (10, 11):
                tel.log({"actor/pg_loss": float(step)}, step=step)
            return b"1" if tel.flush(30) else b"0"

        assert _in_forked_child(child) == b"1"
        assert tensorboard_scalars(str(tb))["actor/pg_loss"] == [(s, float(s)) for s in (0, 1, 2, 10, 11)]
        lines = [json.loads(line[len("metrics_tag: "):]) for line in out.read_text().splitlines()]
        assert [line["step"] for line in lines] == [0, 1, 2, 10, 11]
        tel.log({"actor/pg_loss": 12.0}, step=12)  # the parent's trackers go on
        assert tel.flush(30)
        assert [json.loads(line[len("metrics_tag: "):])["step"] for line in out.read_text().splitlines()][-1] == 12
    finally:
        tel.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX-only")
def test_a_forked_child_starts_with_an_empty_queue_even_when_the_parents_sink_is_stuck():
    """At the fork the parent's sink is busy (hung) with steps queued behind it: the child writes only its own
    steps, and the parent's steps are written by the parent once its sink returns."""
    Recorder.instances.clear()
    tel = rl_otel.init(prometheus=False, trackers=["hang"], handle_sigterm=False, close_timeout_s=30)
    (rec,) = Recorder.instances
    try:
        for step in range(3):  # step 0 is in the sink's hands (hung), 1 and 2 wait
            tel.log({"actor/pg_loss": float(step)}, step=step)
        assert rec.entered.wait(30)  # the sink holds step 0; 1 and 2 were queued before log() returned

        def child() -> bytes:
            rec.release.set()  # the child's copy of the sink is not hung
            tel.log({"actor/pg_loss": 10.0}, step=10)
            ok = tel.flush(30)
            return json.dumps({"ok": ok, "steps": [s for s, _ in rec.steps]}).encode()

        assert json.loads(_in_forked_child(child) or b"{}") == {"ok": True, "steps": [10]}
        rec.release.set()
        assert tel.flush(30) and [s for s, _ in rec.steps] == [0, 1, 2]
    finally:
        rec.release.set()
        tel.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX-only")
def test_a_forked_childs_close_returns_and_leaves_the_parents_endpoint_and_target(tmp_path):
    """fork() after init() (a DataLoader worker, a subprocess pool): the child's close() returns (before: it hung
    forever waiting for a serve thread the child does not have) and removes neither the parent's file_sd target
    nor its endpoint."""
    from tests.promtools import scrape

    tel = rl_otel.init(run="fork", prometheus={"host": "127.0.0.1", "port": 0, "file_sd": str(tmp_path)},
                       handle_sigterm=False)
    try:
        tel.log({"actor/pg_loss": 1.0}, step=0)
        (target,) = list(tmp_path.iterdir())

        def child() -> bytes:
            tel.log({"actor/pg_loss": 2.0}, step=1)
            tel.close()
            return b"closed"

        assert _in_forked_child(child) == b"closed"
        assert target.exists()  # the parent still serves the target it names
        assert "rl_actor_pg_loss{" in scrape(tel.metrics_url)
    finally:
        tel.close()
    assert not target.exists()
