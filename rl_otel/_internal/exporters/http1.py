"""HTTP/1.1 messages as the scrape endpoint reads and writes them: a request head parsed into a WSGI environ (or
the status that refuses it), and a response head. No I/O here: the transport (``server.py``) moves the bytes."""

from __future__ import annotations

import io
import sys
import time
from typing import Any
from urllib.parse import unquote

REASONS = {400: "Bad Request", 413: "Content Too Large", 429: "Too Many Requests", 431:
           "Request Header Fields Too Large", 500: "Internal Server Error", 501: "Not Implemented",
           505: "HTTP Version Not Supported"}
_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def parse_head(head: bytes, max_headers: int, port: int, addr: Any, scheme: str) -> tuple[dict, bool] | int:
    """``(WSGI environ, keep_alive)`` of a request head (without its final CRLF CRLF), or the status to refuse it
    with: 431 past ``max_headers`` lines, 400 for a malformed line (obs-fold, ``Name :``), 505 for another HTTP
    version, 413 for a request with a body (a scrape has none; reading one would be memory spent for nothing)."""
    lines = head.split(b"\r\n")
    if len(lines) > max_headers + 1:
        return 431
    try:
        method, target, version = lines[0].decode("latin-1").split(" ")
    except ValueError:
        return 400
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        return 505 if version.startswith("HTTP/") else 400
    if not method.isalpha() or not target or not (target[0] == "/" or target == "*" or "://" in target):
        return 400
    environ: dict[str, Any] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not name or name[-1:] in b" \t" or line[:1] in b" \t":  # obs-fold, "Name :": refused
            return 400
        key = name.decode("latin-1").upper().replace("-", "_")
        key = key if key in ("CONTENT_TYPE", "CONTENT_LENGTH") else "HTTP_" + key
        text = value.strip(b" \t").decode("latin-1")
        environ[key] = f"{environ[key]},{text}" if key in environ else text
    if environ.get("CONTENT_LENGTH", "0").strip() != "0" or "HTTP_TRANSFER_ENCODING" in environ:
        return 413
    tokens = {t.strip().lower() for t in environ.get("HTTP_CONNECTION", "").split(",")}
    keep_alive = "close" not in tokens if version == "HTTP/1.1" else "keep-alive" in tokens
    if "://" in target:  # absolute form
        target = "/" + target.split("://", 1)[1].partition("/")[2]
    path, _, query = target.partition("?")
    environ.update({
        "REQUEST_METHOD": method, "PATH_INFO": unquote(path, "latin-1"), "QUERY_STRING": query,
        "SERVER_PROTOCOL": version, "SCRIPT_NAME": "", "SERVER_NAME": "rl_otel", "SERVER_PORT": str(port),
        "REMOTE_ADDR": str(addr[0]) if addr else "", "wsgi.version": (1, 0), "wsgi.url_scheme": scheme,
        "wsgi.input": io.BytesIO(), "wsgi.errors": sys.stderr, "wsgi.multithread": False,
        "wsgi.multiprocess": False, "wsgi.run_once": False, "rl_otel.asked_ns": time.monotonic_ns(),
    })
    return environ, keep_alive


class ResponseHeads:
    """Writes response heads; the ``Date`` header's text is made once a second. Not thread-safe: one per thread
    that answers."""

    def __init__(self) -> None:
        self._date = (0, "")

    def head(self, status: str, headers: list, length: int, keep_alive: bool) -> bytes:
        now = time.time()
        if int(now) != self._date[0]:
            t = time.gmtime(now)
            self._date = (int(now), f"{_DAYS[t.tm_wday]}, {t.tm_mday:02d} {_MONTHS[t.tm_mon - 1]} {t.tm_year} "
                                    f"{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d} GMT")
        lines = [f"HTTP/1.1 {status}", f"Date: {self._date[1]}", *(f"{k}: {v}" for k, v in headers),
                 f"Content-Length: {length}"]
        if not keep_alive:
            lines.append("Connection: close")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
