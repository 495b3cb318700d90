"""The bridge: one step's metrics fanned out to every tracker sink, each on a worker thread of its own.

Why a fan-out beside the OTel pipeline and not an OTel exporter: a metric exporter sees aggregated points in
base units, keyed by instrument name and attributes, at collection time - not the user's keys, GiB and step.
Turning them back would need a reverse mapping per key and would mirror a *collection*, not a step. The bridge
instead takes the ``{key: value}`` that ``Telemetry.log`` has flattened and coerced, every key as the user logged
it, before any Prometheus rule (routing, caps, name collisions): one step, two views.

Fault isolation: each sink has a worker of its own, :class:`rl_otel._internal.pipeline.worker.Worker` (the one
queue worker of
rl_otel, with the metrics worker's policy and ``when_full="drop_oldest"``). ``submit`` never blocks and never
raises: when a sink falls behind (hung, slow disk) and its bounded queue (``sink_queue_size``) is full, the oldest
step is dropped and counted (``reason="queue_full"``). Only a caller that asks to (``wait=True``: a replay of
history, from a thread that may wait) waits for a slow sink instead - for room in half its queue, never for a hung
one. A call into a sink that runs longer than ``close_timeout_s`` is counted once as ``reason="timeout"`` (seen at
the next ``submit``: no watchdog thread); a thread cannot be killed, so the call is left to finish, and the sink
goes on if it ever returns. A sink that raises is counted and logged once per reason; the other sinks go on.
``close()`` drains every queue and closes every sink under one deadline; a worker still stuck then is abandoned
(daemon thread) and counted ("close_timeout"). Signals are handled by :mod:`rl_otel._internal.runtime.signals`,
which calls
``Telemetry.close``/``flush``. Thread-safe: ``submit`` may be called from several threads; ``close`` runs once.

A worker's thread starts with its sink's first step. In a forked child each worker starts over empty with a thread
of its own, so what the child logs reaches the (inherited) sinks and its ``flush()`` works; the child flushes the
sinks at its exit but leaves closing them to the parent that opened them.
"""

from __future__ import annotations

import atexit
import errno
import threading
import time
from collections.abc import Callable, Sequence

from rl_otel._internal.forks import reset_in_forked_child
from rl_otel._internal.pipeline.worker import Worker
from rl_otel._internal.trackers.sinks import Metrics, Sink, SinkError, text_keys

OnError = Callable[[str, str, "BaseException | None"], None]  # (sink, reason, exception)
_DISK_FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}


def error_reason(exc: BaseException) -> str:
    if isinstance(exc, SinkError):
        return exc.reason
    if isinstance(exc, OSError) and exc.errno in _DISK_FULL:
        return "disk_full"
    return "exception"


class Bridge:
    """Fans ``(metrics, step)`` out to sinks. Build it with :func:`rl_otel._internal.trackers.bridge.build_bridge`."""

    active = True

    def __init__(self, sinks: Sequence[tuple[str, Sink]], *, on_error: OnError, queue_size: int,
                 close_timeout_s: float) -> None:
        self._on_error = on_error
        self._close_timeout_s = close_timeout_s
        self._names = tuple(name for name, _ in sinks)
        self._workers = [self._worker(name, sink, queue_size) for name, sink in sinks]
        self._closed = False
        self._close_lock = threading.Lock()
        reset_in_forked_child(self)
        atexit.register(self.close)

    def _after_fork(self) -> None:
        self._close_lock = threading.Lock()  # the parent's may have been held by another thread

    def _worker(self, name: str, sink: Sink, queue_size: int) -> Worker[tuple[Metrics, int]]:
        on_error = self._on_error

        def write(item: tuple[Metrics, int]) -> None:
            try:
                sink.log(text_keys(item[0]), item[1])  # a key no tracker can encode costs only itself
            except Exception as exc:  # boundary: the tracker sink (third-party code)
                on_error(name, error_reason(exc), exc)

        def guarded(call: Callable[[], object]) -> Callable[[], None]:
            def run() -> None:
                try:
                    call()
                except Exception as exc:  # boundary: the tracker sink (third-party code)
                    on_error(name, error_reason(exc), exc)
            return run

        flush = getattr(sink, "flush", None)  # a writer with a buffer of its own, like TensorBoard's
        # a call longer than close() would wait for is a hung call
        return Worker(name=f"rl_otel-sink-{name}", handle=write, queue_size=queue_size,
                      timeout_s=self._close_timeout_s, when_full="drop_oldest",
                      on_error=lambda reason: on_error(name, reason, None),
                      on_flush=guarded(flush) if callable(flush) else None, on_close=guarded(sink.close))

    @property
    def sink_names(self) -> tuple[str, ...]:
        return self._names

    def submit(self, metrics: Metrics, step: int, wait: bool = False) -> None:
        """Queue one step for every sink. Never raises; ``metrics`` must not change afterwards. Never blocks
        unless ``wait``: then a sink half its queue behind is waited for (``close_timeout_s`` at most in all; a
        hung sink is not), so that a burst loses no step and leaves room for the callers that never wait."""
        until = time.monotonic() + self._close_timeout_s if wait else None
        first = True
        for worker in self._workers:  # each sink its own dict: one that mutates it changes nothing for the others
            worker.submit((metrics if first else dict(metrics), step), None, until)
            first = False

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every step queued before the call is written and each sink's own ``flush()`` (if it has
        one) has run after them, or ``timeout_s`` passes (default ``close_timeout_s``). True if all were."""
        deadline = time.monotonic() + (self._close_timeout_s if timeout_s is None else timeout_s)
        flushed = [w.flush(max(0.0, deadline - time.monotonic())) for w in self._workers]  # every one, not all()'s
        return all(flushed)

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
        for worker in self._workers:  # a worker still stuck at the deadline counts its "close_timeout"
            worker.close(max(0.0, deadline - time.monotonic()))


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


def build_bridge(trackers: Sequence, *, run: str, mirror: bool, on_error: OnError, queue_size: int,
                 close_timeout_s: float) -> Bridge | NullBridge:
    """Create the sinks of ``trackers`` (:class:`~rl_otel._internal.trackers.config.TrackerSpec`) and their bridge.

    A sink whose kwargs are wrong (``ValueError``/``TypeError``) or whose package is missing (``ImportError``)
    fails ``init()``; one that fails to start for another reason (a network error, a hung service) is logged,
    counted (``reason="start_failed"``) and left out, and training goes on.
    """
    from rl_otel._internal.trackers.config import scrub, secret_values
    from rl_otel._internal.trackers.sinks import sink_factory
    from rl_otel.errors import ConfigurationError

    if not trackers or not mirror:
        return NullBridge()
    sinks: list[tuple[str, Sink]] = []
    try:
        for spec in trackers:
            secrets = secret_values(dict(spec.kwargs))
            try:
                sink = _start(sink_factory(spec.name), run, dict(spec.kwargs), close_timeout_s)
            except (ValueError, TypeError) as exc:
                raise ConfigurationError(f"tracker {spec.name!r}: {scrub(str(exc), secrets)}") from None
            except ImportError:
                raise
            except Exception as exc:  # boundary: the tracker's constructor (third-party code)
                on_error(spec.name, "start_failed", exc)
                continue
            sinks.append((spec.name, sink))
    except BaseException:  # boundary: tracker constructors: the sinks started so far closed, re-raised
        for _, sink in sinks:
            try:
                sink.close()
            except Exception:  # boundary: the tracker sink's close (third-party code)
                pass
        raise
    if not sinks:
        return NullBridge()
    return Bridge(sinks, on_error=on_error, queue_size=queue_size, close_timeout_s=close_timeout_s)


class StartTimeout(Exception):
    """A tracker's constructor still running after ``close_timeout_s`` (a hung login, an unreachable server)."""


def _start(factory: Callable[..., Sink], run: str, kwargs: dict, timeout_s: float) -> Sink:
    """``factory(run=run, **kwargs)`` on a thread of its own, waited for ``timeout_s`` at most: a constructor
    that hangs costs ``init()`` that long, then the tracker is left out (:class:`StartTimeout`, counted as
    ``start_failed``); should it return later, the sink it made is closed. Its exceptions are re-raised here."""
    done = threading.Event()
    lock = threading.Lock()
    result: list = []
    abandoned = False

    def construct() -> None:
        try:
            made: object = factory(run=run, **kwargs)
        except BaseException as exc:  # boundary: the tracker's constructor (third-party code, any error)
            made = exc
        with lock:  # either the caller takes the sink, or it gave up and the sink is closed here: never both
            result.append(made)
            done.set()
            late = abandoned
        if late and not isinstance(made, BaseException):
            try:
                made.close()  # type: ignore[attr-defined]
            except Exception:  # boundary: the tracker sink's close (third-party code)
                pass

    threading.Thread(target=construct, name="rl_otel-tracker-start", daemon=True).start()
    if not done.wait(timeout_s):
        with lock:
            if not done.is_set():
                abandoned = True
                raise StartTimeout(f"still starting after close_timeout_s={timeout_s:g} s; left out")
    made = result[0]
    if isinstance(made, BaseException):
        raise made
    return made
