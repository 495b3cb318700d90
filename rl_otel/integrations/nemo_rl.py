"""NeMo-RL: a logger backend (``nemo_rl.utils.logger.LoggerInterface``) that serves the run's metrics to Prometheus.

NeMo-RL's ``Logger`` fans every call out to the backends in its ``loggers`` list. ``grpo.setup(...)`` returns the
``Logger`` (8th item of its tuple); add the backend before ``grpo_train``::

    from rl_otel.integrations.nemo_rl import attach

    policy, policy_generation, cluster, dataloader, val_dataloader, loss_fn, logger, *rest = setup(...)
    attach(logger, master_config, prometheus={"port": 9464})     # options: rl_otel.init's
    grpo_train(policy, policy_generation, dataloader, val_dataloader, tokenizer, loss_fn, task_to_env, ...,
               logger, ...)

Keys: NeMo-RL hands a backend bare names and a ``prefix`` (``train``, ``validation``, ``timing/train``...); the
backend logs ``f"{prefix}/{name}"``, as NeMo-RL's TensorBoard backend writes them. Steps: the step NeMo-RL passes
(``total_steps + 1``). The GPU monitor's calls (``prefix="ray"`` with a ``step_metric``) count seconds since the
start, not steps: they are logged at the last training step, without the ``step_metric`` key, so they never move
``rl_step``. ``log_hyperparams``, ``log_histogram`` and ``log_plot`` have nothing for Prometheus and are accepted.
``Logger.finish()`` finishes the backend (so does interpreter exit).

The run label is the run's own name: the ``run`` option, else the config's ``logger.wandb.name`` (or
``swanlab.name``, ``mlflow.run_name``), else ``$RL_OTEL_RUN``. Options: ``logger.rl_otel`` of the config, where it
has one, updated with the keyword arguments, checked when the backend is built (an unknown one is refused by
name). :func:`attach` checks the ``Logger`` is the shape relied on (:func:`check_logger`) and otherwise warns and
adds nothing. Nothing on the logging path raises: a failure is counted and logged once.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import os
import sys
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rl_otel.integrations import config_get, options_section, telemetry_from_options

if TYPE_CHECKING:
    from rl_otel.telemetry import Telemetry

FRAMEWORK = "nemo_rl"
CONFIG_KEY = "rl_otel"  # logger.rl_otel in NeMo-RL's master config
WHERE = "NeMo-RL's logger.rl_otel"
# LoggerInterface.log_metrics, as NeMo-RL's Logger calls it on each backend (positionally)
LOG_METRICS_PARAMETERS = ("metrics", "step", "prefix", "step_metric", "step_finished")
ABSTRACT_METHODS = frozenset({"log_metrics", "log_hyperparams", "log_histogram", "log_plot"})
_RUN_NAMES = (("wandb", "name"), ("swanlab", "name"), ("mlflow", "run_name"))
_log = logging.getLogger("rl_otel")


class NemoRLIncompatibleError(RuntimeError):
    """NeMo-RL's ``Logger`` / ``LoggerInterface`` is not the shape this backend relies on."""


class RLOtelLogger:
    """NeMo-RL's ``LoggerInterface`` over a :class:`rl_otel.Telemetry` (registered as a virtual subclass of
    ``LoggerInterface`` by :func:`attach` where NeMo-RL is importable).

    ``cfg`` is NeMo-RL's logger config (``master_config["logger"]``) or the whole master config; the run is named
    from it (``wandb.name``...) unless ``run`` is given. ``options`` are :func:`rl_otel.init` options, over
    ``cfg``'s ``rl_otel`` section.
    """

    telemetry: Telemetry | None = None

    def __init__(self, cfg: Any = None, *, run: str | None = None, **options: Any) -> None:
        logger_cfg = _logger_section(cfg)
        merged = {**options_from_config(logger_cfg), **options}
        log_dir = config_get(logger_cfg, "log_dir")
        stem = os.path.basename(os.path.normpath(str(log_dir))) if log_dir else None
        self._lock = threading.Lock()
        self._last_step: int | None = None
        self._finished = False
        self._failed = False
        self.telemetry = _framework_telemetry(WHERE, run or run_name(logger_cfg), merged, stem)

    def log_metrics(self, metrics: Mapping[str, Any], step: int, prefix: str | None = "",
                    step_metric: str | None = None, step_finished: bool = False) -> None:
        """One call of NeMo-RL's ``Logger.log_metrics``: keys as ``{prefix}/{name}``. Never raises."""
        telemetry = self.telemetry
        if telemetry is None or self._finished:
            return
        try:
            data = {(f"{prefix}/{name}" if prefix else str(name)): value for name, value in metrics.items()
                    if not (step_metric and name == step_metric)}
            with self._lock:
                if step_metric:  # the GPU monitor: seconds since the start, not a training step
                    at = self._last_step if self._last_step is not None else 0
                else:
                    at = int(step)
                    if self._last_step is None or at > self._last_step:
                        self._last_step = at
            telemetry.log(data, at)
        except Exception as exc:  # boundary: the framework's values and step (user objects)
            self._fail(exc)

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        """Hyperparameters have no Prometheus series: accepted, nothing exported."""

    def log_histogram(self, histogram: list[Any], step: int, name: str) -> None:
        """Accepted; NeMo-RL's histograms go to its wandb backend only."""

    def log_plot(self, figure: Any, step: int, name: str) -> None:
        """Figures have no Prometheus series: accepted, nothing exported."""

    def finish(self) -> None:
        """Flush the mirrored trackers and stop serving. Idempotent (``Logger.finish()`` and exit)."""
        if not self._finished:
            self._finished = True
            if self.telemetry is not None:
                self.telemetry.close()

    def _fail(self, exc: Exception) -> None:
        if not self._failed:
            self._failed = True
            _log.warning("rl_otel: NeMo-RL backend could not log a step (%s: %s); further failures are silent",
                         type(exc).__name__, exc)


def _framework_telemetry(where: str, run: str | None, options: Mapping[str, Any], stem: str | None) -> Telemetry:
    return telemetry_from_options(where, run, options, stem=stem, framework=FRAMEWORK)


def _logger_section(cfg: Any) -> Any:
    """The logger config, given it or the whole master config (which has a ``logger`` mapping)."""
    section = config_get(cfg, "logger")
    return section if isinstance(section, Mapping) else cfg


def run_name(logger_cfg: Any) -> str | None:
    """The run's name in NeMo-RL's logger config: ``wandb.name``, ``swanlab.name`` or ``mlflow.run_name``."""
    for backend, key in _RUN_NAMES:
        name = config_get(config_get(logger_cfg, backend), key)
        if name:
            return str(name)
    return None


def options_from_config(logger_cfg: Any) -> dict[str, Any]:
    """The ``rl_otel`` section of NeMo-RL's logger config as plain data (``{}`` where absent)."""
    return options_section(logger_cfg, (CONFIG_KEY,), f"NeMo-RL's logger.{CONFIG_KEY}")


def check_logger(logger: Any, interface: Any = None) -> list[str]:
    """What keeps :func:`attach` from adding a backend to ``logger`` (``[]``: nothing).

    It relies on: ``logger.loggers``, a list that ``Logger.log_metrics`` calls each entry of as
    ``log_metrics(metrics, step, prefix, step_metric, step_finished)``; ``Logger.finish()``; and
    ``LoggerInterface`` (``interface``, default NeMo-RL's where importable) having the abstract methods
    :data:`ABSTRACT_METHODS` with that ``log_metrics`` signature.
    """
    problems = []
    if not isinstance(getattr(logger, "loggers", None), list):
        problems.append("no list 'loggers' of backends")
    if not callable(getattr(logger, "finish", None)):
        problems.append("no finish()")
    if interface is None:
        interface = getattr(sys.modules.get("nemo_rl.utils.logger"), "LoggerInterface", None)
    if interface is not None:
        abstract = set(getattr(interface, "__abstractmethods__", ()))
        if abstract - ABSTRACT_METHODS:
            extra = sorted(abstract - ABSTRACT_METHODS)
            problems.append(f"LoggerInterface has abstract methods rl_otel lacks: {extra}")
        try:
            parameters = list(inspect.signature(interface.log_metrics).parameters)[1:]
        except (AttributeError, TypeError, ValueError):
            parameters = []
        if parameters[:len(LOG_METRICS_PARAMETERS)] != list(LOG_METRICS_PARAMETERS):
            problems.append(f"LoggerInterface.log_metrics takes {parameters}, not {list(LOG_METRICS_PARAMETERS)}")
    return problems


def attach(logger: Any, cfg: Any = None, **options: Any) -> RLOtelLogger | None:
    """Add an :class:`RLOtelLogger` to NeMo-RL's ``Logger`` (``logger.loggers``) and return it.

    ``cfg``: the master config or its ``logger`` section (names the run, may hold ``rl_otel`` options);
    ``options``: :func:`rl_otel.init` options (``run`` too). Idempotent: a second call returns the backend
    already there. A ``Logger`` that is not the shape relied on (:func:`check_logger`) gets nothing: a warning,
    and ``None``. Raises ConfigurationError on a bad option (before anything is added).
    """
    for backend in getattr(logger, "loggers", None) or ():
        if isinstance(backend, RLOtelLogger):
            return backend
    module = sys.modules.get("nemo_rl.utils.logger")
    if module is None:
        try:
            module = importlib.import_module("nemo_rl.utils.logger")
        except Exception:  # boundary: importing NeMo-RL
            module = None
    interface = getattr(module, "LoggerInterface", None)
    problems = check_logger(logger, interface)
    if problems:
        version = getattr(sys.modules.get("nemo_rl"), "__version__", "?")
        _log.warning("rl_otel: cannot add its backend to NeMo-RL %s's Logger: %s. Its metrics are not served to "
                     "Prometheus", version, "; ".join(problems))
        return None
    if interface is not None:
        try:
            interface.register(RLOtelLogger)  # isinstance(backend, LoggerInterface)
        except Exception:  # boundary: NeMo-RL's ABC registration
            pass
    backend = RLOtelLogger(cfg, **options)
    logger.loggers.append(backend)
    return backend
