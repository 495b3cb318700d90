"""Issue 41 items 4, 8, 9: py-spy found beside the interpreter; a dump's command line redacted, its file 0600,
``/debug/stacks`` served only behind auth or on loopback; a bounded number of dump files, the others counted; a
hanging py-spy never holds the endpoint's worker for the requests after the first."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
import threading
import urllib.request
from pathlib import Path

import pytest

import rl_otel
from rl_otel._internal.probes import hangs
from rl_otel._internal.probes.hangs import HangWatch
from rl_otel._internal.probes.stacks import pyspy_text
from tests.test_watch_support import wait_for

ROOT = Path(__file__).resolve().parents[1]
SHELL = pytest.mark.skipif(sys.platform == "win32", reason="a shell script as the fake py-spy")


def _fake_pyspy(directory: Path, body: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    exe = directory / "py-spy"
    exe.write_text(f"#!/bin/sh\n{body}\n")
    exe.chmod(0o755)
    return directory


def _watch(tmp_path: Path, **kwargs) -> HangWatch:
    return HangWatch(base={"run": "r", "role": "trainer", "rank": "0"}, factor=5.0, quantile=0.9, min_s=None,
                     directory=str(tmp_path / "dumps"), **kwargs)


@SHELL
def test_pyspy_installed_beside_the_interpreter_is_found_with_the_venv_not_on_path(tmp_path, monkeypatch):
    """``venv/bin/python train.py``: the venv's bin is not on PATH (before: "py-spy is not installed")."""
    venv_bin = _fake_pyspy(tmp_path / "venv" / "bin", 'echo "fake py-spy $*"')
    monkeypatch.setattr(sys, "executable", str(venv_bin / "python"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    text = pyspy_text(5.0)
    assert f"fake py-spy dump --pid {os.getpid()} --native" in text, text


_SECRET_CHILD = textwrap.dedent("""
    import sys
    import rl_otel

    tel = rl_otel.init(run="argv", prometheus=False, stack_dump_dir=sys.argv[1], handle_sigterm=False,
                       stack_dump_signal=None)
    dump = tel._components.hangs.on_demand("http")
    print(dump.path)
    tel.close()
""")


@SHELL
@pytest.mark.slow
def test_a_dump_shows_the_command_line_without_its_secrets_in_a_file_only_its_owner_reads(tmp_path):
    # the fake py-spy prints the traced process's command line, as the real one does ("Process 12: python ...")
    fake = _fake_pyspy(tmp_path / "bin", "printf 'Process %s: ' \"$3\"; tr '\\000' ' ' < /proc/$3/cmdline; echo")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PATH": f"{fake}{os.pathsep}{os.environ.get('PATH', '')}"}
    secrets = ["wandb-s3cr3t-v4lue", "hf_t0ken_v4lue", "sl4ck-p4th"]
    argv = [f"--wandb-api-key={secrets[0]}", "--hf_token", secrets[1],
            f"--notify=https://hooks.slack.com/services/T0/B0/{secrets[2]}", "--lr=0.1"]
    proc = subprocess.run([sys.executable, "-c", _SECRET_CHILD, str(tmp_path / "dumps"), *argv], env=env,
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    path = Path(proc.stdout.strip().splitlines()[-1])
    text = path.read_text()
    assert "Process " in text and "--lr=0.1" in text and "--wandb-api-key=***" in text, text[-1500:]
    for secret in secrets:
        assert secret not in text
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


@pytest.mark.slow
def test_debug_stacks_is_served_only_on_loopback_or_behind_auth(tmp_path):
    for host, served in (("0.0.0.0", False), ("127.0.0.1", True)):
        with rl_otel.init(run="open", prometheus={"host": host, "port": 0}, stack_dump_dir=tmp_path / host,
                          stack_dump_signal=None, handle_sigterm=False) as tel:
            url = tel.metrics_url.replace("/metrics", "/debug/stacks").replace("0.0.0.0", "127.0.0.1")
            with urllib.request.urlopen(url, timeout=30) as response:
                body = response.read().decode()
            assert ("Current thread" in body) == served, (host, body[:300])
            if not served:
                assert body.startswith("# rl_otel: GET /debug/stacks is off: the endpoint on 0.0.0.0"), body[:300]
        assert (tmp_path / host).exists() == served  # no dump written for an open endpoint


def test_a_telemetry_writes_a_bounded_number_of_dump_files_and_counts_the_others(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(hangs, "ON_DEMAND_SPACING_S", 0.0)
    counted: list[str] = []
    watch = _watch(tmp_path, count=counted.append)
    watch.max_files = 3
    dumps = [watch.on_demand("signal") for _ in range(5)]
    assert [d.path is not None for d in dumps] == [True, True, True, False, False]
    assert len(list((tmp_path / "dumps").glob("stacks-*.txt"))) == 3
    assert counted == ["dump_dropped", "dump_dropped"] and watch.files_dropped == 2
    assert "are not written" in caplog.text and caplog.text.count("are not written") == 1
    assert all("== faulthandler" in d.text for d in dumps)  # still answered
    assert hangs.MAX_DUMP_FILES == 32
    watch.close()


@SHELL
def test_while_a_dump_hangs_in_pyspy_the_next_requests_are_answered_at_once(tmp_path, monkeypatch):
    """Only the request that started a dump waits for it (HTTP_WAIT_S); before, each request while the py-spy hung
    held the endpoint's one worker HTTP_WAIT_S (the test makes it long, so the old code would not answer)."""
    release = tmp_path / "release"
    fake = _fake_pyspy(tmp_path / "bin", f'while [ ! -e {release} ]; do sleep 0.05; done; echo "native frames"')
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-venv" / "python"))
    monkeypatch.setattr(hangs, "HTTP_WAIT_S", 0.05)
    watch = _watch(tmp_path, count=lambda reason: None)
    try:
        first = watch.http_text()
        assert first.startswith("# being written to"), first[:200]
        monkeypatch.setattr(hangs, "HTTP_WAIT_S", 3600.0)
        answers: list[str] = []
        asker = threading.Thread(target=lambda: answers.extend(watch.http_text() for _ in range(16)), daemon=True)
        asker.start()
        wait_for(lambda: len(answers) == 16, 60, "16 requests answered while py-spy hangs")
        assert all(a.startswith("# being written to") and "Current thread" in a for a in answers)
        assert not release.exists()
    finally:
        release.touch()
        watch.close()
