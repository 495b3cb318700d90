"""slime: rollout metrics served to Prometheus through slime's own rollout log hooks, slime's logging unchanged.

slime calls ``--custom-rollout-log-function-path`` (a dotted name, imported where the rollout is logged: the
``RolloutManager`` Ray actor) as ``fn(rollout_id, args, samples, rollout_extra_metrics, rollout_time)`` before its
own logging, and skips its own logging when the function returns a true value; likewise
``--custom-eval-rollout-log-function-path`` as ``fn(rollout_id, args, data, extra_metrics)``. rl_otel's functions
return ``False``: slime's wandb / TensorBoard logging goes on exactly as before::

    python train.py ... \\
      --custom-rollout-log-function-path rl_otel.integrations.slime.log_rollout_data \\
      --custom-eval-rollout-log-function-path rl_otel.integrations.slime.log_eval_rollout_data

What is logged: the rollout keys slime's default logging writes (``rollout/*``, ``perf/*`` and the extra
metrics), computed by slime's own ``compute_metrics_from_samples`` / ``compute_perf_metrics_from_samples`` (so they
match what wandb and TensorBoard get), at slime's step (``compute_rollout_step``: ``rollout/step``); for an
evaluation, ``eval/{name}`` (mean reward), ``eval/{name}-truncated_ratio`` and the extra metrics at ``eval/step``.
The trainer's own keys (``train/*``, logged by the Megatron actor) reach rl_otel through ``rl-otel watch`` on
slime's TensorBoard files.

The Telemetry is built in that process at the first call: run label ``--wandb-group`` (else
``--tb-experiment-name``), options from :func:`configure` (call it in a module of yours and name that module's
function instead) or from the YAML file ``$RL_OTEL_CONFIG`` names (pass it to the actors with slime's Ray runtime
env), checked then: a bad option raises ConfigurationError at that first call. After that nothing raises: a
failure is logged once and the rollout goes on. A slime whose metric functions are not the shape relied on
(:func:`check_slime`) is warned about once and gets nothing logged.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import os
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rl_otel.errors import ConfigurationError
from rl_otel.integrations import check_options, telemetry_from_options

if TYPE_CHECKING:
    from rl_otel.telemetry import Telemetry

FRAMEWORK = "slime"
WHERE = "slime's rollout log function"
CONFIG_ENV = "RL_OTEL_CONFIG"
# what this relies on in slime: (module, function, its leading parameters)
CONTRACT = (
    ("slime.observability.metric_utils", "compute_rollout_step", ("args", "rollout_id")),
    ("slime.observability.rollout_metrics", "compute_metrics_from_samples", ("args", "samples")),
    ("slime.observability.rollout_metrics", "compute_perf_metrics_from_samples", ("args", "samples", "rollout_time")),
)
_log = logging.getLogger("rl_otel")


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.options: dict[str, Any] | None = None
        self.telemetry: Telemetry | None = None
        self.functions: dict[str, Any] | None = None
        self.disabled = False  # the contract failed: warned once, nothing logged
        self.warned: set[str] = set()


_state = _State()


def configure(**options: Any) -> None:
    """Set the :func:`rl_otel.init` options of the Telemetry the first rollout builds in this process (checked
    now: ConfigurationError names a bad one). Has no effect once that Telemetry is built."""
    _state.options = check_options(WHERE, options)


def check_slime() -> dict[str, Any]:
    """slime's functions this relies on (:data:`CONTRACT`), by name. Raises RuntimeError naming what differs."""
    found, problems = {}, []
    for module_name, name, wanted in CONTRACT:
        try:
            function = getattr(importlib.import_module(module_name), name)
            parameters = tuple(inspect.signature(function).parameters)
        except Exception as exc:  # boundary: importing slime and inspecting its functions
            problems.append(f"{module_name}.{name}: {type(exc).__name__}: {exc}")
            continue
        if parameters[:len(wanted)] != wanted:
            problems.append(f"{module_name}.{name}{parameters} does not start with {wanted}")
        found[name] = function
    if problems:
        raise RuntimeError("; ".join(problems))
    return found


def log_rollout_data(rollout_id: int, args: Any, samples: Any, rollout_extra_metrics: Mapping[str, Any] | None,
                     rollout_time: float) -> bool:
    """slime's ``--custom-rollout-log-function-path`` hook: log the rollout's metrics to rl_otel. Returns
    ``False`` (slime's own logging goes on)."""
    functions = _functions()
    telemetry = _telemetry(args)
    if functions is None or telemetry is None or getattr(args, "load_debug_rollout_data", None):
        return False
    try:
        data = dict(rollout_extra_metrics or {})
        data.update(_prefixed(functions["compute_metrics_from_samples"](args, samples), "rollout/"))
        data.update(_prefixed(functions["compute_perf_metrics_from_samples"](args, samples, rollout_time), "perf/"))
        telemetry.log(data, int(functions["compute_rollout_step"](args, rollout_id)))
    except Exception as exc:  # boundary: slime's functions and the rollout's samples (user code)
        _warn_once("rollout", f"rl_otel: slime rollout {rollout_id} not logged ({type(exc).__name__}: {exc}); "
                              "further failures are silent")
    return False


def log_eval_rollout_data(rollout_id: int, args: Any, data: Mapping[str, Any],
                          extra_metrics: Mapping[str, Any] | None) -> bool:
    """slime's ``--custom-eval-rollout-log-function-path`` hook: log the evaluation's mean reward and truncation
    ratio per dataset, and the extra metrics, to rl_otel. Returns ``False`` (slime's own logging goes on)."""
    functions = _functions()
    telemetry = _telemetry(args)
    if functions is None or telemetry is None:
        return False
    try:
        out = dict(extra_metrics or {})
        for name, result in data.items():
            rewards = list(result.get("rewards") or ())
            if rewards:
                out[f"eval/{name}"] = float(sum(rewards)) / len(rewards)
            truncated = list(result.get("truncated") or ())
            if truncated:
                out[f"eval/{name}-truncated_ratio"] = float(sum(truncated)) / len(truncated)
        telemetry.log(out, int(functions["compute_rollout_step"](args, rollout_id)))
    except Exception as exc:  # boundary: slime's functions and the evaluation results (user code)
        _warn_once("eval", f"rl_otel: slime evaluation {rollout_id} not logged ({type(exc).__name__}: {exc}); "
                           "further failures are silent")
    return False


def telemetry() -> Telemetry | None:
    """The Telemetry of this process (``None`` before the first rollout)."""
    return _state.telemetry


def close() -> None:
    """Flush and stop this process's Telemetry (interpreter exit does it too)."""
    with _state.lock:
        tel, _state.telemetry = _state.telemetry, None
    if tel is not None:
        tel.close()


def _prefixed(metrics: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    return {f"{prefix}{key}": value for key, value in metrics.items()}


def _functions() -> dict[str, Any] | None:
    if _state.functions is None and not _state.disabled:
        try:
            _state.functions = check_slime()
        except RuntimeError as exc:  # what check_slime raises: slime missing or of another shape
            _state.disabled = True
            _log.warning("rl_otel: slime is not the shape rl_otel's slime hooks rely on (%s); nothing is logged "
                         "to rl_otel (use `rl-otel watch` on slime's TensorBoard files instead)", exc)
    return _state.functions


def _telemetry(args: Any) -> Telemetry | None:
    """This process's Telemetry, built at the first call (a bad option raises ConfigurationError here)."""
    if _state.telemetry is not None or _state.disabled:
        return _state.telemetry
    with _state.lock:
        if _state.telemetry is None:
            options = dict(_state.options or {})
            if "config" not in options and os.environ.get(CONFIG_ENV):
                options["config"] = os.environ[CONFIG_ENV]
            run = getattr(args, "wandb_group", None) or getattr(args, "tb_experiment_name", None)
            save = getattr(args, "save", None)
            stem = os.path.basename(os.path.normpath(str(save))) if save else None
            try:
                _state.telemetry = _framework_telemetry(str(run) if run else None, options, stem)
            except ConfigurationError:
                raise  # a bad option: refused by name, at the first rollout
            except Exception as exc:  # boundary: starting Telemetry inside slime's rollout (OS, network)
                _state.disabled = True
                _log.warning("rl_otel: slime's rollouts are not served to Prometheus: %s: %s",
                             type(exc).__name__, exc)
    return _state.telemetry


def _framework_telemetry(run: str | None, options: Mapping[str, Any], stem: str | None) -> Telemetry:
    return telemetry_from_options(WHERE, run, options, stem=stem, framework=FRAMEWORK)


def _warn_once(what: str, message: str) -> None:
    if what not in _state.warned:
        _state.warned.add(what)
        _log.warning("%s", message)
