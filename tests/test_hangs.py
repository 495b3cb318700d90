"""Hangs with evidence (issue 33 item 3): a phase stuck far past its usual duration, a signal or GET /debug/stacks
makes the process write the stacks of all its threads to a file and say where (a warning, rl_stack_dumps_total,
rl_stack_dump_info), without stopping training, once per stuck phase run; rl_last_progress_timestamp_seconds tells
a process alive but making no progress."""

from __future__ import annotations

import faulthandler
import inspect
import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import bcrypt
import pytest
import yaml

import rl_otel
from rl_otel._internal.probes.hangs import ON_DEMAND_SPACING_S, HangWatch, PhaseHistory, dump_dir
from rl_otel._internal.probes.live import RunningPhases
from rl_otel._internal.probes.posix import os_handler, signal_taken
from rl_otel._internal.probes.stacks import faulthandler_text, pyspy_text, stacks_text
from rl_otel._internal.runtime.options import build_config
from rl_otel.errors import ConfigurationError
from tests.promtools import scrape
from tests.test_endpoint_hardening import PASSWORD, auth, status_of
from tests.test_watch_support import wait_for

POSIX_SIGNALS = pytest.mark.skipif(not hasattr(signal, "SIGUSR1"), reason="POSIX signals")
ROOT = Path(__file__).resolve().parents[1]


def _generate_blocked(tel: rl_otel.Telemetry, lock: threading.Lock) -> None:
    """A rollout phase hung on a lock another thread holds (the hang under test)."""
    with tel.phase("actor_infer", "generate"):
        lock.acquire()  # the blocking frame
    lock.release()


def _acquire_line() -> int:
    lines, first = inspect.getsourcelines(_generate_blocked)
    return first + next(i for i, line in enumerate(lines) if "lock.acquire()  # the blocking frame" in line)


def _dumps(directory: Path, reason: str) -> list[Path]:
    return sorted(p for p in directory.glob("stacks-*.txt") if f"-{reason}-" in p.name)


def _count(tel: rl_otel.Telemetry, reason: str) -> float | None:
    return tel.value("rl_stack_dumps_total", reason=reason)


def test_a_thread_blocked_on_a_lock_inside_a_phase_gets_one_dump_naming_the_acquire(tmp_path, caplog):
    """The real hang: a thread blocks on a lock inside ``actor_infer/generate`` while another thread trains. Past
    the threshold the dump appears, names the blocking frame (function and line of the acquire), the series and a
    warning point at it, the training thread's steps keep being served, and the stuck run is dumped once however
    long it stays stuck; released and stuck again, it is a new episode and a second dump."""
    caplog.set_level(logging.WARNING, logger="rl_otel")
    lock = threading.Lock()
    lock.acquire()
    stop = threading.Event()

    def train() -> None:
        step = 0
        while not stop.is_set():
            with tel.phase("actor_train", "train_step"):
                pass
            tel.log({"actor/pg_loss": float(step)}, step=step)
            step += 1
            time.sleep(0.005)

    with rl_otel.init(run="hang", prometheus={"host": "127.0.0.1", "port": 0}, hang_min_s=0.3, hang_factor=2.0,
                      stack_dump_dir=tmp_path, stack_dump_signal=None, handle_sigterm=False) as tel:
        trainer = threading.Thread(target=train, name="trainer")
        trainer.start()
        blocked = threading.Thread(target=_generate_blocked, args=(tel, lock), name="rollout")
        blocked.start()
        try:
            wait_for(lambda: _count(tel, "stuck") == 1, 30, "the stuck phase's dump")
            [dump] = _dumps(tmp_path, "stuck")
            assert dump.name.startswith("stacks-hang-trainer-rank0-actor_infer.generate-stuck-")
            text = dump.read_text()
            assert f'"{__file__}", line {_acquire_line()} in _generate_blocked' in text
            assert "phase actor_infer/generate has run" in text and "no run of it has finished yet" in text
            assert "rollout" in text and "trainer" in text  # the threads' names beside their identifiers
            assert tel.value("rl_stack_dump_info", reason="stuck", cluster="actor_infer", phase="generate",
                             path=str(dump)) == 1.0
            assert f'path="{dump}"' in scrape(tel.metrics_url)
            assert any(str(dump) in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)

            # training goes on: the trainer's steps keep being served while the rollout thread stays stuck
            at_dump = tel.value("rl_step")
            assert at_dump is not None
            wait_for(lambda: tel.value("rl_step") >= at_dump + 20, 30, "20 more training steps")
            assert blocked.is_alive()
            progress = tel.value("rl_last_progress_timestamp_seconds")
            assert progress is not None and time.time() - progress < 30

            # one dump per episode: more watchdog passes over the same stuck run write nothing more
            watch = tel._components.hangs
            passes = watch.checks
            wait_for(lambda: watch.checks >= passes + 5, 30, "five more watchdog passes")
            assert _count(tel, "stuck") == 1 and len(_dumps(tmp_path, "stuck")) == 1
            assert not any("actor_train" in p.name for p in tmp_path.iterdir())  # the healthy phase: never

            # recovered, then stuck again: a new episode (its threshold now from the first run's duration)
            lock.release()
            blocked.join(30)
            assert not blocked.is_alive()
            lock.acquire()
            blocked = threading.Thread(target=_generate_blocked, args=(tel, lock), name="rollout-2")
            blocked.start()
            wait_for(lambda: _count(tel, "stuck") == 2, 60, "the second episode's dump")
            second = _dumps(tmp_path, "stuck")[-1]
            assert "over its last 1 runs" in second.read_text()
        finally:
            lock.release()
            blocked.join(30)
            stop.set()
            trainer.join(30)


def test_the_threshold_is_a_multiple_of_the_phases_usual_duration_with_a_floor(tmp_path):
    """Driven pass by pass at chosen times: a phase whose past runs took ~1 s is stuck past 3 x its p90 (3 s), not
    before; one with no history past the floor; each run dumped once; a run after it is a new episode."""
    history = PhaseHistory()
    assert history.threshold("c", "p", 3.0, 0.9, 1.0) == (1.0, None, 0)
    for seconds in (*(1.0,) * 9, 2.0):
        history.add("c", "p", seconds)
    assert history.threshold("c", "p", 3.0, 0.9, 1.0) == (3.0, 1.0, 10)  # p90 of ten: the 9th smallest
    assert history.threshold("c", "p", 3.0, 1.0, 1.0).usual == 2.0
    assert history.threshold("c", "p", 3.0, 0.9, 60.0).seconds == 60.0  # the floor wins

    errors: list[str] = []
    watch = HangWatch(base={"run": "r", "role": "trainer", "rank": "0"}, factor=3.0, quantile=0.9, min_s=1.0,
                      directory=str(tmp_path), count=errors.append)
    running = RunningPhases()
    watch.watch(running, start=False)
    for seconds in (*(1.0,) * 9, 2.0):
        watch.progressed("c", "p", seconds)
    started = running.enter("c", "p")
    fresh = running.enter("c", "new")
    watch.check(now=started + 0.9)  # under the floor: the phase without history waits for it too
    assert list(tmp_path.iterdir()) == []
    watch.check(now=started + 2.9)
    assert [p.name.split("-")[4] for p in tmp_path.iterdir()] == ["c.new"]  # past the floor, no history
    watch.check(now=started + 3.1)
    assert sorted(p.name.split("-")[4] for p in tmp_path.iterdir()) == ["c.new", "c.p"]
    for later in (10.0, 100.0, 1000.0):
        watch.check(now=started + later)
    assert len(list(tmp_path.iterdir())) == 2  # one per episode
    running.leave("c", "p", started)
    again = running.enter("c", "p")
    watch.check(now=again + 3.1)
    assert len(_dumps(tmp_path, "stuck")) == 3
    counts = {labels: value for spec, labels, value in watch.collect() if spec.name == "rl_stack_dumps"}
    assert counts == {(("reason", "stuck"),): 3.0, (("reason", "signal"),): 0.0, (("reason", "http"),): 0.0}
    running.leave("c", "new", fresh)
    assert errors == []
    watch.close()


def test_last_progress_is_set_by_a_logged_step_and_by_a_finished_phase(tmp_path):
    with rl_otel.init(run="p", prometheus=False, stack_dump_dir=tmp_path, handle_sigterm=False) as tel:
        assert tel.value("rl_last_progress_timestamp_seconds") is None  # no progress yet
        before = time.time()
        with tel.phase("actor_infer", "generate"):
            pass
        by_phase = tel.value("rl_last_progress_timestamp_seconds")
        assert by_phase is not None and by_phase >= before
        tel.log({"actor/pg_loss": 1.0})
        assert tel.value("rl_last_progress_timestamp_seconds") >= by_phase
    with rl_otel.init(run="p2", prometheus=False, stack_dump_dir=tmp_path, handle_sigterm=False) as tel:
        tel.log({"actor/pg_loss": 1.0})
        assert tel.value("rl_last_progress_timestamp_seconds") >= before


_CHILD = textwrap.dedent("""
    import os, signal, sys, time
    import rl_otel

    if sys.argv[2] == "own":
        signal.signal(signal.SIGUSR1, lambda signum, frame: print("the application's handler ran", flush=True))
    tel = rl_otel.init(run="sig", rank=3, prometheus=False, stack_dump_dir=sys.argv[1], handle_sigterm=False)

    def training_loop():
        step = 0
        print("ready", flush=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (tel.value("rl_stack_dumps_total", reason="signal")
                                                   or sys.argv[2] == "own" and step > 100):
            tel.log({"actor/pg_loss": float(step)}, step=step)
            step += 1
            time.sleep(0.01)
        for _ in range(50):
            tel.log({"actor/pg_loss": float(step)}, step=step)
            step += 1
        print("steps", step, "dumps", tel.value("rl_stack_dumps_total", reason="signal"), flush=True)

    training_loop()
    tel.close()
""")


def _run_child(tmp_path: Path, mode: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(tmp_path), mode], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        os.kill(proc.pid, signal.SIGUSR1)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err  # not killed by the signal: the process went on
    return out


@POSIX_SIGNALS
def test_sigusr1_makes_a_training_process_dump_its_stacks_and_go_on(tmp_path):
    out = _run_child(tmp_path, "free")
    assert "dumps 1.0" in out
    [dump] = _dumps(tmp_path, "signal")
    assert dump.name.startswith("stacks-sig-trainer-rank3-no-phase-signal-")
    text = dump.read_text()
    assert "stacks asked by SIGUSR1" in text
    assert "in training_loop" in text  # the main thread, where the signal found it
    assert "rl_otel-hangs" in text


@POSIX_SIGNALS
def test_a_signal_the_application_handles_is_never_taken(tmp_path):
    out = _run_child(tmp_path, "own")
    assert "the application's handler ran" in out
    assert "dumps 0.0" in out
    assert _dumps(tmp_path, "signal") == []


@POSIX_SIGNALS
def test_the_signal_is_read_at_the_os_level_taken_only_when_free_and_given_back(tmp_path):
    """The adapter reads the kernel's handler (what signal.getsignal() misses: faulthandler's, a C extension's);
    rl_otel takes a free signal and gives it back at close, and leaves one faulthandler already holds."""
    sig = signal.SIGUSR2
    assert signal.getsignal(sig) is signal.SIG_DFL and os_handler(sig) == 0 and not signal_taken(sig)
    faulthandler.register(sig, file=sys.stderr)
    try:
        assert signal.getsignal(sig) is signal.SIG_DFL  # invisible to the signal module...
        assert os_handler(sig) not in (0, None) and signal_taken(sig)  # ...not to the kernel
        with rl_otel.init(run="s", prometheus=False, stack_dump_dir=tmp_path, stack_dump_signal="USR2",
                          handle_sigterm=False) as tel:
            assert tel._components.hangs._signal is None  # left to the application
        assert faulthandler.unregister(sig)  # still the application's registration
    finally:
        faulthandler.unregister(sig)
    previous = signal.signal(sig, signal.SIG_IGN)
    try:
        assert os_handler(sig) == 1 and signal_taken(sig)
    finally:
        signal.signal(sig, previous)
    with rl_otel.init(run="s", prometheus=False, stack_dump_dir=tmp_path, stack_dump_signal=int(sig),
                      handle_sigterm=False) as tel:
        assert tel._components.hangs._signal == sig and os_handler(sig) not in (0, None)
    assert os_handler(sig) == 0  # given back at close


def _web_config(tmp_path: Path) -> str:
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
    path = tmp_path / "web.yml"
    path.write_text(yaml.safe_dump({"basic_auth_users": {"prometheus": hashed}}))
    return str(path)


def test_debug_stacks_is_behind_the_endpoints_basic_auth(tmp_path):
    dumps = tmp_path / "dumps"
    with rl_otel.init(run="web", prometheus={"host": "127.0.0.1", "port": 0, "web_config_file": _web_config(tmp_path)},
                      stack_dump_dir=dumps, stack_dump_signal=None, handle_sigterm=False) as tel:
        url = tel.metrics_url.replace("/metrics", "/debug/stacks")
        assert status_of(url) == 401
        assert not dumps.exists()  # nothing written for an unauthenticated request
        request = urllib.request.Request(url, headers=auth(PASSWORD))
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.headers["Content-Type"] == "text/plain; charset=utf-8"
            body = response.read().decode()
        [dump] = _dumps(dumps, "http")
        assert body.startswith(f"# written to {dump}\n")
        assert body.endswith(dump.read_text())
        assert "stacks asked by GET /debug/stacks" in body and "Current thread" in body
        assert "in test_debug_stacks_is_behind_the_endpoints_basic_auth" in body  # the test's own (main) thread
        assert _count(tel, "http") == 1.0
        # a second request within ON_DEMAND_SPACING_S gets the same dump: no new file, no py-spy pause
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.read().decode() == body
        assert _count(tel, "http") == 1.0 and len(_dumps(dumps, "http")) == 1
        assert ON_DEMAND_SPACING_S >= 1


def test_debug_stacks_can_be_turned_off(tmp_path):
    with rl_otel.init(run="off", prometheus={"host": "127.0.0.1", "port": 0}, stack_dump_dir=tmp_path,
                      stack_dump_http=False, stack_dump_signal=None, handle_sigterm=False) as tel:
        body = scrape(tel.metrics_url.replace("/metrics", "/debug/stacks"))
        assert "faulthandler" not in body and "rl_stack_dumps_total" in body  # the path serves the metrics
        assert _count(tel, "http") == 0.0 and list(tmp_path.iterdir()) == []


def test_a_dump_that_cannot_be_written_is_counted_and_still_answered(tmp_path):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    with rl_otel.init(run="ro", prometheus={"host": "127.0.0.1", "port": 0}, stack_dump_dir=blocked / "dumps",
                      stack_dump_signal=None, handle_sigterm=False) as tel:
        body = scrape(tel.metrics_url.replace("/metrics", "/debug/stacks"))
        assert body.startswith("# written to not written") and "Current thread" in body
        assert tel.value("rl_telemetry_errors_total", sink="hangs", reason="dump_write") == 1.0
        assert _count(tel, "http") == 0.0
        assert tel.value("rl_stack_dump_info", reason="http", cluster="", phase="", path="") is None


def _fake_pyspy(directory: Path, body: str) -> Path:
    directory.mkdir()
    exe = directory / "py-spy"
    exe.write_text(f"#!/bin/sh\n{body}\n")
    exe.chmod(0o755)
    return directory


def test_faulthandler_text_is_taken_in_memory_or_else_through_a_temporary_file(monkeypatch):
    """Linux's memfd keeps a busy disk out of a dump; where there is none (or it fails), a temporary file."""
    assert "in test_faulthandler_text_is_taken_in_memory" in faulthandler_text()

    def no_memfd(*args):
        raise OSError("no memfd here")

    monkeypatch.setattr(os, "memfd_create", no_memfd, raising=False)
    assert "in test_faulthandler_text_is_taken_in_memory" in faulthandler_text()


@pytest.mark.skipif(sys.platform == "win32", reason="a shell script as the fake py-spy")
def test_pyspy_native_frames_when_installed_faulthandler_alone_when_not(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no py-spy there
    text = stacks_text("# header\n", 5.0)
    assert "py-spy is not installed" in text
    assert "in test_pyspy_native_frames_when_installed_faulthandler_alone_when_not" in text  # faulthandler's

    fake = _fake_pyspy(tmp_path / "bin", 'echo "fake py-spy $*"; echo "Thread 7 (idle): cudaStreamSynchronize"')
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ.get('PATH', '')}")
    watch = HangWatch(base={"run": "r", "role": "rollout", "rank": "1"}, factor=5.0, quantile=0.9, min_s=None,
                      directory=str(tmp_path / "dumps"), count=lambda reason: None)
    dump = watch.on_demand("http")
    assert dump.path is not None
    written = Path(dump.path).read_text()
    assert f"fake py-spy dump --pid {os.getpid()} --native" in written
    assert "cudaStreamSynchronize" in written and "== faulthandler" in written
    watch.close()


@pytest.mark.skipif(sys.platform == "win32", reason="a shell script as the fake py-spy")
def test_a_slow_dump_never_holds_the_scrapes_behind_it(tmp_path, monkeypatch):
    """GET /debug/stacks runs on the endpoint's one worker: a py-spy (or a disk) that takes its time must not hold
    /metrics. The fake py-spy here waits for a file the test makes only after the endpoint answered both requests;
    the dump's file and count follow once it returns."""
    release = tmp_path / "release"
    fake = _fake_pyspy(tmp_path / "bin", f'echo "fake py-spy $*"; while [ ! -e {release} ]; do sleep 0.05; done; '
                                          'echo "Thread 9 (idle): ncclAllReduce"')
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ.get('PATH', '')}")
    dumps = tmp_path / "dumps"
    with rl_otel.init(run="slow", prometheus={"host": "127.0.0.1", "port": 0}, stack_dump_dir=dumps,
                      stack_dump_signal=None, handle_sigterm=False) as tel:
        tel.log({"critic/score/mean": 0.5}, step=1)
        body = scrape(tel.metrics_url.replace("/metrics", "/debug/stacks"))
        assert body.startswith(f"# being written to {dumps}") and "Current thread" in body, body[:300]
        assert "rl_critic_score" in scrape(tel.metrics_url)  # answered while py-spy still runs
        assert not release.exists() and _count(tel, "http") == 0.0  # (so it did)
        release.touch()
        wait_for(lambda: _count(tel, "http") == 1.0, what="the dump written once py-spy returned")
        [dump] = _dumps(dumps, "http")
        text = dump.read_text()
        assert "fake py-spy dump --pid" in text and "ncclAllReduce" in text and "== faulthandler" in text


@pytest.mark.skipif(sys.platform == "win32", reason="a shell script as the fake py-spy")
def test_a_pyspy_that_never_returns_is_killed_at_its_timeout(tmp_path, monkeypatch):
    fake = _fake_pyspy(tmp_path / "bin", f'echo started; exec {shutil.which("sleep")} 60')
    monkeypatch.setenv("PATH", str(fake))
    t0 = time.monotonic()
    text = pyspy_text(0.5)
    assert time.monotonic() - t0 < 30
    assert "still running after 0.5 s: killed" in text


def test_options_are_checked_and_the_dump_directory_resolved(tmp_path, monkeypatch):
    for bad in ({"hang_factor": 0}, {"hang_quantile": 1.5}, {"hang_quantile": 0.0}, {"hang_min_s": -1},
                {"hang_factor": "5"}, {"stack_dump_signal": "SIGTERM"}, {"stack_dump_signal": "NOPE"},
                {"stack_dump_signal": 9}, {"stack_dump_http": "yes"}, {"stack_dump_dir": 3},
                {"stack_dump_dir": ""}):
        name = next(iter(bad))
        with pytest.raises(ConfigurationError, match=name):
            build_config(**bad)
    config = build_config(hang_min_s=None, stack_dump_signal=False)
    assert config.hang_min_s is None and config.stack_dump_signal is None
    if hasattr(signal, "SIGUSR1"):
        assert build_config().stack_dump_signal == signal.SIGUSR1
        assert build_config(stack_dump_signal="usr2").stack_dump_signal == signal.SIGUSR2

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RL_OTEL_DUMP_DIR", raising=False)
    assert build_config(run="r").stack_dump_dir == str(tmp_path / "rl_otel_dumps")
    assert build_config(run="r", trackers={"tensorboard": {}}).stack_dump_dir == str(tmp_path / "runs" / "r")
    assert build_config(run="r", trackers={"tensorboard": {"log_dir": "tb"}}).stack_dump_dir == str(tmp_path / "tb")
    monkeypatch.setenv("RL_OTEL_DUMP_DIR", "/var/dumps")
    assert build_config(run="r", trackers={"tensorboard": {}}).stack_dump_dir == "/var/dumps"
    assert build_config(run="r", stack_dump_dir="mine").stack_dump_dir == str(tmp_path / "mine")
    assert dump_dir(None, [], {}) == str(tmp_path / "rl_otel_dumps")


_NATIVE_CHILD = textwrap.dedent("""
    import ctypes, sys
    import rl_otel

    tel = rl_otel.init(run="native", prometheus=False, stack_dump_dir=sys.argv[1], handle_sigterm=False)
    libc = ctypes.CDLL(None)
    mutex = ctypes.create_string_buffer(64)  # zeroed: PTHREAD_MUTEX_INITIALIZER (glibc, musl)

    def stuck_in_native_code():
        libc.pthread_mutex_lock(mutex)
        print("ready", flush=True)
        libc.pthread_mutex_lock(mutex)  # a default mutex locked twice: blocked forever, in C, the GIL released

    stuck_in_native_code()
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a glibc/musl pthread mutex through ctypes")
def test_the_signal_is_answered_while_the_main_thread_is_stuck_in_native_code(tmp_path):
    """A Python-level handler would wait for the main thread to run bytecode again, which it never does here; the
    faulthandler-registered signal wakes the dumping thread instead, and the dump shows where the main thread is."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", _NATIVE_CHILD, str(tmp_path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        os.kill(proc.pid, signal.SIGUSR1)
        [dump] = wait_for(lambda: [p for p in _dumps(tmp_path, "signal") if "== py-spy" in p.read_text()], 60,
                          "the dump of a process whose main thread is stuck in C")
        assert proc.poll() is None  # still stuck, still alive: nothing was stopped
        assert "in stuck_in_native_code" in dump.read_text()
    finally:
        proc.kill()
        proc.communicate()
