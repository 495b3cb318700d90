"""GPU-true phase times: CUDA events at a phase's edges, resolved on the phase's own thread at later edges.

A phase's host times (``perf_counter``) say how long the host took to *launch* its work: on a GPU the kernels run
later, and the wait lands in whatever part next synchronizes (an ``offload``'s ``.to("cpu")``). Timing the work
itself needs the GPU's clock. ``torch.cuda.synchronize()`` at each edge gives it, but stalls the pipeline it
measures; CUDA events do not: an event recorded on a stream is stamped by the GPU when the stream reaches it.

Edges (``START``, ``ONLOADED``, ``EXECUTED``, ``END``): recorded on the current stream of the phase's device when
the phase reaches them on the host (before ``onload``, after it, at the body's end, after ``offload``). With no
``onload`` callable nothing of the phase runs between ``START`` and ``ONLOADED``, so they are one event (GPU
``onload`` is 0); with no ``offload``, ``END`` is ``EXECUTED``. The GPU time of a part is the time the phase's
*current stream* took from reaching the part's first edge to reaching its last: the phase's own work (work queued
before the phase is not in it) plus any idle gap where the host launched slower than the GPU ran (a launch-bound
part reads about its host time). Work on a side stream counts only where the phase's stream waits for it. A part
that would read negative (edges on two streams that finished out of order) reads 0.

Where CUDA calls happen, and where they never do (the hazards of a library thread that touches CUDA):

- Nothing before the process itself initialized CUDA: :meth:`GpuTimer.begin` asks ``torch.cuda.is_initialized()``
  (which is also False in a child forked from a CUDA process, torch's "bad fork"), never ``current_device()``,
  which would initialize CUDA and put a context on the GPU of a process that has none.
- No thread of its own: a finished phase's events are queried on the thread that ran the phase, at its next
  phase edges (the oldest pending phase first, stopping at the first the GPU has not reached, a few per edge), and
  at ``flush()``/``close()`` (bounded). Each query runs with the phase's device current (``torch.cuda.device``):
  ``cudaEventQuery`` sets no device (``c10/cuda/CUDAEvent.h``), and a CUDA call on a thread whose current device
  has no context creates one there (the "GPU 0 runs out of memory" of eight ranks).
- Not inside a CUDA-graph capture: a phase that begins while its stream captures records no event, an edge reached
  while it captures drops the phase's GPU time, and no query runs while the calling thread's stream captures.
  The limit: ``is_current_stream_capturing()`` sees only the caller's stream. In the default (global) capture
  mode an unsafe call from *any* thread invalidates a capture, so a query on the training thread can still break a
  capture another thread of the process runs at that moment (an in-process engine capturing on its own thread).
  Such a process turns GPU times off with ``init(phase_gpu_time=False)``; a capture on the training thread itself,
  or in another process, is safe.

Cost on the training thread: one ``Event.record`` per edge used (2 for a phase without ``onload``/``offload``, 4
with both), one ``is_current_stream_capturing()`` per edge, a lock held for a list operation, and the queries of
the oldest pending phases at each edge (usually one ``cudaEventQuery``); never a ``synchronize()``.

Bounded: events come from a pool per device, reused once a phase is resolved or abandoned; at most
``max_unresolved`` phases hold events (begun, not yet resolved). A phase beyond that is not GPU-timed, counted as
``gpu_time_backlog``. :meth:`GpuTimer.close` gives the pending phases a bounded time to complete, then hands the
rest to ``on_resolved`` without times and counts each as ``gpu_time_unresolved``: a process exiting with work still
on the GPU neither hangs nor loses a span. A phase whose body (or ``onload``/``offload``) raises records no host
times, and its events go back to the pool unresolved (nothing is dropped: there is nothing to report).

Without CUDA (no torch, a CPU build, no device, CUDA not initialized by the process) :meth:`GpuTimer.begin`
returns ``None`` after a cached check and ``is_initialized()``: no event, no CUDA call.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from rl_otel._internal.forks import reset_in_forked_child

START, ONLOADED, EXECUTED, END = 0, 1, 2, 3
MAX_UNRESOLVED = 1024  # phases holding events at once (4 events each at most)
POOL = 64  # events kept for reuse per device: a burst of fast phases' events beyond it are let go
POLL_S = (0.001, 0.05)  # flush()/close(): first and longest wait between polls while phases are pending
PER_EDGE = 4  # phases resolved at most at one edge (the rest wait for the next edges)


class GpuPhase:
    """The events of one phase, and what its owner needs when they resolve (``payload``)."""

    __slots__ = ("cuda", "device", "events", "failed", "marked", "payload", "thread", "timer")

    def __init__(self, timer: GpuTimer, cuda: Any, device: int, events: list[Any]) -> None:
        self.timer, self.cuda, self.device, self.events = timer, cuda, device, events
        self.thread = threading.get_ident()  # its events are queried on this thread (or at flush/close)
        self.marked = 0  # the edges recorded (bits)
        self.failed = False  # an edge could not be recorded: the phase is not GPU-timed
        self.payload: Any = None

    def mark(self, edge: int) -> None:
        """Record ``edge`` (:meth:`GpuTimer.mark`)."""
        self.timer.mark(self, edge)

    def finish(self, payload: Any) -> bool:
        """Queue the phase for resolution (:meth:`GpuTimer.finish`)."""
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
    edges, :meth:`finish` when its block ended cleanly (or :meth:`release` when it raised). Finished phases are
    resolved on their own thread at its later edges (:meth:`begin`, :meth:`finish`), and by :meth:`wait` and
    :meth:`close`. Thread-safe; nothing here raises to its caller: failures go to ``fail(what)``, drops to
    ``count(reason)``.

    ``cuda()`` returns ``torch.cuda`` only where the process itself initialized CUDA (``GpuProbe.live``): the
    timer never asks anything that would initialize it."""

    def __init__(self, cuda: Callable[[], Any | None], on_resolved: Resolved, *, count: Callable[[str], None],
                 fail: Callable[[str], None], max_unresolved: int = MAX_UNRESOLVED,
                 poll_s: tuple[float, float] = POLL_S) -> None:
        self._cuda, self._on_resolved, self._count, self._fail = cuda, on_resolved, count, fail
        self._max, self._poll = max_unresolved, poll_s
        self._init_state()
        self._closed = False
        reset_in_forked_child(self)

    def _init_state(self) -> None:
        self._lock = threading.Lock()
        self._free: dict[tuple[Any, int], list[Any]] = {}  # (torch.cuda, device) -> events ready for reuse
        self._open = 0  # phases holding events (begun, not yet resolved or released)
        self._pending: dict[int, deque[GpuPhase]] = {}  # thread id -> its finished phases, oldest first
        self._resolving: set[int] = set()  # threads whose queue is being resolved now (by them, or by wait())

    def _after_fork(self) -> None:
        # the parent's events and locks mean nothing here (CUDA itself does not survive a fork)
        self._init_state()

    @property
    def unresolved(self) -> int:
        """Phases holding events now (begun and not yet resolved, released or dropped)."""
        return self._open

    @property
    def pending(self) -> int:
        """Finished phases whose events are not resolved yet."""
        with self._lock:
            return sum(len(q) for q in self._pending.values())

    # -- the phase's thread ---------------------------------------------------------------------------

    def begin(self) -> GpuPhase | None:
        """Take a phase's events and record ``START`` on the current stream; ``None`` when the process has not
        initialized CUDA, the stream is capturing a CUDA graph, the timer is closed, or ``max_unresolved`` phases
        already hold events (counted as ``gpu_time_backlog``). Resolves this thread's oldest finished phases first."""
        cuda = self._cuda()
        if cuda is None or self._closed:
            return None
        try:
            new_event = getattr(cuda, "Event", None)
            if new_event is None:
                return None
            if cuda.is_current_stream_capturing():  # an event recorded here would be a node of the user's graph
                return None
            device = cuda.current_device()  # CUDA is initialized (cuda() said so): this initializes nothing
            if self._pending.get(threading.get_ident()):  # not capturing: asked above
                self._resolve(threading.get_ident(), PER_EDGE)
            with self._lock:
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
        except Exception:  # boundary: torch.cuda (stream capture query, event creation)
            self._fail("gpu_time")
            return None
        self.mark(phase, START)
        return None if phase.failed else phase

    def mark(self, phase: GpuPhase, edge: int) -> None:
        """Record ``edge`` on the current stream of the phase's device (the device it began on, whatever the
        current device is now). An edge reached while the stream captures a CUDA graph (a capture begun inside
        the block) drops the phase's GPU time: nothing is recorded into the user's graph."""
        if phase.failed:
            return
        try:
            cuda = phase.cuda
            if cuda.is_current_stream_capturing():
                phase.failed = True
                self.release(phase)
                return
            phase.events[edge].record(cuda.current_stream(phase.device))
            phase.marked |= 1 << edge
        except Exception:  # e.g. a stream of another device made current by hand: this phase is not GPU-timed
            phase.failed = True
            self.release(phase)
            self._fail("gpu_time")

    def finish(self, phase: GpuPhase, payload: Any) -> bool:
        """Queue a cleanly ended phase: ``on_resolved(phase, seconds or None)`` is called once, on this thread at a
        later edge (or by :meth:`wait`/:meth:`close`). False if it will not be (an edge failed, or the timer is
        closed): the caller then finishes without GPU times."""
        if phase.failed:
            return False
        phase.payload = payload
        with self._lock:
            accepted = not self._closed
            if accepted:
                self._pending.setdefault(phase.thread, deque()).append(phase)
        if not accepted:
            self.release(phase)
            return False
        try:
            self._resolve_own(phase.cuda)
        except Exception:  # boundary: torch.cuda (stream capture query, event queries)
            self._fail("gpu_time")
        return True

    def release(self, phase: GpuPhase) -> None:
        """Give a phase's events back to the pool without resolving them (re-recording an event the GPU has not
        reached yet is allowed: it just takes the new position)."""
        with self._lock:
            events, phase.events = phase.events, []
            if events:  # once per phase
                self._open = max(0, self._open - 1)  # a phase begun before a fork ends in the child
                free = self._free.setdefault((phase.cuda, phase.device), [])
                free.extend(events[:max(0, POOL - len(free))])

    # -- resolution -------------------------------------------------------------------------------------

    def _resolve_own(self, cuda: Any) -> None:
        """At an edge: resolve this thread's oldest finished phases (at most :data:`PER_EDGE`), unless its stream
        is capturing (a query there would invalidate the capture)."""
        if self._pending.get(threading.get_ident()) and not cuda.is_current_stream_capturing():
            self._resolve(threading.get_ident(), PER_EDGE)

    def _resolve(self, thread: int, limit: int) -> bool:
        """Resolve up to ``limit`` of ``thread``'s finished phases, oldest first, stopping at the first the GPU
        has not reached (the later ones on its stream are behind it). True if that thread has none left."""
        with self._lock:
            if thread in self._resolving:  # wait() on another thread is at it: never query one event twice at once
                return False
            self._resolving.add(thread)
        try:
            done = 0
            while done < limit:
                with self._lock:
                    queue = self._pending.get(thread)
                    phase = queue[0] if queue else None
                if phase is None:
                    return True
                try:
                    seconds = self._query(phase)
                except Exception:  # a CUDA error (a sticky one fails every query): dropped, not retried forever
                    self._fail("gpu_time")
                    seconds, resolved = None, True
                else:
                    resolved = seconds is not None
                if not resolved:
                    return False
                self._deliver(thread, phase, seconds)
                done += 1
            return False
        finally:
            with self._lock:
                self._resolving.discard(thread)

    @staticmethod
    def _query(phase: GpuPhase) -> dict[str, float] | None:
        """The phase's GPU seconds if the GPU reached its edges, else ``None``; queried with the phase's device
        current, so that no context is made on this thread's current device."""
        cuda = phase.cuda
        if cuda.current_device() == phase.device:
            return phase.seconds() if phase.complete() else None
        with cuda.device(phase.device):
            return phase.seconds() if phase.complete() else None

    def _deliver(self, thread: int, phase: GpuPhase, seconds: dict[str, float] | None) -> None:
        with self._lock:  # out of pending first: on_resolved runs once even if it raises
            queue = self._pending.get(thread)
            if queue and queue[0] is phase:
                queue.popleft()
                if not queue:
                    del self._pending[thread]
        try:
            self._on_resolved(phase, seconds)
        except Exception:  # boundary: the on_resolved callback (ends spans through the OTel SDK)
            self._fail("gpu_time")
        self.release(phase)

    def wait(self, timeout_s: float | None = None) -> bool:
        """Resolve every phase finished so far, on the calling thread (each queried with its device current),
        polling until ``timeout_s``: True if none is left. Never waits on the GPU itself (no synchronize).
        Skipped while the calling thread's stream captures a CUDA graph (False unless nothing is pending)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        pause = self._poll[0]
        while True:
            with self._lock:
                threads = list(self._pending)
            if not threads:
                return True
            capturing = False
            try:
                capturing = bool(threads) and self._pending_cuda_capturing()
            except Exception:  # boundary: torch.cuda (is_current_stream_capturing)
                pass
            if not capturing:
                for thread in threads:
                    self._resolve(thread, MAX_UNRESOLVED)
                with self._lock:
                    if not self._pending:
                        return True
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            time.sleep(pause if left is None else min(pause, left))
            pause = min(pause * 2, self._poll[1])

    def _pending_cuda_capturing(self) -> bool:
        with self._lock:
            phase = next((q[0] for q in self._pending.values() if q), None)
        return phase is not None and bool(phase.cuda.is_current_stream_capturing())

    # -- closing -----------------------------------------------------------------------------------------

    def close(self, timeout_s: float = 1.0) -> None:
        """Stop timing new phases; give the pending ones until ``timeout_s`` to complete (never waiting on the GPU
        itself: they are polled), then hand the rest to ``on_resolved`` without times, counted as
        ``gpu_time_unresolved``. Idempotent; never raises."""
        with self._lock:
            self._closed = True
        self.wait(max(0.0, timeout_s))
        with self._lock:
            left = [(thread, phase) for thread, queue in self._pending.items() for phase in queue]
        for thread, phase in left:
            self._count("gpu_time_unresolved")
            self._deliver(thread, phase, None)
