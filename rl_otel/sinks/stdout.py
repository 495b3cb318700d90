"""Stdout: one grep-able JSON line per step, like ROLL's ``metrics_tag:`` line, and an optional human table.

``grep '^metrics_tag: ' train.log | cut -c14- | jq .metrics`` recovers every step. A distribution is written as
its summary (count, mean, min, max), not its values.
"""

from __future__ import annotations

import json
import math
import sys
from typing import IO

import numpy as np

from rl_otel.sinks.base import Metrics

TAG = "metrics_tag: "


def _jsonable(value: float | np.ndarray) -> object:
    if isinstance(value, np.ndarray):
        finite = value[np.isfinite(value)]
        return {"count": int(value.size), "mean": float(finite.mean()) if finite.size else math.nan,
                "min": float(finite.min()) if finite.size else math.nan,
                "max": float(finite.max()) if finite.size else math.nan}
    return value


class StdoutSink:
    """Writes to ``stream`` ("stdout", "stderr") or appends to the file ``file``."""

    def __init__(self, *, run: str, stream: str = "stdout", file: str | None = None, table: bool = False,
                 tag: str = TAG) -> None:
        if stream not in ("stdout", "stderr"):
            raise ValueError(f"stream must be 'stdout' or 'stderr', got {stream!r}")
        if not isinstance(table, bool):
            raise ValueError(f"table must be True or False, got {table!r}")
        self._stream_name = stream
        self._file: IO[str] | None = open(file, "a", encoding="utf-8") if file is not None else None  # noqa: SIM115
        self._table = table
        self._tag = tag

    @property
    def _out(self) -> IO[str]:
        # Looked up per write: pytest and notebooks swap sys.stdout.
        return self._file if self._file is not None else getattr(sys, self._stream_name)

    def log(self, metrics: Metrics, step: int) -> None:
        line = json.dumps({"step": step, "metrics": {k: _jsonable(v) for k, v in metrics.items()}})
        out = self._out
        out.write(f"{self._tag}{line}\n")
        if self._table:
            out.write(render_table(metrics, step))
        out.flush()

    def close(self) -> None:
        if self._file is not None:
            file, self._file = self._file, None
            file.close()


def render_table(metrics: Metrics, step: int) -> str:
    """A compact two-column table: key, value (``%.4g``); distributions as ``mean [min, max] n=count``."""
    rows = []
    for key in sorted(metrics):
        v = metrics[key]
        if isinstance(v, np.ndarray):
            s = _jsonable(v)
            text = f"{s['mean']:.4g} [{s['min']:.4g}, {s['max']:.4g}] n={s['count']}"
        else:
            text = f"{v:.4g}"
        rows.append((key, text))
    width = max((len(k) for k, _ in rows), default=0)
    head = f"-- step {step} " + "-" * max(0, width - 6)
    return "\n".join([head, *(f"{k:<{width}}  {t}" for k, t in rows)]) + "\n"
