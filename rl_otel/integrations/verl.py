"""verl: ``trainer.logger=[console,rl_otel]`` serves the trainer's metrics to Prometheus, with no change to verl.

Select it from verl's own config, beside (or instead of) wandb/tensorboard/console::

    python3 -m verl.trainer.main_ppo ... \\
        'trainer.logger=[console,rl_otel]' \\
        +trainer.rl_otel.prometheus.port=9464        # optional: any rl_otel.init option under trainer.rl_otel

Every ``Tracking.log(data, step)`` of the trainer reaches rl_otel, and ``Tracking.finish()`` (verl calls it at the
end of the run, and ``Tracking.__del__`` calls it when the object is collected) closes the trackers and stops the
scrape endpoint. The run label is ``trainer.experiment_name``; the endpoint is ``0.0.0.0:9464`` unless
``trainer.rl_otel.prometheus`` says otherwise. ``trainer.rl_otel`` takes the options of :func:`rl_otel.init`
(``run``, ``prometheus``, ``trackers``, ``otlp``, ``config`` - a YAML file of them, ...); an unknown key is
refused by name. In YAML::

    trainer:
      logger: [console, rl_otel]
      rl_otel:
        prometheus: {port: 9464}
        trackers: {tensorboard: {log_dir: ./tb}}

How it gets there: verl has no public hook for extra backends, so rl_otel declares a ``verl.plugins`` entry point
(``rl_otel = rl_otel.integrations.verl_plugin``). ``import verl`` loads it in every verl process - the driver and
the Ray ``TaskRunner`` actor where the trainer logs - and :func:`install` makes ``verl.utils.tracking.Tracking``
accept the name ``rl_otel`` (it appends it to ``Tracking.supported_backend``, wraps ``Tracking.__init__`` to add an
:class:`RLOtelBackend` when ``rl_otel`` is among the backends, and wraps ``Tracking.finish`` to finish it).
Nothing changes for a Tracking without ``rl_otel``. ``VERL_USE_EXTERNAL_PLUGINS=none`` turns verl's plugin
loading off; then ``VERL_USE_EXTERNAL_MODULES=rl_otel.integrations.verl_plugin`` (to reach the Ray actors:
``+ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES=rl_otel.integrations.verl_plugin``) does
the same. :func:`check_tracking` lists what this relies on; a verl whose ``Tracking`` differs is reported with a
warning at ``import verl`` instead of being patched.

For a ``Tracking`` you build without ``rl_otel`` among its backends (your own trainer), :func:`attach` adds one::

    from rl_otel.integrations.verl import attach

    attach(tracking, experiment_name="e", prometheus={"port": 9464})   # tracking.logger["rl_otel"]
"""

from __future__ import annotations

import functools
import inspect
import logging
import sys
import weakref
from typing import Any

from rl_otel.integrations import options_section, telemetry_from_options

NAME = "rl_otel"
CONFIG_KEY = "rl_otel"  # verl config: trainer.rl_otel holds rl_otel.init options
_INSTALLED = "_rl_otel_installed"
_log = logging.getLogger("rl_otel")

# What install() relies on in verl.utils.tracking.Tracking (checked by check_tracking)
INIT_PARAMETERS = ("project_name", "experiment_name", "default_backend", "config")
LOG_PARAMETERS = ("data", "step")


class VerlIncompatibleError(RuntimeError):
    """verl's ``Tracking`` is not the shape :func:`install` patches (a verl release changed it)."""


class RLOtelBackend:
    """verl's backend interface (``log(data, step)``, ``finish()``) over a :class:`rl_otel.Telemetry`.

    The run is named ``experiment_name`` unless a ``run`` option is given. The options are ``config``'s
    ``trainer.rl_otel`` section (verl's whole config, as ``Tracking`` receives it) updated with the keyword
    arguments; all are :func:`rl_otel.init` options.
    """

    def __init__(self, project_name: str | None = None, experiment_name: str | None = None,
                 config: Any = None, **options: Any) -> None:
        self.project_name = project_name
        self.experiment_name = experiment_name
        merged = {**options_from_config(config), **options}
        self._finished = False
        self.telemetry = telemetry_from_options("verl's trainer.rl_otel", experiment_name, merged)
        hint = engine_stats_hint(config)
        if hint is not None:
            _log.warning("%s", hint)

    def log(self, data: dict, step: int | None) -> None:
        """One step's metrics. Never raises."""
        self.telemetry.log(data, step)

    def finish(self, *_: Any, **__: Any) -> None:
        """Flush the mirrored trackers and stop serving. Idempotent: a second call (``Tracking.__del__`` at
        interpreter shutdown, after the exit hook closed the Telemetry) does nothing."""
        if not self._finished:
            self._finished = True
            self.telemetry.close()

    close = finish


def _get(node: Any, *path: str) -> Any:
    for key in path:
        getter = getattr(node, "get", None)
        if getter is None:
            return None
        node = getter(key)
    return node


def engine_stats_hint(config: Any) -> str | None:
    """What to set so that verl's vLLM rollout records its Prometheus families (``docs/engines.md``), or ``None``
    when nothing is to be said: verl builds its vLLM engines with ``disable_log_stats=True`` unless told
    otherwise, and an engine with statistics off records no family at all."""
    rollout = _get(config, "actor_rollout_ref", "rollout")
    if rollout is None or _get(rollout, "name") not in (None, "vllm"):
        return None
    if _get(rollout, "disable_log_stats") is False:
        return None
    return ("rl_otel: verl's vLLM rollout records no Prometheus metrics while actor_rollout_ref.rollout."
            "disable_log_stats is not False (verl's default is True); set "
            "actor_rollout_ref.rollout.disable_log_stats=False to see the engine on the Rollout engines dashboard "
            "(docs/engines.md)")


def options_from_config(config: Any) -> dict[str, Any]:
    """The ``trainer.rl_otel`` section of verl's config (a dict or an OmegaConf config) as plain data; ``{}``
    when absent."""
    return options_section(config, ("trainer", CONFIG_KEY), f"verl's trainer.{CONFIG_KEY}")


def _backend_names(default_backend: Any) -> list[str]:
    if default_backend is None:
        return []
    if isinstance(default_backend, str):
        return [default_backend]
    try:
        return [str(name) for name in default_backend]
    except TypeError:
        return []


def check_tracking(tracking_cls: Any) -> None:
    """Raise :class:`VerlIncompatibleError` unless ``tracking_cls`` is what :func:`install` patches.

    It relies on: a class-level list ``supported_backend`` that ``__init__`` checks names against;
    ``__init__(project_name, experiment_name, default_backend, config)`` which sets the dict ``self.logger``;
    ``log(data, step, ...)`` calling ``log(data=..., step=...)`` on each entry of ``self.logger``; ``finish()``.
    """
    problems = []
    if not isinstance(getattr(tracking_cls, "supported_backend", None), list):
        problems.append("no class-level list 'supported_backend'")
    for method, wanted in (("__init__", INIT_PARAMETERS), ("log", LOG_PARAMETERS), ("finish", ())):
        function = getattr(tracking_cls, method, None)
        if not callable(function):
            problems.append(f"no method {method}()")
            continue
        try:
            parameters = list(inspect.signature(function).parameters)
        except (TypeError, ValueError):
            problems.append(f"{method}() has no readable signature")
            continue
        missing = [p for p in wanted if p not in parameters]
        if missing:
            problems.append(f"{method}{inspect.signature(function)} lacks {missing}")
    if problems:
        version = getattr(sys.modules.get("verl"), "__version__", "?")
        raise VerlIncompatibleError(
            f"rl_otel cannot add its backend to verl {version}'s {getattr(tracking_cls, '__qualname__', tracking_cls)}"
            f": {'; '.join(problems)}. rl_otel's verl integration is tested with verl 0.9.1; meanwhile, "
            "rl_otel.integrations.verl.attach(tracking, experiment_name=...) adds the backend by hand")


def install(tracking_cls: Any = None) -> Any:
    """Make verl's ``Tracking`` (default ``verl.utils.tracking.Tracking``) accept the backend name ``rl_otel``.

    Appends ``rl_otel`` to ``Tracking.supported_backend``; wraps ``Tracking.__init__`` so that a Tracking whose
    backends include ``rl_otel`` gets ``self.logger["rl_otel"] = RLOtelBackend(project_name, experiment_name,
    config)``; wraps ``Tracking.finish`` so that every :class:`RLOtelBackend` in ``self.logger`` is finished
    (verl finishes only its built-in backends). A backend is also finished when its Tracking is collected or
    at interpreter exit. Idempotent. Returns the class.

    Raises:
        VerlIncompatibleError: ``Tracking`` is not the shape this relies on (see :func:`check_tracking`).
    """
    if tracking_cls is None:
        from verl.utils.tracking import Tracking

        tracking_cls = Tracking
    if getattr(tracking_cls, _INSTALLED, False):
        if NAME not in tracking_cls.supported_backend:
            tracking_cls.supported_backend.append(NAME)
        return tracking_cls
    check_tracking(tracking_cls)
    original_init, original_finish = tracking_cls.__init__, tracking_cls.finish
    init_signature = inspect.signature(original_init)

    @functools.wraps(original_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        bound = init_signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        given = bound.arguments
        if NAME in _backend_names(given["default_backend"]) and NAME not in self.logger:
            backend = RLOtelBackend(given["project_name"], given["experiment_name"], config=given["config"])
            self.logger[NAME] = backend
            _finish_when_collected(self, backend)

    # Tracking.__del__ runs this at interpreter shutdown too, when this module's globals may already be None:
    # it reads only what it closes over
    backend_cls = RLOtelBackend

    @functools.wraps(original_finish)
    def finish(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return original_finish(self, *args, **kwargs)
        finally:
            logger = getattr(self, "logger", None)
            for backend in list(logger.values()) if isinstance(logger, dict) else ():
                if isinstance(backend, backend_cls):
                    backend.finish()

    tracking_cls.__init__ = __init__
    tracking_cls.finish = finish
    if NAME not in tracking_cls.supported_backend:
        tracking_cls.supported_backend.append(NAME)
    setattr(tracking_cls, _INSTALLED, True)
    return tracking_cls


def _finish_when_collected(tracking: Any, backend: RLOtelBackend) -> None:
    try:
        weakref.finalize(tracking, backend.finish)
    except TypeError:  # not weak-referenceable: finish() and __del__ remain
        pass


def install_from_plugin(tracking_cls: Any = None) -> None:
    """:func:`install`, as verl's plugin loader runs it at ``import verl``: a failure is logged as a warning
    (verl would swallow it at DEBUG level) and ``import verl`` goes on without the ``rl_otel`` backend."""
    try:
        install(tracking_cls)
    except Exception as exc:  # boundary: verl's plugin loader (verl's classes of any version)
        _log.warning("rl_otel: verl's trainer.logger cannot use 'rl_otel' in this process: %s: %s",
                     type(exc).__name__, exc)


def attach(tracking: Any, name: str = NAME, *, project_name: str | None = None,
           experiment_name: str | None = None, **options: Any) -> RLOtelBackend:
    """Add an :class:`RLOtelBackend` to ``tracking.logger`` under ``name`` and return it.

    For a Tracking built without ``rl_otel`` among its backends. verl's ``Tracking`` does not keep its
    experiment name, so pass ``experiment_name`` to name the run (else a ``run`` option, ``$RL_OTEL_RUN`` or a
    timestamp); ``options`` are :func:`rl_otel.init` options. On verl's ``Tracking`` this also applies
    :func:`install`, so that ``tracking.finish()`` finishes the backend; it is finished as well when
    ``tracking`` is collected.
    """
    logger = getattr(tracking, "logger", None)
    if not isinstance(logger, dict):
        raise TypeError(f"attach() needs verl's Tracking (with a .logger dict of backends), got {tracking!r}")
    verl_tracking = getattr(sys.modules.get("verl.utils.tracking"), "Tracking", None)
    if isinstance(verl_tracking, type) and isinstance(tracking, verl_tracking):
        install(type(tracking))
    backend = RLOtelBackend(project_name or getattr(tracking, "project_name", None),
                            experiment_name or getattr(tracking, "experiment_name", None), **options)
    logger[name] = backend
    _finish_when_collected(tracking, backend)
    return backend
