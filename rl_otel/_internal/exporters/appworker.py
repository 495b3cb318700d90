"""The scrape endpoint's application thread: it runs the WSGI app (basic auth and the rendering) for one request at
a time, in arrival order, a fresh request before every pipelined one, off the event loop (:mod:`.server`), which
takes its answers back. Its CPU time is charged to the endpoint's budget, a credentials check's excepted (bcrypt
has a budget of its own)."""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from rl_otel._internal.exporters import cputime
from rl_otel._internal.exporters.admission import Admission
from rl_otel._internal.exporters.connection import BUSY, QUEUED, Conn
from rl_otel._internal.exporters.http1 import ResponseHeads

_log = logging.getLogger("rl_otel")

WsgiApp = Callable[[dict, Callable], Iterable[bytes]]


class AppWorker:
    """Runs ``app`` on requests the loop submits; ``wake()`` tells the loop an answer is ready (:meth:`finish`)
    after each (it costs nothing while a wake-up is pending)."""

    def __init__(self, app: WsgiApp, admission: Admission, on_event: Callable[[str], None],
                 wake: Callable[[], None]) -> None:
        self._app = app
        self._admission = admission
        self._governor = admission.governor
        self._on_event = on_event
        self._wake = wake
        self._ready: collections.deque[tuple[Conn, dict]] = collections.deque()  # fresh requests
        self._pipelined: collections.deque[tuple[Conn, dict]] = collections.deque()  # answered when none is fresh
        self._done: collections.deque[tuple[Conn, list[bytes]]] = collections.deque()
        self._jobs: queue.SimpleQueue[tuple[Conn, dict] | None] = queue.SimpleQueue()
        self._busy = False
        self._failure_logged = -float("inf")  # when a failed request's traceback was last logged
        self._heads = ResponseHeads()  # the worker's
        self._thread = threading.Thread(target=self._work, name="rl_otel-scrape-app", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """The thread ends after the request it runs (if any)."""
        self._jobs.put(None)

    def submit(self, conn: Conn, environ: dict) -> None:
        """Queue a parsed request (the loop's thread): a pipelined one waits for the fresh ones."""
        (self._pipelined if conn.pipelined else self._ready).append((conn, environ))

    def dispatch(self) -> None:
        """Hand the next queued request to the thread, unless it runs one (the loop's thread)."""
        while not self._busy and (self._ready or self._pipelined):
            conn, environ = (self._ready or self._pipelined).popleft()
            if conn.state != QUEUED:  # dropped meanwhile
                continue
            conn.state = BUSY
            self._busy = True
            self._jobs.put((conn, environ))

    def finish(self, respond: Callable[[Conn, list[bytes]], None]) -> None:
        """``respond(conn, parts)`` for each answer ready, unless its connection was dropped (the loop's thread)."""
        while self._done:
            conn, parts = self._done.popleft()
            self._busy = False
            if conn.state == BUSY:
                respond(conn, parts)

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            conn, environ = job
            cputime.begin()
            cpu = cputime.own_cpu_s()
            auth_cpu = 0.0
            try:
                parts, auth_cpu = self._call(environ, conn.keep_alive)
            except Exception:  # boundary: the application (the render, registered prometheus_client collectors)
                now = time.monotonic()
                if now - self._failure_logged >= 60.0:  # a client repeating the request must not flood stderr
                    self._failure_logged = now
                    _log.exception("rl_otel: the scrape endpoint failed to answer a request (a traceback a "
                                   "minute at most; each failure is counted)")
                self._on_event("internal")
                conn.keep_alive = False
                parts = [self._heads.head("500 Internal Server Error", [], 0, False)]
            # bcrypt has a budget of its own (webconfig.UNCACHED_CHECKS_PER_S): charged here, one check would
            # pause the endpoint for its 65 ms / cpu_share = 1.3 s
            self._governor.charge(cputime.own_cpu_s() - cpu - auth_cpu)
            cputime.end()
            self._done.append((conn, parts))
            self._wake()

    def _call(self, environ: dict, keep_alive: bool) -> tuple[list[bytes], float]:
        """The answer to one request, and the thread time its credentials check took."""
        extra = self._admission.headers
        refusal, auth_cpu = self._admission.authorize(environ)
        if refusal is not None:
            return [self._heads.head(refusal.status, [*refusal.headers, *extra], len(refusal.body), keep_alive),
                    refusal.body], auth_cpu
        captured: list = []

        def start_response(status: str, headers: list, exc_info: Any = None) -> Callable:
            captured[:] = [status, headers]
            return lambda data: None  # the legacy write() callable: the apps served here never call it

        result = self._app(environ, start_response)
        try:
            parts = [bytes(p) for p in result]
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()
        status, headers = captured
        length = sum(len(p) for p in parts)
        if environ["REQUEST_METHOD"] == "HEAD":
            parts = []
        return [self._heads.head(status, [*headers, *extra], length, keep_alive), *parts], auth_cpu
