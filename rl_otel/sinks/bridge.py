"""The bridge: one step's metrics fanned out to every tracker sink, each on a worker thread of its own.

Why a fan-out beside the OTel pipeline and not an OTel exporter: a metric exporter sees aggregated points in
base units, keyed by instrument name and attributes, at collection time - not the user's keys, GiB and step.
Turning them back would need a reverse mapping per key and would mirror a *collection*, not a step. The bridge
instead takes the ``{key: value}`` that ``Telemetry.log`` has already flattened, coerced and routed, after the
same checks that admit a value to Prometheus: one data path, two views.

Fault isolation: ``submit`` never blocks and never raises. Each worker owns a bounded queue; when a sink falls
behind (hung, slow disk) the oldest step is dropped and counted (``reason="queue_full"``). Only a caller that asks
to (``wait=True``: a replay of history, from a thread that may wait) waits for a slow sink instead - half its
queue, never for a hung one. A call into a sink that
runs longer than ``close_timeout_s`` is counted once as ``reason="timeout"`` (seen at the next ``submit``: no
watchdog thread); a thread cannot be killed, so the call is left to finish, and the sink goes on if it ever
returns. A sink that raises is counted and logged once per reason; the other sinks go on. ``close()`` drains every
queue and closes every sink under one deadline; a worker still stuck then is abandoned (daemon thread) and counted
("close_timeout"). Signals are handled by :mod:`rl_otel.core.signals`, which calls ``Telemetry.close``/``flush``.
Thread-safe: ``submit`` may be called from several threads; ``close`` runs once.
"""

from __future__ import annotations

import atexit
import errno
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

from rl_otel.sinks.base import Metrics, Sink, SinkError


OnError = Callable[[str, str, "BaseException | None"], None]  # (sink, reason, exception)
_DISK_FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}


def error_reason(exc: BaseException) -> str:
    if isinstance(exc, SinkError):
        return exc.reason
    if isinstance(exc, OSError) and exc.errno in _DISK_FULL:
        return "disk_full"
    return "exception"


class _Worker:
    def __init__(self, name: str, sink: Sink, queue_size: int, timeout_s: float, on_error: OnError) -> None:
        self.name = name
        self.sink = sink
        self._maxlen = queue_size
        self._timeout_s = timeout_s
        self._started = 0.0  # when the call in progress began
        self._timed_out = False  # the call in progress was already counted as a timeout
        self._items: deque[tuple[Metrics, int]] = deque()
        self._cond = threading.Condition()
        self._busy = False
        self._flush_wanted = False
        self._closing = False
        self._ended = False  # the worker has left _run: nobody will ever clear _flush_wanted again
        self._on_error = on_error
        self.thread = threading.Thread(target=self._run, name=f"rl_otel-sink-{name}", daemon=True)
        self.thread.start()

    def _stuck(self) -> bool:
        return self._busy and time.monotonic() - self._started > self._timeout_s

    def submit(self, metrics: Metrics, step: int, wait_until: float | None = None) -> None:
        with self._cond:
            if self._closing:
                return
            room = max(1, self._maxlen // 2)  # a waiting caller fills half the queue: the rest is for those that
            if wait_until is not None and len(self._items) >= room and not self._stuck():  # never wait (training)
                # a caller that may wait: for room, unless the sink is hung (then the oldest step goes, as always)
                self._cond.wait_for(lambda: self._closing or len(self._items) < room or self._stuck(),
                                    timeout=max(0.0, wait_until - time.monotonic()))
                if self._closing:
                    return
            hung = self._busy and not self._timed_out and time.monotonic() - self._started > self._timeout_s
            if hung:
                self._timed_out = True
            dropped = len(self._items) >= self._maxlen
            if dropped:
                self._items.popleft()
            self._items.append((metrics, step))
            self._cond.notify_all()  # the worker, whatever else waits on the condition (flush, a waiting submit)
        if hung:
            self._on_error(self.name, "timeout", None)
        if dropped:
            self._on_error(self.name, "queue_full", None)

    def _run(self) -> None:
        try:
            self._work()
        finally:
            with self._cond:
                self._ended = True
                self._cond.notify_all()

    def _work(self) -> None:
        while True:
            with self._cond:
                while not (self._items or self._closing or self._flush_wanted):
                    self._cond.wait()
                if self._items:
                    job: tuple[Metrics, int] | None = self._items.popleft()
                    self._cond.notify_all()  # room: a submit waiting for it goes on
                elif self._flush_wanted:
                    job, self._flush_wanted = None, False
                else:  # closing, and nothing left to write
                    break
                self._busy, self._started, self._timed_out = True, time.monotonic(), False
            try:
                if job is not None:
                    self.sink.log(*job)
                elif callable(getattr(self.sink, "flush", None)):
                    self.sink.flush()
            except Exception as exc:
                self._on_error(self.name, error_reason(exc), exc)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()
        try:
            self.sink.close()
        except Exception as exc:
            self._on_error(self.name, error_reason(exc), exc)

    def flush(self, deadline: float) -> bool:
        """Wait until every queued step is handed to the sink and the sink's own ``flush()`` (if it has one: a
        writer with a buffer of its own, like TensorBoard's) has run after them. Once the worker has ended (after
        ``close()``) nobody is left to wait for: done if nothing is left queued."""
        with self._cond:
            self._flush_wanted = True
            self._cond.notify_all()
            done = self._cond.wait_for(lambda: self._ended or not (self._items or self._busy or self._flush_wanted),
                                       timeout=max(0.0, deadline - time.monotonic()))
            return done and not self._items

    def begin_close(self) -> None:
        """Stop taking steps; the worker writes what is queued, closes its sink and ends."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()

    def close(self, deadline: float) -> bool:
        self.begin_close()
        self.thread.join(timeout=max(0.0, deadline - time.monotonic()))
        return not self.thread.is_alive()


class Bridge:
    """Fans ``(metrics, step)`` out to sinks. Build it with :func:`rl_otel.sinks.bridge.build_bridge`."""

    active = True

    def __init__(self, sinks: Sequence[tuple[str, Sink]], *, on_error: OnError, queue_size: int = 64,
                 close_timeout_s: float = 10.0) -> None:
        self._on_error = on_error
        self._close_timeout_s = close_timeout_s
        # a call longer than close() would wait for is a hung call
        self._workers = [_Worker(name, sink, queue_size, close_timeout_s, on_error) for name, sink in sinks]
        self._closed = False
        self._close_lock = threading.Lock()
        atexit.register(self.close)

    @property
    def sink_names(self) -> tuple[str, ...]:
        return tuple(w.name for w in self._workers)

    def submit(self, metrics: Metrics, step: int, wait: bool = False) -> None:
        """Queue one step for every sink. Never raises; ``metrics`` must not change afterwards. Never blocks
        unless ``wait``: then a sink half its queue behind is waited for (``close_timeout_s`` at most in all; a
        hung sink is not), so that a burst loses no step and leaves room for the callers that never wait."""
        until = time.monotonic() + self._close_timeout_s if wait else None
        for worker in self._workers:
            worker.submit(metrics, step, until)

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every queued step is written (or ``timeout_s`` passes). True if all were."""
        deadline = time.monotonic() + (self._close_timeout_s if timeout_s is None else timeout_s)
        return all([w.flush(deadline) for w in self._workers])

    def close(self) -> None:
        """Write what is queued, close every sink, within ``close_timeout_s`` in all. Idempotent."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        atexit.unregister(self.close)
        deadline = time.monotonic() + self._close_timeout_s
        for worker in self._workers:  # all drain at once; one deadline for all
            worker.begin_close()
        for worker in self._workers:
            if not worker.close(deadline):
                self._on_error(worker.name, "close_timeout", None)


class NullBridge:
    """The bridge of a process that mirrors to no tracker (no trackers configured, or not its rank)."""

    active = False
    sink_names: tuple[str, ...] = ()

    def submit(self, metrics: Metrics, step: int, wait: bool = False) -> None:
        pass

    def flush(self, timeout_s: float | None = None) -> bool:
        return True

    def close(self) -> None:
        pass


def build_bridge(trackers: Sequence, *, run: str, mirror: bool, on_error: OnError, queue_size: int = 64,
                 close_timeout_s: float = 10.0) -> Bridge | NullBridge:
    """Create the sinks of ``trackers`` (:class:`~rl_otel.sinks.config.TrackerSpec`) and their bridge.

    A sink whose kwargs are wrong (``ValueError``/``TypeError``) or whose package is missing (``ImportError``)
    fails ``init()``; one that fails to start for another reason (a network error, a hung service) is logged,
    counted (``reason="start_failed"``) and left out, and training goes on.
    """
    from rl_otel.errors import ConfigurationError
    from rl_otel.sinks.base import sink_factory
    from rl_otel.sinks.config import scrub, secret_values

    if not trackers or not mirror:
        return NullBridge()
    sinks: list[tuple[str, Sink]] = []
    try:
        for spec in trackers:
            secrets = secret_values(dict(spec.kwargs))
            try:
                sink = sink_factory(spec.name)(run=run, **dict(spec.kwargs))
            except (ValueError, TypeError) as exc:
                raise ConfigurationError(f"tracker {spec.name!r}: {scrub(str(exc), secrets)}") from None
            except ImportError:
                raise
            except Exception as exc:
                on_error(spec.name, "start_failed", exc)
                continue
            sinks.append((spec.name, sink))
    except BaseException:
        for _, sink in sinks:
            try:
                sink.close()
            except Exception:
                pass
        raise
    if not sinks:
        return NullBridge()
    return Bridge(sinks, on_error=on_error, queue_size=queue_size, close_timeout_s=close_timeout_s)
