"""Test sinks (a recorder, one that raises, one that hangs), a script runner and an error-counter reader, shared by
the bridge and fault tests (one module, so the sinks are registered once)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import ClassVar

from rl_otel.sinks import register_sink

REPO = Path(__file__).resolve().parents[1]


class Recorder:
    instances: ClassVar[list[Recorder]] = []

    def __init__(self, *, run: str, fail: str | None = None, secret: str = "") -> None:
        self.steps: list[tuple[int, dict]] = []
        self.fail, self.secret, self.closed = fail, secret, False
        self.release = threading.Event()
        self.entered = threading.Event()  # a step reached log() (and, when hanging, waits there)
        self.seen = threading.Condition()
        Recorder.instances.append(self)

    def wait_for_steps(self, n: int) -> bool:
        with self.seen:
            return self.seen.wait_for(lambda: len(self.steps) >= n, timeout=30)

    def log(self, metrics, step):
        if self.fail == "raise":
            raise RuntimeError(f"tracker exploded (key {self.secret})")
        self.entered.set()
        if self.fail == "hang":
            self.release.wait()
        with self.seen:
            self.steps.append((step, metrics))
            self.seen.notify_all()

    def close(self):
        self.closed = True


register_sink("recorder", lambda **kw: Recorder(**kw))
register_sink("boom", lambda **kw: Recorder(fail="raise", **kw))
register_sink("hang", lambda **kw: Recorder(fail="hang", **kw))


class _Errors:
    """``rl_telemetry_errors_total`` of a Telemetry by ``(sink, reason)``, read with the public ``tel.value``."""

    def __init__(self, tel) -> None:
        self._tel = tel

    def get(self, key: tuple[str, str], default=None):
        value = self._tel.value("rl_telemetry_errors_total", sink=key[0], reason=key[1])
        return default if value is None else value

    def __getitem__(self, key: tuple[str, str]) -> float:
        value = self.get(key)
        if value is None:
            raise KeyError(key)
        return value

    def __contains__(self, key: tuple[str, str]) -> bool:
        return self.get(key) is not None


def tel_errors(tel) -> _Errors:
    return _Errors(tel)


def run_script(code: str, env: dict, cwd: Path) -> subprocess.CompletedProcess:
    # A script file, not ``-c``: SwanLab and WandB record the command line, which would hold the test's secrets.
    script = cwd / "train.py"
    script.write_text(textwrap.dedent(code))
    # WANDB_SERVICE: set in os.environ by a wandb run of this process (an earlier test); a child inheriting it
    # hands its run to that wandb-core, whose working directory is not the child's, and its files land elsewhere
    inherited = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}
    env = {**inherited, "PYTHONPATH": str(REPO), **env}
    try:
        return subprocess.run([sys.executable, str(script)], cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=120)
    finally:
        script.unlink()
