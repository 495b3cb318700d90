"""The HTTP(S) server under the scrape endpoint: binding (with an optional search for a free port), TLS, mTLS,
basic auth and response headers from a :class:`~rl_otel._internal.exporters.webconfig.WebConfig`.

prometheus_client's ``start_http_server`` wraps the listening socket, so every TLS handshake runs on the accept
thread: one client that connects and sends nothing stalls every scrape. Here the handshake runs on the
connection's own thread, under a timeout, and a client that fails it (no certificate, wrong CA, SAN not allowed)
is dropped without touching the others.
"""

from __future__ import annotations

import errno
import logging
import socket
import ssl
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from rl_otel._internal.exporters.webconfig import WebConfig
from rl_otel.errors import PortInUseError

_log = logging.getLogger("rl_otel")

HANDSHAKE_TIMEOUT_S = 10.0
IDLE_TIMEOUT_S = 60.0  # a keep-alive connection idle this long frees its thread

WsgiApp = Callable[[dict, Callable], Iterable[bytes]]


class _QuietHandler(WSGIRequestHandler):
    timeout = IDLE_TIMEOUT_S

    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes arrive every few seconds: no access log."""


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    tls: ssl.SSLContext | None = None
    web: WebConfig | None = None

    def finish_request(self, request: socket.socket, client_address: Any) -> None:
        if self.tls is None:
            super().finish_request(request, client_address)
            return
        request.settimeout(HANDSHAKE_TIMEOUT_S)
        try:
            conn = self.tls.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError) as exc:  # no client certificate, untrusted one, wrong protocol, timeout
            _log.debug("rl_otel: TLS handshake with %s failed: %s", client_address, exc)
            return
        try:
            if self.web is not None and not self.web.san_allowed(conn.getpeercert()):
                _log.debug("rl_otel: client %s has no allowed SAN", client_address)
                return
            super().finish_request(conn, client_address)
        finally:
            self.shutdown_request(conn)


def _secured(app: WsgiApp, web: WebConfig) -> WsgiApp:
    """``app`` behind the web config's basic auth, adding its response headers."""
    extra = list(web.headers)

    def secured(environ: dict, start_response: Callable) -> Iterable[bytes]:
        if web.auth is not None and not web.auth.authorized(environ.get("HTTP_AUTHORIZATION")):
            start_response("401 Unauthorized", [("WWW-Authenticate", 'Basic realm="rl_otel"'),
                                                ("Content-Type", "text/plain; charset=utf-8"), *extra])
            return [b"Unauthorized\n"]

        def start(status: str, headers: list, exc_info: Any = None) -> Any:
            return start_response(status, [*headers, *extra], exc_info)

        return app(environ, start)

    return secured


def _bind(app: WsgiApp, host: str, port: int, server_class: type[_Server]) -> _Server:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, _, _, sockaddr = infos[0]

    class FamilyServer(server_class):  # type: ignore[misc, valid-type]
        address_family = family

    return make_server(sockaddr[0], port, app, FamilyServer, handler_class=_QuietHandler)


def serve(app: WsgiApp, host: str, port: int, *, web: WebConfig | None = None,
          port_search: int = 0) -> tuple[WSGIServer, threading.Thread]:
    """Serve ``app`` on ``host:port`` from a daemon thread. When the port is taken, try the next ``port_search``
    ports in turn (ranks of one host started with the same base port land on distinct ports); raise
    :class:`PortInUseError` naming the range when none is free."""
    server_class = type("Server", (_Server,), {"tls": web.tls if web else None, "web": web})
    if web is not None and (web.auth is not None or web.headers):
        app = _secured(app, web)
    last = port + port_search if port else 0
    for candidate in range(port, last + 1):
        try:
            server = _bind(app, host, candidate, server_class)
            break
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise PortInUseError(f"cannot serve metrics on {host!r}:{candidate}: {exc}") from exc
    else:
        tried = f"ports {port}..{last} are all" if port_search else f"port {port} is"
        raise PortInUseError(f"prometheus {tried} already in use on {host!r}; pass prometheus={{'port': 0}} for a free "
                             "port, another port, or 'port_search': N to try the next N ports")
    thread = threading.Thread(target=server.serve_forever, name="rl_otel-scrape", daemon=True)
    thread.start()
    return server, thread
