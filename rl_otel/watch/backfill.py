"""``rl-otel backfill``: finished runs' files as OpenMetrics text with their original timestamps.

The output is what ``promtool tsdb create-blocks-from openmetrics out.om DATA_DIR`` turns into TSDB blocks: each
family once (``# HELP``/``# TYPE``/``# UNIT`` as the live endpoint writes them, then all its samples), each
series' samples in time order, timestamps in seconds, ``# EOF`` at the end. Names, labels and units are the live
endpoint's for the same keys: each run's keys go through the pipeline's own :class:`Router` (catalog entry,
labels, unit scale, the unknown-key cap and collision refusal, one router per run as one Telemetry has), and the
headers and label strings are written by the exposition's own functions. ``rl_step`` is written at each step.
TensorBoard events carry their ``wall_time``; a JSONL line needs a time field (``timestamp``, ``_timestamp``,
``wall_time`` or ``time``), a line without one is left out (counted in the summary).

Memory stays bounded: one run is read at a time, and samples are spooled to a temporary file per family past
:data:`SPOOL_LINES` held lines.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import IO, Any

from rl_otel._internal.exporters.textformat import OPENMETRICS, family_of, go_float, header, label_text
from rl_otel._internal.pipeline.histogram import BulkHistogram
from rl_otel._internal.pipeline.router import Route, Router
from rl_otel._internal.pipeline.values import as_histogram
from rl_otel.catalog import Catalog, Kind, MetricSpec, meta
from rl_otel.watch import events, frameworks, jsonl, scan
from rl_otel.watch.records import RecordTail

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
    def __init__(self, spec: MetricSpec) -> None:
        self.spec = spec
        name, typ, _unit = family_of(spec)
        self.sample = name + "_total" if typ == "counter" else name
        self.le = tuple(f"{float(b)}" for b in spec.buckets) if spec.kind is Kind.HISTOGRAM else ()
        self.has_sum = bool(self.le) and float(spec.buckets[0]) >= 0
        self.lines: list[str] = []
        self.spool: IO[str] | None = None


def backfill(paths: Sequence[str], out: str | os.PathLike, *, max_unknown_keys: int = 1_000,
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
    with tempfile.TemporaryDirectory(prefix="rl_otel-backfill-") as spool_dir:
        for (run, rank), files in sorted(by_run.items()):
            summary.runs += 1
            router: Router | None = None
            series: dict[tuple[str, tuple], dict[float, Any]] = {}
            hists: dict[tuple[str, tuple], BulkHistogram] = {}
            base = (("rank", str(rank)), ("run", run))
            for found in files:
                for step, ts, values in _points(found, summary, step_keys, time_keys):
                    if router is None:
                        named = frameworks.infer(values) if framework == "auto" else framework
                        router = Router(catalog or frameworks.catalog_for(named), max_unknown_keys)
                    if ts is None:
                        summary.untimed += 1
                        continue
                    ts = round(ts, 3)
                    series.setdefault((meta.STEP.name, base), {})[ts] = float(step) if step is not None else None
                    families.setdefault(meta.STEP.name, _Family(meta.STEP))
                    for key, value in values.items():
                        route = router.route(key)
                        if not isinstance(route, Route):
                            summary.refused[key] = route.detail
                            continue
                        _add(route, value, ts, base, series, hists, families)
            for (name, labels), points in series.items():
                fam = families[name]
                summary.series += 1
                for ts in sorted(points):
                    value = points[ts]
                    if value is None:
                        continue
                    fam.lines.extend(_lines(fam, labels, value, ts))
            held = sum(len(fam.lines) for fam in families.values())
            if held > SPOOL_LINES:
                for fam in families.values():
                    _spill(fam, spool_dir)
        summary.samples = _write(families, out)
    return summary


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
                except Exception:
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
        for line in chunk.lines:
            try:
                parsed = jsonl.parse(line, step_keys, time_keys)
            except Exception:
                summary.corrupt += 1
                continue
            if parsed is not None:
                step = parsed[0] if parsed[0] is not None else (0 if last_step is None else last_step + 1)
                last_step = step
                yield step, parsed[1], parsed[2]
        if not chunk.more:
            return


def _add(route: Route, value: Any, ts: float, base: tuple, series: dict, hists: dict,
         families: dict[str, _Family]) -> None:
    spec = route.spec
    labels = tuple(sorted(base + route.labels))
    families.setdefault(spec.name, _Family(spec))
    if spec.kind is Kind.HISTOGRAM:
        if value is None:
            return
        h = hists.get((spec.name, labels))
        if h is None:
            h = hists[(spec.name, labels)] = BulkHistogram(spec.buckets)
        try:
            h.add(float(value) * spec.scale if isinstance(value, (int, float)) else
                  as_histogram(value, spec.buckets, spec.scale))
        except Exception:
            return
        series.setdefault((spec.name, labels), {})[ts] = (list(h.counts), h.sum)
        return
    if isinstance(value, list):
        return  # a distribution for a gauge: the live endpoint refuses it too
    series.setdefault((spec.name, labels), {})[ts] = (None if value is None else
                                                      float(value) * spec.scale if spec.scale != 1.0
                                                      else float(value))


def _lines(fam: _Family, labels: tuple, value: Any, ts: float) -> list[str]:
    stamp = f"{ts:.3f}"
    if not fam.le:
        return [f"{fam.sample}{{{label_text(labels)}}} {go_float(value)} {stamp}"]
    counts, total = value
    before = label_text(p for p in labels if p[0] < "le")
    after = label_text(p for p in labels if p[0] > "le")
    head = f"{fam.sample}_bucket{{{before}{',' if before else ''}le=\""
    tail = f"\"{',' if after else ''}{after}}} "
    cumulative = list(accumulate(counts))
    out = [f"{head}{le}{tail}{go_float(n)} {stamp}" for le, n in zip(fam.le, cumulative, strict=True)]
    if fam.has_sum:
        plain = label_text(labels)
        out.append(f"{fam.sample}_count{{{plain}}} {go_float(cumulative[-1])} {stamp}")
        out.append(f"{fam.sample}_sum{{{plain}}} {go_float(total)} {stamp}")
    return out


def _spill(fam: _Family, spool_dir: str) -> None:
    if not fam.lines:
        return
    if fam.spool is None:
        fam.spool = tempfile.NamedTemporaryFile("w+", dir=spool_dir, suffix=".om", delete=False)  # noqa: SIM115
    fam.spool.write("\n".join(fam.lines) + "\n")
    fam.lines.clear()


def _write(families: dict[str, _Family], out: str | os.PathLike) -> int:
    """Each family's header and samples, then ``# EOF``; written to a temporary file and renamed into place."""
    out = os.fspath(out)
    samples = 0
    directory = os.path.dirname(os.path.abspath(out))
    fd, tmp = tempfile.mkstemp(prefix=".backfill.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for fam in families.values():
                if fam.spool is None and not fam.lines:
                    continue
                f.write(header(fam.spec, OPENMETRICS))
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
        os.replace(tmp, out)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return samples
