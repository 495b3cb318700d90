"""The sink protocol and the sink registry (public as :mod:`rl_otel.sinks`, which re-exports them).

A sink receives one step's metrics - the keys the user logged, values in the user's units: a float for a
scalar, a 1-d float64 ``numpy`` array for a distribution - and writes them to one tracker. Sinks run on a
worker thread of their own (see :mod:`rl_otel._internal.trackers.bridge`), so ``log`` may block or raise without harming
training; it is never called from two threads at once. A sink with a buffer of its own may also have a
``flush()``, which ``Telemetry.flush()`` runs on that thread after the steps queued before it.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import numpy as np

_log = logging.getLogger("rl_otel")

Metrics = dict[str, "float | np.ndarray"]


@runtime_checkable
class Sink(Protocol):
    """Where one step's metrics go. ``close()`` flushes and releases; it is called once, after the last ``log``."""

    def log(self, metrics: Metrics, step: int) -> None: ...

    def close(self) -> None: ...


SinkFactory = Callable[..., Sink]
"""Called as ``factory(run=<run name>, **tracker_kwargs)``; raises ``ValueError``/``TypeError`` for bad kwargs."""


class SinkError(Exception):
    """Raised by a sink for an expected failure; the bridge counts it under ``reason`` instead of "exception",
    ``steps`` times: the logged steps it lost (a failed write of a buffer loses the steps buffered before too)."""

    def __init__(self, reason: str, message: str, steps: int = 1) -> None:
        super().__init__(message)
        self.reason = reason
        self.steps = steps


def text_key(key: str) -> str:
    """``key`` as text every tracker can write: a lone surrogate (``"\\udce9"``, from bytes decoded with
    ``surrogateescape``), which UTF-8 cannot encode, becomes its escape written out, ``\\udce9`` (backslash, u, 4
    hex digits), as ``backslashreplace`` writes it. Any other key is returned as it is."""
    if key.isascii():
        return key
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        return key.encode("utf-8", "backslashreplace").decode("utf-8")
    return key


def text_keys(metrics: Metrics) -> Metrics:
    """``metrics`` with every key as :func:`text_key` writes it (the same dict when no key needs it, the common
    case: one ``isascii()`` per key). Should an escaped key be spelled exactly like another key of the step, that
    other key keeps its value and the escaped one is left out: one odd key costs at most itself."""
    if all(key.isascii() or text_key(key) is key for key in metrics):
        return metrics
    out: Metrics = {}
    for key, value in metrics.items():
        text = text_key(key)
        if text is key or text not in metrics:
            out[text] = value
    return out


_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_registry: dict[str, SinkFactory] = {}
_registry_lock = threading.Lock()


def register_sink(name: str, factory: SinkFactory) -> None:
    """Make ``name`` usable in ``track_with``/``trackers``. Re-registering a name replaces it, with a warning.

    Thread-safe (copy-on-write: lookups never see a half-built registry).
    """
    global _registry
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"a sink name must be lowercase letters, digits and '_', starting with a letter; "
                         f"got {name!r}")
    if not callable(factory):
        raise TypeError(f"the factory for sink {name!r} must be callable, got {factory!r}")
    with _registry_lock:
        if name in _registry and _registry[name] is not factory:
            _log.warning("rl_otel: sink %r was registered before; the new factory replaces it", name)
        _registry = {**_registry, name: factory}


def sink_factory(name: str) -> SinkFactory:
    """The factory registered under ``name``; ``KeyError`` naming the known sinks otherwise."""
    try:
        return _registry[name]
    except KeyError:
        raise KeyError(f"no sink named {name!r}; known: {sorted(_registry)}") from None


def registered_sinks() -> tuple[str, ...]:
    return tuple(sorted(_registry))


def missing_dependency(package: str, extra: str) -> ImportError:
    """The error a sink raises when its optional package is not installed (chain it ``from e``): one line naming
    the package, rl_otel's extra and the command that works from a checkout."""
    from rl_otel.errors import MissingExtraError, install_hint

    return MissingExtraError(f"the {extra} sink needs the {package!r} package (rl_otel's extra [{extra}]): "
                             f"{install_hint(extra)}")


def _lazy(module: str, attr: str) -> SinkFactory:
    def factory(**kwargs: Any) -> Sink:
        import importlib

        return getattr(importlib.import_module(module), attr)(**kwargs)

    factory.__qualname__ = f"{module}.{attr}"
    return factory


for _name, _cls in (("tensorboard", "TensorBoardSink"), ("wandb", "WandbSink"), ("swanlab", "SwanLabSink"),
                    ("stdout", "StdoutSink")):
    _registry[_name] = _lazy(f"rl_otel.sinks.{_name}", _cls)
