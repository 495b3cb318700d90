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
(:mod:`rl_otel._internal.exporters.exposition`) once per store version - once per training step, at the first
scrape after it - and those bytes (and their gzip stream) are served until the store changes. What can change
between two scrapes without a ``log()`` is rendered at every scrape: the live gauges (process and GPU memory), and
any collector registered on the registry. A ``log()`` finished before a scrape starts is always in it.
``?name[]=`` cuts only the families it names from those bytes.
"""

from __future__ import annotations

import gzip
import logging
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import parse_qs

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder, gzip_accepted, make_wsgi_app

from rl_otel._internal.exporters.exposition import EOF, OPENMETRICS, TEXT, Renderer, Span, encode, families
from rl_otel._internal.exporters.server import Limits, Server, serve
from rl_otel._internal.exporters.webconfig import WebConfig
from rl_otel._internal.pipeline.store import SeriesStore

_log = logging.getLogger("rl_otel")

GZIP_LEVEL = 1  # 3.5 ms for a 1.2 MB scrape (level 9, prometheus_client's: 23 ms) and 1.3x its size


@dataclass
class _Stored:
    """The store's families rendered at one version, in one format: the bytes, and where each family is in them
    (``?name[]=`` requests are cut from the families they name, never from the whole text)."""

    version: int
    valid_until_ns: int | None
    body: bytes
    names: frozenset[str]
    taken_ns: int = 0  # time.monotonic_ns() before the store was settled and read: it holds every log() done by then
    chunks: list[str] = field(default_factory=list)  # body's text, by series
    spans: list[Span] = field(default_factory=list)  # (sample names, first chunk, past the last) per family
    gzip: tuple[bytes, zlib._Compress] | None = None  # (compressed prefix, compressor before its flush)

    def gzip_head(self) -> tuple[bytes, zlib._Compress]:
        if self.gzip is None:
            compressor = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 31)  # wbits 31: a gzip stream
            self.gzip = (compressor.compress(self.body), compressor)
        return self.gzip

    def text_of(self, names: set[str]) -> str:
        """The families writing a sample named in ``names``, whole (headers and every sample)."""
        return "".join("".join(self.chunks[a:b]) for samples, a, b in self.spans if not samples.isdisjoint(names))


class ScrapeRegistry(CollectorRegistry):
    """Serializes scrapes, guarantees one family per name in each one, and renders the store's families once
    per store version. A prometheus_client collector registered on it (e.g. a ``PrometheusMetricReader`` given
    ``registry=``) is collected at every scrape, after the store's families. ``on_error(reason)`` counts what a
    scrape absorbed (and is what the endpoint counts its refusals with)."""

    def __init__(self, on_duplicate: Callable[[str], None], store: SeriesStore | None = None,
                 on_error: Callable[[str], None] = lambda reason: None) -> None:
        super().__init__(auto_describe=False)
        self._scrape_lock = threading.Lock()
        self._on_duplicate = on_duplicate
        self.on_error = on_error
        self._store = store
        self._renderer = Renderer()
        self._stored: dict[str, _Stored] = {}

    def render(self, fmt: str = TEXT, gzipped: bool = False) -> bytes:
        """One scrape's exposition in ``fmt`` (``TEXT`` or ``OPENMETRICS``), gzip-compressed if asked."""
        return b"".join(self.render_parts(fmt, gzipped))

    def render_parts(self, fmt: str = TEXT, gzipped: bool = False, names: set[str] | None = None,
                     asked_ns: int | None = None) -> list[bytes]:
        """:meth:`render` as a list of byte strings to send in turn: the store's cached bytes are not copied.
        With ``names``, only the samples of those names (prometheus_client's ``restricted_registry``); only the
        families writing them are cut from the cached rendering, whatever the size of the rest. ``asked_ns``
        (``time.monotonic_ns()`` when the request arrived): a rendering of the store read after that is served
        even if the store changed since - it holds every ``log()`` finished before the request - so scrapers
        queued behind each other share one rendering."""
        with self._scrape_lock:
            stored = self._render_store(fmt, asked_ns)
            seen = set(stored.names)
            chunks: list[str] = []
            if self._store is not None:
                try:
                    views = self._store.live()
                    if names is not None:
                        views = [v for v in views if not self._renderer.header(v.spec).samples.isdisjoint(names)]
                    chunks = self._renderer.render(views, fmt, seen, on_error=self.on_error)
                except Exception:  # never break a scrape
                    _log.exception("rl_otel: rendering the live gauges failed")
                    self.on_error("collect")
            registered = self._registered(fmt, seen, names)
            tail = registered + "".join(chunks)
            if names is not None:
                body = restricted(stored.text_of(names) + tail, names) + (EOF if fmt == OPENMETRICS else "")
                data = _utf8(body, self.on_error)
                return [gzip.compress(data, GZIP_LEVEL) if gzipped else data]
            end = _utf8(tail + (EOF if fmt == OPENMETRICS else ""), self.on_error)
            if not gzipped:
                return [stored.body, end]
            head, compressor = stored.gzip_head()
            compressor = compressor.copy()  # the cached prefix stays reusable for the next scrape
            return [head, compressor.compress(end) + compressor.flush()]

    def _registered(self, fmt: str, seen: set[str], names: set[str] | None) -> str:
        """The registered collectors' families not already written (a second one of a name is dropped and
        counted), each encoded alone: one that cannot be encoded is left out and counted."""
        out = []
        for family in self.collect():
            if family.name in seen:
                self._on_duplicate(family.name)
                continue
            seen.add(family.name)
            if names is not None and not any(sample.name in names for sample in family.samples):
                continue
            try:
                out.append(encode(families(family), fmt))
            except Exception:  # e.g. a label value that is not UTF-8
                _log.exception("rl_otel: encoding the registered family %s failed", family.name)
                self.on_error("render")
        return "".join(out)

    def _render_store(self, fmt: str, asked_ns: int | None = None) -> _Stored:
        if self._store is None:
            return _Stored(0, None, b"", frozenset())
        cached = self._stored.get(fmt)
        if cached is not None and cached.valid_until_ns is not None and time.time_ns() >= cached.valid_until_ns:
            cached = None  # a series has expired since
        if cached is not None and asked_ns is not None and cached.taken_ns >= asked_ns:
            return cached
        taken_ns = time.monotonic_ns()
        self._store.settle()  # jobs submitted before this scrape land first: no step served half-computed
        if cached is not None and cached.version == self._store.version:
            return cached
        try:
            version, views, valid_until = self._store.snapshot()
            seen: set[str] = set()
            spans: list[Span] = []
            chunks = self._renderer.render(views, fmt, seen, spans, self.on_error)
            try:
                body = "".join(chunks).encode()
            except UnicodeEncodeError:  # not expected (labels are escaped): leave out the families that fail
                chunks, spans = _encodable_families(chunks, spans, self.on_error)
                body = "".join(chunks).encode()
        except Exception:  # never break a scrape: serve the live gauges and the registered collectors
            _log.exception("rl_otel: collecting the series store failed")
            self.on_error("collect")
            return _Stored(-1, None, b"", frozenset())
        stored = self._stored[fmt] = _Stored(version, valid_until, body, frozenset(seen), taken_ns, chunks, spans)
        return stored


def _utf8(text: str, on_error: Callable[[str], None]) -> bytes:
    try:
        return text.encode()
    except UnicodeEncodeError:
        on_error("render")
        return text.encode("utf-8", "replace")


def _encodable_families(chunks: list[str], spans: list[Span], on_error: Callable[[str], None],
                        ) -> tuple[list[str], list[Span]]:
    kept_chunks: list[str] = []
    kept_spans: list[Span] = []
    for samples, a, b in spans:
        try:
            "".join(chunks[a:b]).encode()
        except UnicodeEncodeError:
            _log.error("rl_otel: the family of %s is not valid UTF-8; it is left out of the scrape", sorted(samples))
            on_error("render")
            continue
        kept_spans.append((samples, len(kept_chunks), len(kept_chunks) + b - a))
        kept_chunks.extend(chunks[a:b])
    return kept_chunks, kept_spans


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
        query = environ.get("QUERY_STRING", "")
        names = parse_qs(query).get("name[]") if "name" in query else None
        fmt = OPENMETRICS if content_type.startswith("application/openmetrics-text") else TEXT
        parts = registry.render_parts(fmt, gzipped, set(names) if names else None, environ.get("rl_otel.asked_ns"))
        headers = [("Content-Type", content_type)] + ([("Content-Encoding", "gzip")] if gzipped else [])
        start_response("200 OK", headers)
        return parts

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
    """An HTTP(S) server serving ``registry`` on ``host:port/metrics``; ``close()`` is idempotent and fast.

    ``web`` adds TLS, mTLS and basic auth (:mod:`rl_otel._internal.exporters.webconfig`); ``port_search`` tries the
    next ports when ``port`` is taken; ``limits`` bounds what clients can make it hold and spend
    (:mod:`rl_otel._internal.exporters.server`). A :class:`ScrapeRegistry` is served by :func:`scrape_app` (cached
    rendering), and counts what the server refuses (``on_error``); any other registry by prometheus_client's app."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int, *, web: WebConfig | None = None,
                 port_search: int = 0, limits: Limits | None = None) -> None:
        app = make_wsgi_app(registry)
        on_event = None
        if isinstance(registry, ScrapeRegistry):
            app = scrape_app(registry, app)
            on_event = registry.on_error
        self._server = serve(app, host, port, web=web, port_search=port_search, on_event=on_event, limits=limits)
        self.host = host
        self.port: int = self._server.server_port
        self.scheme = web.scheme if web is not None else "http"
        self._closed = False

    @property
    def server(self) -> Server:
        """The HTTP server (its limits, CPU governor and connection count)."""
        return self._server

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
        self._server.close(timeout_s)
