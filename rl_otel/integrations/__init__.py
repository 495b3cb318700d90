"""Drop-in integrations, one file per framework, each on the framework's own tracker interface.

``roll`` (a ROLL tracker for ``track_with``), ``verl`` (a backend for verl's ``Tracking``), ``trinity`` (a
Trinity-RFT ``Monitor``), ``accelerate`` (an accelerate ``GeneralTracker``), ``transformers`` (a
``TrainerCallback`` for TRL's and transformers' trainers). Each builds its :class:`rl_otel.Telemetry` with
:func:`telemetry_from_options`, so every integration takes the same options as :func:`rl_otel.init`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rl_otel.errors import ConfigurationError
from rl_otel.sinks.config import FILE_KEYS

if TYPE_CHECKING:
    from rl_otel.core.telemetry import Telemetry

# rl_otel.init()'s options an integration passes through: a config file's keys, the file itself, tracing.
INIT_OPTIONS = (*FILE_KEYS, "config", "tracing")


def telemetry_from_options(where: str, run: str | None, options: Mapping[str, Any]) -> Telemetry:
    """``rl_otel.init(run=run, **options)``, with an unknown option refused by name (``where`` says whose)."""
    import rl_otel

    unknown = sorted(set(options) - set(INIT_OPTIONS))
    if unknown:
        raise ConfigurationError(f"unknown rl_otel option(s) {unknown} for {where}; known: {list(INIT_OPTIONS)}")
    options = dict(options)
    run = options.pop("run", None) or run
    return rl_otel.init(run, **options) if run is not None else rl_otel.init(**options)
