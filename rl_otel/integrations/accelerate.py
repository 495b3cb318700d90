"""An accelerate tracker: ``Accelerator(log_with=[RLOtelTracker("run")])`` serves ``accelerator.log()`` to
Prometheus, beside (or instead of) accelerate's own trackers::

    from accelerate import Accelerator
    from rl_otel.integrations.accelerate import RLOtelTracker

    accelerator = Accelerator(log_with=[RLOtelTracker("my-run", prometheus={"port": 9464})])
    accelerator.init_trackers("my-project", config={"lr": 1e-4})
    accelerator.log({"train/loss": loss}, step=step)
    accelerator.end_training()

What each rank does: accelerate runs ``init_trackers`` and ``log`` on the main process only (they are
``@on_main_process``), and ``end_training`` finishes only the trackers ``init_trackers`` started. So under
``accelerate launch``/``torchrun`` the main process (rank 0) starts the Telemetry, serves on the port and mirrors
to the trackers; on every other rank accelerate never starts nor calls the tracker, and
``accelerator.get_tracker("rl_otel")`` there hands back accelerate's blank ``GeneralTracker``, whose ``log`` does
nothing. To serve every rank's values, keep the tracker object you passed to ``log_with`` and call it on every
rank (``tracker.log(values, step)``, or ``tracker.tracker`` for the :class:`rl_otel.Telemetry`)::

    tracker = RLOtelTracker("my-run", prometheus={"port": 9464})
    accelerator = Accelerator(log_with=[tracker])
    accelerator.init_trackers("my-project")
    tracker.log({"train/loss": loss}, step=step)      # every rank: served on 9464 + LOCAL_RANK

Call it instead of ``accelerator.log`` (on rank 0 both reach the same tracker). It starts on first use on any
rank and mirrors to no tracker except on rank 0 (``tracker_ranks=``). A tracker that
``end_training`` does not finish is closed at process exit. The options are checked when the tracker is built; a
taken port is served on a free one further on, in steps of ``LOCAL_WORLD_SIZE`` (a warning names it).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from rl_otel.sinks.base import missing_dependency

try:
    from accelerate.tracking import GeneralTracker
except ImportError as e:
    raise missing_dependency("accelerate", "accelerate") from e

from rl_otel.integrations import check_options, telemetry_from_options

if TYPE_CHECKING:
    from rl_otel.telemetry import Telemetry

_log = logging.getLogger("rl_otel")


class RLOtelTracker(GeneralTracker):
    """accelerate's ``GeneralTracker`` over a :class:`rl_otel.Telemetry`, started by ``start()`` (which
    ``init_trackers`` calls on the main process) or on first use.

    ``options`` are :func:`rl_otel.init` options. ``store_init_configuration`` keeps the hyper-parameters on
    ``self.config`` only: Prometheus has no place for them (use a mirrored tracker's own hparams).
    """

    name = "rl_otel"
    requires_logging_directory = False
    main_process_only = False

    def __init__(self, run_name: str | None = None, **options: Any) -> None:
        super().__init__()
        self.run_name, self._options = run_name, check_options("RLOtelTracker", options, run_name)
        self._failed = False
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
        """One step's metrics; on a rank accelerate did not start the tracker on, the first call starts it.
        Never raises: a Telemetry that cannot start is a warning, and nothing is logged."""
        if self._telemetry is None and not self._failed:
            try:
                self.start()
            except Exception as exc:  # boundary: starting Telemetry inside accelerate's loop (config, OS, network)
                self._failed = True
                _log.warning("rl_otel: RLOtelTracker could not start (%s: %s); nothing is logged",
                             type(exc).__name__, exc)
        if self._telemetry is not None:
            self._telemetry.log(values, step)

    def finish(self) -> None:
        """Flush the mirrored trackers and stop serving. Idempotent."""
        if self._telemetry is not None:
            self._telemetry.close()
