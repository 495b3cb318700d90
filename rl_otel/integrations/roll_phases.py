"""ROLL's own phases as OTel spans: ``state_offload_manger`` makes ``<cluster>/<phase>`` > onload|execute|offload.

ROLL times each phase of a worker (``actor_train/train_step``, ``actor_infer/model_update``...) with
``roll.utils.context_managers.state_offload_manger(strategy, metrics, metric_infix, is_offload_states=True,
load_kwargs={})``, a ``@contextmanager`` that loads the states, yields to the phase's work, offloads, and writes
``time/...`` and ``memory/...`` keys into ``metrics``. With :func:`install`, each such block also makes the spans
``Telemetry.phase()`` makes: a root span named ``metric_infix`` with the attributes ``cluster``, ``phase`` and
``rank`` (ROLL's ``RANK`` of the worker), and its children ``onload`` (everything before ROLL's ``yield``: the start
snapshots and ``load_states``), ``execute`` (the block) and ``offload`` (everything after the ``yield``), each
current while it runs, so spans made inside (ROLL's, the user's) nest under it. ROLL's context manager is not
told the step, but the worker method that opens it has read ``global_step`` from its data's ``meta_info``: with
tracing on and no span around the phase, the root goes under that step's ``step`` span, in the step's one trace
with the driver's and every worker's phases (:func:`framework_step`, ``docs/tracing.md``), with a ``step``
attribute. No change to ROLL or to the training code::

    from rl_otel.integrations.roll import register
    register()                 # the tracker, and roll_phases.install(): phases in every worker ROLL's Cluster starts

Where the spans go: configure tracing once, in the tracker (``tracker_kwargs: {tracing: {exporter: jsonl, path:
spans.jsonl}}``, or ``otlp``, ``console``): ROLL's phases then go where ``Telemetry.phase()``'s go
(:func:`use_tracing`, which the tracker calls). In the driver they use the tracker's
``Telemetry.tracer_provider``; each worker of a Cluster built after the tracker (ROLL builds the tracker first)
starts a Telemetry of its own for its spans only (no endpoint, no tracker; run and tracing options the tracker's,
a ``jsonl`` path made absolute, role the worker's ``CLUSTER_NAME``, rank its ``RANK``), so one jsonl file, or
one collector, gets the driver's phases and every worker's. A worker sends a phase's spans when the phase ends
(the worker is killed seconds after its driver exits: nothing waits for its exit). Without tracing in the
tracker, the phases use the worker's TracerProvider: ROLL's own (``system_envs: {ROLL_OTEL_ENABLED: "1"}``, the
spans then nest under ROLL's ``worker.<method>`` > ``exec`` spans, in the driver's trace) or your OTel setup's
global one.

How the patch reaches ROLL's workers: they are Ray actors, in other processes, started by
``roll.distributed.executor.cluster.Cluster`` from the worker class it is given (usually a dotted name from the
YAML). ROLL calls ``ray.init`` itself, so a job-level ``worker_process_setup_hook`` cannot be added without touching
ROLL, and ``system_envs`` only carries environment variables (no Python code runs on them). :func:`install` wraps
``Cluster.__init__`` in the driver so that the worker class becomes a subclass made here, with the same name, whose
``__init__`` first applies :func:`install_here` and then runs the class's own. Ray ships such a class by value
(cloudpickle: it is not importable by its name), so the patch runs in each worker before the worker's own code, and
ROLL's ``isinstance`` checks, registered methods and async detection see the class they saw. :func:`install_here`
replaces ``state_offload_manger`` in ``roll.utils.context_managers`` and in every loaded module that imported it
by name (``roll.pipeline.base_worker``, ``roll.distributed.executor.worker``...; modules loaded later import the
new one). A worker class given already wrapped by ``ray.remote`` is left as it is (warned once).

The wrapper keeps ROLL's behaviour: it runs ROLL's own context manager (its ``__enter__`` and ``__exit__``), so the
same keys land in ``metrics``, exceptions propagate unchanged (the body's, ROLL's, the strategy's), the value of
the ``with`` is ROLL's, and a body exception is thrown into ROLL's generator as before (no ``offload`` span then:
ROLL stops at its ``yield``; ``execute`` and the root end with an error status). Spans only: no metric is
recorded, no memory read (ROLL's ``memory/...`` keys, written in ROLL's debug mode, reach the driver's tracker and
become rl_otel's memory gauges by ``device_id`` there). Telemetry's own failures are logged once, never raised.
:func:`check_state_offload_manager` is the contract: a ROLL whose function differs is warned about once and left
unpatched.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import logging
import os
import sys
import threading
from collections.abc import Callable, Mapping
from types import FrameType, TracebackType
from typing import Any

MODULE = "roll.utils.context_managers"
NAME = "state_offload_manger"  # sic: ROLL's spelling
CLUSTER_MODULE = "roll.distributed.executor.cluster"
# state_offload_manger's parameters, in order (checked by check_state_offload_manager)
PARAMETERS = ("strategy", "metrics", "metric_infix", "is_offload_states", "load_kwargs")
CLUSTER_PARAMETERS = ("name", "worker_cls", "resource_manager", "worker_config")
TRACER_NAME = "rl_otel.roll"
_ORIGINAL = "__rl_otel_original__"
_PATCHED_CLASS = "_rl_otel_phases"
_WORKER_OPTIONS = "_rl_otel_worker_options"  # on a worker_class: init() options of the worker's tracing Telemetry
_log = logging.getLogger("rl_otel")
_lock = threading.Lock()
_warned: set[str] = set()
_tracer_provider: Any = None  # None: the process's global TracerProvider (ROLL's get_tracer where loaded)
_worker_options: dict[str, Any] | None = None  # use_tracing()'s, for the workers of Clusters built later
_worker_telemetry: Any = None  # this worker process's tracing-only Telemetry (see _start_worker_tracing)
_run: str | None = None  # the run whose step traces the phases join (docs/tracing.md); None: they do not
_worker_lock = threading.Lock()


class RollIncompatibleError(RuntimeError):
    """ROLL's ``state_offload_manger`` or ``Cluster`` is not the shape this patch relies on."""


def check_state_offload_manager(function: Any) -> None:
    """Raise :class:`RollIncompatibleError` unless ``function`` is what the patch wraps: a ``@contextmanager``
    function (a generator function under ``__wrapped__``) with the parameters :data:`PARAMETERS`, in order."""
    if not callable(function):
        raise RollIncompatibleError(f"{MODULE}.{NAME} is {function!r}, not a function")
    try:
        parameters = tuple(inspect.signature(function).parameters)
    except (TypeError, ValueError) as exc:
        raise RollIncompatibleError(f"{MODULE}.{NAME} has no readable signature ({exc})") from None
    if parameters != PARAMETERS:
        raise RollIncompatibleError(f"{MODULE}.{NAME}{parameters} is not {NAME}{PARAMETERS}")
    if not inspect.isgeneratorfunction(getattr(function, "__wrapped__", None)):
        raise RollIncompatibleError(f"{MODULE}.{NAME} is not a @contextmanager generator function")


def check_cluster(cluster_cls: Any) -> None:
    """Raise :class:`RollIncompatibleError` unless ``Cluster.__init__`` takes :data:`CLUSTER_PARAMETERS`."""
    try:
        parameters = tuple(inspect.signature(cluster_cls.__init__).parameters)[1:]
    except (AttributeError, TypeError, ValueError) as exc:
        raise RollIncompatibleError(f"{CLUSTER_MODULE}.Cluster.__init__ has no readable signature ({exc})") from None
    if parameters[:len(CLUSTER_PARAMETERS)] != CLUSTER_PARAMETERS:
        raise RollIncompatibleError(f"{CLUSTER_MODULE}.Cluster.__init__{parameters} does not start with "
                                    f"{CLUSTER_PARAMETERS}")


def install(tracer_provider: Any = None, *, clusters: bool = True) -> bool:
    """Make ROLL's ``state_offload_manger`` make phase spans: in this process (:func:`install_here`) and, with
    ``clusters``, in every worker process a ``Cluster`` built after this call starts (:func:`patch_cluster`).
    Call it in the driver before the pipeline is built. ``tracer_provider``: where this process's spans go
    (default: the global one; workers use theirs, or the tracker's tracing: :func:`use_tracing`). Idempotent.
    Returns whether this process is patched; a ROLL that differs from the contract is warned about once and left
    as it is."""
    here = install_here(tracer_provider)
    if clusters:
        patch_cluster()
    return here


def install_here(tracer_provider: Any = None) -> bool:
    """Replace ``state_offload_manger`` in ``roll.utils.context_managers`` and in every loaded module holding it by
    name, with the span-making wrapper. Returns False (warned once) when ROLL is missing or differs."""
    global _tracer_provider
    if tracer_provider is not None:
        _tracer_provider = tracer_provider
    try:
        module = importlib.import_module(MODULE)
    except Exception as exc:  # boundary: importing ROLL
        _warn_once("import", f"rl_otel: ROLL's phases make no spans in this process: cannot import {MODULE} "
                             f"({type(exc).__name__}: {exc})")
        return False
    with _lock:
        current: Any = getattr(module, NAME, None)
        original: Any = getattr(current, _ORIGINAL, None)
        if original is None:
            try:
                check_state_offload_manager(current)
            except RollIncompatibleError as exc:
                _warn_once("contract", f"rl_otel: ROLL's phases make no spans: {exc}. rl_otel's ROLL phase "
                                       "integration follows ROLL's state_offload_manger(strategy, metrics, "
                                       "metric_infix, is_offload_states=True, load_kwargs={})")
                return False
            original, wrapper = current, wrap(current)
            setattr(module, NAME, wrapper)
        else:
            wrapper = current
        for loaded in list(sys.modules.values()):  # the callers that imported it by name before this call
            try:
                if loaded is not None and loaded.__dict__.get(NAME) is original:
                    setattr(loaded, NAME, wrapper)
            except Exception:  # boundary: another library's module object (a lazy module may raise)
                continue
    return True


def use_tracing(tracer_provider: Any, worker_options: Mapping[str, Any] | None = None, *,
                run: str | None = None) -> None:
    """Make this process's phases spans of ``tracer_provider`` (a tracker's ``Telemetry.tracer_provider``), and
    the workers of every Cluster built after this call start a Telemetry from ``worker_options``
    (:func:`rl_otel.init` options, plain data: they travel with the worker class) and make their phases spans of
    its provider. ``worker_options`` ``None``: the workers keep their own TracerProvider (see the module).
    ``run``: a phase that ROLL runs at a ``global_step`` goes in that step's trace of ``run``
    (:func:`framework_step`)."""
    global _tracer_provider, _worker_options, _run
    with _lock:
        _tracer_provider = tracer_provider
        _run = run
        _worker_options = dict(worker_options) if worker_options is not None else None


def uninstall() -> None:
    """Put ROLL's own ``state_offload_manger`` back (this process; Clusters built later start unpatched
    workers)."""
    module = sys.modules.get(MODULE)
    wrapper = getattr(module, NAME, None)
    original = getattr(wrapper, _ORIGINAL, None)
    if original is None:
        return
    with _lock:
        for loaded in list(sys.modules.values()):
            try:
                if loaded is not None and loaded.__dict__.get(NAME) is wrapper:
                    setattr(loaded, NAME, original)
            except Exception:  # boundary: another library's module object (a lazy module may raise)
                continue
    cluster: Any = getattr(sys.modules.get(CLUSTER_MODULE), "Cluster", None)
    init = getattr(cluster, "__init__", None)
    if getattr(init, _ORIGINAL, None) is not None:
        cluster.__init__ = getattr(init, _ORIGINAL)


def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
    """``original`` (ROLL's ``state_offload_manger``) with spans around it; same signature and behaviour."""

    @functools.wraps(original)
    def state_offload_manger(*args: Any, **kwargs: Any) -> _PhaseSpans:
        return _PhaseSpans(original, args, kwargs)

    setattr(state_offload_manger, _ORIGINAL, original)
    return state_offload_manger


class _PhaseSpans(contextlib.ContextDecorator):
    """ROLL's context manager, run as it is, between the spans of its three parts."""

    def __init__(self, original: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self._original, self._args, self._kwargs = original, args, kwargs
        self._cm = original(*args, **kwargs)  # a bad call raises here, as ROLL's would
        self._root: Any = None
        self._root_ctx: Any = None
        self._span: Any = None
        self._token: Any = None
        self._tracer: Any = None
        self._attributes: dict[str, Any] = {}

    def _recreate_cm(self) -> _PhaseSpans:  # used as a decorator: one per call, as contextlib's
        return _PhaseSpans(self._original, self._args, self._kwargs)

    def __enter__(self) -> Any:
        onload = self._guard(self._start)
        token = self._guard(_attach, onload)  # spans ROLL's load_states makes nest under onload
        try:
            result = self._cm.__enter__()
        except BaseException as exc:  # boundary: ROLL's context manager (user code): spans ended, re-raised
            self._guard(_detach, token)
            self._guard(self._finish, onload, exc)
            self._guard(self._finish, self._root, exc)
            raise
        self._guard(_detach, token)
        self._guard(self._finish, onload, None)
        self._guard(self._execute)
        return result

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool:
        token, self._token = self._token, None
        self._guard(_detach, token)
        self._guard(self._finish, self._span, exc)
        offload = self._guard(self._child, "offload") if exc is None else None
        token = self._guard(_attach, offload if offload is not None else self._root)
        try:
            suppress = bool(self._cm.__exit__(exc_type, exc, tb))
        except BaseException as raised:  # boundary: ROLL's context manager (user code): spans ended, re-raised
            self._guard(_detach, token)
            self._guard(self._finish, offload, raised)
            self._guard(self._finish, self._root, raised)
            raise
        self._guard(_detach, token)
        self._guard(self._finish, offload, None)
        self._guard(self._finish, self._root, None if suppress else exc)
        return suppress

    # -- spans: never raise (each call guarded) --------------------------------------------------------------

    def _start(self) -> Any:
        from opentelemetry import trace

        infix = self._infix()
        if infix is None:
            return None
        cluster, _, phase = infix.partition("/")
        attributes: dict[str, Any] = {"cluster": cluster, "phase": phase}
        rank = os.environ.get("RANK", "")
        if rank.isdigit():
            attributes["rank"] = int(rank)
        tracer = _tracer()
        parent = None
        run = _run
        if run is not None and not trace.get_current_span().get_span_context().is_valid:
            step = framework_step()  # no span around it (ROLL's own tracing off): under its step's span
            if step is not None:
                from rl_otel._internal.tracing.steps import step_parent

                attributes["step"] = step
                parent = step_parent(run, step)
        self._attributes = attributes
        self._tracer = tracer
        self._root = tracer.start_span(infix, context=parent, attributes=attributes)
        self._root_ctx = trace.set_span_in_context(self._root)
        return self._child("onload")

    def _child(self, name: str) -> Any:
        if self._root is None:
            return None
        return self._tracer.start_span(name, context=self._root_ctx, attributes=self._attributes)

    def _execute(self) -> None:
        from opentelemetry import context, trace

        span = self._child("execute")
        if span is not None:
            self._span = span
            self._token = context.attach(trace.set_span_in_context(span, self._root_ctx))

    def _infix(self) -> str | None:
        args, kwargs = self._args, self._kwargs
        infix = kwargs["metric_infix"] if "metric_infix" in kwargs else args[2] if len(args) > 2 else None
        return infix if isinstance(infix, str) else None

    @staticmethod
    def _finish(span: Any, exc: BaseException | None) -> None:
        if span is None:
            return
        if exc is not None:
            from opentelemetry.trace import Status, StatusCode

            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        span.end()

    @staticmethod
    def _guard(function: Callable[..., Any], *args: Any) -> Any:
        try:
            return function(*args)
        except Exception as exc:  # boundary: the OTel SDK (spans) inside ROLL's phase
            _warn_once("span", f"rl_otel: a ROLL phase span failed ({type(exc).__name__}: {exc}); the phase goes "
                               "on, further failures are silent")
            return None


_STEP_LOCAL = "global_step"
_STEP_FRAMES = 8  # how far up from the span code the worker method's frame is looked for


def framework_step() -> int | None:
    """ROLL's step of the phase being entered: the ``global_step`` local of the worker method that opens
    ``state_offload_manger`` (ROLL's methods read ``data.meta_info["global_step"]`` into it first:
    ``step = data.meta_info.get("global_step", 0)`` under that name, in ``train_step``, ``compute_log_probs``,
    ``generate``...), found within a few frames; ``None`` where no such int is there (then the phase's spans are
    a trace of their own, with the run's resource). The one place that reads ROLL's locals;
    ``tests/test_tracing_steps.py`` pins the shape it reads."""
    frame: FrameType | None = sys._getframe(1)
    for _ in range(_STEP_FRAMES):
        if frame is None:
            return None
        step = frame.f_locals.get(_STEP_LOCAL)
        if type(step) is int and step >= 0:
            return step
        frame = frame.f_back
    return None


def _attach(span: Any) -> Any:
    """Make ``span`` current (``None``: nothing to do); returns the token for :func:`_detach`."""
    if span is None:
        return None
    from opentelemetry import context, trace

    return context.attach(trace.set_span_in_context(span))


def _detach(token: Any) -> None:
    if token is not None:
        from opentelemetry import context

        context.detach(token)


def _tracer() -> Any:
    """The tracer phases use: the one :func:`install` was given, else ROLL's ``get_tracer`` where loaded (it
    honours ROLL's per-call trace suppression), else the global TracerProvider's."""
    if _tracer_provider is not None:
        return _tracer_provider.get_tracer(TRACER_NAME)
    roll_get_tracer = getattr(sys.modules.get("roll.utils.telemetry"), "get_tracer", None)
    if callable(roll_get_tracer):
        return roll_get_tracer(TRACER_NAME)
    from opentelemetry import trace

    return trace.get_tracer(TRACER_NAME)


# -- reaching ROLL's worker processes -------------------------------------------------------------------------


def patch_cluster(cluster_cls: Any = None) -> bool:
    """Wrap ``Cluster.__init__`` (default ROLL's) so that the workers it starts apply :func:`install_here` first
    (:func:`worker_class`). Idempotent. Returns False (warned once) when ROLL is missing or differs."""
    if cluster_cls is None:
        try:
            cluster_cls = importlib.import_module(CLUSTER_MODULE).Cluster
        except Exception as exc:  # boundary: importing ROLL
            _warn_once("cluster-import", f"rl_otel: ROLL's workers get no phase spans: cannot import "
                                         f"{CLUSTER_MODULE}.Cluster ({type(exc).__name__}: {exc})")
            return False
    with _lock:
        if getattr(cluster_cls.__init__, _ORIGINAL, None) is not None:
            return True
        try:
            check_cluster(cluster_cls)
        except RollIncompatibleError as exc:
            _warn_once("cluster", f"rl_otel: ROLL's workers get no phase spans: {exc}")
            return False
        original = cluster_cls.__init__
        signature = inspect.signature(original)

        @functools.wraps(original)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            try:
                bound = signature.bind(self, *args, **kwargs)
                bound.arguments["worker_cls"] = worker_class(bound.arguments["worker_cls"])
                args, kwargs = bound.args[1:], bound.kwargs
            except Exception as exc:  # ROLL's own call decides what a bad call raises
                _warn_once("cluster-call", f"rl_otel: a ROLL Cluster's workers get no phase spans "
                                           f"({type(exc).__name__}: {exc})")
            original(self, *args, **kwargs)

        setattr(__init__, _ORIGINAL, original)
        cluster_cls.__init__ = __init__
    return True


def worker_class(worker_cls: Any) -> Any:
    """``worker_cls`` (a class or ROLL's dotted name of one) as a subclass with the same name whose instances
    apply :func:`install_here` before the class's own ``__init__``. A class already wrapped by ``ray.remote``, or
    a name that does not import, is returned as it is."""
    if isinstance(worker_cls, str):
        try:
            safe_import_class = importlib.import_module("roll.utils.import_utils").safe_import_class
            worker_cls = safe_import_class(worker_cls)
        except Exception:
            return worker_cls  # ROLL's Cluster reports it
    if not isinstance(worker_cls, type):
        return worker_cls
    if hasattr(worker_cls, "__ray_actor_class__"):
        _warn_once(f"remote:{worker_cls!r}", f"rl_otel: {worker_cls!r} is already a Ray actor class: its "
                                             "workers get no phase spans (pass the class or its dotted name)")
        return worker_cls
    if worker_cls.__dict__.get(_PATCHED_CLASS):
        return worker_cls
    namespace = {"__init__": _worker_init, "__module__": worker_cls.__module__,
                 "__qualname__": worker_cls.__qualname__, "__doc__": worker_cls.__doc__, _PATCHED_CLASS: True,
                 _WORKER_OPTIONS: _worker_options}
    return type(worker_cls)(worker_cls.__name__, (worker_cls,), namespace)


def _worker_init(self: Any, *args: Any, **kwargs: Any) -> None:
    """The ``__init__`` of :func:`worker_class`'s subclasses (module level: Ray pickles it by reference)."""
    try:
        install_here()
        options = getattr(type(self), _WORKER_OPTIONS, None)
        if options is not None:
            _start_worker_tracing(options)
    except Exception as exc:  # never the reason a worker fails to start
        _warn_once("worker", f"rl_otel: ROLL's phases make no spans in this worker ({type(exc).__name__}: {exc})")
    for klass in type(self).__mro__:
        if klass.__dict__.get("__init__") is _worker_init:
            base_init: Any = super(klass, self).__init__  # type: ignore[arg-type]  # klass is type(self)'s base
            base_init(*args, **kwargs)
            return


def _start_worker_tracing(options: Mapping[str, Any]) -> None:
    """This worker's phases as spans of a Telemetry built from ``options`` (once per process: a process may hold
    several workers); it closes at exit, writing the spans it still holds."""
    global _worker_telemetry, _tracer_provider, _run
    with _worker_lock:
        if _worker_telemetry is None:
            import rl_otel

            _worker_telemetry = rl_otel.init(**{"role": os.environ.get("CLUSTER_NAME") or "worker", **options})
        _tracer_provider = _worker_telemetry.tracer_provider
        _run = _worker_telemetry.config.run


def _warn_once(what: str, message: str) -> None:
    if what not in _warned:
        _warned.add(what)
        _log.warning("%s", message)
