"""``rl-otel watch`` and ``rl-otel backfill``: serve what a training already writes to files.

A training that logs to TensorBoard event files or to JSONL metric lines (every major RL framework does one or
the other) is followed from beside it, without touching its code: :class:`~rl_otel.watch.watcher.Watcher` tails
the files as they grow and logs their values through one :func:`rl_otel.init` Telemetry per run and rank, so the
catalog, labels, recording rules, alerts and dashboards are those of an instrumented training.
:func:`~rl_otel.watch.backfill.backfill` writes finished runs as OpenMetrics text with their original timestamps,
for ``promtool tsdb create-blocks-from openmetrics``.

The modules, each small: :mod:`.records` (TFRecord framing, CRC-checked, resumable), :mod:`.events` (an Event's
scalars), :mod:`.jsonl` (metric lines), :mod:`.scan` (which files, which run and rank), :mod:`.state` (offsets and
last values, written atomically), :mod:`.frameworks` (``--framework auto``), :mod:`.served` (one run's
Telemetry), :mod:`.watcher` (the loop), :mod:`.backfill`, :mod:`.command` (the CLI).
"""

from __future__ import annotations

__all__ = ["WatchOptions", "Watcher", "backfill"]


def __getattr__(name: str) -> object:  # light: `import rl_otel.watch` imports no Telemetry, no protobuf
    if name in ("Watcher", "WatchOptions"):
        from rl_otel.watch import watcher

        return getattr(watcher, name)
    if name == "backfill":
        from rl_otel.watch.backfill import backfill

        return backfill
    raise AttributeError(f"module 'rl_otel.watch' has no attribute {name!r}")
