"""The typed configuration a Telemetry runs with: :class:`TelemetryConfig`, every option of
:data:`~rl_otel._internal.runtime.options.OPTIONS` in its checked form (each option's check is defined with the
option, in ``options.py``, and fills the field of its name; ``tests/test_architecture.py`` holds the two to each
other and to ``init()``'s signature)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rl_otel._internal.exporters.engines import EnginesConfig
    from rl_otel._internal.exporters.otlp import OtlpConfig
    from rl_otel._internal.exporters.webconfig import WebConfig
    from rl_otel._internal.tracing.config import TracingConfig
    from rl_otel._internal.trackers.config import TrackerSpec


@dataclass(frozen=True)
class PrometheusConfig:
    """Where and how the scrape endpoint serves; ``port`` already includes the local rank (see
    :func:`rl_otel._internal.runtime.ranks.serving_port`). The settings' defaults are
    :data:`~rl_otel._internal.runtime.options.PROMETHEUS_DEFAULTS`, applied by the option's check; ``None``: the
    feature is off."""

    host: str
    port: int
    port_search: int  # on a taken port, try the next ``port_search`` ports
    file_sd: str | None  # a directory (or .json/.yml file) to publish the target in
    advertise_host: str | None  # the host name written in the targets file
    web: WebConfig | None = None  # TLS / mTLS / basic auth, from an exporter-toolkit web-config file


@dataclass(frozen=True)
class TelemetryConfig:
    """Every option of :data:`~rl_otel._internal.runtime.options.OPTIONS` in its checked form (``prometheus``,
    ``tracing``, ``otlp``: their resolved configs; ``trackers``: the specs of ``track_with``/``tracker_kwargs``/
    ``trackers``), plus what the environment says (host, local rank, world size). No field has a default: an
    option's default is written once, in ``OPTIONS``, and :func:`~rl_otel._internal.runtime.options.build_config`
    fills every field."""

    run: str
    rank: int
    role: str
    host_name: str
    prometheus: PrometheusConfig | None
    max_series_per_metric: int
    max_unknown_keys: int
    series_ttl_s: float | None
    tracing: TracingConfig | None
    trackers: tuple[TrackerSpec, ...]
    tracker_ranks: int | str | frozenset[int]
    handle_sigterm: bool
    sink_queue_size: int
    submit_queue_size: int
    close_timeout_s: float
    otlp: OtlpConfig | None
    local_rank: int  # from LOCAL_RANK (see rl_otel._internal.runtime.ranks); on the OTel resource, not a label
    world_size: int
    resource: tuple[tuple[str, object], ...]  # init(resource=...): OTel resource attributes, over OTEL_*
    tracer_provider: Any  # init(tracer_provider=...): the user's, used instead of rl_otel's own
    hang_factor: float  # a phase is stuck past max(hang_factor x its hang_quantile, hang_min_s)
    hang_quantile: float
    hang_min_s: float | None  # None: no dumps for stuck phases
    stack_dump_signal: int | None  # the signal number of on-demand dumps (None: none)
    stack_dump_dir: str  # absolute once resolved by build_config
    stack_dump_http: bool  # GET /debug/stacks on the scrape endpoint
    phase_memory: bool  # phases take memory snapshots (phase(..., memory=) per phase)
    phase_peaks: bool  # the outermost phase resets torch's peak memory statistics
    phase_gpu_time: bool  # CUDA events at the phases' edges
    engines: EnginesConfig | None  # the engine families served (None: none), exporters/engines.py

    @property
    def base_labels(self) -> dict[str, str]:
        """The labels of every series this process serves: run, role and rank (two roles of one run, such as
        Trinity's explorer and trainer, are told apart on every series)."""
        return {"run": self.run, "role": self.role, "rank": str(self.rank)}
