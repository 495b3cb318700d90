"""An accelerate tracker: ``Accelerator(log_with=[RLOtelTracker("run")])`` serves ``accelerator.log()`` to
Prometheus, beside (or instead of) accelerate's own trackers::

    from accelerate import Accelerator
    from rl_otel.integrations.accelerate import RLOtelTracker

    accelerator = Accelerator(log_with=[RLOtelTracker("my-run", prometheus={"port": 9464})])
    accelerator.init_trackers("my-project", config={"lr": 1e-4})
    accelerator.log({"train/loss": loss}, step=step)
    accelerator.end_training()

``accelerator.log`` runs on the main process only; other ranks can log through ``tracker.tracker.log(...)``
(``main_process_only`` is False, so the tracker starts on every rank and each serves its own endpoint).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rl_otel.sinks.base import missing_dependency

try:
    from accelerate.tracking import GeneralTracker
except ImportError as e:
    raise missing_dependency("accelerate", "accelerate") from e

from rl_otel.integrations import telemetry_from_options

if TYPE_CHECKING:
    from rl_otel.core.telemetry import Telemetry


class RLOtelTracker(GeneralTracker):
    """accelerate's ``GeneralTracker`` over a :class:`rl_otel.Telemetry`, started lazily in ``start()``.

    ``options`` are :func:`rl_otel.init` options. ``store_init_configuration`` keeps the hyper-parameters on
    ``self.config`` only: Prometheus has no place for them (use a mirrored tracker's own hparams).
    """

    name = "rl_otel"
    requires_logging_directory = False
    main_process_only = False

    def __init__(self, run_name: str | None = None, **options: Any) -> None:
        super().__init__()
        self.run_name, self._options = run_name, options
        self._telemetry: Telemetry | None = None
        self.config: dict[str, Any] = {}

    def start(self) -> None:
        if self._telemetry is None:
            self._telemetry = telemetry_from_options("RLOtelTracker", self.run_name, self._options)

    @property
    def tracker(self) -> Telemetry:
        """The :class:`rl_otel.Telemetry` (started on first use)."""
        self.start()
        return self._telemetry  # type: ignore[return-value]

    def store_init_configuration(self, values: dict) -> None:
        self.config = dict(values)

    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """One step's metrics. Never raises."""
        self.tracker.log(values, step)

    def finish(self) -> None:
        """Flush the mirrored trackers and stop serving. Idempotent."""
        if self._telemetry is not None:
            self._telemetry.close()
