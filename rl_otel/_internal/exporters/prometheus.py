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
scrape after it, through a plan compiled once per set of series - and those bytes (and their gzip stream) are
served until the store changes. What can change between two scrapes without a ``log()`` is rendered at every
scrape: the live gauges (process and GPU memory), and any collector registered on the registry. A ``log()``
finished before a scrape starts is always in it. ``?name[]=`` cuts only the families it names from those bytes.

prometheus_client is not imported on this path (~25 ms of ``init()``): content negotiation, the headers and the
answers to other methods are written here, as prometheus_client 0.26 writes them (``tests/test_exposition_headers``
compares them); it is imported by the first scrape with a registered collector's family to encode, and for a
registry that is not a :class:`ScrapeRegistry`.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import logging
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from rl_otel._internal.exporters.admission import Limits
from rl_otel._internal.exporters.exposition import Plan, Renderer, Rendering
from rl_otel._internal.exporters.server import Server, serve
from rl_otel._internal.exporters.textformat import EOF, OPENMETRICS, TEXT
from rl_otel._internal.exporters.webconfig import WebConfig
from rl_otel._internal.forks import reset_in_forked_child
from rl_otel._internal.pipeline.records import Family
from rl_otel._internal.pipeline.snapshot import Snapshot
from rl_otel._internal.pipeline.store import StoreSnapshot

_log = logging.getLogger("rl_otel")

GZIP_LEVEL = 1  # 3.5 ms for a 1.2 MB scrape (level 9, prometheus_client's: 23 ms) and 1.3x its size

# prometheus_client's content types (exposition.py and openmetrics/exposition.py)
CONTENT_TYPE_PLAIN_0_0_4 = "text/plain; version=0.0.4; charset=utf-8"
CONTENT_TYPE_PLAIN_1_0_0 = "text/plain; version=1.0.0; charset=utf-8"
CONTENT_TYPE_OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"
_ESCAPINGS = ("allow-utf-8", "underscores", "dots", "values")


@dataclass
class _Stored:
    """The stored part of a snapshot rendered in one format: the bytes, and the rendering they were encoded from
    (``?name[]=`` requests are cut from the families they name, never from the whole text)."""

    snapshot: StoreSnapshot | None
    body: bytes
    names: frozenset[str]
    taken_ns: int = 0  # time.monotonic_ns() before the recorder was read: it holds every log() done by then
    rendering: Rendering | None = None
    gzip: tuple[bytes, zlib._Compress] | None = None  # (compressed prefix, compressor before its flush)

    def gzip_head(self) -> tuple[bytes, zlib._Compress]:
        if self.gzip is None:
            compressor = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 31)  # wbits 31: a gzip stream
            self.gzip = (compressor.compress(self.body), compressor)
        return self.gzip

    def text_of(self, names: set[str]) -> str:
        """The families writing a sample named in ``names``, whole (headers and every sample)."""
        return "" if self.rendering is None else self.rendering.text_of(names)


Collect = Callable[..., Snapshot]  # collect(settle=...): the recorder's one read


class ScrapeRegistry:
    """Serializes scrapes, guarantees one family per name in each one, and renders the stored families once per
    store version. ``collect(settle=...)`` is the recorder's read (:meth:`Recorder.collect`, or several recorders'
    merged). A prometheus_client collector registered on it (``register``, as on a prometheus_client
    ``CollectorRegistry``: e.g. a ``PrometheusMetricReader`` given ``registry=``) is collected at every scrape,
    after rl_otel's families; prometheus_client is imported only then. ``on_error(reason)`` counts what a scrape
    absorbed (and is what the endpoint counts its refusals with): counted outside the store, so a scrape never
    writes what it reads.

    The snapshot's stored families are compiled into a :class:`Plan` once per layout (set of series) and format,
    and each new version's values are filled into it (:meth:`Renderer.fill`); its live families are rendered at
    every scrape."""

    def __init__(self, on_duplicate: Callable[[str], None], collect: Collect | None = None,
                 on_error: Callable[[str], None] = lambda reason: None,
                 clock: Callable[[], int] = time.time_ns, *, routes: Mapping[str, Callable[[], str]] | None = None,
                 exemplars: Callable[[], dict] | None = None) -> None:
        self._scrape_lock = threading.Lock()
        self._collectors_lock = threading.Lock()
        reset_in_forked_child(self)
        self._collectors: dict[Any, None] = {}  # registered prometheus_client collectors, in order
        self._on_duplicate = on_duplicate
        self.on_error = on_error
        self._collect = collect
        self._clock = clock  # the store's clock: when a rendered snapshot's series expire
        self._renderer = Renderer()
        self._stored: dict[str, _Stored] = {}
        self._plans: dict[str, tuple[object, Plan]] = {}  # format -> (snapshot layout, the plan compiled for it)
        # more GET paths, each answered with the text its function returns (which must never raise), behind the
        # endpoint's TLS and basic auth as /metrics is: ``/debug/stacks`` (probes/hangs.py)
        self.routes: dict[str, Callable[[], str]] = dict(routes or {})
        # the phases' latest exemplars (exporters/exemplars.py), written into OpenMetrics renderings only
        self.exemplars = exemplars
        # when /metrics was asked (monotonic): close() waits for one scrape of the final state (rl_run_finished)
        self._scraped = threading.Condition()
        self._scrapes: list[float] = []  # the last three
        self._count = 0  # scrapes begun
        self._scrape_done = 0  # the latest scrape (by its number) that has its body

    def _after_fork(self) -> None:
        self._scrape_lock = threading.Lock()  # the parent's may have been held by its scrape thread at the fork
        self._collectors_lock = threading.Lock()
        self._scraped = threading.Condition()

    def scrape_begins(self) -> int:
        """Record that a scrape of /metrics begins (before it renders); its ticket for :meth:`scrape_rendered`."""
        with self._scraped:
            self._scrapes = [*self._scrapes[-2:], time.monotonic()]
            self._count += 1
            return self._count

    def scrape_rendered(self, ticket: int) -> None:
        """The scrape of ``ticket`` has its body (what it serves is decided)."""
        with self._scraped:
            self._scrape_done = max(self._scrape_done, ticket)
            self._scraped.notify_all()

    def scrape_interval(self) -> tuple[float, float] | None:
        """``(interval, the monotonic time of the last scrape)`` when something scrapes regularly (the last three
        scrapes' two intervals within a factor of 2 of each other, as a Prometheus' are); else ``None`` (a person
        or a test that looked once or twice)."""
        with self._scraped:
            if len(self._scrapes) < 3:
                return None
            a, b, c = self._scrapes
            first, second = b - a, c - b
            if max(first, second) > 2 * min(first, second):
                return None
            return second, self._scrapes[-1]

    def wait_next_scrape(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for a scrape that began after this call to have its body; whether one did."""
        with self._scraped:
            seen = self._count
            return self._scraped.wait_for(lambda: self._scrape_done > seen, timeout_s)

    def register(self, collector: Any) -> None:
        """Collect ``collector`` (its ``collect()`` yields prometheus_client families) at every scrape."""
        with self._collectors_lock:
            self._collectors[collector] = None

    def unregister(self, collector: Any) -> None:
        with self._collectors_lock:
            del self._collectors[collector]

    def collect(self) -> Iterable[Any]:
        """The registered collectors' families (prometheus_client's ``Collector`` interface)."""
        with self._collectors_lock:
            collectors = list(self._collectors)
        for collector in collectors:
            yield from collector.collect()

    def render(self, fmt: str = TEXT, gzipped: bool = False) -> bytes:
        """One scrape's exposition in ``fmt`` (``TEXT`` or ``OPENMETRICS``), gzip-compressed if asked."""
        return b"".join(self.render_chunks(fmt, gzipped))

    def render_chunks(self, fmt: str = TEXT, gzipped: bool = False, names: set[str] | None = None,
                      asked_ns: int | None = None) -> list[bytes]:
        """:meth:`render` as a list of byte strings to send in turn: the cached bytes are not copied. With
        ``names``, only the samples of those names (prometheus_client's ``restricted_registry``); only the
        families writing them are cut from the cached rendering, whatever the size of the rest. ``asked_ns``
        (``time.monotonic_ns()`` when the request arrived): a rendering of the stored families read after that
        is served even if the store changed since - it holds every ``log()`` finished before the request - so
        scrapers queued behind each other share one rendering."""
        with self._scrape_lock:
            cached = self._stored.get(fmt)
            shared = (cached is not None and asked_ns is not None and cached.taken_ns >= asked_ns
                      and cached.snapshot is not None and cached.snapshot.valid(self._clock()))
            taken_ns = time.monotonic_ns()
            snapshot = None
            if self._collect is not None:
                # a shared rendering holds every write done before this request: nothing to wait for. A store
                # that cannot be read is counted through on_error and leaves the live families served.
                snapshot = self._collect(settle=not shared, on_error=self.on_error)
            if shared or snapshot is None:
                stored = cached if shared else _Stored(None, b"", frozenset())
            else:
                stored = self._render_stored(snapshot.stored, fmt, taken_ns)
            assert stored is not None
            seen = set(stored.names)
            live = ""
            if snapshot is not None and snapshot.live:
                views: Iterable[Family] = snapshot.live
                if names is not None:
                    views = [v for v in views if not self._renderer.samples(v.spec).isdisjoint(names)]
                # a family that fails to render is left out and counted (on_error), the others served
                live = self._renderer.render(views, fmt, seen, on_error=self.on_error).text
            registered = self._registered(fmt, seen, names) if self._collectors else ""
            tail = registered + live
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

    def _render_stored(self, snapshot: StoreSnapshot, fmt: str, taken_ns: int) -> _Stored:
        cached = self._stored.get(fmt)
        if cached is not None and cached.snapshot is snapshot:
            return cached
        rendering = self._rendered(snapshot, fmt)
        if fmt == OPENMETRICS and self.exemplars is not None:
            from rl_otel._internal.exporters.exemplars import with_exemplars

            rendering = dataclasses.replace(rendering, text=with_exemplars(rendering.text, self.exemplars()))
        try:
            body = rendering.text.encode()
        except UnicodeEncodeError:  # not expected (labels are escaped): leave out the families that fail
            rendering = _encodable_families(rendering, self.on_error)
            body = rendering.text.encode()
        stored = self._stored[fmt] = _Stored(snapshot, body, rendering.names, taken_ns, rendering)
        return stored

    def _rendered(self, snapshot: StoreSnapshot, fmt: str) -> Rendering:
        """The snapshot's families rendered through the plan compiled for its layout, compiled again when series
        came or went. A plan kept writes every series of the snapshot, in order (a plan that leaves one out - a
        duplicate name, a family that failed - is compiled for each snapshot), so a new snapshot's values fill it
        in the snapshot's order."""
        compiled = self._plans.get(fmt)
        if compiled is None or snapshot.layout is None or compiled[0] != snapshot.layout:
            families = snapshot.families
            plan = self._renderer.compile(families, fmt, set())
            if (snapshot.layout is not None and not plan.failed
                    and len(plan.numbers) + len(plan.hists) == sum(len(fam.points) for fam in families)):
                self._plans[fmt] = (snapshot.layout, plan)
            else:
                self._plans.pop(fmt, None)
            return self._renderer.fill(plan, plan.numbers, plan.hists, self.on_error)
        return self._renderer.fill(compiled[1], snapshot.numbers, snapshot.hists, self.on_error)


def families(*items: Any) -> Any:
    """A collector of prometheus_client families, for the stock encoders."""
    from types import SimpleNamespace

    return SimpleNamespace(collect=lambda: list(items))


def encode(collector: Any, fmt: str) -> str:
    """prometheus_client's own encoding of ``collector`` (OpenMetrics without its ``# EOF``); prometheus_client is
    imported here, by the first scrape that has a registered collector's family to write."""
    if fmt == OPENMETRICS:
        from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

        return generate_openmetrics(collector).decode()[:-len(EOF)]
    from prometheus_client.exposition import generate_latest

    return generate_latest(collector).decode()


def _utf8(text: str, on_error: Callable[[str], None]) -> bytes:
    try:
        return text.encode()
    except UnicodeEncodeError:
        on_error("render")
        return text.encode("utf-8", "replace")


def _encodable_families(rendering: Rendering, on_error: Callable[[str], None]) -> Rendering:
    parts, texts = [], []
    for part, text in zip(rendering.families(), rendering.family_texts(), strict=True):
        try:
            text.encode()
        except UnicodeEncodeError:
            _log.error("rl_otel: the family of %s is not valid UTF-8; it is left out of the scrape",
                       sorted(part.samples))
            on_error("render")
            continue
        parts.append(part)
        texts.append(text)
    return Rendering("".join(texts), frozenset(part.name for part in parts), rendering.plan, None, texts, parts)


def content_type(accept: str | None) -> str:
    """The content type prometheus_client's ``choose_encoder`` answers ``Accept`` with (0.26: OpenMetrics
    1.0.0 and up, text 1.0.0 and up with an escaping scheme, else text 0.0.4); its format is OpenMetrics when the
    type is ``application/openmetrics-text``, else the text format (rl_otel writes names that need no escaping).
    A version that does not compare (``version=x``) is taken as older than 1.0.0, where prometheus_client raises
    (its app answers 500): a malformed ``Accept`` gets the text format."""
    escaping = "underscores"
    for accepted in (accept or "").split(","):
        toks = accepted.split(";")
        mime = toks[0].strip()
        if mime == "application/openmetrics-text":
            version, escaping = _accept_param(toks, "version"), _escaping(toks)
            if not version:
                return CONTENT_TYPE_OPENMETRICS
            if _at_least_1(version):
                return f"application/openmetrics-text; version={version}; charset=utf-8; escaping={escaping}"
        elif mime == "text/plain":
            version, escaping = _accept_param(toks, "version"), _escaping(toks)
            if version and _at_least_1(version):
                return f"{CONTENT_TYPE_PLAIN_1_0_0}; escaping={escaping}"
    return CONTENT_TYPE_PLAIN_0_0_4


def _accept_param(toks: list[str], name: str) -> str:
    for tok in toks:
        if "=" in tok:
            key, value = tok.strip().split("=", 1)
            if key == name:
                return value
    return ""


def _escaping(toks: list[str]) -> str:
    for tok in toks:
        if "=" in tok:
            key, value = tok.strip().split("=", 1)
            if key == "escaping":
                return value if value in _ESCAPINGS else "underscores"
    return "underscores"


def _at_least_1(version: str) -> bool:
    try:
        return _version(version) >= (1, 0, 0)
    except TypeError:  # a word compared with a number
        return False


def _version(text: str) -> tuple[int | str, ...]:
    """prometheus_client's ``parse_version`` (comparing a non-numeric part with a number raises, as there)."""
    parts: list[int | str] = []
    for part in text.split("."):
        try:
            parts.append(int(part))
        except ValueError:
            parts.append(part)
    return tuple(parts)


def gzip_accepted(accept_encoding: str | None) -> bool:
    """prometheus_client's ``gzip_accepted``: ``gzip`` among the ``Accept-Encoding`` codings."""
    return any(accepted.split(";")[0].strip().lower() == "gzip" for accepted in (accept_encoding or "").split(","))


_ALLOW = [("Allow", "OPTIONS,GET")]


def scrape_app(registry: ScrapeRegistry) -> Callable:
    """A WSGI app serving ``registry.render()`` to GET requests with prometheus_client's content negotiation
    (``Accept``: text 0.0.4 or OpenMetrics; ``Accept-Encoding: gzip``). ``?name[]=`` keeps the samples of those
    names (the stock app served nothing: our collector has no ``describe``); OPTIONS, other methods and
    ``/favicon.ico`` are answered as prometheus_client's own app answers them; a path of ``registry.routes``
    (``/debug/stacks``) with its text."""

    def app(environ, start_response):
        method = environ.get("REQUEST_METHOD")
        if method == "OPTIONS":
            start_response("200 OK", list(_ALLOW))
            return [b""]
        if method != "GET":
            start_response("405 Method Not Allowed", list(_ALLOW))
            return [f"# HTTP 405 Method Not Allowed: {method}; use OPTIONS or GET\n".encode()]
        if environ.get("PATH_INFO") == "/favicon.ico":
            start_response("200 OK", [])
            return [b""]
        route = registry.routes.get(environ.get("PATH_INFO", ""))
        if route is not None:
            start_response("200 OK", [("Content-Type", "text/plain; charset=utf-8")])
            return [route().encode("utf-8", "replace")]
        ticket = registry.scrape_begins()
        kind = content_type(environ.get("HTTP_ACCEPT"))
        gzipped = gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING"))
        query = environ.get("QUERY_STRING", "")
        names = parse_qs(query).get("name[]") if "name" in query else None
        fmt = OPENMETRICS if kind.startswith("application/openmetrics-text") else TEXT
        parts = registry.render_chunks(fmt, gzipped, set(names) if names else None, environ.get("rl_otel.asked_ns"))
        registry.scrape_rendered(ticket)
        headers = [("Content-Type", kind)] + ([("Content-Encoding", "gzip")] if gzipped else [])
        start_response("200 OK", headers)
        return parts

    return app


def restricted(body: str, names: set[str]) -> str:
    """The exposition ``body`` cut to the samples named in ``names``, each with its family's header lines, as
    prometheus_client's ``restricted_registry`` does (a family with no sample left is left out)."""
    out: list[str] = []
    header: list[str] = []
    in_header = False
    # lines end at "\n" only: str.splitlines() also ends one at U+2028, U+0085 or \x1c in a label value, and the
    # sample cut there would not be recognised and be left out
    for line in io.StringIO(body, newline="\n"):
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

    def __init__(self, registry: Any, host: str, port: int, *, web: WebConfig | None = None,
                 port_search: int = 0, limits: Limits | None = None) -> None:
        on_event = None
        if isinstance(registry, ScrapeRegistry):
            app = scrape_app(registry)
            on_event = registry.on_error
        else:  # a prometheus_client CollectorRegistry
            from prometheus_client.exposition import make_wsgi_app

            app = make_wsgi_app(registry)
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
