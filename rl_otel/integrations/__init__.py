"""Drop-in integrations, one file per framework, each on the framework's own tracker interface.

``roll`` (a ROLL tracker for ``track_with``), ``verl`` (a backend for verl's ``Tracking``), ``trinity`` (a
Trinity-RFT ``Monitor``), ``accelerate`` (an accelerate ``GeneralTracker``), ``transformers`` (a
``TrainerCallback`` for TRL's and transformers' trainers). Each builds its :class:`rl_otel.Telemetry` with
:func:`telemetry_from_options`, so every integration takes the same options as :func:`rl_otel.init`.

verl and Trinity-RFT are selected from their own configs, with no code in the launcher and none in their Ray
actors: ``trainer.logger=[console,rl_otel]`` in verl (a ``verl.plugins`` entry point that ``import verl`` loads),
``monitor.monitor_type: rl_otel.integrations.trinity.RLOtelMonitor`` in Trinity-RFT (its registry imports a
dotted name by itself).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rl_otel._internal.runtime.options import INTEGRATION_OPTIONS
from rl_otel.errors import ConfigurationError

if TYPE_CHECKING:
    from rl_otel.telemetry import Telemetry


def plain_options(value: Any) -> Any:
    """A framework's config node (OmegaConf, a dataclass-ish mapping) as plain dicts, lists and scalars."""
    if isinstance(value, Mapping):
        return {str(k): plain_options(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return [plain_options(v) for v in value]
    return value


def telemetry_from_options(where: str, run: str | None, options: Mapping[str, Any]) -> Telemetry:
    """``rl_otel.init(run=run, **options)``, with an unknown option refused by name (``where`` says whose)."""
    import rl_otel

    unknown = sorted(set(options) - set(INTEGRATION_OPTIONS))
    if unknown:
        raise ConfigurationError(f"unknown rl_otel option(s) {unknown} for {where}; known: {list(INTEGRATION_OPTIONS)}")
    options = dict(options)
    run = options.pop("run", None) or run
    return rl_otel.init(run, **options) if run is not None else rl_otel.init(**options)
