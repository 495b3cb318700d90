"""GPU-true phase times: CUDA events at a phase's edges, resolved on a thread of their own.

A phase's host times (``perf_counter``) say how long the host took to *launch* its work: on a GPU the kernels run
later, and the wait lands in whatever part next synchronizes (an ``offload``'s ``.to("cpu")``). Timing the work
itself needs the GPU's clock. ``torch.cuda.synchronize()`` at each edge gives it, but stalls the pipeline it
measures; CUDA events do not: an event recorded on a stream is stamped by the GPU when the stream reaches it.

Edges (``START``, ``ONLOADED``, ``EXECUTED``, ``END``): recorded on the current stream of the phase's device when
the phase reaches them on the host (before ``onload``, after it, at the body's end, after ``offload``). With no
``onload`` callable nothing of the phase runs between ``START`` and ``ONLOADED``, so they are one event (GPU
``onload`` is 0); with no ``offload``, ``END`` is ``EXECUTED``. The GPU time of a part is the time the stream took
from reaching the part's first edge to reaching its last: the phase's own work (work queued before the phase is
not in it) plus any idle gap where the host launched slower than the GPU ran (a launch-bound part reads about its
host time). Work on another stream counts where the phase's stream waits for it. A part that would read negative
(edges on two streams that finished out of order) reads 0.

Cost on the training thread: a lock held for a list operation at the start and at the end, and one
``Event.record`` per edge used (2 for a phase without ``onload``/``offload``, 4 with both); never a
``synchronize()``. A resolver thread, started at the first finished phase, polls ``event.query()`` (1 ms, backing
off to 50 ms while nothing completes; it sleeps on a condition while nothing is pending) and hands each resolved
phase's seconds per part to ``on_resolved``.

Bounded: events come from a pool per device, reused once a phase is resolved or abandoned; at most
``max_unresolved`` phases hold events (begun, not yet resolved). A phase beyond that is not GPU-timed, counted as
``gpu_time_backlog``. :meth:`GpuTimer.close` gives the pending phases a bounded time to complete, then hands the
rest to ``on_resolved`` without times and counts each as ``gpu_time_unresolved``: a process exiting with work still
on the GPU neither hangs nor loses a span. A phase whose body (or ``onload``/``offload``) raises records no host
times, and its events go back to the pool unresolved (nothing is dropped: there is nothing to report).

Without CUDA (no torch, a CPU build, no device, a torch without ``cuda.Event``) :meth:`GpuTimer.begin` returns
``None`` after one cached check: no event, no thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from rl_otel._internal.pipeline.worker import reset_in_forked_child

START, ONLOADED, EXECUTED, END = 0, 1, 2, 3
MAX_UNRESOLVED = 1024  # phases holding events at once (4 events each at most)
POOL = 64  # events kept for reuse per device: a burst of fast phases' events beyond it are let go
POLL_S = (0.001, 0.05)  # the resolver's first and longest wait between polls while phases are pending


class GpuPhase:
    """The events of one phase, and what its owner needs when they resolve (``payload``)."""

    __slots__ = ("cuda", "device", "events", "failed", "marked", "payload", "timer")

    def __init__(self, timer: GpuTimer, cuda: Any, device: int, events: list[Any]) -> None:
        self.timer, self.cuda, self.device, self.events = timer, cuda, device, events
        self.marked = 0  # the edges recorded (bits)
        self.failed = False  # an edge could not be recorded: the phase is not GPU-timed
        self.payload: Any = None

    def mark(self, edge: int) -> None:
        """Record ``edge`` (:meth:`GpuTimer.mark`)."""
        self.timer.mark(self, edge)

    def finish(self, payload: Any) -> bool:
        """Hand the phase to the resolver (:meth:`GpuTimer.finish`)."""
        return self.timer.finish(self, payload)

    def release(self) -> None:
        """Give the events back unresolved (:meth:`GpuTimer.release`)."""
        self.timer.release(self)

    def edge(self, i: int) -> Any:
        """The event standing for edge ``i``: its own if recorded, else the edge before it (no user code ran
        between them)."""
        while not self.marked & (1 << i):
            i -= 1
        return self.events[i]

    def seconds(self) -> dict[str, float]:
        """GPU seconds per part (every event completed)."""
        start, onloaded, executed, end = (self.edge(i) for i in (START, ONLOADED, EXECUTED, END))

        def between(a: Any, b: Any) -> float:
            return 0.0 if a is b else max(0.0, a.elapsed_time(b) / 1e3)  # milliseconds -> seconds

        return {"total": between(start, end), "execute": between(onloaded, executed),  # the host durations' order
                "onload": between(start, onloaded), "offload": between(executed, end)}

    def complete(self) -> bool:
        """Whether the GPU reached every recorded edge (the last first: usually the last to complete)."""
        recorded = [e for i, e in enumerate(self.events) if self.marked & (1 << i)]
        return all(e.query() for e in reversed(recorded))


Resolved = Callable[[GpuPhase, "dict[str, float] | None"], None]


class GpuTimer:
    """CUDA-event timing of phases for one Telemetry: :meth:`begin` at a phase's start, :meth:`mark` at its
    edges, :meth:`finish` when its block ended cleanly (or :meth:`release` when it raised). Thread-safe; nothing
    here raises to its caller: failures go to ``fail(what)``, drops to ``count(reason)``."""

    def __init__(self, cuda: Callable[[], Any | None], on_resolved: Resolved, *, count: Callable[[str], None],
                 fail: Callable[[str], None], max_unresolved: int = MAX_UNRESOLVED,
                 poll_s: tuple[float, float] = POLL_S) -> None:
        self._cuda, self._on_resolved, self._count, self._fail = cuda, on_resolved, count, fail
        self._max, self._poll = max_unresolved, poll_s
        self._init_state()
        self._closed = False
        reset_in_forked_child(self)

    def _init_state(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._free: dict[tuple[Any, int], list[Any]] = {}  # (torch.cuda, device) -> events ready for reuse
        self._open = 0  # phases holding events (begun, not yet resolved or released)
        self._pending: list[GpuPhase] = []  # finished phases waiting for their events
        self._thread: threading.Thread | None = None
        self._deadline: float | None = None  # set by close(): pending phases get until then

    def _after_fork(self) -> None:
        # the parent's events, thread and locks mean nothing here (CUDA itself does not survive a fork)
        self._init_state()

    @property
    def unresolved(self) -> int:
        """Phases holding events now (begun and not yet resolved, released or dropped)."""
        return self._open

    # -- the training thread --------------------------------------------------------------------------

    def begin(self) -> GpuPhase | None:
        """Take a phase's events and record ``START`` on the current stream; ``None`` when there is no CUDA, the
        timer is closed, or ``max_unresolved`` phases already hold events (counted as ``gpu_time_backlog``)."""
        cuda = self._cuda()
        if cuda is None or self._closed:
            return None
        try:
            new_event = getattr(cuda, "Event", None)
            if new_event is None:
                return None
            device = cuda.current_device()
            with self._cond:
                if self._open >= self._max:
                    backlog = True
                else:
                    backlog = False
                    self._open += 1
                    free = self._free.get((cuda, device))
                    events = [free.pop() if free else None for _ in range(4)]
            if backlog:
                self._count("gpu_time_backlog")
                return None
            phase = GpuPhase(self, cuda, device,
                             [e if e is not None else new_event(enable_timing=True) for e in events])
        except Exception:
            self._fail("gpu_time")
            return None
        self.mark(phase, START)
        return None if phase.failed else phase

    def mark(self, phase: GpuPhase, edge: int) -> None:
        """Record ``edge`` on the current stream of the phase's device (the device it began on, whatever the
        current device is now)."""
        if phase.failed:
            return
        try:
            phase.events[edge].record(phase.cuda.current_stream(phase.device))
            phase.marked |= 1 << edge
        except Exception:  # e.g. a stream of another device made current by hand: this phase is not GPU-timed
            phase.failed = True
            self.release(phase)
            self._fail("gpu_time")

    def finish(self, phase: GpuPhase, payload: Any) -> bool:
        """Hand a cleanly ended phase to the resolver, which calls ``on_resolved(phase, seconds or None)`` once.
        False if it will not (an edge failed, or the timer is closed): the caller then finishes without GPU
        times."""
        if phase.failed:
            return False
        phase.payload = payload
        with self._cond:
            if self._closed:
                accepted = False
            else:
                accepted = True
                self._pending.append(phase)
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="rl_otel-gpu-time", daemon=True)
                    self._thread.start()
                self._cond.notify_all()  # all: a wait()er on the same condition must not take the resolver's wake-up
        if not accepted:
            self.release(phase)
        return accepted

    def release(self, phase: GpuPhase) -> None:
        """Give a phase's events back to the pool without resolving them (re-recording an event the GPU has not
        reached yet is allowed: it just takes the new position)."""
        with self._cond:
            events, phase.events = phase.events, []
            if events:  # once per phase
                self._open = max(0, self._open - 1)  # a phase begun before a fork ends in the child
                free = self._free.setdefault((phase.cuda, phase.device), [])
                free.extend(events[:max(0, POOL - len(free))])

    # -- the resolver thread --------------------------------------------------------------------------

    def _run(self) -> None:
        wait = self._poll[0]
        while True:
            with self._cond:
                while not self._pending and self._deadline is None:
                    self._cond.wait()
                    wait = self._poll[0]
                batch = list(self._pending)
                deadline = self._deadline
            if not batch:  # closing, nothing left
                return
            done: list[tuple[GpuPhase, dict[str, float] | None]] = []
            for phase in batch:
                try:
                    if phase.complete():
                        done.append((phase, phase.seconds()))
                except Exception:  # a CUDA error (a sticky one fails every query): dropped, not retried forever
                    self._fail("gpu_time")
                    done.append((phase, None))
            if done:
                self._deliver(done)
                wait = self._poll[0]
                continue
            if deadline is not None and time.monotonic() >= deadline:
                with self._cond:
                    left = list(self._pending)
                for _ in left:
                    self._count("gpu_time_unresolved")
                self._deliver([(phase, None) for phase in left])
                return
            with self._cond:
                self._cond.wait(wait if deadline is None else min(wait, max(0.0, deadline - time.monotonic())))
            wait = min(wait * 2, self._poll[1])

    def _deliver(self, done: list[tuple[GpuPhase, dict[str, float] | None]]) -> None:
        for phase, seconds in done:
            try:
                self._on_resolved(phase, seconds)
            except Exception:
                self._fail("gpu_time")
            self.release(phase)
        with self._cond:  # out of pending once delivered: wait() returns when what it waited for is written
            ids = {id(phase) for phase, _ in done}
            self._pending = [p for p in self._pending if id(p) not in ids]
            self._cond.notify_all()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait (bounded by ``timeout_s``) until every phase handed to :meth:`finish` so far is resolved or
        dropped, and delivered. True if none is left. Never waits on the GPU itself: the resolver polls."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            while self._pending:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
        return True

    # -- closing -----------------------------------------------------------------------------------------

    def close(self, timeout_s: float = 1.0) -> None:
        """Stop timing new phases; give the pending ones until ``timeout_s`` to complete (never waiting on the GPU
        itself: the resolver polls), then hand the rest to ``on_resolved`` without times, counted as
        ``gpu_time_unresolved``. Idempotent; never raises."""
        with self._cond:
            self._closed = True
            thread = self._thread
            if self._deadline is None:
                self._deadline = time.monotonic() + max(0.0, timeout_s)
            self._cond.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join(max(0.0, timeout_s) + 1.0)
