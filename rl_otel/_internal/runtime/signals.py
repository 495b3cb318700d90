"""Write what was logged when the run is stopped by a signal, then let the signal do what it did before.

SIGTERM (Kubernetes, Slurm, torchrun ending a job) closes the Telemetry: every step already logged reaches the
trackers and they are closed, within ``close_timeout_s``; then the previous handler runs (by default the process
dies by SIGTERM, as it would have without rl_otel). SIGINT (Ctrl-C) flushes the trackers and then runs the
previous handler (by default ``KeyboardInterrupt``), so a notebook that catches the interrupt can keep logging.

A signal that arrives while the main thread is inside ``log()`` is handled when ``log()`` returns: the step being
logged is complete, and the flush cannot wait on a lock the interrupted ``log()`` holds. The action runs on a
helper thread joined with a deadline, so a lock held elsewhere by the interrupted thread cannot hang the process.
Handlers can only be installed from the main thread (Python's rule); elsewhere this does nothing.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable


class SignalFlush:
    """Runs ``on_term`` on SIGTERM and ``on_int`` on SIGINT, then the handler that was there before.

    ``hold()``/``release()`` bracket a critical section of the main thread (nestable; other threads never run
    signal handlers, so they do not count).
    """

    def __init__(self, on_term: Callable[[], None], on_int: Callable[[], None], timeout_s: float) -> None:
        self._actions = {signal.SIGTERM: on_term, signal.SIGINT: on_int}
        self._timeout_s = timeout_s
        self._previous: dict[int, object] = {}
        self._pending: list[tuple[int, object]] = []
        self._depth = 0
        self._main = threading.main_thread().ident
        if threading.get_ident() != self._main:
            return
        for signum in self._actions:
            try:
                previous = signal.getsignal(signum)
                signal.signal(signum, self._handle)
            except (ValueError, OSError):  # not the main interpreter, or no such signal here
                continue
            self._previous[signum] = previous

    @property
    def installed(self) -> tuple[int, ...]:
        return tuple(self._previous)

    def hold(self) -> None:
        if threading.get_ident() == self._main:
            self._depth += 1

    def release(self) -> None:
        if threading.get_ident() != self._main:
            return
        self._depth -= 1
        while not self._depth and self._pending:
            self._dispatch(*self._pending.pop(0))

    def _handle(self, signum: int, frame: object) -> None:
        if self._depth:
            self._pending.append((signum, frame))
        else:
            self._dispatch(signum, frame)

    def _dispatch(self, signum: int, frame: object) -> None:
        helper = threading.Thread(target=self._actions[signum], name="rl_otel-signal-flush", daemon=True)
        helper.start()
        helper.join(self._timeout_s + 1.0)
        previous = self._previous.get(signum, signal.SIG_DFL)
        if signum == signal.SIGTERM:
            self.uninstall()
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_IGN:
            return
        else:  # SIG_DFL (or a handler installed outside Python): end as the run would have without us
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    def uninstall(self) -> None:
        """Put the previous handlers back where ours is still the current one (main thread only)."""
        if threading.get_ident() != self._main:
            return
        previous, self._previous = self._previous, {}
        for signum, handler in previous.items():
            try:
                if signal.getsignal(signum) == self._handle:
                    signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
            except (ValueError, OSError):
                pass
