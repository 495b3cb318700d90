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
"""

from __future__ import annotations

import collections
import errno
import logging
import os
import queue
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from rl_otel._internal.exporters import cputime
from rl_otel._internal.exporters.admission import DONE, REFUSED, WANT_READ, Admission, Limits
from rl_otel._internal.exporters.http1 import REASONS, ResponseHeads, parse_head
from rl_otel.errors import PortInUseError

if TYPE_CHECKING:  # loaded with a web-config file only (TLS, auth): a plain endpoint never imports it
    from rl_otel._internal.exporters.webconfig import WebConfig

_log = logging.getLogger("rl_otel")

WsgiApp = Callable[[dict, Callable], Iterable[bytes]]


HANDSHAKE, READ, QUEUED, BUSY, WRITE, LINGER = range(6)
_SEND_CHUNK = 256 * 1024
_ACCEPT_BATCH = 16
class _Conn:
    __slots__ = ("addr", "buf", "deadline", "events", "head", "keep_alive", "linger", "out", "pipelined", "served",
                 "sock", "state")

    def __init__(self, sock: socket.socket, addr: Any, state: int, deadline: float) -> None:
        self.sock = sock
        self.addr = addr
        self.state = state
        self.buf = bytearray()
        self.out: collections.deque[memoryview] = collections.deque()
        self.deadline: float | None = deadline
        self.keep_alive = True
        self.events = 0
        self.served = 0
        self.head = False  # bytes of a request head are buffered (the header timeout runs, not the idle one)
        self.linger = False  # refused: after the answer, held unread until its deadline instead of closed
        self.pipelined = False  # its request was sent before the previous answer was taken (it does not read)

    # what eviction knows of it (admission.Standing)
    @property
    def held(self) -> bool:
        return self.state == LINGER

    @property
    def unread(self) -> bool:
        return self.state != BUSY and (self.pipelined or (self.state == WRITE and self.events == selectors.EVENT_WRITE))

    @property
    def answering(self) -> bool:
        return self.state not in (HANDSHAKE, READ)


class Server:
    """Serves ``app`` (WSGI, one request at a time) on the listening socket ``listener``; see the module."""

    def __init__(self, app: WsgiApp, listener: socket.socket, admission: Admission,
                 on_event: Callable[[str], None] | None = None) -> None:
        self._app = app
        self._listener = listener
        self.admission = admission
        self._on_event = on_event or (lambda reason: None)
        self.limits = admission.limits
        self.governor = admission.governor
        self.server_port: int = listener.getsockname()[1]
        self._conns: collections.OrderedDict[_Conn, None] = collections.OrderedDict()  # oldest activity first
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._ready: collections.deque[tuple[_Conn, dict]] = collections.deque()  # fresh requests
        self._pipelined: collections.deque[tuple[_Conn, dict]] = collections.deque()  # answered when none is fresh
        self._done: collections.deque[tuple[_Conn, list[bytes]]] = collections.deque()
        self._jobs: queue.SimpleQueue[tuple[_Conn, dict] | None] = queue.SimpleQueue()
        self._busy = False
        self._failure_logged = -float("inf")  # the worker's: when a failed request's traceback was last logged
        self._woken = False  # a wake-up byte is in the socket pair, not read yet
        self._accepting = False
        self._accept_at = 0.0  # when accepting may resume after EMFILE
        self._stop = threading.Event()
        self._closed = False
        self._pid = os.getpid()
        self._heads = ResponseHeads()  # the worker's
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._resume_accept()
        self._loop_thread = threading.Thread(target=self._run, name="rl_otel-scrape", daemon=True)
        self._worker = threading.Thread(target=self._work, name="rl_otel-scrape-app", daemon=True)

    def start(self) -> None:
        self._worker.start()
        self._loop_thread.start()

    @property
    def connections(self) -> int:
        return len(self._conns)

    @property
    def sending(self) -> bool:
        """Whether an answer is being computed or is not all handed to the kernel yet (close() would cut it)."""
        return any(c.state == BUSY or (c.state == WRITE and c.out) for c in list(self._conns))

    # ---- lifecycle

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop serving and close every socket; returns within a few milliseconds (``timeout_s`` at most)."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._jobs.put(None)
        if os.getpid() == self._pid and self._loop_thread.is_alive():
            self._wake()
            self._loop_thread.join(timeout_s)
            if not self._loop_thread.is_alive():
                return
        self._close_all()  # a forked child (no loop thread runs here) or a loop that did not stop in time

    def _close_all(self) -> None:
        for conn in list(self._conns):
            self._drop(conn, unregister=False)
        for sock in (self._listener, self._wake_r, self._wake_w):
            try:
                sock.close()
            except OSError:
                pass
        try:
            self._sel.close()
        except (OSError, ValueError):
            pass

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except (BlockingIOError, OSError):  # full: the loop is awake already; closed: it is gone
            pass

    # ---- the loop

    def _run(self) -> None:
        try:
            self._loop()
        except Exception:  # a bug here must not take the process down; the endpoint stops serving
            _log.exception("rl_otel: the scrape endpoint's loop failed; the endpoint stops serving")
            self._on_event("internal")
        finally:
            cputime.end()
            self._close_all()

    def _loop(self) -> None:
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
            self._finish_done()
            self._dispatch()
            if not self._accepting and not self._accept_at and not self._closed:
                self._accept_if_room()
            timeout = self._expire(time.monotonic())
            cputime.end()  # no gc callback while the endpoint waits for its next scrape
            events = self._sel.select(timeout)
            cputime.begin()
            for key, _events in events:
                conn = key.data
                if conn is None:
                    self._drain_wake()
                elif conn is self:
                    self._accept()
                elif conn.state == HANDSHAKE:
                    self._handshake(conn)
                elif conn.state == READ:
                    self._read(conn)
                elif conn.state == WRITE:
                    self._write(conn)
            check_at = self.admission.next_check()
            if check_at is not None and time.monotonic() >= check_at:
                self.admission.check_web_config()

    def _deliver_until(self, end: float) -> None:
        """While paused: no accepting, reading or dispatching, but responses already computed are sent (a scrape
        that put the budget in debt is not held back by it)."""
        while not self._stop.is_set():
            self._finish_done()
            now = time.monotonic()
            for conn in [c for c in self._conns if c.state == WRITE and c.out]:
                if conn.deadline is not None and conn.deadline <= now:  # its reader stalled: dropped even now
                    self._on_event("client_timeout")
                    self._drop(conn)
                else:
                    self._write(conn)
            remaining = end - time.monotonic()
            if remaining <= 0:
                return
            self._stop.wait(min(remaining, 0.01))

    def _drain_wake(self) -> None:
        try:
            self._wake_r.recv(4096)
        except (BlockingIOError, OSError):
            pass
        # after reading: a result the worker added meanwhile without a byte of its own (it saw one pending) is
        # taken by _finish_done, which runs before the loop waits again; before reading, a byte sent between the
        # two would be read with this one and its result left waiting
        self._woken = False

    def _expire(self, now: float) -> float | None:
        """Close connections past their deadline; the time until the next deadline (None: none)."""
        soonest = None
        for conn in list(self._conns):
            deadline = conn.deadline
            if deadline is None:
                continue
            if deadline <= now:
                if conn.state == LINGER:  # refused and counted already
                    pass
                elif conn.state != READ or conn.head or not conn.served:  # a keep-alive one going idle is normal
                    self._on_event("client_timeout")
                self._drop(conn)
            elif soonest is None or deadline < soonest:
                soonest = deadline
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
        if len(self._conns) < self.limits.max_connections or self.admission.victim(self._conns) is not None:
            self._resume_accept()

    def _accept(self) -> None:
        limits = self.limits
        for _ in range(_ACCEPT_BATCH):
            full = len(self._conns) >= limits.max_connections
            victim = self.admission.victim(self._conns) if full else None  # oldest activity first
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
                self._drop(victim)  # type: ignore[arg-type]  # one of self._conns
            sock.setblocking(False)
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            deadline = time.monotonic() + limits.header_timeout_s
            wrapped = self.admission.wrap(sock)
            if wrapped is None:
                continue
            sock, tls = wrapped
            conn = _Conn(sock, addr, HANDSHAKE if tls else READ, deadline)
            self._conns[conn] = None
            # with TCP_DEFER_ACCEPT the request (or the TLS hello) is usually here already: no round of select
            if conn.state == HANDSHAKE:
                self._handshake(conn)
            else:
                self._read(conn)

    # ---- per connection

    def _want(self, conn: _Conn, events: int) -> None:
        if conn.events == events:
            return
        if conn.events == 0:
            self._sel.register(conn.sock, events, conn)
        elif events == 0:
            self._sel.unregister(conn.sock)
        else:
            self._sel.modify(conn.sock, events, conn)
        conn.events = events

    def _drop(self, conn: _Conn, unregister: bool = True) -> None:
        if conn not in self._conns:  # dropped already
            return
        del self._conns[conn]
        if unregister and conn.events:
            try:
                self._sel.unregister(conn.sock)
            except (KeyError, ValueError, OSError):
                pass
        conn.events = 0
        conn.state = -1
        conn.out.clear()
        try:
            conn.sock.close()
        except OSError:
            pass
        if not self._accepting and not self._accept_at and not self._closed and not self._stop.is_set():
            self._resume_accept()

    def _handshake(self, conn: _Conn) -> None:
        step = self.admission.handshake(conn.sock, conn.addr)
        if step == REFUSED:
            self._drop(conn)
        elif step != DONE:
            self._want(conn, selectors.EVENT_READ if step == WANT_READ else selectors.EVENT_WRITE)
        else:
            conn.state = READ
            self._read(conn)

    def _read(self, conn: _Conn) -> None:
        limits = self.limits
        buf = conn.buf
        while True:
            end = buf.find(b"\r\n\r\n")
            if end >= 0:
                self._request(conn, end)
                return
            room = limits.max_header_bytes - len(buf)
            if room <= 0:
                self._refuse(conn, 431)
                return
            try:
                data = conn.sock.recv(room)
            except (BlockingIOError, InterruptedError, ssl.SSLWantReadError):
                self._want(conn, selectors.EVENT_READ)
                return
            except ssl.SSLWantWriteError:
                self._want(conn, selectors.EVENT_WRITE)
                return
            except OSError:
                self._drop(conn)
                return
            if not data:
                self._drop(conn)
                return
            if not conn.head:
                conn.head = True
                conn.deadline = time.monotonic() + limits.header_timeout_s
            buf += data

    def _request(self, conn: _Conn, end: int) -> None:
        head = bytes(conn.buf[:end])
        del conn.buf[:end + 4]
        parsed = parse_head(head, self.limits.max_headers, self.server_port, conn.addr, self.admission.scheme)
        if isinstance(parsed, int):
            self._refuse(conn, parsed)
            return
        environ, conn.keep_alive = parsed
        conn.head = bool(conn.buf)
        conn.pipelined = conn.pipelined or conn.head  # the next request came with it: not Prometheus' way
        conn.state = QUEUED
        conn.deadline = None
        self._want(conn, 0)  # one request at a time: nothing more is read until it is answered
        self._conns.move_to_end(conn)
        (self._pipelined if conn.pipelined else self._ready).append((conn, environ))

    def _refuse(self, conn: _Conn, status: int) -> None:
        """Answer a request the server refuses by itself, then hold the connection (:meth:`_hold`)."""
        self._on_event("bad_request")
        conn.keep_alive = False
        conn.linger = True
        body = f"{status} {REASONS[status]}\n".encode()
        head = self._heads.head(f"{status} {REASONS[status]}", [("Content-Type", "text/plain")], len(body), False)
        self._respond(conn, [head + body])

    def _hold(self, conn: _Conn) -> None:
        """Keep a refused connection, unread, until its header deadline (a lingering close). Closing at once would
        have a client that streams a huge or malformed head reconnect and start over as fast as it can; held, it
        waits (its unread bytes stay in a kernel buffer of 64 kB at most). The answer is sent and, on plain TCP,
        followed by a FIN. The oldest held connection makes room for a newcomer first."""
        self._want(conn, 0)
        conn.state = LINGER
        conn.buf = bytearray()
        conn.deadline = time.monotonic() + self.limits.header_timeout_s
        if not isinstance(conn.sock, ssl.SSLSocket):
            try:
                conn.sock.shutdown(socket.SHUT_WR)
            except OSError:
                self._drop(conn)

    def _respond(self, conn: _Conn, parts: list[bytes]) -> None:
        if len(parts) > 1 and sum(len(p) for p in parts) <= _SEND_CHUNK:
            parts = [b"".join(parts)]  # one send; a large cached body is sent as it is, never copied
        conn.out.extend(memoryview(p) for p in parts if p)
        conn.state = WRITE
        conn.deadline = time.monotonic() + self.limits.write_timeout_s
        self._write(conn)

    def _write(self, conn: _Conn) -> None:
        out = conn.out
        while out:
            data = out[0]
            chunk = data[:_SEND_CHUNK]  # the same slice again after a TLS want-write, as OpenSSL requires
            try:
                sent = conn.sock.send(chunk)
            except (BlockingIOError, InterruptedError, ssl.SSLWantWriteError):
                self._want(conn, selectors.EVENT_WRITE)
                return
            except ssl.SSLWantReadError:
                self._want(conn, selectors.EVENT_READ)
                return
            except OSError:
                self._drop(conn)
                return
            conn.deadline = time.monotonic() + self.limits.write_timeout_s
            if sent >= len(data):
                out.popleft()
            else:
                out[0] = data[sent:]
        if conn.linger and not self._stop.is_set():
            self._hold(conn)
            return
        if not conn.keep_alive or self._stop.is_set():
            self._drop(conn)
            return
        conn.served += 1
        conn.state = READ
        conn.deadline = time.monotonic() + (self.limits.header_timeout_s if conn.head
                                            else self.limits.idle_timeout_s)
        self._conns.move_to_end(conn)
        conn.pipelined = True  # what is read now was sent before this answer was taken
        self._read(conn)  # a pipelined request, or bytes TLS has already decrypted, may be waiting
        if conn.state == READ:
            conn.pipelined = bool(conn.buf)  # the rest of a head begun before: still pipelined

    # ---- the application

    def _dispatch(self) -> None:
        while not self._busy and (self._ready or self._pipelined):
            conn, environ = (self._ready or self._pipelined).popleft()
            if conn.state != QUEUED:  # dropped meanwhile
                continue
            conn.state = BUSY
            self._busy = True
            self._jobs.put((conn, environ))

    def _finish_done(self) -> None:
        while self._done:
            conn, parts = self._done.popleft()
            self._busy = False
            if conn.state == BUSY:
                self._respond(conn, parts)

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
            except Exception:
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
            self.governor.charge(cputime.own_cpu_s() - cpu - auth_cpu)
            cputime.end()
            self._done.append((conn, parts))
            if not self._woken:  # one byte in the socket pair wakes the loop; more would cost a syscall each
                self._woken = True
                self._wake()

    def _call(self, environ: dict, keep_alive: bool) -> tuple[list[bytes], float]:
        """The answer to one request, and the thread time its credentials check took."""
        extra = self.admission.headers
        refusal, auth_cpu = self.admission.authorize(environ)
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
    except BaseException:
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
