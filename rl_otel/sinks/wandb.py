"""WandB: one ``run.log(..., step=step)`` per step, distributions as ``wandb.Histogram``.

The step is always explicit and one call carries the whole step, so rl_otel never makes WandB drop data with
"steps must be monotonically increasing". A step lower than the last one (a restarted loop without resume) is
refused here - counted as ``reason="step_out_of_order"`` and warned once - rather than left to WandB's
per-call warning. ``api_key`` is never written: offline runs need none, online runs get it through
``wandb.Settings`` (not ``wandb.login``, which stores it in ``~/.netrc``). ``config`` is uploaded redacted.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from rl_otel._internal.trackers.config import redact
from rl_otel.sinks.base import Metrics, SinkError, missing_dependency


class WandbSink:
    """Starts a WandB run with ``wandb.init(**kwargs)`` (``name`` defaults to the rl_otel run)."""

    def __init__(self, *, run: str, api_key: str | None = None, histogram_bins: int = 64, **init_kwargs: Any) -> None:
        try:
            import wandb
        except ImportError as e:
            raise missing_dependency("wandb", "wandb") from e
        self._wandb = wandb
        self._bins = histogram_bins
        init_kwargs.setdefault("name", run)
        if "config" in init_kwargs:
            init_kwargs["config"] = redact(init_kwargs["config"])
        mode = init_kwargs.get("mode") or os.environ.get("WANDB_MODE", "online")
        if api_key and mode not in ("offline", "disabled", "dryrun"):
            settings = init_kwargs.get("settings") or wandb.Settings()
            settings.api_key = api_key
            init_kwargs["settings"] = settings
        init_kwargs.setdefault("reinit", "create_new")
        self._run = wandb.init(**init_kwargs)
        self._last_step: int | None = None

    def log(self, metrics: Metrics, step: int) -> None:
        if self._last_step is not None and step < self._last_step:
            raise SinkError("step_out_of_order", f"step {step} is below the last step {self._last_step} "
                                                 "logged to WandB; WandB would drop it")
        self._last_step = step
        row: dict[str, object] = {}
        for key, v in metrics.items():
            if isinstance(v, np.ndarray):
                finite = v[np.isfinite(v)]
                if finite.size:
                    # wandb's annotation says Sequence, but it runs np.histogram on the values: an array is fine
                    row[key] = self._wandb.Histogram(finite, num_bins=self._bins)  # type: ignore[arg-type]
            else:
                row[key] = v
        self._run.log(row, step=step)

    def close(self) -> None:
        self._run.finish()
