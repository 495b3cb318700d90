"""The Prometheus scrape endpoint: the series store rendered as opentelemetry-exporter-prometheus would write it,
with its pitfalls designed out.

- rl_otel's series come from its own store, not the SDK's aggregation, so NaN/Inf reach Prometheus;
- one pipeline: the store holds every family the endpoint serves, ``rl_otel_build_info`` and ``target_info`` (the
  OTel resource, as the exporter writes it) included; no SDK meter provider behind the endpoint;
- no ``otel_scope_*`` labels; explicit histogram buckets come from the catalog;
- scrapes are serialized: the stock collector pops a shared deque, and two concurrent scrapes could each
  see half of the data;
- a family name is written once per scrape: a second family with the same name from a collector registered on
  the registry (which would make Prometheus reject the whole scrape) is dropped and counted;
- the server binds 0.0.0.0 by default (a pod is scraped from outside); port 0 picks a free port; TLS, mTLS and
  basic auth come from a web-config file (``server.py``, ``webconfig.py``).

Cost: the store's families (thousands of series on a node with 8 GPUs) are rendered straight to text
(:mod:`rl_otel._internal.exporters.exposition`) once per store version - once per training step, at the first scrape after
it - and those bytes (and their gzip stream) are served until the store changes. What can change between two
scrapes without a ``log()`` is rendered at every scrape: the live gauges (process and GPU memory), and any
collector registered on the registry. A ``log()`` finished before a scrape starts is always in it.
"""

from __future__ import annotations

import gzip
import logging
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import parse_qs

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder, gzip_accepted, make_wsgi_app

from rl_otel._internal.exporters.exposition import EOF, OPENMETRICS, TEXT, Renderer, encode, families
from rl_otel._internal.exporters.server import serve
from rl_otel._internal.exporters.webconfig import WebConfig
from rl_otel._internal.pipeline.store import SeriesStore

_log = logging.getLogger("rl_otel")

GZIP_LEVEL = 1  # 3.5 ms for a 1.2 MB scrape (level 9, prometheus_client's: 23 ms) and 1.3x its size


@dataclass
class _Stored:
    """The store's families rendered at one version, in one format."""

    version: int
    valid_until_ns: int | None
    body: bytes
    names: frozenset[str]
    gzip: tuple[bytes, zlib._Compress] | None = None  # (compressed prefix, compressor before its flush)

    def gzip_head(self) -> tuple[bytes, zlib._Compress]:
        if self.gzip is None:
            compressor = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 31)  # wbits 31: a gzip stream
            self.gzip = (compressor.compress(self.body), compressor)
        return self.gzip


class ScrapeRegistry(CollectorRegistry):
    """Serializes scrapes, guarantees one family per name in each one, and renders the store's families once
    per store version. A prometheus_client collector registered on it (e.g. a ``PrometheusMetricReader`` given
    ``registry=``) is collected at every scrape, after the store's families."""

    def __init__(self, on_duplicate: Callable[[str], None], store: SeriesStore | None = None,
                 on_error: Callable[[str], None] = lambda reason: None) -> None:
        super().__init__(auto_describe=False)
        self._scrape_lock = threading.Lock()
        self._on_duplicate = on_duplicate
        self._on_error = on_error
        self._store = store
        self._renderer = Renderer()
        self._stored: dict[str, _Stored] = {}

    def render(self, fmt: str = TEXT, gzipped: bool = False) -> bytes:
        """One scrape's exposition in ``fmt`` (``TEXT`` or ``OPENMETRICS``), gzip-compressed if asked."""
        with self._scrape_lock:
            stored = self._render_store(fmt)
            seen = set(stored.names)
            chunks = []
            if self._store is not None:
                try:
                    chunks = self._renderer.render(self._store.live(), fmt, seen)
                except Exception:  # never break a scrape
                    _log.exception("rl_otel: rendering the live gauges failed")
                    self._on_error("collect")
            kept = []
            for family in self.collect():
                if family.name in seen:
                    self._on_duplicate(family.name)
                    continue
                seen.add(family.name)
                kept.append(family)
            registered = encode(families(*kept), fmt) if kept else ""
            tail = (registered + "".join(chunks) + (EOF if fmt == OPENMETRICS else "")).encode()
            if not gzipped:
                return stored.body + tail
            head, compressor = stored.gzip_head()
            compressor = compressor.copy()  # the cached prefix stays reusable for the next scrape
            return head + compressor.compress(tail) + compressor.flush()

    def _render_store(self, fmt: str) -> _Stored:
        if self._store is None:
            return _Stored(0, None, b"", frozenset())
        self._store.settle()  # jobs submitted before this scrape land first: no step served half-computed
        cached = self._stored.get(fmt)
        if (cached is not None and cached.version == self._store.version
                and (cached.valid_until_ns is None or time.time_ns() < cached.valid_until_ns)):
            return cached
        try:
            version, views, valid_until = self._store.snapshot()
            seen: set[str] = set()
            body = "".join(self._renderer.render(views, fmt, seen)).encode()
        except Exception:  # never break a scrape: serve the live gauges and the registered collectors
            _log.exception("rl_otel: collecting the series store failed")
            self._on_error("collect")
            return _Stored(-1, None, b"", frozenset())
        stored = self._stored[fmt] = _Stored(version, valid_until, body, frozenset(seen))
        return stored


def scrape_app(registry: ScrapeRegistry, fallback: Callable) -> Callable:
    """A WSGI app serving ``registry.render()`` to GET requests with prometheus_client's content negotiation
    (``Accept``: text 0.0.4 or OpenMetrics; ``Accept-Encoding: gzip``). ``?name[]=`` keeps the samples of those
    names (the stock app served nothing: our collector has no ``describe``); OPTIONS, other methods and
    ``/favicon.ico`` go to ``fallback``, prometheus_client's own app."""

    def app(environ, start_response):
        if environ.get("REQUEST_METHOD") != "GET" or environ.get("PATH_INFO") == "/favicon.ico":
            return fallback(environ, start_response)
        content_type = choose_encoder(environ.get("HTTP_ACCEPT"))[1]
        gzipped = gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING"))
        names = parse_qs(environ.get("QUERY_STRING", "")).get("name[]")
        fmt = OPENMETRICS if content_type.startswith("application/openmetrics-text") else TEXT
        if names:
            body = restricted(registry.render(fmt).decode(), set(names)).encode()
            body = gzip.compress(body, GZIP_LEVEL) if gzipped else body
        else:
            body = registry.render(fmt, gzipped)
        headers = [("Content-Type", content_type)] + ([("Content-Encoding", "gzip")] if gzipped else [])
        start_response("200 OK", headers)
        return [body]

    return app


def restricted(body: str, names: set[str]) -> str:
    """The exposition ``body`` cut to the samples named in ``names``, each with its family's header lines, as
    prometheus_client's ``restricted_registry`` does (a family with no sample left is left out)."""
    out: list[str] = []
    header: list[str] = []
    in_header = False
    for line in body.splitlines(keepends=True):
        if line.startswith("#"):
            if line == EOF:
                out.append(line)
                continue
            if not in_header:  # the first header line after samples starts the next family
                header, in_header = [], True
            header.append(line)
            continue
        in_header = False
        brace, space = line.find("{"), line.find(" ")
        if line[:brace if 0 <= brace < space else space] in names:
            if header:
                out.extend(header)
                header = []
            out.append(line)
    return "".join(out)


class ScrapeEndpoint:
    """An HTTP(S) server serving ``registry`` on ``host:port/metrics``; ``close()`` is idempotent.

    ``web`` adds TLS, mTLS and basic auth (:mod:`rl_otel._internal.exporters.webconfig`); ``port_search`` tries the next
    ports when ``port`` is taken (:func:`rl_otel._internal.exporters.server.serve`). A :class:`ScrapeRegistry` is served
    by :func:`scrape_app` (cached rendering), any other registry by prometheus_client's app."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int, *, web: WebConfig | None = None,
                 port_search: int = 0) -> None:
        app = make_wsgi_app(registry)
        if isinstance(registry, ScrapeRegistry):
            app = scrape_app(registry, app)
        self._server, self._thread = serve(app, host, port, web=web, port_search=port_search)
        self.host = host
        self.port: int = self._server.server_port
        self.scheme = web.scheme if web is not None else "http"
        self._closed = False

    @property
    def url(self) -> str:
        host = {"0.0.0.0": "127.0.0.1", "::": "[::1]", "": "127.0.0.1"}.get(self.host, self.host)
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"{self.scheme}://{host}:{self.port}/metrics"

    def close(self, timeout_s: float = 5.0) -> None:
        if self._closed:
            return
        self._closed = True
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout_s)
