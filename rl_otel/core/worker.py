"""The metrics worker: one thread that computes and stores metrics off the training thread.

``Telemetry.submit(fn, ...)`` hands a statistics function (``ppo_stats``, an evaluation aggregation) and its
tensors to this thread, which calls it and stores the dict it returns: the training thread pays for the hand-off
(a few microseconds), not for the statistics' hundred small tensor ops and their host sync. Jobs run one at a time
in submission order, so steps reach the store and the trackers in the order they were logged.

Nothing is lost and nothing goes stale: readers (a scrape, an OTLP export, ``flush()``, ``close()``) first wait for
the jobs submitted before them (:meth:`MetricsWorker.wait_idle`). The queue is bounded: a producer that outruns
the worker waits for room - backpressure, the cost then shows in the step time - and only a worker stuck for
longer than ``timeout_s`` makes it drop the oldest job (counted). The thread starts with the first job: a process
that never submits has no extra thread.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator

Job = Callable[[], None]
_WORKERS: weakref.WeakSet[MetricsWorker] = weakref.WeakSet()


def _reset_after_fork() -> None:
    for worker in list(_WORKERS):
        worker._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


class MetricsWorker:
    """A bounded FIFO of jobs run by one daemon thread. Thread-safe; never raises to a producer."""

    def __init__(self, *, queue_size: int, timeout_s: float, on_error: Callable[[str], None],
                 name: str = "rl_otel-metrics") -> None:
        self._jobs: deque[tuple[Job, Callable[[], None] | None]] = deque()
        self._cond = threading.Condition()
        self._maxlen = queue_size
        self._timeout_s = timeout_s
        self._on_error = on_error  # (reason) -> None; called outside the lock
        self._name = name
        self._thread: threading.Thread | None = None
        self._submitted = 0  # jobs accepted
        self._finished = 0  # jobs run or dropped
        self._closing = False
        _WORKERS.add(self)

    def _after_fork(self) -> None:
        """In a forked child the thread is gone (only the forking thread survives) and the lock may be held:
        start over empty - the parent's queued jobs are the parent's to run."""
        self._jobs = deque()
        self._cond = threading.Condition()
        self._thread = None
        self._submitted = self._finished = 0

    @property
    def pending(self) -> bool:
        """Whether accepted jobs have not finished yet (a racy read: a hint for the fast path, not a barrier)."""
        return self._finished != self._submitted

    def submit(self, job: Job, on_drop: Callable[[], None] | None = None) -> bool:
        """Queue ``job`` (it must not raise). Waits up to ``timeout_s`` while the queue is full, then drops the
        oldest queued job (its ``on_drop`` is called). False after :meth:`close` (the job is not run)."""
        dropped: Callable[[], None] | None = None
        dropped_any = False
        with self._cond:
            if self._closing:
                return False
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            if len(self._jobs) >= self._maxlen and not self._cond.wait_for(
                    lambda: len(self._jobs) < self._maxlen or self._closing, self._timeout_s):
                _, dropped = self._jobs.popleft()
                dropped_any = True
                self._finished += 1
                self._cond.notify_all()
            if self._closing:
                return False
            self._jobs.append((job, on_drop))
            self._submitted += 1
            self._cond.notify_all()
        if dropped_any:
            self._on_error("queue_full")
            if dropped is not None:
                dropped()
        return True

    def wait_idle(self, timeout_s: float | None = None) -> bool:
        """Wait until every job submitted before this call has run. True if they did within ``timeout_s``.
        Returns at once on the worker thread itself (a job that reads the store must not wait for itself)."""
        if threading.current_thread() is self._thread:
            return True
        with self._cond:
            target = self._submitted
            return self._cond.wait_for(lambda: self._finished - target >= 0, timeout_s)

    def close(self, timeout_s: float | None = None) -> bool:
        """Run what is queued (up to ``timeout_s``, default the worker's ``timeout_s``), then stop the thread. Later submits are refused. True if
        every job ran; jobs still queued at the deadline are dropped (the thread is a daemon: a job stuck in
        user code cannot hold the process)."""
        timeout_s = self._timeout_s if timeout_s is None else timeout_s
        drained = self.wait_idle(timeout_s)
        with self._cond:
            self._closing = True
            left = list(self._jobs)
            self._jobs.clear()
            self._finished += len(left)
            self._cond.notify_all()
            thread = self._thread
        for _, on_drop in left:
            if on_drop is not None:
                on_drop()
        if left:
            self._on_error("close_timeout")
        if thread is not None and drained:
            thread.join(timeout_s)
        return drained and not left

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._jobs or self._closing)
                if not self._jobs:
                    return
                job, _ = self._jobs.popleft()
                self._cond.notify_all()  # room for a waiting producer
            try:
                job()
            except BaseException:  # jobs catch their own errors; this is the last guard: the thread must live
                try:
                    self._on_error("internal")
                except Exception:
                    pass
            finally:
                with self._cond:
                    self._finished += 1
                    self._cond.notify_all()


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

    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.cuda.device(streams[0].device))
        for stream in streams:
            stack.enter_context(torch.cuda.stream(stream))
        yield
