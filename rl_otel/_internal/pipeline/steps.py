"""The step bookkeeping of one recorder: which step a ``log()`` writes at (:class:`Steps`), and the ROLL keys of
the phases finished since the trackers' last step (:class:`PhaseBuffer`).

A step that is not an int in ``[0, 2**63-1]`` (``bad_step``: not a number, negative, too large for TensorBoard's
int64) is replaced by the previous valid step + 1, for every sink alike; the steps after it are not affected.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping

from rl_otel._internal.forks import reset_in_forked_child
from rl_otel._internal.pipeline.diagnostics import Diagnostics

_log = logging.getLogger("rl_otel")
MAX_STEP = 2**63 - 1  # the highest step every sink can hold (TensorBoard's and WandB's steps are int64)


class PhaseBuffer:
    """ROLL-keyed values of the phases finished since the trackers' last step (they reach the trackers with the
    next step, as in ROLL; Prometheus has them at once)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._metrics: dict[str, float] = {}
        reset_in_forked_child(self)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()  # the parent's may have been held by another thread at the fork

    def add(self, metrics: Mapping[str, float]) -> None:
        with self._lock:
            self._metrics.update(metrics)

    def take(self) -> dict[str, float]:
        if not self._metrics:  # most steps: no lock, no copy (a phase ending now is taken next step)
            return {}
        with self._lock:
            taken, self._metrics = self._metrics, {}
        return taken


class Steps:
    """The steps handed out (what ``step=None`` continues from) and the highest step stored (a step below it is
    history). Thread-safe."""

    def __init__(self, diagnostics: Diagnostics) -> None:
        self._diag = diagnostics
        self._lock = threading.Lock()
        self.last: int | None = None  # the highest step handed out
        self._stored: int | None = None
        self._history_noted = False
        reset_in_forked_child(self)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()

    def next(self) -> int:
        """The step the next ``log()`` without a step gets."""
        return 0 if self.last is None else self.last + 1

    def advance(self, step: object) -> int:
        """The step a ``log()``/``submit()`` writes at: ``step`` as an int in ``[0, MAX_STEP]``; for ``None``, and in
        place of a step that is no such int (counted as ``bad_step``, said once), the highest valid step + 1. A
        bad step costs only its own call: the steps after it continue from the valid ones."""
        if step is not None and not (type(step) is int and 0 <= step <= MAX_STEP):
            step = self._valid(step)
        with self._lock:
            if step is None:
                step = 0 if self.last is None else min(self.last + 1, MAX_STEP)
            if self.last is None or step > self.last:
                self.last = step
            return step

    def store(self, step: int) -> bool:
        """Note ``step`` as stored; False if it is history (below the highest step stored; said once)."""
        with self._lock:
            current = self._stored is None or step >= self._stored
            if current:
                self._stored = step
            elif not self._history_noted:
                self._history_noted = True
                _log.info("rl_otel: step %d is below the highest step logged (%s): the trackers get it; on the "
                          "endpoint series keep the newer steps' values (said once)", step, self._stored)
        return current

    def _valid(self, step: object) -> int | None:
        """``step`` as an int in ``[0, MAX_STEP]`` (a 0-d tensor, a numpy int, a float like 3.0), else ``None``,
        counted and said once: every sink then gets the previous valid step + 1 (TensorBoard's steps are int64, an
        overflowing step would otherwise poison every automatic step after it)."""
        why = "not an int"
        if not isinstance(step, bool):
            try:
                number = int(step)  # type: ignore[call-overload]
            except Exception as exc:  # boundary: the user's step object (its __int__ may raise anything)
                why = f"not an int ({type(exc).__name__})"
            else:
                if 0 <= number <= MAX_STEP:
                    return number
                why = "negative" if number < 0 else "above 2**63-1"
        self._diag.bad("", f"step must be an int in [0, 2**63-1], got {_safe_repr(step)} ({why}); using the "
                           "previous step + 1", "bad_step")
        return None



def _safe_repr(value: object) -> str:
    try:
        text = repr(value)
    except Exception:  # boundary: the user's object's __repr__
        return f"a {type(value).__name__}"
    return text if len(text) <= 80 else text[:80] + "..."
