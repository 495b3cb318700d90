"""Who a process is: its OTel resource and the info series that state it on the scrape endpoint
(``rl_otel_build_info{version}``, ``target_info`` from the resource's attributes, Prometheus' convention). One
place for both a training process (``runtime/components.py``) and each run ``rl-otel watch`` serves
(``watch/served.py``).
"""

from __future__ import annotations

from collections.abc import Mapping

from rl_otel._internal.exporters.otel_env import ResolvedResource, resolve_resource
from rl_otel._internal.exporters.textformat import target_info_labels
from rl_otel._internal.pipeline.records import Batch, Info
from rl_otel._internal.runtime.config import TelemetryConfig
from rl_otel._version import __version__
from rl_otel.catalog import meta


def resource_of(*, host_name: str, run: str, role: str, rank: int, own: Mapping[str, object],
                explicit: Mapping[str, object] | None = None, host_attribute: bool = True) -> ResolvedResource:
    """A process's resource: explicit (``init(resource=)``) > ``OTEL_SERVICE_NAME`` > ``OTEL_RESOURCE_ATTRIBUTES``
    > rl_otel's defaults (``service.*``, ``host.name`` unless ``host_attribute`` is False) and ``own`` (its
    ``rl.*`` attributes)."""
    defaults: dict[str, object] = {"service.name": "rl_otel", "service.version": __version__,
                                   "service.instance.id": f"{host_name}/{run}/{role}/{rank}"}
    if host_attribute:
        defaults["host.name"] = host_name
    return resolve_resource(defaults, {"rl.run": run, "rl.rank": rank, "rl.role": role, **own}, dict(explicit or {}))


def process_resource(config: TelemetryConfig) -> ResolvedResource:
    """A training process's resource (the SDK ``Resource`` object itself is built when something needs it)."""
    return resource_of(host_name=config.host_name, run=config.run, role=config.role, rank=config.rank,
                       own={"rl.local_rank": config.local_rank, "rl.world_size": config.world_size},
                       explicit=dict(config.resource))


def info_batch(resource: ResolvedResource) -> Batch:
    """The write of the process's info series: ``rl_otel_build_info`` and ``target_info`` (only its own labels)."""
    return Batch([], infos=(Info(meta.BUILD_INFO, (("version", __version__),)),
                            Info(meta.TARGET_INFO, target_info_labels(resource.attributes), own_labels=True)))
