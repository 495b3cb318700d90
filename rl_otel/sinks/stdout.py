"""Stdout: a short line a person reads (the default on a stream), or ROLL's grep-able ``metrics_tag:`` JSON line.

Formats (``format=``):

- ``"summary"`` (default when writing to ``stdout``/``stderr``): one line per written step with a few key values,
  ``step 40  reward=0.512 kl_ref=0.013 kl_old=0.0021 entropy=1.31 loss=-0.0042 tok/s=8283``. Which
  keys: the first logged key of each training concept (:mod:`rl_otel.catalog.concepts`: reward, KL to the reference
  model, KL to the old policy, entropy, loss, ...), so ROLL's ``critic/score/mean``, TRL's ``reward`` and
  Trinity-RFT's ``rollout/reward/mean`` all show as ``reward``; ``keys=[...]`` picks them instead. The two KLs are
  named apart: ``kl_ref`` (policy to reference, what GRPO and PPO users watch drift) and ``kl_old`` (the old to
  the updated policy within one update, about 0 for a single-update GRPO step).
- ``"json"`` (default when writing to a ``file``, which programs read): the full dict, one line per step,
  ``metrics_tag: {"step": ..., "metrics": {...}}`` like ROLL's stdout tracker;
  ``grep '^metrics_tag: ' train.log | cut -c14- | jq .metrics`` recovers every step.
- ``"table"``: every key and value of the step, a two-column table.

``every=N`` writes every N-th step only (steps 0, N, 2N, ... by the step number), so a long run stays a screenful.
A distribution is written as its summary (count, mean, min, max), not its values. On a terminal a summary or table
line first clears the current line, so a progress bar redrawn there (the demo's) is not garbled.
"""

from __future__ import annotations

import json
import math
import re
import sys
from typing import IO, Any

import numpy as np

from rl_otel.sinks.base import Metrics, text_key

TAG = "metrics_tag: "
FORMATS = ("summary", "json", "table")

# (concept, short label) in the order the summary shows them (see rl_otel.catalog.concepts)
# (the clip fraction gave its place to the second KL: a line fits 100 columns; keys=[...] shows it again)
SUMMARY_CONCEPTS = (
    ("reward", "reward"), ("eval_score", "eval"), ("ref_kl", "kl_ref"), ("policy_kl", "kl_old"),
    ("entropy", "entropy"), ("policy_loss", "loss"), ("throughput", "tok/s"),
)
_CLEAR_LINE = "\r\033[K"


def _jsonable(value: float | np.ndarray) -> object:
    if isinstance(value, np.ndarray):
        finite = value[np.isfinite(value)]
        return {"count": int(value.size), "mean": float(finite.mean()) if finite.size else math.nan,
                "min": float(finite.min()) if finite.size else math.nan,
                "max": float(finite.max()) if finite.size else math.nan}
    return value


class StdoutSink:
    """Writes to ``stream`` ("stdout", "stderr") or appends to the file ``file``.

    Args:
        format: ``"summary"``, ``"json"`` or ``"table"`` (default: ``"json"`` with ``file``, else ``"summary"``).
        every: write every N-th step (by step number; default 1: every step).
        keys: the keys a summary line shows (default: one per training concept, see the module docstring).
        table: ``True`` is ``format="table"`` (kept for old configurations).
        tag: the prefix of a JSON line (default ``"metrics_tag: "``, ROLL's).
    """

    def __init__(self, *, run: str, stream: str = "stdout", file: str | None = None, format: str | None = None,
                 every: int = 1, keys: list[str] | tuple[str, ...] | None = None, table: bool = False,
                 tag: str = TAG) -> None:
        if stream not in ("stdout", "stderr"):
            raise ValueError(f"stream must be 'stdout' or 'stderr', got {stream!r}")
        if not isinstance(table, bool):
            raise ValueError(f"table must be True or False, got {table!r}")
        if format is None:
            format = "table" if table else ("json" if file is not None else "summary")
        if format not in FORMATS:
            raise ValueError(f"format must be one of {FORMATS}, got {format!r}")
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be a positive int, got {every!r}")
        if keys is not None and (isinstance(keys, str) or not all(isinstance(k, str) for k in keys)):
            raise ValueError(f"keys must be a list of metric keys, got {keys!r}")
        self._stream_name = stream
        self._file: IO[str] | None = open(file, "a", encoding="utf-8") if file is not None else None  # noqa: SIM115
        self.format, self.every = format, every
        self._keys = tuple(text_key(k) for k in keys) if keys is not None else None  # as the bridge passes keys
        self._tag = tag
        self._picker = _ConceptPicker() if keys is None and format == "summary" else None

    @property
    def _out(self) -> IO[str]:
        # Looked up per write: pytest and notebooks swap sys.stdout.
        return self._file if self._file is not None else getattr(sys, self._stream_name)

    def log(self, metrics: Metrics, step: int) -> None:
        if step % self.every:
            return
        out = self._out
        if self.format == "json":
            line = json.dumps({"step": step, "metrics": {k: _jsonable(v) for k, v in metrics.items()}})
            text = f"{self._tag}{line}\n"
        elif self.format == "table":
            text = render_table(metrics, step)
        else:
            text = self.summary(metrics, step) + "\n"
        if self.format != "json" and _isatty(out):
            text = _CLEAR_LINE + text
        out.write(text)
        out.flush()

    def summary(self, metrics: Metrics, step: int) -> str:
        """The summary line of a step (without the newline)."""
        if self._keys is not None:
            shown = [(k, metrics[k]) for k in self._keys if k in metrics]
        else:
            assert self._picker is not None
            shown = self._picker.pick(metrics)
        return f"step {step}  " + " ".join(f"{label}={_short(value)}" for label, value in shown)

    def close(self) -> None:
        if self._file is not None:
            file, self._file = self._file, None
            file.close()


def _isatty(out: IO[str]) -> bool:
    try:
        return out.isatty()
    except (AttributeError, ValueError):
        return False


def _short(value: float | np.ndarray) -> str:
    """Three significant digits; whole numbers up to ten million as they are (``8283``, not ``8.28e+03``)."""
    if isinstance(value, np.ndarray):
        s = _jsonable(value)
        assert isinstance(s, dict)
        value = s["mean"]
    v = float(value)
    return f"{v:.0f}" if 1000 <= abs(v) < 1e7 else f"{v:.3g}"


class _ConceptPicker:
    """For each summary concept, the first logged key whose catalog series is one of the concept's sources."""

    def __init__(self) -> None:
        from rl_otel.catalog import default_catalog
        from rl_otel.catalog.concepts import concept

        self._catalog = default_catalog()
        self._concepts = [(label, concept(name)) for name, label in SUMMARY_CONCEPTS]
        self._of_key: dict[str, int | None] = {}  # key -> index into _concepts (None: no concept); cached

    def _concept_of(self, key: str) -> int | None:
        if key not in self._of_key:
            if len(self._of_key) > 100_000:  # hostile input: unbounded distinct keys
                self._of_key.clear()
            self._of_key[key] = self._lookup(key)
        return self._of_key[key]

    def _lookup(self, key: str) -> int | None:
        resolved = self._catalog.resolve(key)
        if not resolved.known:
            return None
        name, labels = resolved.spec.prometheus_name, dict(resolved.labels)
        for i, (_, c) in enumerate(self._concepts):
            if any(s.metric == name and _matches(s.matchers, labels) for s in c.sources):
                return i
        return None

    def pick(self, metrics: Metrics) -> list[tuple[str, Any]]:
        chosen: dict[int, tuple[str, Any]] = {}
        for key in sorted(metrics):
            i = self._concept_of(key)
            if i is not None and i not in chosen:
                chosen[i] = (self._concepts[i][0], metrics[key])
        return [chosen[i] for i in sorted(chosen)]


def _matches(matchers: tuple[tuple[str, str, str], ...], labels: dict[str, str]) -> bool:
    for label, op, value in matchers:
        have = labels.get(label, "")
        if (op == "=" and have != value) or (op == "!=" and have == value):
            return False
        if op in ("=~", "!~") and (re.fullmatch(value, have) is not None) != (op == "=~"):
            return False
    return True


def render_table(metrics: Metrics, step: int) -> str:
    """A compact two-column table: key, value (``%.4g``); distributions as ``mean [min, max] n=count``."""
    rows = []
    for key in sorted(metrics):
        v = metrics[key]
        if isinstance(v, np.ndarray):
            s = _jsonable(v)
            assert isinstance(s, dict)
            text = f"{s['mean']:.4g} [{s['min']:.4g}, {s['max']:.4g}] n={s['count']}"
        else:
            text = f"{v:.4g}"
        rows.append((key, text))
    width = max((len(k) for k, _ in rows), default=0)
    head = f"-- step {step} " + "-" * max(0, width - 6)
    return "\n".join([head, *(f"{k:<{width}}  {t}" for k, t in rows)]) + "\n"
