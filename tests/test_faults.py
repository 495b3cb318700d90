"""Faults during a run, each against the real parts: a hung tracker, a full disk under TensorBoard, SIGTERM and
SIGINT in the middle of a step, NVML failing mid-run. Training always goes on; nothing already logged is lost.

(A raising sink and a full disk under the stdout sink are in test_bridge.py; a port in use in test_telemetry.py.)
"""

from __future__ import annotations

import errno
import functools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import rl_otel
from rl_otel._internal.probes import live
from tests._child import Child
from tests._readers import tensorboard_scalars
from tests._sinks import Recorder, run_script, tel_errors
from tests.gpu_fakes import FakeNvml, wait_for_nvml
from tests.promtools import promtool_check, samples, scrape

pytestmark = pytest.mark.slow  # the slow layer (tests/conftest.py)


def test_hung_sink_call_is_counted_as_a_timeout_and_log_never_waits():
    Recorder.instances.clear()
    tel = rl_otel.init(prometheus=False, trackers=["hang", "recorder"], sink_queue_size=4, close_timeout_s=1.0,
                       handle_sigterm=False)
    hung, good = Recorder.instances
    try:
        for step in range(20):
            if step == 1:
                assert hung.entered.wait(30)
                entered = time.monotonic()  # the hung call started before this
            if step == 10:  # the hung call is now older than close_timeout_s: a lower bound, not a race
                time.sleep(max(0.0, entered + 1.0 - time.monotonic()) + 0.01)
            tel.log({"actor/pg_loss": float(step)}, step=step)
            assert good.wait_for_steps(step + 1)  # the healthy sink keeps up
        errors = tel_errors(tel)
    finally:
        tel.close()  # bounded: the hung worker is abandoned
        hung.release.set()
    assert errors[("hang", "timeout")] == 1  # once per stuck call, not once per step
    assert errors[("hang", "queue_full")] >= 10 and ("recorder", "timeout") not in errors
    assert [s for s, _ in good.steps] == list(range(20)) and tel.step == 19


def wait_until(condition, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


class SmallDisk:
    """A 1 MiB tmpfs nearly filled by a ``filler`` file when we may mount (root, and ``mount`` asked); otherwise
    ENOSPC injected where the sink's event file writer hands bytes to its file. ``fill()``/``free()`` switch
    between a full and a roomy disk."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch, mount: bool = True) -> None:
        self.path = root / "disk"
        self.path.mkdir()
        self.mounted = mount and os.geteuid() == 0 and subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(self.path)], capture_output=True).returncode == 0
        self.full = False
        if not self.mounted:
            from rl_otel.sinks.tfevents import EventFileWriter

            real_write = EventFileWriter._write

            def write(writer, data):
                if self.full:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), writer.path)
                return real_write(writer, data)

            monkeypatch.setattr(EventFileWriter, "_write", write)

    def fill(self) -> None:
        self.full = True
        if self.mounted:
            try:
                with open(self.path / "filler", "wb", buffering=0) as f:
                    while True:
                        f.write(b"\0" * 4096)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC

    def free(self) -> None:
        self.full = False
        if self.mounted:
            (self.path / "filler").unlink()

    def close(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.path)], check=True)


@pytest.mark.parametrize("mount", [True, False], ids=["tmpfs_if_root", "injected_enospc"])
def test_full_disk_under_tensorboard_is_counted_and_mirroring_resumes_when_space_is_freed(tmp_path, monkeypatch,
                                                                                         mount):
    disk = SmallDisk(tmp_path, monkeypatch, mount)
    tb = disk.path / "tb"
    row = {f"actor/k{i}": 0.0 for i in range(50)}
    try:
        tel = rl_otel.init(prometheus=False, handle_sigterm=False,
                           trackers={"tensorboard": {"log_dir": str(tb), "flush_secs": 0.05, "reopen_secs": 0}})
        step = 0
        for step in range(5):  # room: written
            tel.log({k: float(step) for k in row}, step=step)
        assert tel.flush(10)  # on disk: flush() writes the sink's pending records out
        disk.fill()
        while tel_errors(tel).get(("tensorboard", "disk_full"), 0) < 2 and step < 2000:
            step += 1
            tel.log({k: float(step) for k in row}, step=step)  # never raises, never blocks
            tel.flush(10)
            time.sleep(0.01)
        disk.free()
        freed_at = step + 1
        for step in range(freed_at, freed_at + 10):
            tel.log({k: float(step) for k in row}, step=step)
        tel.close()
        errors = tel_errors(tel)
        scalars = tensorboard_scalars(str(tb))
    finally:
        disk.close()
    assert errors[("tensorboard", "disk_full")] >= 2 and tel.step == freed_at + 9
    assert set(scalars) == set(row)
    steps = {s for s, _ in scalars["actor/k0"]}
    assert set(range(5)) <= steps  # written before the disk filled
    # the first step or two after freeing may still meet a writer opened while the disk was full; then it resumes
    assert set(range(freed_at + 2, freed_at + 10)) <= steps
    # every step missing from the file is counted, once: the steps buffered in a failed write too (before: 1,184
    # steps lost, 880 counted)
    assert errors[("tensorboard", "disk_full")] == len(set(range(tel.step + 1)) - steps)


SIGNALLED_RUN = """
    import os, signal, sys, time
    from collections.abc import Mapping
    import rl_otel

    SIGNUM = signal.{signame}

    class SignalInside(Mapping):
        '''A step whose reading sends the signal: it arrives while log() is running.'''
        def __init__(self, data): self.data, self.sent = data, False
        def __getitem__(self, k): return self.data[k]
        def __len__(self): return len(self.data)
        def __iter__(self):  # log() reads the keys first, whichever path it takes: the signal arrives inside it
            if not self.sent:
                self.sent = True
                os.kill(os.getpid(), SIGNUM)
            return iter(self.data)

    tel = rl_otel.init(prometheus=False, trackers={{"tensorboard": {{"log_dir": "tb", "flush_secs": 3600}},
                                                    "stdout": {{"file": "out.log"}}}})
    row = lambda step: {{f"actor/k{{i}}": float(step) for i in range(100)}}
    for step in range(30):
        tel.log(row(step), step=step)
    try:
        tel.log(SignalInside(row(30)), step=30)
    except KeyboardInterrupt:
        # SIGINT: the trackers were flushed before the interrupt reached the loop, which may go on
        print("interrupted with", len(open("out.log").read().splitlines()), "steps written", flush=True)
        for step in range(31, 40):
            tel.log(row(step), step=step)
        tel.close()
        sys.exit(0)
    time.sleep(30)
    raise SystemExit("the signal did not end the run")
"""


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT"])
def test_signal_inside_a_step_writes_every_step_logged(tmp_path, signame):
    proc = run_script(SIGNALLED_RUN.format(signame=signame), {}, tmp_path)
    scalars = tensorboard_scalars(str(tmp_path / "tb"))
    assert len(scalars) == 100, proc.stderr[-2000:]
    steps = {k: [s for s, _ in v] for k, v in scalars.items()}
    if signame == "SIGTERM":  # killed by SIGTERM as without rl_otel, after the step in progress was written
        assert proc.returncode == -signal.SIGTERM, proc.stderr[-2000:]
        assert all(v == list(range(31)) for v in steps.values())
    else:
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "interrupted with 31 steps written" in proc.stdout
        assert all(v == list(range(40)) for v in steps.values())


CLOSING_RUN = """
import os, sys, time
import rl_otel
from rl_otel.sinks import register_sink

tel = None

class Slow:
    # A tracker still uploading when the run is stopped: it writes each step to a file. At step 5 it tells the
    # test that the Telemetry is closing, then waits until the test has sent its signal.
    def __init__(self, **kw):
        self.out = open("written.txt", "a")
    def log(self, metrics, step):
        if step == 5:
            deadline = time.monotonic() + 120
            while not tel._closed and time.monotonic() < deadline:  # the close has begun
                time.sleep(0.005)
            say(event="closing")
            while not os.path.exists("signalled") and time.monotonic() < deadline:
                time.sleep(0.005)
        time.sleep(0.002)
        self.out.write(f"{step}\\n")
        self.out.flush()
    def close(self):
        self.out.close()

register_sink("slow", lambda **kw: Slow(**kw))
tel = rl_otel.init(prometheus=False, trackers=["slow"], sink_queue_size=100, close_timeout_s=60)
for step in range(60):
    tel.log({"actor/pg_loss": float(step)}, step=step)
if sys.argv[1] == "close":
    tel.close()
    say(event="closed")
    wait()
# else: the exit-time (atexit) close
"""


@pytest.mark.parametrize(("signame", "where"), [("SIGTERM", "close"), ("SIGTERM", "atexit"), ("SIGINT", "close")])
def test_a_signal_during_close_lets_the_close_finish_then_acts(tmp_path, signame, where):
    """SIGTERM (a Slurm time limit, a pod deleted) or SIGINT while close() or the exit-time close waits for a slow
    tracker: the close finishes (all 60 steps written), then the signal does what it would have done without
    rl_otel - death by SIGTERM, a KeyboardInterrupt (before: the handler was the first thing close() removed, and
    the process died at once with 5 of 60 steps written)."""
    child = Child(CLOSING_RUN, [where], tmp_path, env={"PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    try:
        assert child.expect() == {"event": "closing"}
        child.proc.send_signal(getattr(signal, signame))
        (tmp_path / "signalled").touch()
        rc = child.proc.wait(120)
    finally:
        child.kill()
    written = (tmp_path / "written.txt").read_text().split()
    stderr = child.stderr_path.read_text()
    assert written == [str(step) for step in range(60)], (len(written), stderr[-3000:])
    if signame == "SIGTERM":
        assert rc == -signal.SIGTERM, stderr[-3000:]
    else:  # the KeyboardInterrupt reached the program once close() had finished (Python then ends by SIGINT)
        assert rc == -signal.SIGINT and "KeyboardInterrupt" in stderr, stderr[-3000:]
        assert '"closed"' not in "".join(child.output)


def test_nvml_failing_mid_run_leaves_training_and_the_scrape_intact(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    nvml = FakeNvml(uuids=("GPU-a",))
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setattr(live, "NvmlPoller", functools.partial(live.NvmlPoller, interval_s=0.02, stale_after_s=0.3))
    tel = rl_otel.init(run="nvml", prometheus={"host": "127.0.0.1", "port": 0}, handle_sigterm=False)
    try:
        assert wait_for_nvml(tel.metrics_url)
        used = lambda text: samples(text, "rl_gpu_device_memory_used_bytes")
        assert used(scrape(tel.metrics_url))
        nvml.failing = True  # the GPU falls off the bus
        deadline = time.monotonic() + 20
        step = 0
        while used(text := scrape(tel.metrics_url)) and time.monotonic() < deadline:
            tel.log({"actor/pg_loss": float(step)}, step=step)
            step += 1
            time.sleep(0.02)
        assert not used(text), "a failed NVML's last values were served past stale_after_s"
        assert samples(text, "rl_process_resident_memory_bytes") and promtool_check(text) == ""
        errors = tel_errors(tel)
        assert errors[("live", "nvml")] >= 1 and errors[("live", "nvml_stale")] >= 1
        tel.log({"actor/pg_loss": 1.5}, step=step)
        assert samples(scrape(tel.metrics_url), "rl_actor_pg_loss")
        nvml.failing = False  # NVML recovers: the series come back
        wait_until(lambda: used(scrape(tel.metrics_url)))
    finally:
        tel.close()
