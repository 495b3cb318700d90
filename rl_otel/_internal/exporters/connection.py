"""The scrape endpoint's connections and what its event loop does on each one's socket (:mod:`.server` runs the
loop): the TLS handshake, reading a request head (``max_header_bytes`` at most), handing the parsed request to the
application, sending the answer, and after it reading the next request, closing, or holding a refused connection
unread until its header deadline (a lingering close). All non-blocking, on the loop's thread only."""

from __future__ import annotations

import collections
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable
from typing import Any

from rl_otel._internal.exporters.admission import DONE, REFUSED, WANT_READ, Admission
from rl_otel._internal.exporters.http1 import REASONS, ResponseHeads, parse_head

HANDSHAKE, READ, QUEUED, BUSY, WRITE, LINGER = range(6)
_SEND_CHUNK = 256 * 1024


class Conn:
    """One client connection: its socket, state, deadline, the bytes of a request head read so far and the answer
    not yet sent."""

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


class Connections:
    """The open connections, oldest activity first (:attr:`open`), each driven through its states on the loop's
    thread. A parsed request goes to ``on_request(conn, environ)``; the loop sees a closed connection's room in
    :attr:`open`; ``stop`` set: an answer sent closes its connection."""

    def __init__(self, sel: selectors.BaseSelector, admission: Admission, port: int, stop: threading.Event,
                 on_event: Callable[[str], None], on_request: Callable[[Conn, dict], None]) -> None:
        self.open: collections.OrderedDict[Conn, None] = collections.OrderedDict()
        self._sel = sel
        self._admission = admission
        self._limits = admission.limits
        self._port = port
        self._stop = stop
        self._on_event = on_event
        self._on_request = on_request
        self._heads = ResponseHeads()  # the refusals' (one per thread that answers)

    def add(self, sock: socket.socket, addr: Any, tls: bool, deadline: float) -> None:
        """A connection just accepted: its handshake or its request is read at once (with ``TCP_DEFER_ACCEPT`` it is
        usually here already: no round of select)."""
        conn = Conn(sock, addr, HANDSHAKE if tls else READ, deadline)
        self.open[conn] = None
        if conn.state == HANDSHAKE:
            self.handshake(conn)
        else:
            self.read(conn)

    def expire(self, now: float) -> float | None:
        """Close connections past their deadline; the next deadline (None: none)."""
        soonest = None
        for conn in list(self.open):
            deadline = conn.deadline
            if deadline is None:
                continue
            if deadline <= now:
                if conn.state == LINGER:  # refused and counted already
                    pass
                elif conn.state != READ or conn.head or not conn.served:  # a keep-alive one going idle is normal
                    self._on_event("client_timeout")
                self.drop(conn)
            elif soonest is None or deadline < soonest:
                soonest = deadline
        return soonest

    def flush(self) -> None:
        """Send what is computed (while the loop is paused), dropping the connections whose readers stalled."""
        now = time.monotonic()
        for conn in [c for c in self.open if c.state == WRITE and c.out]:
            if conn.deadline is not None and conn.deadline <= now:  # its reader stalled: dropped even now
                self._on_event("client_timeout")
                self.drop(conn)
            else:
                self.write(conn)

    def want(self, conn: Conn, events: int) -> None:
        if conn.events == events:
            return
        if conn.events == 0:
            self._sel.register(conn.sock, events, conn)
        elif events == 0:
            self._sel.unregister(conn.sock)
        else:
            self._sel.modify(conn.sock, events, conn)
        conn.events = events

    def drop(self, conn: Conn, unregister: bool = True) -> None:
        if conn not in self.open:  # dropped already
            return
        del self.open[conn]
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

    def handshake(self, conn: Conn) -> None:
        step = self._admission.handshake(conn.sock, conn.addr)
        if step == REFUSED:
            self.drop(conn)
        elif step != DONE:
            self.want(conn, selectors.EVENT_READ if step == WANT_READ else selectors.EVENT_WRITE)
        else:
            conn.state = READ
            self.read(conn)

    def read(self, conn: Conn) -> None:
        limits = self._limits
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
                self.want(conn, selectors.EVENT_READ)
                return
            except ssl.SSLWantWriteError:
                self.want(conn, selectors.EVENT_WRITE)
                return
            except OSError:
                self.drop(conn)
                return
            if not data:
                self.drop(conn)
                return
            if not conn.head:
                conn.head = True
                conn.deadline = time.monotonic() + limits.header_timeout_s
            buf += data

    def _request(self, conn: Conn, end: int) -> None:
        head = bytes(conn.buf[:end])
        del conn.buf[:end + 4]
        parsed = parse_head(head, self._limits.max_headers, self._port, conn.addr, self._admission.scheme)
        if isinstance(parsed, int):
            self._refuse(conn, parsed)
            return
        environ, conn.keep_alive = parsed
        conn.head = bool(conn.buf)
        conn.pipelined = conn.pipelined or conn.head  # the next request came with it: not Prometheus' way
        conn.state = QUEUED
        conn.deadline = None
        self.want(conn, 0)  # one request at a time: nothing more is read until it is answered
        self.open.move_to_end(conn)
        self._on_request(conn, environ)

    def _refuse(self, conn: Conn, status: int) -> None:
        """Answer a request the server refuses by itself, then hold the connection (:meth:`_hold`)."""
        self._on_event("bad_request")
        conn.keep_alive = False
        conn.linger = True
        body = f"{status} {REASONS[status]}\n".encode()
        head = self._heads.head(f"{status} {REASONS[status]}", [("Content-Type", "text/plain")], len(body), False)
        self.respond(conn, [head + body])

    def _hold(self, conn: Conn) -> None:
        """Keep a refused connection, unread, until its header deadline (a lingering close). Closing at once would
        have a client that streams a huge or malformed head reconnect and start over as fast as it can; held, it
        waits (its unread bytes stay in a kernel buffer of 64 kB at most). The answer is sent and, on plain TCP,
        followed by a FIN. The oldest held connection makes room for a newcomer first."""
        self.want(conn, 0)
        conn.state = LINGER
        conn.buf = bytearray()
        conn.deadline = time.monotonic() + self._limits.header_timeout_s
        if not isinstance(conn.sock, ssl.SSLSocket):
            try:
                conn.sock.shutdown(socket.SHUT_WR)
            except OSError:
                self.drop(conn)

    def respond(self, conn: Conn, parts: list[bytes]) -> None:
        """Send an answer: its parts in one send when small, as they are (never copied) when large."""
        if len(parts) > 1 and sum(len(p) for p in parts) <= _SEND_CHUNK:
            parts = [b"".join(parts)]  # one send; a large cached body is sent as it is, never copied
        conn.out.extend(memoryview(p) for p in parts if p)
        conn.state = WRITE
        conn.deadline = time.monotonic() + self._limits.write_timeout_s
        self.write(conn)

    def write(self, conn: Conn) -> None:
        out = conn.out
        while out:
            data = out[0]
            chunk = data[:_SEND_CHUNK]  # the same slice again after a TLS want-write, as OpenSSL requires
            try:
                sent = conn.sock.send(chunk)
            except (BlockingIOError, InterruptedError, ssl.SSLWantWriteError):
                self.want(conn, selectors.EVENT_WRITE)
                return
            except ssl.SSLWantReadError:
                self.want(conn, selectors.EVENT_READ)
                return
            except OSError:
                self.drop(conn)
                return
            conn.deadline = time.monotonic() + self._limits.write_timeout_s
            if sent >= len(data):
                out.popleft()
            else:
                out[0] = data[sent:]
        if conn.linger and not self._stop.is_set():
            self._hold(conn)
            return
        if not conn.keep_alive or self._stop.is_set():
            self.drop(conn)
            return
        conn.served += 1
        conn.state = READ
        conn.deadline = time.monotonic() + (self._limits.header_timeout_s if conn.head
                                            else self._limits.idle_timeout_s)
        self.open.move_to_end(conn)
        conn.pipelined = True  # what is read now was sent before this answer was taken
        self.read(conn)  # a pipelined request, or bytes TLS has already decrypted, may be waiting
        if conn.state == READ:
            conn.pipelined = bool(conn.buf)  # the rest of a head begun before: still pipelined
