"""The operating-system facts the stack dumps need that Python's standard library does not expose: whether a
signal already has a handler at the OS level (and that handler, to put it back), letting our own py-spy child read
this process under Yama, and whether faulthandler still holds our registration of a signal.

- :func:`signal_taken`: ``signal.getsignal()`` only knows the handlers installed through the ``signal`` module; a
  handler installed by ``faulthandler.register()`` (a common idiom for this very signal), by a C extension or by
  the process that started us is invisible to it. ``sigaction(signum, NULL, &old)`` reads the one the kernel will
  call. Through ``ctypes``: the handler is the first member of ``struct sigaction`` on glibc, musl and the BSDs
  (macOS included), so only that pointer is read, from a buffer larger than the struct.
- :func:`allow_descendants_to_trace`: under Yama's ``ptrace_scope=1`` (Ubuntu's default) a process may only be
  traced by its ancestors, so a ``py-spy`` this process starts cannot attach to it; ``prctl(PR_SET_PTRACER, pid)``
  declares this process as the exception, which admits its own descendants (Yama walks the tracer's ancestors).

- :func:`faulthandler_holds`: ``faulthandler`` has no way to ask what a signal is registered to; it keeps a
  reference to the ``file`` object it writes to and drops it when the signal is registered again, so the object's
  reference count says whether the registration is still the one made with it.

``tests/test_hangs.py`` checks them against the real kernel (a default handler, one set by ``faulthandler``, one
set by ``signal.signal``, SIG_IGN) and fails loudly when a platform reads them differently.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_SIGACTION_BUFFER = 512  # bytes: larger than any platform's struct sigaction (glibc x86_64: 152)
PR_SET_PTRACER = 0x59616D61  # linux/prctl.h ("Yama")
_YAMA_SCOPE = "/proc/sys/kernel/yama/ptrace_scope"


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def os_handler(signum: int) -> int | None:
    """The address of the handler the kernel calls for ``signum`` (0: SIG_DFL, 1: SIG_IGN), or ``None`` when it
    cannot be read here (no ``sigaction``: Windows)."""
    action = os_action(signum)
    if action is None:
        return None
    return ctypes.c_void_p.from_buffer_copy(action).value or 0  # sa_handler is the struct's first member


def os_action(signum: int) -> bytes | None:
    """The kernel's whole ``struct sigaction`` for ``signum`` (opaque bytes, for :func:`set_os_action`), or
    ``None`` when it cannot be read here."""
    libc = _libc()
    sigaction = getattr(libc, "sigaction", None) if libc is not None else None
    if sigaction is None or sys.platform == "win32":
        return None
    old = ctypes.create_string_buffer(_SIGACTION_BUFFER)
    sigaction.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    return old.raw if sigaction(signum, None, old) == 0 else None


def set_os_action(signum: int, action: bytes) -> bool:
    """Install a ``struct sigaction`` read by :func:`os_action` (a handler set by someone else, put back as it
    was); True if the kernel took it."""
    libc = _libc()
    sigaction = getattr(libc, "sigaction", None) if libc is not None else None
    if sigaction is None or sys.platform == "win32":
        return False
    sigaction.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    return sigaction(signum, ctypes.create_string_buffer(action, len(action)), None) == 0


def ignore_signal(signum: int) -> bytes | None:
    """Have the kernel ignore ``signum`` (SIG_IGN, set through ``sigaction``: from any thread, no Python handler);
    returns the action it replaced (for :func:`set_os_action`), or ``None`` if it could not be done here."""
    previous = os_action(signum)
    if previous is None:
        return None
    ignore = ctypes.create_string_buffer(_SIGACTION_BUFFER)  # zeroed: no flags, an empty mask
    ctypes.c_void_p.from_buffer(ignore).value = 1  # the handler, the struct's first member: SIG_IGN
    return previous if set_os_action(signum, ignore.raw) else None


def faulthandler_holds(file: object) -> bool:
    """Whether ``faulthandler`` still holds ``file``, the object given to ``faulthandler.register`` (the caller
    holds exactly one other reference to it: its local variable)."""
    probe = object()  # one reference, as ``file``'s caller holds one beside this parameter
    return sys.getrefcount(file) - 1 > sys.getrefcount(probe)


def signal_taken(signum: int) -> bool:
    """Whether something in this process already handles (or ignores) ``signum``: a Python handler, SIG_IGN, a
    handler installed outside Python, or an OS-level one the ``signal`` module does not know of."""
    try:
        if signal.getsignal(signum) is not signal.SIG_DFL:
            return True
    except (ValueError, OSError):  # no such signal here
        return True
    return os_handler(signum) not in (0, None)


def yama_restricts_tracing() -> bool:
    """Whether Yama only lets ancestors trace a process (``ptrace_scope`` 1); 0: anyone of the same user; 2, 3:
    only an administrator, whom no ``prctl`` of ours can stand in for."""
    try:
        with open(_YAMA_SCOPE) as f:
            return f.read().strip() == "1"
    except OSError:
        return False


def allow_descendants_to_trace(allow: bool) -> bool:
    """``prctl(PR_SET_PTRACER, getpid() if allow else 0)`` (Linux); True if the kernel took it."""
    libc = _libc()
    prctl = getattr(libc, "prctl", None) if libc is not None else None
    if prctl is None or not sys.platform.startswith("linux"):
        return False
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    return prctl(PR_SET_PTRACER, os.getpid() if allow else 0, 0, 0, 0) == 0
