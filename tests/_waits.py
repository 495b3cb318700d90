"""Bounded, diagnosed waits on a child process: a test waits for a child's line (or its end) with a deadline,
and when the deadline passes the failure says what it waited for, with the child's stderr and the stack of every
thread of the child (faulthandler's, asked for with SIGABRT: start the child with ``CHILD_ENV``)."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import threading
from typing import IO

# generous: a loaded 2-core machine (two CPU hogs, load 12) stretches an import of torch to a minute; the wait
# ends on the line, never on time, so a generous bound costs nothing when the child is well
DEADLINE_S = 180.0
# a Python child started with this dumps the stack of every thread on SIGABRT (and on a crash)
CHILD_ENV = {"PYTHONFAULTHANDLER": "1"}


def stack_and_stderr(proc: subprocess.Popen, stderr: IO[str] | None = None) -> str:
    """End a child that is still there and say what it was doing: its stderr, with faulthandler's dump of its
    threads when it was started with ``CHILD_ENV``. ``stderr``: its stderr stream when not ``proc.stderr``."""
    if proc.poll() is None:
        try:
            os.kill(proc.pid, signal.SIGABRT)
            proc.wait(10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    stream = stderr if stderr is not None else proc.stderr
    text = ""
    if stream is not None and not stream.closed:
        got: list[str] = []
        reader = threading.Thread(target=lambda: got.append(stream.read()), daemon=True)
        reader.start()
        reader.join(10)  # a grandchild may hold the pipe open: what came by then
        text = got[0] if got else "(its stderr stayed open: a grandchild holds it)"
    return f"rc={proc.returncode}; its stderr (with its threads' stacks when it hung):\n{text[-8000:]}"


def read_line(proc: subprocess.Popen, what: str, timeout: float = DEADLINE_S, stream: IO[str] | None = None) -> str:
    """The child's next stdout line (``stream``: another of its pipes, e.g. ``proc.stderr``), read within
    ``timeout`` seconds. A child that ends first, or is still silent at the deadline, fails the test naming
    ``what`` it was waited on for, with its stderr and stack."""
    source = stream if stream is not None else proc.stdout
    assert source is not None
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: lines.put(source.readline()), daemon=True).start()
    try:
        line = lines.get(timeout=timeout)
    except queue.Empty:
        raise AssertionError(f"no line from pid {proc.pid} ({what}) within {timeout:.0f} s; "
                             f"{stack_and_stderr(proc)}") from None
    if not line:
        raise AssertionError(f"pid {proc.pid} ended before its line ({what}); {stack_and_stderr(proc)}")
    return line


def finish(proc: subprocess.Popen, what: str, timeout: float = DEADLINE_S, input: str | None = None
           ) -> tuple[str, str]:
    """``proc.communicate()`` within ``timeout`` seconds: its stdout and stderr. A child still there at the deadline
    fails the test naming ``what`` it was waited on for, with its output and stack (``CHILD_ENV``)."""
    try:
        return proc.communicate(input, timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.kill(proc.pid, signal.SIGABRT)  # its threads' stacks to its stderr
    except ProcessLookupError:
        pass
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate(timeout=30)
    raise AssertionError(f"pid {proc.pid} still there {timeout:.0f} s later ({what}); rc={proc.returncode}; "
                         f"stderr (with its threads' stacks):\n{(err or '')[-8000:]}\nstdout:\n{(out or '')[-2000:]}")
