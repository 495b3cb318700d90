"""The HTTP/1.1 transport under the scrape endpoint: bounded in threads and memory whatever its clients do. What
it lets in and what it may spend is :mod:`rl_otel._internal.exporters.admission`'s to decide.

- two threads, whatever the number of clients: one event loop (``selectors``) accepts, runs TLS handshakes,
  reads request heads and writes responses, all non-blocking; one worker runs the application (basic auth and
  the rendering) for one request at a time, in arrival order (a connection has at most one request in flight);
  a fresh request is answered before every pipelined one;
- a request head is at most ``max_header_bytes`` in ``max_headers`` lines, sent within ``header_timeout_s``
  (TLS handshake included); a keep-alive connection idle ``idle_timeout_s`` is closed; a response that makes no
  progress for ``write_timeout_s`` is dropped. Request bodies are refused (413). A refused request is answered
  and its connection held unread until its header deadline (a lingering close), so that a client streaming
  megabytes of head waits instead of reconnecting at once; a silent connection does not even reach ``accept()``
  until it sends (``TCP_DEFER_ACCEPT``, Linux); the listen backlog holds a burst of parallel scrapers;
- over its CPU budget the loop pauses: nothing new starts, but responses already computed are still sent; the
  budget is charged the threads' own CPU time, not the process's garbage collections that happen to run on them
  (:mod:`rl_otel._internal.exporters.cputime`);
- ``close()`` wakes the loop through a socket pair: it returns in about a millisecond (socketserver polls every
  0.5 s). In a forked child, whose copies of these threads do not run, it only closes its copies of the sockets.

It counts through ``on_event(reason)`` (``rl_telemetry_errors_total{sink="prometheus",reason}``): ``bad_request``,
``client_timeout``, ``connection_limit``, ``internal``, and the policy's reasons.

This module holds the loop (accepting, deadlines, the CPU budget) and ``serve``; each connection's states are
:mod:`rl_otel._internal.exporters.connection`'s, the application thread :mod:`rl_otel._internal.exporters.appworker`.
"""

from __future__ import annotations

import errno
import logging
import os
import selectors
import socket
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from rl_otel._internal.exporters import cputime
from rl_otel._internal.exporters.admission import Admission, Limits
from rl_otel._internal.exporters.appworker import AppWorker, WsgiApp
from rl_otel._internal.exporters.connection import BUSY, HANDSHAKE, READ, WRITE, Connections
from rl_otel.errors import PortInUseError

if TYPE_CHECKING:  # loaded with a web-config file only (TLS, auth): a plain endpoint never imports it
    from rl_otel._internal.exporters.webconfig import WebConfig

_log = logging.getLogger("rl_otel")

_ACCEPT_BATCH = 16


class _Waker:
    """Wakes the loop out of ``select``: a byte in a socket pair whose read end the loop watches."""

    def __init__(self) -> None:
        self.reader, self._writer = socket.socketpair()
        self.reader.setblocking(False)
        self._writer.setblocking(False)
        self._pending = False  # a wake-up byte is in the socket pair, not read yet

    def wake(self) -> None:
        try:
            self._writer.send(b"\0")
        except (BlockingIOError, OSError):  # full: the loop is awake already; closed: it is gone
            pass

    def notify(self) -> None:
        """The worker's: one byte wakes the loop; more, while it is pending, would cost a syscall each."""
        if not self._pending:
            self._pending = True
            self.wake()

    def drain(self) -> None:
        try:
            self.reader.recv(4096)
        except (BlockingIOError, OSError):
            pass
        # after reading: a result the worker added meanwhile without a byte of its own (it saw one pending) is
        # taken by AppWorker.finish, which runs before the loop waits again; before reading, a byte sent between
        # the two would be read with this one and its result left waiting
        self._pending = False

    def close(self) -> None:
        for sock in (self.reader, self._writer):
            try:
                sock.close()
            except OSError:
                pass


class Server:
    """Serves ``app`` (WSGI, one request at a time) on the listening socket ``listener``; see the module. The loop
    accepts and keeps the budget; :class:`.connection.Connections` drives each connection, :class:`.appworker.
    AppWorker` runs the application."""

    def __init__(self, app: WsgiApp, listener: socket.socket, admission: Admission,
                 on_event: Callable[[str], None] | None = None) -> None:
        self._listener = listener
        self.admission = admission
        self._on_event = on_event or (lambda reason: None)
        self.limits = admission.limits
        self.governor = admission.governor
        self.server_port: int = listener.getsockname()[1]
        self._sel = selectors.DefaultSelector()
        self._waker = _Waker()
        self._stop = threading.Event()
        self._app = AppWorker(app, admission, self._on_event, self._waker.notify)
        self._conns = Connections(self._sel, admission, self.server_port, self._stop, self._on_event,
                                  self._app.submit)
        self._accepting = False
        self._accept_at = 0.0  # when accepting may resume after EMFILE
        self._closed = False
        self._pid = os.getpid()
        self._sel.register(self._waker.reader, selectors.EVENT_READ, None)
        self._resume_accept()
        self._loop_thread = threading.Thread(target=self._run, name="rl_otel-scrape", daemon=True)

    def start(self) -> None:
        self._app.start()
        self._loop_thread.start()

    @property
    def connections(self) -> int:
        return len(self._conns.open)

    @property
    def sending(self) -> bool:
        """Whether an answer is being computed or is not all handed to the kernel yet (close() would cut it)."""
        return any(c.state == BUSY or (c.state == WRITE and c.out) for c in list(self._conns.open))

    # ---- lifecycle

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop serving and close every socket; returns within a few milliseconds (``timeout_s`` at most)."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._app.stop()
        if os.getpid() == self._pid and self._loop_thread.is_alive():
            self._waker.wake()
            self._loop_thread.join(timeout_s)
            if not self._loop_thread.is_alive():
                return
        self._close_all()  # a forked child (no loop thread runs here) or a loop that did not stop in time

    def _close_all(self) -> None:
        for conn in list(self._conns.open):
            self._conns.drop(conn, unregister=False)
        try:
            self._listener.close()
        except OSError:
            pass
        self._waker.close()
        try:
            self._sel.close()
        except (OSError, ValueError):
            pass

    # ---- the loop

    def _run(self) -> None:
        try:
            self._loop()
        except Exception:  # boundary: the event loop's thread; a bug here must not take the process down
            _log.exception("rl_otel: the scrape endpoint's loop failed; the endpoint stops serving")
            self._on_event("internal")
        finally:
            cputime.end()
            self._close_all()

    def _loop(self) -> None:
        conns, app = self._conns, self._app
        cputime.begin()  # the process's older-generation garbage collections are not charged to the budget
        cpu = cputime.own_cpu_s()
        while not self._stop.is_set():
            now_cpu = cputime.own_cpu_s()
            self.governor.charge(now_cpu - cpu)
            cpu = now_cpu
            pause = self.governor.pause_s()
            if pause > 0:  # over budget: nothing new starts until it refills (the kernel queues what comes)
                self.governor.paused_s += pause
                self._deliver_until(time.monotonic() + pause)
                continue
            app.finish(conns.respond)
            app.dispatch()
            timeout = self._expire(time.monotonic())
            # a connection closed or answered since the last pass (by an event, an answer, a deadline) may make
            # room: accepting resumes before the loop waits (the connections never call back into the loop)
            if not self._accepting and not self._accept_at and not self._closed:
                self._accept_if_room()
            cputime.end()  # no gc callback while the endpoint waits for its next scrape
            events = self._sel.select(timeout)
            cputime.begin()
            for key, _events in events:
                conn = key.data
                if conn is None:
                    self._waker.drain()
                elif conn is self:
                    self._accept()
                elif conn.state == HANDSHAKE:
                    conns.handshake(conn)
                elif conn.state == READ:
                    conns.read(conn)
                elif conn.state == WRITE:
                    conns.write(conn)
            check_at = self.admission.next_check()
            if check_at is not None and time.monotonic() >= check_at:
                self.admission.check_web_config()

    def _deliver_until(self, end: float) -> None:
        """While paused: no accepting, reading or dispatching, but responses already computed are sent (a scrape
        that put the budget in debt is not held back by it)."""
        while not self._stop.is_set():
            self._app.finish(self._conns.respond)
            self._conns.flush()
            remaining = end - time.monotonic()
            if remaining <= 0:
                return
            self._stop.wait(min(remaining, 0.01))

    def _expire(self, now: float) -> float | None:
        """Close connections past their deadline; the time until the next deadline, the web-config file's next
        check or accepting's resumption (None: none)."""
        soonest = self._conns.expire(now)
        check_at = self.admission.next_check()  # the web-config file is checked even when nobody connects
        if check_at is not None:
            soonest = check_at if soonest is None else min(soonest, check_at)
        if not self._accepting and self._accept_at and not self._closed:
            soonest = self._accept_at if soonest is None else min(soonest, self._accept_at)
            if now >= self._accept_at:
                self._accept_at = 0.0
                self._resume_accept()
        return None if soonest is None else max(0.0, soonest - now)

    # ---- accepting

    def _resume_accept(self) -> None:
        if not self._accepting:
            self._sel.register(self._listener, selectors.EVENT_READ, self)
            self._accepting = True

    def _pause_accept(self) -> None:
        if self._accepting:
            self._sel.unregister(self._listener)
            self._accepting = False

    def _accept_if_room(self) -> None:
        """Accepting paused because every connection held a fresh request: it resumes once one may make room
        (answered and idle, not reading its answers, or held refused), not only when one closes: clients that
        never read nor hang up leave their answered connections open until the idle timeout (60 s)."""
        if len(self._conns.open) < self.limits.max_connections or self.admission.victim(self._conns.open) is not None:
            self._resume_accept()

    def _accept(self) -> None:
        limits, open_ = self.limits, self._conns.open
        for _ in range(_ACCEPT_BATCH):
            full = len(open_) >= limits.max_connections
            victim = self.admission.victim(open_) if full else None  # oldest activity first
            if full and victim is None:
                self._pause_accept()  # resumed when one closes; the backlog holds the rest meanwhile
                return
            try:
                sock, addr = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE, ENFILE, ENOBUFS: no descriptor now; try again in a moment
                _log.debug("rl_otel: accept failed: %s", exc)
                self._on_event("connection_limit")
                self._pause_accept()
                self._accept_at = time.monotonic() + 0.1
                return
            if victim is not None:  # room for the newcomer
                self._on_event("connection_limit")
                self._conns.drop(victim)  # type: ignore[arg-type]  # one of the open connections
            sock.setblocking(False)
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            deadline = time.monotonic() + limits.header_timeout_s
            wrapped = self.admission.wrap(sock)
            if wrapped is None:
                continue
            sock, tls = wrapped
            self._conns.add(sock, addr, tls, deadline)


def _listen(host: str, port: int, backlog: int, defer_s: float) -> socket.socket:
    # an ASCII name or address as bytes: a str goes through the idna codec, whose import (with stringprep) is ~1 ms
    # of init(); a non-ASCII name still does
    name: str | bytes | None = (host.encode("ascii") if host.isascii() else host) if host else None
    infos = socket.getaddrinfo(name, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, _, _, sockaddr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # A request head fits in 16 kB: a small receive buffer (inherited by accepted sockets) keeps a client
        # pushing megabytes from making the kernel copy them before the head is refused.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 * 1024)
        if hasattr(socket, "TCP_DEFER_ACCEPT"):  # Linux: a connection reaches accept() once its client sends
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT, max(1, int(defer_s)))
        sock.bind(sockaddr)
        sock.listen(backlog)  # the kernel caps it at net.core.somaxconn (4096 on Linux >= 5.4)
        sock.setblocking(False)
    except BaseException:  # a rollback, re-raised: the socket is closed on any failure of the OS's calls
        sock.close()
        raise
    return sock


def serve(app: WsgiApp, host: str, port: int, *, web: WebConfig | None = None, port_search: int = 0,
          on_event: Callable[[str], None] | None = None, limits: Limits | None = None) -> Server:
    """Serve ``app`` on ``host:port`` (see the module). When the port is taken, try the next ``port_search``
    ports in turn (ranks of one host started with the same base port land on distinct ports); raise
    :class:`PortInUseError` naming the range when none is free."""
    limits = limits or Limits()
    last = port + port_search if port else 0
    for candidate in range(port, last + 1):
        try:
            listener = _listen(host, candidate, limits.backlog, limits.header_timeout_s)
            break
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise PortInUseError(f"cannot serve metrics on {host!r}:{candidate}: {exc}") from exc
    else:
        tried = f"ports {port}..{last} are all" if port_search else f"port {port} is"
        raise PortInUseError(f"prometheus {tried} already in use on {host!r}; pass prometheus={{'port': 0}} for a free "
                             "port, another port, or 'port_search': N to try the next N ports")
    server = Server(app, listener, Admission(web, limits, on_event), on_event)
    server.start()
    return server
