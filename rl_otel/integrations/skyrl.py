"""SkyRL: the trainer's tracker also serves its metrics to Prometheus, through ``BasePPOExp.get_tracker()``.

SkyRL's experiment builds its tracker in one overridable method, ``BasePPOExp.get_tracker()`` (a
``skyrl.train.utils.tracking.Tracking`` for ``trainer.logger``). Put :class:`RLOtelExpMixin` before the
experiment class and the trainer's tracker logs to rl_otel as well as to the backend ``trainer.logger`` names::

    from skyrl.train.entrypoints.main_base import BasePPOExp
    from rl_otel.integrations.skyrl import RLOtelExpMixin

    class Exp(RLOtelExpMixin, BasePPOExp):
        rl_otel_options = {"prometheus": {"port": 9464}}   # optional: any rl_otel.init option

Or wrap a tracker by hand (a custom entrypoint, ``main_generate``):
``tracker = rl_otel_tracker(cfg, Tracking(...), prometheus={"port": 9464})``.

The run label is ``trainer.run_name``. The tracker the trainer gets is a :class:`RLOtelTracking`: ``log(data,
step, commit=False)`` goes to SkyRL's own tracker first, exactly as before (its exceptions are its own and
propagate), then to rl_otel, which never raises. The sync trainer logs once per step (``commit=True``), the
fully-async one twice (metrics with ``commit=False``, then timings with ``commit=True``): both reach rl_otel at
the same step, as soon as they are logged. Everything else (``finish``, ``log_exception``,
``log_samples_to_table``, ``backend``, ``logger``) is SkyRL's tracker's; ``finish()`` also flushes rl_otel's
mirrored trackers and stops its endpoint (as does interpreter exit).

Options: ``rl_otel_options`` (the mixin), the keyword arguments of :func:`rl_otel_tracker`, and a
``trainer.rl_otel`` mapping in the config where the config has one (a ``DictConfig``); all are
:func:`rl_otel.init` options, checked when the tracker is built (an unknown one is refused by name). A tracker
that is not the shape relied on (:func:`check_tracker`) is returned unchanged, with a warning.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from rl_otel.integrations import config_get, options_section, telemetry_from_options

if TYPE_CHECKING:
    from rl_otel.telemetry import Telemetry

FRAMEWORK = "skyrl"
CONFIG_KEY = "rl_otel"  # trainer.rl_otel, where a config has it
WHERE = "SkyRL's tracker"
# what the trainer calls on its tracker and this relies on in the wrapped one
LOG_PARAMETERS = ("data", "step")
_log = logging.getLogger("rl_otel")


def framework_telemetry(where: str, run: str | None, options: Mapping[str, Any], framework: str, *,
                        stem: str | None = None) -> Telemetry:
    """:func:`rl_otel.integrations.telemetry_from_options`, naming the framework where it takes one."""
    return telemetry_from_options(where, run, options, stem=stem, framework=framework)


def check_tracker(tracker: Any) -> list[str]:
    """What keeps ``tracker`` from being wrapped (``[]``: nothing): SkyRL's trainer calls
    ``log(data, step=..., commit=...)`` and ``finish()``."""
    problems = []
    log = getattr(tracker, "log", None)
    if not callable(log):
        problems.append("no log()")
    else:
        try:
            parameters = inspect.signature(log).parameters
        except (TypeError, ValueError):
            parameters = None
        if parameters is not None and not any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
            missing = [p for p in LOG_PARAMETERS if p not in parameters]
            if missing:
                problems.append(f"log{inspect.signature(log)} lacks {missing}")
    if not callable(getattr(tracker, "finish", None)):
        problems.append("no finish()")
    return problems


class RLOtelTracking:
    """SkyRL's tracker interface: ``tracking`` (SkyRL's ``Tracking``, or ``None`` for rl_otel alone) and a
    :class:`rl_otel.Telemetry` named ``run_name`` unless a ``run`` option names it. Any other attribute is
    ``tracking``'s."""

    telemetry: Telemetry | None = None
    tracking: Any = None

    def __init__(self, tracking: Any = None, run_name: str | None = None, /, **options: Any) -> None:
        self.tracking = tracking
        self._finished = False
        self._accepts_commit = _accepts(tracking, "commit")
        self.telemetry = framework_telemetry(WHERE, run_name, options, FRAMEWORK)

    def log(self, data: Mapping[str, Any], step: int | None = None, commit: bool = False, **kwargs: Any) -> None:
        """SkyRL's tracker first (as before: its exceptions propagate), then rl_otel (never raises)."""
        try:
            if self.tracking is not None:
                if self._accepts_commit:
                    self.tracking.log(data, step, commit=commit, **kwargs)
                else:
                    self.tracking.log(data, step, **kwargs)
        finally:
            telemetry = self.telemetry
            if telemetry is not None:
                telemetry.log(data, step)  # never raises

    def finish(self) -> None:
        """SkyRL's tracker's ``finish()``, then rl_otel's (flush the mirrored trackers, stop the endpoint).
        rl_otel's part runs once."""
        try:
            if self.tracking is not None:
                self.tracking.finish()
        finally:
            if not self._finished:
                self._finished = True
                if self.telemetry is not None:
                    self.telemetry.close()

    def __getattr__(self, name: str) -> Any:
        # only for what this class does not define: log_exception, log_samples_to_table, backend, logger...
        tracking = self.__dict__.get("tracking")
        if tracking is None:
            raise AttributeError(name)
        return getattr(tracking, name)


def _accepts(obj: Any, parameter: str) -> bool:
    try:
        parameters = inspect.signature(obj.log).parameters
    except (AttributeError, TypeError, ValueError):
        return False
    return parameter in parameters or any(p.kind is p.VAR_KEYWORD for p in parameters.values())


def options_from_config(cfg: Any) -> dict[str, Any]:
    """``trainer.rl_otel`` of SkyRL's config as plain data (``{}`` where the config has none)."""
    return options_section(cfg, ("trainer", CONFIG_KEY), f"SkyRL's trainer.{CONFIG_KEY}")


def rl_otel_tracker(cfg: Any = None, tracking: Any = None, **options: Any) -> Any:
    """``tracking`` (SkyRL's tracker; ``None``: rl_otel alone) wrapped so that it logs to rl_otel too.

    The run is ``cfg.trainer.run_name`` unless a ``run`` option names it; options are ``cfg``'s
    ``trainer.rl_otel`` updated with ``options``. A ``tracking`` that is not the shape SkyRL's trainer uses
    (:func:`check_tracker`) is returned as it is, with a warning. Raises ConfigurationError on a bad option.
    """
    if tracking is not None:
        problems = check_tracker(tracking)
        if problems:
            _log.warning("rl_otel: SkyRL's tracker %r is not the shape rl_otel wraps (%s); its metrics are not "
                         "served to Prometheus", type(tracking).__name__, "; ".join(problems))
            return tracking
    run = config_get(config_get(cfg, "trainer"), "run_name")
    merged = {**options_from_config(cfg), **options}
    wrapped = RLOtelTracking(tracking, str(run) if run else None, **merged)
    if wrapped.telemetry is not None:
        publish_remote_engines(wrapped.telemetry, cfg)
    return wrapped


def remote_engine_urls(cfg: Any) -> list[str]:
    """The inference engine servers of SkyRL's config (``generator.remote_inference_engine_urls``, ``host:port``
    each) when it runs none locally (``generator.run_engines_locally: false``); ``[]`` otherwise."""
    generator = config_get(cfg, "generator")
    if generator is None or config_get(generator, "run_engines_locally") is not False:
        return []
    urls = config_get(generator, "remote_inference_engine_urls") or []
    if isinstance(urls, str):  # one URL given as a string (an OmegaConf ListConfig iterates like a list)
        urls = [urls]
    try:
        return [str(u) for u in urls]
    except TypeError:
        return []


def publish_remote_engines(telemetry: Telemetry, cfg: Any) -> None:
    """Each remote engine server of SkyRL's config as a scrape target of the run (``tel.engine``, named
    ``engine-<i>``; docs/engines.md). A URL rl_otel cannot read is said and skipped: the trainer goes on."""
    for i, url in enumerate(remote_engine_urls(cfg)):
        try:
            telemetry.engine(url, name=f"engine-{i}")
        except ValueError as exc:
            _log.warning("rl_otel: SkyRL's remote inference engine %r is not published for scraping: %s", url, exc)


class RLOtelExpMixin:
    """Put before SkyRL's ``BasePPOExp`` (or a subclass): ``get_tracker()`` returns the experiment's own tracker
    wrapped by :func:`rl_otel_tracker` with :attr:`rl_otel_options`."""

    rl_otel_options: ClassVar[Mapping[str, Any]] = {}
    cfg: Any

    def get_tracker(self) -> Any:
        tracker = super().get_tracker()  # type: ignore[misc]  # the experiment class after this mixin
        return rl_otel_tracker(getattr(self, "cfg", None), tracker, **dict(self.rl_otel_options))
