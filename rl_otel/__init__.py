"""rl_otel: RL training observable like a production service - OpenTelemetry data, a Prometheus endpoint.

``import rl_otel`` is light: the OTel SDK, the exporter and numpy load on first use of ``init``/``Telemetry``;
torch, tensorboard, wandb, swanlab and pynvml only when a feature needs them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rl_otel._version import __version__
from rl_otel.errors import ConfigurationError, PortInUseError

if TYPE_CHECKING:
    from rl_otel.catalog import Catalog
    from rl_otel.core.telemetry import Telemetry

__all__ = ["Catalog", "ConfigurationError", "PortInUseError", "Telemetry", "__version__", "default_catalog", "init"]


def init(
    run: str | None = None,
    *,
    rank: int | None = None,
    role: str = "trainer",
    prometheus: dict[str, Any] | bool | None = True,
    catalog: Catalog | None = None,
    max_series_per_metric: int = 10_000,
    max_unknown_keys: int = 1_000,
    series_ttl_s: float | None = None,
    tracing: Any = None,
) -> Telemetry:
    """Create the process's :class:`Telemetry` and start its scrape endpoint.

    Args:
        run: the run's name, a label on every series (default: ``$RL_OTEL_RUN``, else a timestamp).
        rank: the process's rank, a label on every series (default: ``$RANK``, else 0).
        role: what this process does (trainer, actor, rollout, ...), recorded on the OTel resource.
        prometheus: ``{"host": ..., "port": ...}`` for the scrape endpoint (default ``0.0.0.0:9464``; port 0
            picks a free port, see ``Telemetry.metrics_url``), ``True`` for the defaults, ``False`` for none.
        catalog: the metric catalog (default: :func:`default_catalog`).
        max_series_per_metric: cap on label sets per metric; past it new series are dropped and counted.
        max_unknown_keys: cap on keys without a catalog entry exported through the fallback gauge.
        series_ttl_s: forget a series not written for this many seconds (``None``: keep; liveness never expires).
        tracing: where ``phase()`` spans go: ``None`` (nowhere), ``"console"`` (JSON lines on stderr),
            ``{"exporter": "jsonl", "path": ...}``, ``{"exporter": "otlp", "endpoint": ..., "protocol":
            "http/protobuf" | "grpc"}`` (needs ``pip install 'rl-otel[otlp]'``) or a ``SpanExporter``.

    Raises:
        ConfigurationError: a bad argument (the message names it); PortInUseError when the port is taken.
    """
    from rl_otel.catalog import default_catalog as _default_catalog
    from rl_otel.core.config import build_config
    from rl_otel.core.telemetry import Telemetry as _Telemetry

    config = build_config(run=run, rank=rank, role=role, prometheus=prometheus,
                          max_series_per_metric=max_series_per_metric, max_unknown_keys=max_unknown_keys,
                          series_ttl_s=series_ttl_s, tracing=tracing)
    return _Telemetry(config, catalog if catalog is not None else _default_catalog())


def __getattr__(name: str) -> Any:
    if name == "Telemetry":
        from rl_otel.core.telemetry import Telemetry

        return Telemetry
    if name in ("Catalog", "default_catalog"):
        from rl_otel import catalog

        return getattr(catalog, name)
    raise AttributeError(f"module 'rl_otel' has no attribute {name!r}")
