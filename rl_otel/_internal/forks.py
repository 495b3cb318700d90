"""Objects made anew in a forked child: :func:`reset_in_forked_child` registers one, and its ``_after_fork()`` runs
in every child forked afterwards (``os.register_at_fork``).

In a child only the forking thread exists: a lock another thread of the parent held at the fork stays held for
ever, and the parent's worker threads are gone. Every object of rl_otel that holds a lock or a thread registers
here and makes them again in the child (a fresh lock, no thread: one starts at the next use), so that a
``fork()`` (a DataLoader worker, vLLM's engine processes) never deadlocks on telemetry.
"""

from __future__ import annotations

import os
import weakref

_FORK_AWARE: weakref.WeakSet = weakref.WeakSet()


def reset_in_forked_child(obj: object) -> None:
    """Have ``obj._after_fork()`` called in every forked child (``obj`` held weakly)."""
    _FORK_AWARE.add(obj)


def _after_fork_in_child() -> None:
    for obj in list(_FORK_AWARE):
        try:
            obj._after_fork()
        except Exception:  # boundary: the fork hook; a child must never fail to start because of telemetry
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
