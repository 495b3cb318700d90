"""The stacks of every thread of this process, as text: the standard library's ``faulthandler`` for every Python
thread (read from outside them: a thread blocked on a lock, in I/O or in a C extension is shown where it waits),
and, where ``py-spy`` is installed, its ``dump --native`` for the C/C++ frames beneath (a CUDA or NCCL call).

Cost: ``faulthandler`` holds the GIL for the dump (well under a millisecond for a few threads); ``py-spy --native``
stops the process while it reads the native stacks (tens of milliseconds) and is killed past its timeout
(``hangs.PYSPY_TIMEOUT_S``). A dump is written once per stuck phase, or when someone asks for one, never per step.
"""

from __future__ import annotations

import faulthandler
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
from typing import IO

from rl_otel._internal.probes.posix import allow_descendants_to_trace, yama_restricts_tracing

_PYSPY_LIMIT = 1 << 20  # bytes of py-spy's output kept


def thread_names() -> str:
    """``0x<ident> <name>`` per Python thread: faulthandler names threads by identifier only."""
    return "".join(f"  0x{t.ident:016x} {t.name}{' (daemon)' if t.daemon else ''}\n"
                   for t in threading.enumerate() if t.ident is not None)


def faulthandler_text() -> str:
    """Every Python thread's stack, most recent call first, as ``faulthandler.dump_traceback`` writes it (the
    thread calling this is the ``Current thread``)."""
    with _scratch_file() as f:
        faulthandler.dump_traceback(f.fileno(), all_threads=True)
        f.seek(0)
        return f.read().decode("utf-8", "replace")


def _scratch_file() -> IO[bytes]:
    """A file for faulthandler (it writes to a file descriptor): in memory where the OS has one (Linux's memfd),
    so a busy disk cannot slow a dump, else a temporary file."""
    memfd = getattr(os, "memfd_create", None)
    if memfd is not None:
        try:
            return open(memfd("rl_otel-stacks", getattr(os, "MFD_CLOEXEC", 0)), "w+b")
        except OSError:
            pass
    return tempfile.TemporaryFile()


def pyspy_executable() -> str | None:
    """``py-spy`` installed beside this interpreter (a virtual environment's ``bin``, run as ``venv/bin/python
    train.py`` with the environment never activated), else on ``PATH``."""
    name = "py-spy.exe" if sys.platform == "win32" else "py-spy"
    places = [os.path.dirname(sys.executable)] if sys.executable else []
    try:
        places.append(sysconfig.get_path("scripts"))
    except (KeyError, ValueError):
        pass
    for place in places:
        candidate = os.path.join(place, name)
        if place and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("py-spy")


def pyspy_text(timeout_s: float) -> str:
    """``py-spy dump --pid <this process> --native`` (what it printed, errors included), or a line saying why
    there is none: not installed, or still running after ``timeout_s`` (then killed)."""
    exe = pyspy_executable()
    if exe is None:
        return "py-spy is not installed (pip install py-spy, for native frames); faulthandler's stacks only\n"
    command = [exe, "dump", "--pid", str(os.getpid()), "--native"]
    restricted = yama_restricts_tracing()
    if restricted:  # ptrace_scope 1: only an ancestor may trace us, unless we admit our descendants
        allow_descendants_to_trace(True)
    try:
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            out, _ = proc.communicate(timeout=timeout_s)
            tail = "" if proc.returncode == 0 else f"(py-spy exited with {proc.returncode})\n"
        except subprocess.TimeoutExpired as exc:
            proc.kill()
            try:
                out, _ = proc.communicate(timeout=1.0)
            except subprocess.TimeoutExpired:  # a child of it still holds the pipe: keep what it wrote
                out = exc.output or b""
            tail = f"(py-spy still running after {timeout_s:g} s: killed)\n"
    except OSError as exc:
        return f"py-spy could not run: {exc}\n"
    finally:
        if restricted:
            allow_descendants_to_trace(False)
    text = out[:_PYSPY_LIMIT].decode("utf-8", "replace")
    return f"$ {' '.join(command)}\n{text}{'' if text.endswith(chr(10)) or not text else chr(10)}{tail}"


def stacks_text(header: str, pyspy_timeout_s: float) -> str:
    """A dump: ``header``, the threads' names, faulthandler's stacks, py-spy's."""
    return (f"{header}\nthreads (faulthandler names them by identifier):\n{thread_names()}\n"
            f"== faulthandler: every Python thread, most recent call first ==\n{faulthandler_text()}\n"
            f"== py-spy: native frames ==\n{pyspy_text(pyspy_timeout_s)}")
