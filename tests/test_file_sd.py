"""file_sd: every process publishes its endpoint in a targets file of its own, so none drops out of discovery."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest

import rl_otel
from rl_otel._internal.atomic import atomic_write
from tests._waits import CHILD_ENV, read_line

ROOT = Path(__file__).resolve().parent.parent


def _targets(directory) -> dict[str, list[str]]:
    """File name -> the targets it names."""
    return {p.name: [t for group in json.loads(p.read_text()) for t in group["targets"]]
            for p in directory.iterdir()}


def test_processes_sharing_run_and_rank_or_a_run_name_that_reads_alike_each_get_their_own_target_file(tmp_path):
    """Trinity's explorer and trainer share run and rank 0; runs named "实验" and "测试" read alike once made
    ASCII; two processes of one role and rank (a misconfigured rank). Each gets a target file of its own, with a
    readable name, and close() removes only its own (before: they wrote one file, rl_otel-<run>-rank0.json, and
    only the last writer was ever scraped)."""
    prometheus = {"host": "127.0.0.1", "port": 0, "file_sd": str(tmp_path)}
    processes = [rl_otel.init(run="trinity", role="explorer", prometheus=prometheus),
                 rl_otel.init(run="trinity", role="trainer", prometheus=prometheus),
                 rl_otel.init(run="实验", prometheus=prometheus),
                 rl_otel.init(run="测试", prometheus=prometheus),
                 rl_otel.init(run="测试", prometheus=prometheus)]
    try:
        files = _targets(tmp_path)
        served = sorted(f"127.0.0.1:{urllib.parse.urlsplit(tel.metrics_url).port}" for tel in processes)
        assert sorted(t for targets in files.values() for t in targets) == served  # each target once, none lost
        assert len(files) == len(processes)
        names = sorted(files)
        assert sum(n.startswith("rl_otel-trinity-explorer-rank0-") for n in names) == 1
        assert sum(n.startswith("rl_otel-trinity-trainer-rank0-") for n in names) == 1
        assert all(n.endswith(".json") and n.isascii() for n in names)
        explorer = processes.pop(0)
        explorer.close()  # removes its own file only
        left = _targets(tmp_path)
        assert len(left) == len(processes) and not any(n.startswith("rl_otel-trinity-explorer-") for n in left)
    finally:
        for tel in processes:
            tel.close()
    assert list(tmp_path.iterdir()) == []


def test_an_atomic_write_replaces_the_file_whole_or_not_at_all(tmp_path):
    """The one atomic-write helper (file_sd's targets files, the watcher's state file): the new content and the
    asked permissions, or on a failure mid-write the old content and no temporary file left beside it."""
    path = tmp_path / "targets.json"
    path.write_text("old\n")
    with atomic_write(path, mode=0o644) as f:
        f.write("new\n")
        assert path.read_text() == "old\n"  # nothing visible under the name until the block ends
    assert path.read_text() == "new\n" and stat.S_IMODE(path.stat().st_mode) == 0o644
    with pytest.raises(RuntimeError), atomic_write(path) as f:
        f.write("half")
        raise RuntimeError("killed mid-write")
    assert path.read_text() == "new\n" and os.listdir(tmp_path) == ["targets.json"]
    with pytest.raises(OSError), atomic_write(tmp_path / "missing-dir" / "x.json") as f:
        f.write("x")


def test_files_are_replaced_and_tfrecords_framed_in_one_place_each():
    """One atomic-write helper and one TFRecord framing (issue 34): no other module of rl_otel makes its own
    temporary file to rename, or defines the masked CRC."""
    root = Path(rl_otel.__file__).parent
    replacing = {str(p.relative_to(root)) for p in root.rglob("*.py") if "os.replace(" in p.read_text()}
    framing = {str(p.relative_to(root)) for p in root.rglob("*.py") if "0xA282EAD8" in p.read_text()}
    assert replacing == {"_internal/atomic.py"}
    assert framing == {"_internal/tfrecord.py"}


def _dead_pid() -> int:
    """The id of a process that has ended (and been reaped)."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_the_next_process_reaps_the_file_of_a_dead_process_of_its_host_and_nothing_else(tmp_path):
    """A killed rank ran no close(): its file names a dead target (RLScrapeTargetDown) until removed. The next
    process publishing in the directory removes the files of this host's processes that are gone, and leaves a
    live process's file, another host's, and a file without owner labels (an older rl_otel, a user's) alone."""
    prometheus = {"host": "127.0.0.1", "port": 0, "file_sd": str(tmp_path)}
    with rl_otel.init(run="live", prometheus=prometheus) as live:
        host = live.config.host_name
        dead = _dead_pid()

        def written(name: str, labels: dict[str, str]) -> Path:
            path = tmp_path / name
            path.write_text(json.dumps([{"targets": ["127.0.0.1:1"], "labels": {"run": "x", **labels}}]))
            return path

        killed = written("rl_otel-killed-trainer-rank0-0123456789.json",
                         {"__rl_otel_host": host, "__rl_otel_pid": str(dead)})
        elsewhere = written("rl_otel-other-trainer-rank1-0123456789.json",
                            {"__rl_otel_host": f"not-{host}", "__rl_otel_pid": str(dead)})
        unowned = written("rl_otel-old-trainer-rank2-0123456789.json", {})
        mine = next(p for p in tmp_path.iterdir() if p.name.startswith("rl_otel-live-"))
        with rl_otel.init(run="next", prometheus=prometheus):
            names = {p.name for p in tmp_path.iterdir()}
            assert killed.name not in names, names
            assert {elsewhere.name, unowned.name, mine.name} <= names and len(names) == 4, names


@pytest.mark.slow
def test_a_killed_rank_s_target_is_gone_once_the_next_rank_starts(tmp_path):
    """Real processes: a rank killed with SIGKILL leaves its file; the rank started after it removes it."""
    script = ("import sys, rl_otel\n"
              "tel = rl_otel.init(run='r', prometheus={'host': '127.0.0.1', 'port': 0, 'file_sd': sys.argv[1]})\n"
              "print(tel.metrics_url, flush=True)\n"
              "sys.stdin.readline()\n")
    env = {**os.environ, **CHILD_ENV, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        read_line(proc, "the rank serving")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    (left,) = tmp_path.iterdir()  # no close ran: the dead rank's file stays...
    with rl_otel.init(run="r", rank=1, prometheus={"host": "127.0.0.1", "port": 0, "file_sd": str(tmp_path)}):
        assert [p.name for p in tmp_path.iterdir() if p.name == left.name] == []  # ...until the next one starts
    assert list(tmp_path.iterdir()) == []
