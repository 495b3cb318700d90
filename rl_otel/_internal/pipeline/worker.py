"""The one queue worker of rl_otel: a bounded FIFO run by one daemon thread, for the metrics worker and the trackers.

Two uses, one class (:class:`Worker`) and one policy:

- ``Telemetry.submit(fn, ...)`` and a ``log()`` queued behind submitted jobs run on the *metrics worker*: the
  training thread pays for the hand-off (a few microseconds), not for the statistics' hundred small tensor ops and
  their host sync. Readers (a scrape, an OTLP export, ``flush()``, ``close()``) first wait for the jobs submitted
  before them (:meth:`Worker.flush`), so nothing goes stale.
- Each tracker sink has a worker of its own in the tracker bridge (:mod:`rl_otel._internal.trackers.bridge`):
  ``log()`` never waits on a hung or slow tracker.

The policy, for both:

- **Order and bound.** Items run one at a time in submission order. At most ``queue_size`` wait. The thread
  starts with the first submit: a process that never submits has no extra thread.
- **A full queue.** A producer that may wait waits for room (backpressure: the cost then shows in its step
  time). It stops waiting when its time is up, or at once when the call in progress has run longer than
  ``timeout_s``, because waiting for a hung call is pointless. Then, if the queue is still full, the oldest queued
  item is dropped: its ``on_drop`` runs and ``on_error("queue_full")`` counts it. A producer that may not wait
  drops the oldest at once. Which producers wait is the one choice a use makes (``when_full``):

  - ``"wait"`` (the metrics worker: "backpressure, not loss"): every submit waits, for up to ``timeout_s``, for
    room in the whole queue.
  - ``"drop_oldest"`` (the trackers: the training loop never waits on a tracker): a submit drops at once, unless
    its caller gives ``wait_until`` (a replay of history, from a thread that may wait). That caller waits for
    room in *half* the queue, so the producers that never wait still find room.
- **A hung call.** A call running longer than ``timeout_s`` is reported once, ``on_error("timeout")``, at the
  next submit (no watchdog thread). A thread cannot be killed: the call is left to finish.
- **Errors.** A handler catches its own errors (a tracker's are counted by the bridge per reason). The thread's
  last guard reports anything that escapes, ``on_error("internal")``, and goes on. Nothing raises to a producer.
- **flush(timeout_s).** Waits until every item submitted before the call has run or been dropped, then for the
  ``on_flush`` hook (a sink's own buffer, e.g. TensorBoard's), run on the worker thread after them. Returns True
  if it finished in time. On the worker thread itself it returns True at once, because a job must not wait for
  itself.
- **close(timeout_s).** Later submits are refused (False). The thread runs what is queued, then ``on_close``, and
  ends. ``close()`` joins it, all under one deadline. A thread still busy at the deadline is abandoned (a daemon:
  a call stuck in user code cannot hold the process): what is still queued is dropped (each ``on_drop`` runs)
  and ``on_error("close_timeout")`` counts it once.
- **fork().** In a forked child only the forking thread exists, and the parent's worker thread may have held the
  lock. The child's worker starts over with a fresh lock and an empty queue (the parent's queued items are the
  parent's to run). It starts a thread of its own at its first submit, so the child's ``flush()`` works and its
  items reach the handler. The hooks act on the parent's objects (a sink's open file or run), so in a child
  ``close()`` runs ``on_flush`` in place of ``on_close``: the child writes what it logged, and the parent closes
  what it opened.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from time import monotonic
from typing import Generic, Literal, TypeVar, cast

from rl_otel._internal.forks import reset_in_forked_child

T = TypeVar("T")
Job = Callable[[], None]

def _call(job: Job) -> None:
    job()


class Worker(Generic[T]):
    """A bounded FIFO of items handed to ``handle`` by one daemon thread, with the policy in this module's doc.

    ``handle(item)`` runs each item (default: items are jobs, called with no argument); it should catch its own
    errors. ``on_error(reason)`` is called outside the lock with ``"queue_full"``, ``"timeout"``,
    ``"close_timeout"`` or ``"internal"``. ``on_flush``/``on_close`` run on the worker thread (see
    :meth:`flush` and :meth:`close`). Thread-safe; never raises to a producer.
    """

    def __init__(self, *, name: str, queue_size: int, timeout_s: float, on_error: Callable[[str], None],
                 handle: Callable[[T], object] | None = None, when_full: Literal["wait", "drop_oldest"] = "wait",
                 on_flush: Callable[[], object] | None = None, on_close: Callable[[], object] | None = None) -> None:
        if when_full not in ("wait", "drop_oldest"):
            raise ValueError(f"when_full must be 'wait' or 'drop_oldest', got {when_full!r}")
        if isinstance(queue_size, bool) or not isinstance(queue_size, int) or queue_size < 1:
            raise ValueError(f"queue_size must be a positive int, got {queue_size!r}")
        self.name = name
        self._handle: Callable[[T], object] = handle if handle is not None else _call  # type: ignore[assignment]
        self._maxlen = queue_size
        self._waits = when_full == "wait"  # whether every submit may wait for room
        # a waiting producer waits for room in the whole queue if every producer waits, else in half of it
        self._room = queue_size if self._waits else max(1, queue_size // 2)
        self._timeout_s = timeout_s
        self._on_error = on_error
        self._on_flush = on_flush
        self._on_close = on_close
        self._owner = os.getpid()  # the process whose objects the hooks act on
        self._closing = False
        self._reset()
        reset_in_forked_child(self)

    def _reset(self) -> None:
        self._cond = threading.Condition()
        self._items: deque[tuple[T, Callable[[], None] | None]] = deque()
        self._thread: threading.Thread | None = None
        self._submitted = 0  # items accepted
        self._finished = 0  # items run or dropped
        self._busy = False  # a call (an item or a hook) is in progress...
        self._started = 0.0  # ...since then (time.monotonic)
        self._timed_out = False  # ...and was already reported as hung
        self._asks: deque[tuple[int, int]] = deque()  # flushes waiting for their hook: (items before it, number)
        self._asked = 0  # flushes numbered so far
        self._flushed = 0  # the highest flush number whose hook has run
        self._ended = False  # the thread has left its loop: nobody will serve a flush again
        self._abandoned = False  # close() gave up on the thread (counted once)

    def _after_fork(self) -> None:
        """In a forked child: a fresh lock, an empty queue, no thread (one starts at the first submit)."""
        self._reset()

    # -- producers ---------------------------------------------------------------------------------------------

    @property
    def pending(self) -> bool:
        """Whether accepted items have not finished yet (a racy read: a hint for a fast path, not a barrier)."""
        return self._finished != self._submitted

    @property
    def queued(self) -> int:
        """How many items wait (not counting the one in progress)."""
        return len(self._items)

    @property
    def busy(self) -> bool:
        """Whether the thread is in a call (an item or a hook)."""
        return self._busy

    def submit(self, item: T, on_drop: Callable[[], None] | None = None, wait_until: float | None = None) -> bool:
        """Queue ``item``; if the queue is full, wait or drop the oldest as the policy says (``wait_until``: a
        ``time.monotonic()`` a ``"drop_oldest"`` caller may wait until, or that replaces ``"wait"``'s
        ``timeout_s``). False after :meth:`close` (the item is not run, ``on_drop`` is not called)."""
        dropped: Callable[[], None] | None = None
        dropped_any = False
        with self._cond:
            if self._closing:
                return False
            if self._thread is None:
                self._start()
            items = self._items
            if len(items) >= self._room and (self._waits or wait_until is not None) \
                    and threading.current_thread() is not self._thread:  # the worker cannot make room for itself
                self._wait_for_room(monotonic() + self._timeout_s if wait_until is None else wait_until)
                if self._closing:
                    return False
            hung = self._busy and not self._timed_out and monotonic() - self._started > self._timeout_s
            if hung:
                self._timed_out = True
            if len(items) >= self._maxlen:
                _, dropped = items.popleft()
                dropped_any = True
                self._finished += 1
            items.append((item, on_drop))
            self._submitted += 1
            self._cond.notify_all()  # the thread, and whatever else waits (a flush, a waiting producer)
        if hung:
            self._report("timeout")
        if dropped_any:
            self._report("queue_full")
            if dropped is not None:
                dropped()
        return True

    def _wait_for_room(self, until: float) -> None:
        """Under the lock: wait until there is room, ``until`` passes, or the call in progress is hung."""
        while len(self._items) >= self._room and not self._closing:
            now = monotonic()
            limit = until
            if self._busy:
                hung_at = self._started + self._timeout_s
                if now >= hung_at:
                    return
                limit = min(limit, hung_at)
            if now >= until:
                return
            self._cond.wait(limit - now)

    def _start(self) -> None:
        """Under the lock: start the thread."""
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    # -- readers -----------------------------------------------------------------------------------------------

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every item submitted before this call has run (or was dropped), then for ``on_flush`` run
        after them on the worker thread. True if that finished within ``timeout_s`` (``None``: no limit). True at
        once on the worker thread itself, and where nothing was ever submitted (in this process)."""
        with self._cond:
            thread = self._thread
            if thread is None or threading.current_thread() is thread:
                return True
            target = self._submitted
            if self._on_flush is None or self._ended:  # nothing to run after the items: they are the flush
                return self._cond.wait_for(lambda: self._finished >= target, timeout_s)
            self._asked += 1
            number = self._asked
            self._asks.append((target, number))
            self._cond.notify_all()
            self._cond.wait_for(lambda: self._flushed >= number or self._ended, timeout_s)
            # once the thread has ended (closed) nobody is left to wait for: done if every item ran
            return self._flushed >= number or (self._ended and self._finished >= target)

    def begin_close(self) -> None:
        """Refuse later submits; the thread runs what is queued, then ``on_close`` (``on_flush`` in a forked
        child), and ends. Does not wait (:meth:`close` does)."""
        with self._cond:
            if self._closing:
                return
            self._closing = True
            if self._thread is None and self._on_close is not None and os.getpid() == self._owner:
                self._start()  # nothing was submitted: the thread only runs on_close, under close()'s deadline
            self._cond.notify_all()

    def close(self, timeout_s: float | None = None) -> bool:
        """:meth:`begin_close`, then join the thread within ``timeout_s`` (default: the worker's ``timeout_s``).
        True if it ended in time. If not, it is abandoned (a daemon), what is still queued is dropped (their
        ``on_drop`` run) and ``on_error("close_timeout")`` is called once. Idempotent."""
        deadline = monotonic() + (self._timeout_s if timeout_s is None else timeout_s)
        self.begin_close()
        thread = self._thread
        if thread is None:
            return True
        if thread is threading.current_thread():  # closed from one of its own items: it drains after this one
            return False
        thread.join(max(0.0, deadline - monotonic()))
        if not thread.is_alive():
            return True
        with self._cond:
            left = list(self._items)
            self._items.clear()
            self._finished += len(left)
            self._cond.notify_all()
            counted, self._abandoned = self._abandoned, True
        for _, on_drop in left:
            if on_drop is not None:
                on_drop()
        if not counted:
            self._report("close_timeout")
        return False

    # -- the thread --------------------------------------------------------------------------------------------

    def _report(self, reason: str) -> None:
        try:
            self._on_error(reason)
        except Exception:  # boundary: the owner's callback, called from its producers' threads and the worker's
            pass

    def _run(self) -> None:
        try:
            self._loop()
            # the parent's objects are the parent's to close: a forked child writes out what it logged
            final = self._on_close if os.getpid() == self._owner else self._on_flush
            if final is not None:
                try:
                    final()
                except BaseException:  # boundary: the owner's close hook (a sink's close: files, network)
                    self._report("internal")
        finally:
            with self._cond:
                self._ended = True
                self._cond.notify_all()

    def _loop(self) -> None:
        cond, items, asks = self._cond, self._items, self._asks
        while True:
            with cond:
                while True:
                    flush = 0
                    while asks and asks[0][0] <= self._finished:  # the items before these flushes have run
                        flush = asks.popleft()[1]
                    if flush or items or self._closing:
                        break
                    cond.wait()
                if flush:
                    item = None
                elif items:
                    item, _ = items.popleft()
                else:  # closing, and nothing left
                    return
                self._busy, self._started, self._timed_out = True, monotonic(), False
                cond.notify_all()  # room: a producer waiting for it goes on
            try:
                if flush:
                    self._on_flush()  # type: ignore[misc]
                else:
                    self._handle(item)  # type: ignore[arg-type]
            except BaseException:  # boundary: the thread's loop; handlers catch their own errors, it must live
                self._report("internal")
            finally:
                with cond:
                    self._busy = False
                    if flush:
                        self._flushed = flush
                    else:
                        self._finished += 1
                    cond.notify_all()


def caller_streams(values: Iterable[object]) -> tuple[object, ...]:
    """The calling thread's current CUDA stream on each device that holds one of ``values`` (tensors), for
    :func:`on_streams`: the worker's thread has its own current streams (the default ones), and kernels it
    queues there could read a tensor before the caller's stream has produced it. ``()`` without CUDA tensors;
    torch is never imported here."""
    torch = sys.modules.get("torch")
    if torch is None:
        return ()
    devices = {v.device for v in values if isinstance(v, torch.Tensor) and v.is_cuda}
    return tuple(torch.cuda.current_stream(d) for d in devices)


@contextlib.contextmanager
def on_streams(streams: tuple[object, ...]) -> Iterator[None]:
    """Make ``streams`` (from :func:`caller_streams`) current on this thread: the job's kernels queue behind the
    caller's, in order, with no host synchronization."""
    if not streams:
        yield
        return
    import torch

    cuda_streams = cast("tuple[torch.cuda.Stream, ...]", streams)  # caller_streams' CUDA streams
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.cuda.device(cuda_streams[0].device))
        for stream in cuda_streams:
            stack.enter_context(torch.cuda.stream(stream))
        yield
