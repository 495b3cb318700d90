"""Write what was logged when the run is stopped by a signal, then let the signal do what it did before.

SIGTERM (Kubernetes, Slurm, torchrun ending a job) with the default action closes the Telemetry: every step
already logged reaches the trackers and they are closed, the file_sd target is removed, within
``close_timeout_s``; then the process dies by SIGTERM, as it would have without rl_otel. When the application has
a SIGTERM handler of its own (a graceful stop that checkpoints and logs its last steps) or ignores SIGTERM, the
run goes on: rl_otel only writes what is logged so far, then runs that handler, and stays open for the final
steps (it closes at exit). SIGINT (Ctrl-C) flushes the trackers and then runs the previous handler (by default
``KeyboardInterrupt``), so a notebook that catches the interrupt can keep logging.

A signal that arrives while the main thread is inside ``log()`` is handled when ``log()`` returns: the step being
logged is complete, and the flush cannot wait on a lock the interrupted ``log()`` holds. The action runs on a
helper thread joined with a deadline, so a lock held elsewhere by the interrupted thread cannot hang the process.
Handlers can only be installed from the main thread (Python's rule); elsewhere this does nothing.

A signal that arrives while the Telemetry closes (``close()``, the exit-time close, or the close a first SIGTERM
started) does not cut the close short: the handlers stay installed until the very end of the close, which finishes
within its deadlines (``close_timeout_s`` for the trackers), and only then is the signal delivered to the handler
that was there before - by default the process still dies by SIGTERM, or gets its ``KeyboardInterrupt``. This is
a Slurm time limit or a pod deletion arriving while a tracker still uploads the final steps.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from types import FrameType

    # what signal.getsignal() returns: a Python handler, SIG_DFL/SIG_IGN, or None (one installed outside Python)
    _Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


class SignalFlush:
    """Runs ``on_term`` on SIGTERM and ``on_int`` on SIGINT, then the handler that was there before.

    ``hold()``/``release()`` bracket a critical section of the main thread (nestable; other threads never run
    signal handlers, so they do not count).
    """

    def __init__(self, on_term: Callable[[], object], on_int: Callable[[], object], timeout_s: float) -> None:
        self._actions: dict[int, Callable[[], object]] = {signal.SIGTERM: on_term, signal.SIGINT: on_int}
        self._timeout_s = timeout_s
        self._previous: dict[int, _Handler] = {}
        self._pending: list[tuple[int, FrameType | None]] = []
        self._depth = 0
        self._main = threading.main_thread().ident
        self._closer: int | None = None  # the thread closing the Telemetry, from begin_close() on
        self._closed = threading.Event()  # set by uninstall(): the close is over
        # after uninstall(): the handlers it found at install, for a SignalFlush installed after this one, whose
        # "previous" is this (closed) one's handler: it puts these back, never a closed Telemetry's
        self._gone: dict[int, _Handler] = {}
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

    def __enter__(self) -> SignalFlush:  # ``with signals:`` holds them for the block
        self.hold()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def begin_close(self) -> None:
        """The Telemetry starts closing (on any thread): a signal from now on is delivered after :meth:`uninstall`,
        which ends the close."""
        if self._closer is None:
            self._closer = threading.get_ident()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._depth or self._closer == self._main:  # in a step, or in a close on this (the main) thread
            self._pending.append((signum, frame))
        else:
            self._dispatch(signum, frame)

    def _dispatch(self, signum: int, frame: FrameType | None) -> None:
        if self._closer is not None:  # another thread is closing the Telemetry: let it finish (bounded) first
            self._closed.wait(self._timeout_s + 1.0)
        previous = _resolve(signum, self._previous.get(signum, signal.SIG_DFL))
        # Only a signal that ends the process now (SIGTERM with the default action) closes the Telemetry. With the
        # application's own handler (a graceful stop: checkpoint, log the last steps, exit) or SIG_IGN the run
        # goes on, so only what is logged is written: the endpoint keeps serving and the final steps are logged;
        # the Telemetry closes at exit (atexit) or when the application closes it.
        ends = not callable(previous) and previous != signal.SIG_IGN
        action = self._actions[signum] if signum == signal.SIGTERM and ends else self._actions[signal.SIGINT]
        helper = threading.Thread(target=action, name="rl_otel-signal-flush", daemon=True)
        helper.start()
        helper.join(self._timeout_s + 1.0)
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_IGN:
            return
        else:  # SIG_DFL (or a handler installed outside Python): end as the run would have without us
            self.uninstall()
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    def uninstall(self) -> None:
        """Put the previous handlers back where ours is still the current one (main thread only), the end of a
        close: a signal that arrived during the close is then delivered to them (the process may end here)."""
        self._closed.set()
        if threading.get_ident() != self._main:
            return
        previous, self._previous = self._previous, {}
        self._gone = previous
        for signum, handler in previous.items():
            try:
                if signal.getsignal(signum) == self._handle:
                    handler = _resolve(signum, handler)
                    signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
            except (ValueError, OSError):
                pass
        if self._closer is None:
            return
        pending, self._pending = self._pending, []
        for signum in dict.fromkeys(signum for signum, _ in pending):  # each signal once, in arrival order
            signal.raise_signal(signum)  # as it would have been without rl_otel: the previous handler's action


def _resolve(signum: int, handler: _Handler) -> _Handler:
    """``handler``, or, where it is the handler of a SignalFlush already uninstalled (a Telemetry closed after
    another was made), what that one found at install, followed as far as it goes."""
    for _ in range(64):  # as many Telemetry objects as a process makes in a row, bounded
        owner = getattr(handler, "__self__", None)
        if not isinstance(owner, SignalFlush) or getattr(handler, "__func__", None) is not SignalFlush._handle \
                or not owner._closed.is_set():
            return handler
        handler = owner._gone.get(signum, signal.SIG_DFL)
    return handler
