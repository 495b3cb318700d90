"""``rl-otel backfill``: finished runs' files as OpenMetrics text with their original timestamps.

The output is what ``promtool tsdb create-blocks-from openmetrics out.om DATA_DIR`` turns into TSDB blocks: each
family once (``# HELP``/``# TYPE``/``# UNIT`` as the live endpoint writes them, then all its samples), each
series' samples in time order, timestamps in seconds, ``# EOF`` at the end.

It writes and reads as a live process does: each run and rank has a
:class:`~rl_otel._internal.pipeline.recorder.Recorder` (its framework's catalog, labels, unit scale, the
unknown-key cap and collision refusal), each point of its files is routed and recorded (``record``, the one write)
in time order, and what the point changed is read back from ``collect()`` (the one read) and encoded by the
endpoint's own :class:`~rl_otel._internal.exporters.exposition.Renderer`, each sample line stamped with the
point's time. ``rl_step`` and ``rl_last_step_timestamp_seconds`` are written at each step. TensorBoard events carry
their ``wall_time``; a JSONL line needs a time field (``timestamp``, ``_timestamp``, ``wall_time`` or ``time``), a
line without one is left out (counted in the summary).

Memory stays bounded by one run's points: runs are read one at a time, and samples are spooled to a temporary file
per family past :data:`SPOOL_LINES` held lines.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from rl_otel._internal.atomic import atomic_write
from rl_otel._internal.exporters.exposition import Renderer
from rl_otel._internal.exporters.textformat import OPENMETRICS
from rl_otel._internal.pipeline.ingest import Ingest
from rl_otel._internal.pipeline.recorder import Recorder
from rl_otel._internal.pipeline.records import Batch, Count, Labels, Measurement
from rl_otel._internal.pipeline.router import Refusal
from rl_otel._internal.runtime.assembly import pipeline
from rl_otel.catalog import Catalog, meta
from rl_otel.watch import events, frameworks, jsonl, scan
from rl_otel.watch.records import RecordTail
from rl_otel.watch.served import ROLE

SPOOL_LINES = 500_000


@dataclass
class Summary:
    """What a backfill wrote: runs, series, samples, and the records left out (corrupt, or without a time)."""

    runs: int = 0
    series: int = 0
    samples: int = 0
    corrupt: int = 0
    untimed: int = 0
    refused: dict[str, str] = field(default_factory=dict)


class _Family:
    """One family of the output: its header (as the endpoint writes it) and its sample lines so far."""

    def __init__(self, header: str) -> None:
        self.header = header
        self.lines: list[str] = []
        self.spool: IO[str] | None = None


def backfill(paths: Sequence[str], out: str | os.PathLike, *, max_unknown_keys: int | None = None,
             step_keys: Sequence[str] = jsonl.STEP_KEYS, time_keys: Sequence[str] = jsonl.TIME_KEYS,
             catalog: Catalog | None = None, framework: str = "auto") -> Summary:
    """Write the runs under ``paths`` (directories or files, as ``rl-otel watch`` takes them) to ``out`` as
    OpenMetrics text with the original timestamps; returns a :class:`Summary`. Each run's keys resolve in
    ``catalog``, else in its framework's (``framework``, or inferred from its first values as watch does)."""
    summary = Summary()
    by_run: dict[tuple[str, int], list[scan.Found]] = {}
    for found in scan.scan(paths):
        by_run.setdefault((found.run, found.rank), []).append(found)
    families: dict[str, _Family] = {}
    renderer = Renderer()
    with tempfile.TemporaryDirectory(prefix="rl_otel-backfill-") as spool_dir:
        for (run, rank), files in sorted(by_run.items()):
            summary.runs += 1
            points = [point for found in files for point in _points(found, summary, step_keys, time_keys)]
            timed = [(ts, i, step, values) for i, (step, ts, values) in enumerate(points) if ts is not None]
            summary.untimed += len(points) - len(timed)
            if not timed:
                continue
            timed.sort(key=lambda p: (p[0], p[1]))  # time order (a restarted training's second file interleaves)
            named = frameworks.infer(timed[0][3]) if framework == "auto" else framework
            parts = pipeline(catalog or frameworks.catalog_for(named), {"run": run, "role": ROLE, "rank": str(rank)},
                             max_unknown_keys=max_unknown_keys)
            recorder, ingest, router = parts.recorder, parts.ingest, parts.ingest.router
            written: set[tuple[str, Labels]] = set()
            for ts, _i, step, values in timed:
                for key in values:
                    route = router.route(key)
                    if isinstance(route, Refusal):
                        summary.refused.setdefault(key, route.detail)
                touched = _record(recorder, ingest, values, step, round(ts, 3))
                _encode(renderer, recorder, touched, f"{round(ts, 3):.3f}", families, written)
            summary.series += len(written)
            if sum(len(fam.lines) for fam in families.values()) > SPOOL_LINES:
                for fam in families.values():
                    _spill(fam, spool_dir)
        summary.samples = _write(families, out)
    return summary


def _record(recorder: Recorder, ingest: Ingest, values: dict[str, Any], step: int | None,
            ts: float) -> dict[str, set[Labels]]:
    """Record one point at its time (every series written, whatever its step: a backfill's order is time, so the
    step's series are plain measurements here, not a step's marks) and return the series it changed, by family
    name."""
    routed = ingest.route(values.items())
    measurements = routed.measurements
    if step is not None:
        measurements += [Measurement(meta.STEP, (), float(step)), Measurement(meta.LAST_STEP_TIMESTAMP, (), ts)]
    recorder.record(Batch(measurements, gone=routed.gone,
                          counts=[Count(meta.DROPPED_SERIES, (("metric", m),)) for m in routed.refused]))
    touched: dict[str, set[Labels]] = {}
    for spec, labels, _value in measurements:
        touched.setdefault(spec.name, set()).add(labels)
    return touched


def _encode(renderer: Renderer, recorder: Recorder, touched: dict[str, set[Labels]], stamp: str,
            families: dict[str, _Family], written: set[tuple[str, Labels]]) -> None:
    """The touched series as they are served now, each sample line stamped (the endpoint's encoder). Reads only
    those series (``collect(only=)``): a point costs what it wrote, not the whole store."""
    views = list(recorder.collect(only=touched).stored.families)
    for fam in views:
        written.update((fam.spec.name, p.labels) for p in fam.points)
    if not views:
        return
    rendering = renderer.render(views, OPENMETRICS, set())
    for part, text in zip(rendering.families(), rendering.family_texts(), strict=True):
        lines = text.split("\n")
        out = families.get(part.name)
        if out is None:
            out = families[part.name] = _Family("".join(f"{line}\n" for line in lines if line.startswith("#")))
        out.lines.extend(f"{line} {stamp}" for line in lines if line and not line.startswith("#"))


def _points(found: scan.Found, summary: Summary, step_keys: Sequence[str],
            time_keys: Sequence[str]) -> Iterator[tuple[int | None, float | None, dict[str, Any]]]:
    """Every point of one file, read to its end; corrupt records counted."""
    size = os.path.getsize(found.path)
    if found.kind == "tfevents":
        tail = RecordTail(found.path)
        while True:
            batch = tail.read(size)
            summary.corrupt += batch.corrupt
            for data in batch.records:
                try:
                    point = events.scalars(data)
                except ImportError:
                    raise
                except Exception:  # boundary: a record of the user's files, decoded by protobuf/TensorBoard
                    summary.corrupt += 1
                    continue
                if point is not None:
                    yield point
            if not batch.more:
                return
    lines = jsonl.LineTail(found.path)
    last_step: int | None = None
    while True:
        chunk = lines.read(size)
        summary.corrupt += chunk.corrupt
        for line in chunk.records:
            try:
                parsed = jsonl.parse(line, step_keys, time_keys)
            except (ValueError, RecursionError):  # a line of any content: what json and the checks raise
                summary.corrupt += 1
                continue
            if parsed is not None:
                step = parsed[0] if parsed[0] is not None else (0 if last_step is None else last_step + 1)
                last_step = step
                yield step, parsed[1], parsed[2]
        if not chunk.more:
            return


def _spill(fam: _Family, spool_dir: str) -> None:
    if not fam.lines:
        return
    if fam.spool is None:
        fam.spool = tempfile.NamedTemporaryFile("w+", dir=spool_dir, suffix=".om", delete=False)  # noqa: SIM115
    fam.spool.write("\n".join(fam.lines) + "\n")
    fam.lines.clear()


def _write(families: dict[str, _Family], out: str | os.PathLike) -> int:
    """Each family's header and samples, then ``# EOF``, replacing ``out`` atomically; returns the samples."""
    samples = 0
    with atomic_write(out, mode=0o644) as f:
        for fam in families.values():
            if fam.spool is None and not fam.lines:
                continue
            f.write(fam.header)
            if fam.spool is not None:
                fam.spool.seek(0)
                for line in fam.spool:
                    f.write(line)
                    samples += 1
                fam.spool.close()
            if fam.lines:
                f.write("\n".join(fam.lines) + "\n")
                samples += len(fam.lines)
        f.write("# EOF\n")
    return samples
