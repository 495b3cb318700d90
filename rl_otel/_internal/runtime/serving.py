"""The scrape endpoint of a recorder (or of several, merged), and its file_sd targets file: what a Telemetry and
``rl-otel watch`` both serve through."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from rl_otel._internal.exporters.admission import Limits
from rl_otel._internal.exporters.file_sd import TargetsFile, targets_path
from rl_otel._internal.exporters.prometheus import Collect, ScrapeEndpoint, ScrapeRegistry
from rl_otel._internal.runtime.config import PrometheusConfig


def scrape_registry(collect: Collect, count: Callable[[str], None], clock: Callable[[], int], *,
                    routes: Mapping[str, Callable[[], str]] | None = None,
                    exemplars: Callable[[], dict] | None = None) -> ScrapeRegistry:
    """A registry serving ``collect(settle=, on_error=)``; what a scrape absorbs is counted as ``count(reason)``
    (``rl_telemetry_errors_total{sink="prometheus"}``), a second family of one name as ``duplicate_family``;
    ``routes``, ``exemplars``: :class:`~rl_otel._internal.exporters.prometheus.ScrapeRegistry`'s."""
    return ScrapeRegistry(on_duplicate=lambda name: count("duplicate_family"), collect=collect, on_error=count,
                          clock=clock, routes=routes, exemplars=exemplars)


def publish(prom: PrometheusConfig, endpoint: ScrapeEndpoint, *, host_name: str, run: str, rank: int, role: str,
            labels: Mapping[str, str]) -> TargetsFile | None:
    """The file_sd targets file of ``endpoint`` (``None`` when ``prom.file_sd`` is not set), its target group
    labelled with ``labels``; raises ConfigurationError when it cannot be written."""
    if prom.file_sd is None:
        return None
    host = prom.advertise_host or (host_name if prom.host in ("", "0.0.0.0", "::") else prom.host)
    host = f"[{host}]" if ":" in host else host
    target = f"{host}:{endpoint.port}"
    path = targets_path(prom.file_sd, run, rank, role=role, host=host_name, target=target)
    return TargetsFile(path, target, dict(labels), owner=host_name)


class Served:
    """An endpoint serving ``collect`` and its file_sd targets file, started and closed together (what each of
    ``rl-otel watch``'s endpoints is: the shared one, or a run's own with ``--port-per-run``). The endpoint is
    closed again when its targets file cannot be written; ``close()`` is idempotent. ``limits``: the endpoint's
    (``None``: a training process's, with its CPU budget of 4% of a core)."""

    def __init__(self, prom: PrometheusConfig, collect: Collect, count: Callable[[str], None],
                 clock: Callable[[], int], *, host_name: str, run: str, rank: int, role: str,
                 labels: Mapping[str, str], limits: Limits | None = None) -> None:
        self.endpoint: ScrapeEndpoint | None = ScrapeEndpoint(scrape_registry(collect, count, clock), prom.host,
                                                              prom.port, port_search=prom.port_search,
                                                              limits=limits)
        try:
            self.targets = publish(prom, self.endpoint, host_name=host_name, run=run, rank=rank, role=role,
                                   labels=labels)
        except BaseException:  # boundary: the OS/Ray publishing targets: the endpoint closed, re-raised
            self.endpoint.close()
            raise
        self.url = self.endpoint.url

    def close(self) -> None:
        if self.targets is not None:
            self.targets.close()
            self.targets = None
        if self.endpoint is not None:
            self.endpoint.close()
            self.endpoint = None
