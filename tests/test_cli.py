"""The ``rl-otel`` command as a shell user meets it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_a_reader_that_stops_early_ends_the_command_quietly():
    """``rl-otel catalog | head``: the reader closes the pipe after a few lines; no BrokenPipeError traceback."""
    command = f"{sys.executable} -m rl_otel.cli catalog | head -n 3"
    proc = subprocess.run(["bash", "-o", "pipefail", "-c", command], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert len(proc.stdout.splitlines()) == 3, proc.stdout
    assert proc.stderr == "", proc.stderr
    assert proc.returncode == 0
