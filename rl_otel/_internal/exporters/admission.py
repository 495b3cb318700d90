"""What the scrape endpoint lets in and what it may spend: the policy under the transport of ``server.py``.

The endpoint binds ``0.0.0.0`` by default, so anyone who reaches the node reaches it, and it runs inside the
training process, where every CPU second and every moment it holds the GIL is taken from training. The transport
(:mod:`rl_otel._internal.exporters.server`) moves bytes; this module decides:

- **limits** (:class:`Limits`): connections, request heads (bytes, lines, time), idle keep-alive, a response that
  makes no progress, the listen backlog;
- **a CPU budget** (:class:`Governor`): the server's two threads may use ``cpu_share`` of one core on average
  (bursts of ``cpu_burst_s``); past it the loop pauses and the kernel queues what arrives. Hostile clients then
  slow each other and the scrapers, never training. bcrypt checks of credentials not seen before have a budget of
  their own (``webconfig.UNCACHED_CHECKS_PER_S``: they hold the GIL ~65 ms each), past which the answer is 429;
- **eviction** (:meth:`Admission.victim`): when the connections are at their limit, which one is closed for a
  newcomer, so held-open sockets cannot lock scrapers out: first one already refused, then the oldest that does
  not read its answers (it pipelined its request before taking the previous answer, or its answer sits in a full
  socket buffer), then the oldest not being answered (idle keep-alive, handshaking, or still sending its head); a
  fresh request (the first of a connection, or one sent after the previous answer was taken: Prometheus' way) is
  never closed for a newcomer;
- **TLS** (:meth:`Admission.wrap`, :meth:`Admission.handshake`): the handshake and the client certificate's SAN;
- **basic auth** (:meth:`Admission.authorize`): 401, or 429 past the bcrypt budget;
- **the web-config file** (:meth:`Admission.check_web_config`): checked for changes every ``config_check_s`` and
  read again (a revoked password stops working, a renewed certificate is served); a file that no longer loads, or
  that would switch TLS on or off or weaken it (no basic auth, fewer clients verified, a lower TLS version, no SAN
  check: an empty or half-written file reads as a valid, weaker one) is refused, logged and counted, and the
  previous configuration kept.

What it refuses is counted through ``on_event(reason)``: ``auth_failed``, ``auth_throttled``, ``connection_limit``,
``tls_handshake``, ``tls_san``, ``web_config_reload`` (the transport counts ``bad_request``, ``client_timeout`` and
``internal``).
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from rl_otel._internal.exporters.cputime import own_cpu_s
from rl_otel.errors import ConfigurationError

if TYPE_CHECKING:  # loaded with a web-config file only (TLS, auth): a plain endpoint never imports it
    from rl_otel._internal.exporters.webconfig import WebConfig

_log = logging.getLogger("rl_otel")

# how a TLS handshake step ended (Admission.handshake)
DONE, WANT_READ, WANT_WRITE, REFUSED = range(4)


@dataclass(frozen=True)
class Limits:
    """What one endpoint may hold and spend (the defaults are the documented ones)."""

    max_connections: int = 64
    max_header_bytes: int = 16 * 1024  # request line and headers
    max_headers: int = 64
    header_timeout_s: float = 10.0  # from the connection (or a request's first byte) to the end of its head
    idle_timeout_s: float = 60.0  # a keep-alive connection between requests
    write_timeout_s: float = 10.0  # a response making no progress
    cpu_share: float = 0.04  # of one core, on average, for both threads
    cpu_burst_s: float = 0.1
    backlog: int = 1024  # capped by the kernel's somaxconn
    config_check_s: float = 1.0


class Governor:
    """A token bucket of CPU seconds: refilled at ``share`` per wall second, holding at most ``burst``. The
    threads charge what they used (``cputime.own_cpu_s``: their thread time less the process's older-generation
    garbage collections that ran on them); :meth:`pause_s` says how long to wait before spending
    more: in debt, until ``quantum`` is available again (one pause, then a batch of requests: pausing for each
    few microseconds of refill would spend the refill on waking up). Thread-safe."""

    def __init__(self, share: float, burst: float, quantum: float = 0.002) -> None:
        self._share, self._burst, self._quantum = share, burst, min(quantum, burst)
        self._tokens = burst
        self._at = time.monotonic()
        self._lock = threading.Lock()
        self.paused_s = 0.0  # total time the loop waited for the budget (reported by the attack benchmark)

    def charge(self, cpu_s: float) -> None:
        with self._lock:
            self._tokens -= cpu_s

    def pause_s(self) -> float:
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self._burst, self._tokens + (now - self._at) * self._share)
            self._at = now
            return 0.0 if self._tokens >= 0 else (self._quantum - self._tokens) / self._share


class Standing(Protocol):
    """What eviction knows of a connection (the transport's connection object)."""

    @property
    def held(self) -> bool:
        """Refused, answered, held unread until its deadline."""

    @property
    def unread(self) -> bool:
        """It does not read its answers (it pipelined, or its answer fills the socket buffer)."""

    @property
    def answering(self) -> bool:
        """A fresh request of it is queued, being answered or being written."""


class Refusal(NamedTuple):
    """An answer the policy gives instead of the application's: status line, headers, body."""

    status: str
    headers: list[tuple[str, str]]
    body: bytes


class Admission:
    """The policy of one endpoint (see the module). ``web``: the TLS / basic auth configuration (``None``: plain
    HTTP, no auth). Its methods run on the server's threads; ``authorize`` on the application worker, the others
    on the event loop."""

    def __init__(self, web: WebConfig | None, limits: Limits | None = None,
                 on_event: Callable[[str], None] | None = None) -> None:
        self.web = web
        self.limits = limits = limits or Limits()
        self.governor = Governor(limits.cpu_share, limits.cpu_burst_s)
        self._on_event = on_event or (lambda reason: None)
        self._web_stamp = web.stamp() if web is not None else ()
        self._web_checked = time.monotonic()

    @property
    def scheme(self) -> str:
        return self.web.scheme if self.web is not None else "http"

    @property
    def headers(self) -> list[tuple[str, str]]:
        """The headers every answer carries (the web-config file's ``http_server_config.headers``)."""
        return list(self.web.headers) if self.web is not None else []

    # ---- connections

    def victim(self, conns: Iterable[Standing]) -> Standing | None:
        """The connection to close for a newcomer, or ``None`` (none may be closed): the oldest of the lowest
        rank, ``conns`` oldest activity first (see the module)."""
        found, found_rank = None, 3
        for conn in conns:
            rank = 0 if conn.held else 1 if conn.unread else 3 if conn.answering else 2
            if rank < found_rank:
                found, found_rank = conn, rank
                if rank == 0:
                    break
        return found

    def wrap(self, sock: socket.socket) -> tuple[socket.socket, bool] | None:
        """``(socket, tls)`` for an accepted socket: wrapped for TLS (its handshake not yet done) when the endpoint
        serves TLS; ``None`` when it cannot be (closed)."""
        web = self.web
        if web is None or web.tls is None:
            return sock, False
        try:
            return web.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), True
        except (ssl.SSLError, OSError):
            sock.close()
            return None

    def handshake(self, sock: Any, addr: Any) -> int:
        """One step of a TLS handshake: :data:`DONE`, :data:`WANT_READ`, :data:`WANT_WRITE` or :data:`REFUSED`
        (counted: no client certificate, an untrusted one, the wrong protocol, a reset, a SAN not allowed)."""
        try:
            sock.do_handshake()
        except ssl.SSLWantReadError:
            return WANT_READ
        except ssl.SSLWantWriteError:
            return WANT_WRITE
        except (ssl.SSLError, OSError) as exc:
            _log.debug("rl_otel: TLS handshake with %s failed: %s", addr, exc)
            self._on_event("tls_handshake")
            return REFUSED
        web = self.web
        if web is not None and not web.san_allowed(sock.getpeercert()):
            _log.debug("rl_otel: client %s has no allowed SAN", addr)
            self._on_event("tls_san")
            return REFUSED
        return DONE

    # ---- requests

    def authorize(self, environ: dict) -> tuple[Refusal | None, float]:
        """Basic auth of a request: ``(None, cpu)`` when it may be served, else the 401 or 429 answer; ``cpu``: the
        thread time its credentials check took (bcrypt has a budget of its own: the caller does not charge it to
        the governor)."""
        web = self.web
        if web is None or web.auth is None:
            return None, 0.0
        from rl_otel._internal.exporters.webconfig import Verdict  # loaded: web came from it

        cpu = own_cpu_s()
        verdict = web.auth.verdict(environ.get("HTTP_AUTHORIZATION"))
        cpu = own_cpu_s() - cpu
        if verdict is Verdict.OK:
            return None, cpu
        if verdict is Verdict.THROTTLED:
            self._on_event("auth_throttled")
            return Refusal("429 Too Many Requests", [("Retry-After", "1")],
                           b"Too many attempts with new credentials; retry later\n"), cpu
        if verdict is Verdict.DENIED:
            self._on_event("auth_failed")
        return Refusal("401 Unauthorized", [("WWW-Authenticate", 'Basic realm="rl_otel"'),
                                            ("Content-Type", "text/plain; charset=utf-8")], b"Unauthorized\n"), cpu

    # ---- the web-config file

    def next_check(self) -> float | None:
        """When the web-config file is next checked (monotonic time; ``None`` without one)."""
        return None if self.web is None else self._web_checked + self.limits.config_check_s

    def check_web_config(self) -> None:
        """Read the web-config file again if it changed; keep the previous one if the new one does not load or
        would switch TLS on or off or weaken security (counted ``web_config_reload``)."""
        self._web_checked = time.monotonic()
        web = self.web
        assert web is not None
        stamp = web.stamp()
        if stamp == self._web_stamp:
            return
        self._web_stamp = stamp  # a file that fails to load is tried again when it changes again
        from rl_otel._internal.exporters.webconfig import load_web_config, weakenings

        try:
            new = load_web_config(web.path)
            if new.scheme != web.scheme:
                raise ConfigurationError(f"it would switch the endpoint from {web.scheme} to {new.scheme}; "
                                         "restart the process for that")
            weaker = weakenings(web, new)
            if weaker:
                raise ConfigurationError(f"it would weaken security ({'; '.join(weaker)}); restart the process "
                                         "for that")
        except ConfigurationError as exc:
            _log.warning("rl_otel: web config %r changed but is not used (the previous one still is): %s",
                         web.path, exc)
            self._on_event("web_config_reload")
            return
        if new.auth is not None and web.auth is not None:
            new.auth.adopt(web.auth)
        self.web = new
        self._web_stamp = new.stamp()
        _log.info("rl_otel: web config %r read again", web.path)
