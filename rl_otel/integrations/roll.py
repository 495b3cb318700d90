"""A ROLL tracker: ``track_with: rl_otel`` in a ROLL pipeline YAML serves the run's metrics to Prometheus.

ROLL builds trackers from a registry dict by name, as ``tracker_registry[track_with](config, **tracker_kwargs)``,
then calls ``log(values, step)`` every step and ``finish()`` at the end. Register once, before the pipeline
starts::

    from rl_otel.integrations.roll import register
    register()                       # adds "rl_otel" to roll.utils.tracking.tracker_registry; ROLL's phases as spans

and in the YAML (``tracker_kwargs`` are :func:`rl_otel.init` options; ``trackers`` mirrors as ROLL would)::

    track_with: rl_otel
    tracker_kwargs:
      prometheus: {port: 9464}
      trackers: {tensorboard: {log_dir: ./tb}}

- **Phases as spans**: ``tracker_kwargs: {tracing: {exporter: jsonl, path: spans.jsonl}}`` (or ``otlp``,
  ``console``) exports ``Telemetry.phase()``'s spans and ROLL's own phases (``state_offload_manger``, in the driver
  and in every worker of the clusters built after the tracker) alike: configured once, here
  (:mod:`rl_otel.integrations.roll_phases`).
- **Resume**: with ``resume_from_checkpoint``, ROLL's ``resume_metrics`` replays the saved ``log_history`` through
  ``log()`` from a thread pool, possibly while the first resumed steps are logged (the DPO pipeline logs before
  its first ``do_checkpoint`` waits for the replay). The mirrored trackers get every replayed step; on the
  endpoint a replayed step below the highest step logged sets nothing back - ``rl_step`` never goes back, no
  counter decreases, no gauge returns to an old value (see :meth:`rl_otel.Telemetry.log`). A replay that comes
  before the first new step, as in RLVR and agentic, is in step order and exported as it goes, ending at the
  checkpoint's step. The replay's thread waits for a mirrored
  tracker that falls behind (``sink_queue_size`` steps) instead of dropping steps; the pipeline thread never
  waits.
- **Shutdown**: ROLL never calls ``finish()``. The Telemetry closes itself at interpreter exit - the trackers
  write what is queued and close, the endpoint stops - so nothing logged is lost on a normal exit.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, MutableMapping
from typing import TYPE_CHECKING, Any, cast

from rl_otel.integrations import telemetry_from_options

if TYPE_CHECKING:
    from rl_otel.telemetry import Telemetry

NAME = "rl_otel"


class RLOtelTracker:
    """ROLL's tracker interface over a :class:`rl_otel.Telemetry`.

    ``config`` is the pipeline config ROLL passes (its ``exp_name`` names the run unless ``run`` is given);
    ``kwargs`` are ROLL's ``tracker_kwargs``: :func:`rl_otel.init` options. ROLL's reducer tags
    (``actor/pg_loss@sum``) and its ``time/``/``memory/`` keys are understood as they are.
    """

    def __init__(self, config: dict | None = None, **kwargs: Any) -> None:
        run = config.get("exp_name") if isinstance(config, dict) else None
        self.telemetry = telemetry_from_options("ROLL's tracker_kwargs", run, kwargs)
        self._pipeline_thread = threading.get_ident()  # ROLL builds the tracker where the pipeline runs
        trace_roll_phases(self.telemetry, kwargs)

    def log(self, values: dict, step: int | None, **kwargs: Any) -> None:
        """One step's metrics (extra keyword arguments ROLL may pass are ignored). Never raises. A call from
        another thread than the pipeline's - ``resume_metrics`` on ROLL's executor, a burst of the whole history -
        waits for a mirrored tracker that falls behind instead of losing steps; the pipeline's own never waits."""
        self.telemetry.log(values, step, wait_for_trackers=threading.get_ident() != self._pipeline_thread)

    def log_traces(self, name: str, records: list[dict], step: int | None = None) -> None:
        """ROLL's ``BaseTracker.log_traces`` (conversation records for trace viewers such as Trackio): not
        metrics, so there is nothing to export; accepted so a pipeline calling it on every tracker keeps running."""

    def finish(self) -> None:
        """Flush the mirrored trackers and stop serving. Idempotent. ROLL itself never calls it: the Telemetry
        does the same at interpreter exit."""
        self.telemetry.close()


def trace_roll_phases(telemetry: Telemetry, options: Mapping[str, Any]) -> None:
    """When the tracker's options configure tracing (``tracing``, or ``tracer_provider`` in code), ROLL's phases
    become spans where ``telemetry``'s phases go: in this process on ``telemetry.tracer_provider``, in the workers
    of Clusters built later on a Telemetry of their own with the same run and ``tracing`` (a ``jsonl`` path made
    absolute: a worker may run elsewhere); a ``SpanExporter`` object cannot travel to them, so they keep their
    own provider then. See :func:`rl_otel.integrations.roll_phases.use_tracing`."""
    config = telemetry.config
    if config.tracing is None and config.tracer_provider is None:
        return
    from rl_otel.integrations import roll_phases

    # tracker_kwargs only: ROLL passes its pipeline config as config=, so they cannot name an rl_otel config file
    tracing, resource = options.get("tracing"), options.get("resource")
    worker: dict[str, Any] | None = None
    if isinstance(tracing, (str, Mapping)):
        if isinstance(tracing, Mapping):
            tracing = dict(tracing)
            if tracing.get("path") is not None:
                tracing["path"] = os.path.abspath(os.fspath(tracing["path"]))
        worker = {"run": config.run, "tracing": tracing, "prometheus": False, "handle_sigterm": False}
        if isinstance(resource, Mapping):
            worker["resource"] = dict(resource)
    roll_phases.use_tracing(telemetry.tracer_provider, worker, run=config.run)


def register(registry: MutableMapping[str, Any] | None = None, name: str = NAME, *, phases: bool = True) -> None:
    """Add :class:`RLOtelTracker` to ROLL's tracker registry (default ``roll.utils.tracking.tracker_registry``).

    ``phases`` (default on, with ROLL's own registry): ROLL's ``state_offload_manger`` blocks in every worker the
    pipeline's clusters start also make rl_otel's phase spans (:mod:`rl_otel.integrations.roll_phases`); a ROLL
    whose code differs from what that relies on is warned about once and left as it is."""
    if registry is None:
        from roll.utils.tracking import tracker_registry

        registry = cast("MutableMapping[str, Any]", tracker_registry)  # ROLL's dict of tracker classes
        if phases:
            from rl_otel.integrations import roll_phases

            roll_phases.install()  # never raises: a changed ROLL is warned about and left unpatched
    registry[name] = RLOtelTracker
