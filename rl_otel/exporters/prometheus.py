"""The Prometheus scrape endpoint, built on opentelemetry-exporter-prometheus with its pitfalls designed out.

- rl_otel's series (the store) are merged into each collection, so NaN/Inf reach Prometheus;
- no ``otel_scope_*`` labels (``scope_info_enabled=False``); explicit histogram buckets come from the catalog;
- scrapes are serialized: the stock collector pops a shared deque, and two concurrent scrapes could each
  see half of the data;
- a family name is written once per scrape: a second family with the same name (which would make Prometheus
  reject the whole scrape) is dropped and counted;
- the server binds 0.0.0.0 by default (a pod is scraped from outside); port 0 picks a free port; TLS, mTLS and
  basic auth come from a web-config file (``server.py``, ``webconfig.py``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics.export import Metric, MetricsData, ResourceMetrics, ScopeMetrics
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import make_wsgi_app

from rl_otel.exporters.server import serve
from rl_otel.exporters.webconfig import WebConfig

_log = logging.getLogger("rl_otel")

SCOPE = InstrumentationScope("rl_otel")


def merge(data: MetricsData | None, resource: Resource, extra: list[Metric]) -> MetricsData:
    """``data`` with ``extra`` as the first scope of the first resource: when a family name is written twice,
    the scrape keeps the first, so rl_otel's catalog-defined family wins over a stray SDK instrument."""
    scope = ScopeMetrics(scope=SCOPE, metrics=extra, schema_url="")
    if data is None or not data.resource_metrics:
        return MetricsData(resource_metrics=[ResourceMetrics(resource=resource, scope_metrics=[scope],
                                                             schema_url="")])
    first, *rest = data.resource_metrics
    return MetricsData(resource_metrics=[replace(first, scope_metrics=[scope, *first.scope_metrics]), *rest])


class StoreMetricReader(PrometheusMetricReader):
    """A PrometheusMetricReader whose every collection also carries rl_otel's own series."""

    def __init__(self, produce: Callable[[], list[Metric]], resource: Resource, registry: CollectorRegistry,
                 on_error: Callable[[str], None]) -> None:
        super().__init__(disable_target_info=False, scope_info_enabled=False, registry=registry)
        self._produce = produce
        self._resource = resource
        self._on_error = on_error

    def _receive_metrics(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs) -> None:
        try:
            extra = self._produce()
        except Exception:  # never break a scrape: serve what the SDK has
            _log.exception("rl_otel: collecting the series store failed")
            self._on_error("collect")
            extra = []
        super()._receive_metrics(merge(metrics_data, self._resource, extra), timeout_millis, **kwargs)


class ScrapeRegistry(CollectorRegistry):
    """Serializes scrapes and guarantees one family per name in each one."""

    def __init__(self, on_duplicate: Callable[[str], None]) -> None:
        super().__init__(auto_describe=False)
        self._scrape_lock = threading.Lock()
        self._on_duplicate = on_duplicate

    def collect(self) -> Iterator:
        with self._scrape_lock:
            families = list(super().collect())
        seen: set[str] = set()
        for family in families:
            if family.name in seen:
                self._on_duplicate(family.name)
                continue
            seen.add(family.name)
            yield family


class ScrapeEndpoint:
    """An HTTP(S) server serving ``registry`` on ``host:port/metrics``; ``close()`` is idempotent.

    ``web`` adds TLS, mTLS and basic auth (:mod:`rl_otel.exporters.webconfig`); ``port_search`` tries the next
    ports when ``port`` is taken (:func:`rl_otel.exporters.server.serve`)."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int, *, web: WebConfig | None = None,
                 port_search: int = 0) -> None:
        self._server, self._thread = serve(make_wsgi_app(registry), host, port, web=web, port_search=port_search)
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
