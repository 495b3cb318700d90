"""A fresh Python process driven line by line: it reports with ``say(...)`` (a JSON line on stdout), the test
answers on its stdin. Every wait is for a line (or the process's end), bounded by a generous deadline."""

from __future__ import annotations

import json
import os
import queue
import socket
import subprocess
import sys
import threading
import urllib.parse
from pathlib import Path

MARK = "RLOTEL-CHILD "
# prepended to a child's script: say() reports to the test, wait() blocks until the test answers
PRELUDE = f"""
import json as _json, sys as _sys
def say(**kw):
    print({MARK!r} + _json.dumps(kw), flush=True)
def wait():
    return _sys.stdin.readline().strip()
"""
TIMEOUT_S = 300.0  # a loaded 2-core machine imports torch + ray + verl slowly; the waits end on a line, not on time


class Child:
    def __init__(self, script: str, args: list[str], tmp: Path, env: dict[str, str] | None = None) -> None:
        path = tmp / "child.py"
        path.write_text(PRELUDE + script)
        self.stderr_path = tmp / "child.stderr"
        self._stderr = open(self.stderr_path, "w")  # noqa: SIM115 (the child's stderr, open while it runs)
        self.proc = subprocess.Popen([sys.executable, str(path), *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._stderr, text=True,
                                     env={**os.environ, **(env or {})}, cwd=tmp)
        self._lines: queue.Queue[str | None] = queue.Queue()
        self.output: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.output.append(line)
            if line.startswith(MARK):
                self._lines.put(line[len(MARK):])
        self._lines.put(None)

    def expect(self) -> dict:
        """The child's next report; fails with its stderr when it ends (or hangs past TIMEOUT_S) first."""
        try:
            line = self._lines.get(timeout=TIMEOUT_S)
        except queue.Empty:
            line = None
        if line is None:
            self.kill()
            raise AssertionError(f"the child ended (rc={self.proc.poll()}) before reporting; stderr:\n"
                                 f"{self.stderr_path.read_text()[-6000:]}\nstdout:\n{''.join(self.output)[-3000:]}")
        return json.loads(line)

    def send(self, line: str = "go") -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def finish(self) -> int:
        """Let the child end; its exit status."""
        self.send("exit")
        self.proc.stdin.close()
        rc = self.proc.wait(TIMEOUT_S)
        self._stderr.close()
        return rc

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._stderr.close()


def port_closed(url: str) -> bool:
    """Nothing listens at ``url``'s host:port any more (a connection is refused)."""
    parts = urllib.parse.urlsplit(url)
    try:
        with socket.create_connection((parts.hostname, parts.port), timeout=10):
            return False
    except ConnectionRefusedError:
        return True


def finish_ranks(procs: list[subprocess.Popen]) -> list[tuple[str, str]]:
    """Tell rank processes waiting on their stdin to end (two empty lines), collect ``(stdout, stderr)`` of each
    within a deadline, and kill any that is still there."""
    for p in procs:
        try:
            p.stdin.write("\n\n")  # type: ignore[union-attr]
            p.stdin.flush()  # type: ignore[union-attr]
        except OSError:
            pass
    try:
        return [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            p.kill()
