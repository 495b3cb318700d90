"""The series store: last values of gauges, absolute values of counters, bulk histograms.

rl_otel aggregates here instead of in OTel SDK instruments because the SDK drops every non-finite measurement
(an alert must see a NaN loss), costs ~6 µs per attributed record, and keeps a vanished sync-gauge series
forever. The store is bounded (series cap per metric, optional TTL) and hands the SDK's readers finished
OTel ``Metric`` objects at collection time. Thread-safe: one lock guards all families.

Collectors (``add_collector``) add live series computed at collection time (process and GPU memory); they run
before the lock is taken and must be fast: anything slow (NVML) belongs in a poller thread with a cached value.

Every change bumps :attr:`SeriesStore.version`: the scrape endpoint renders the stored families once per version
(and TTL deadline) and serves those bytes until the next change; only the live collectors run at every scrape.
It renders through held points (:meth:`SeriesStore.laid_out`, then :meth:`SeriesStore.read` at each version): the
families and their series are laid out once per set of series, and a new version's values are read in one pass.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple, TypeVar, cast

from rl_otel._internal.pipeline.histogram import BulkHistogram
from rl_otel._internal.pipeline.worker import reset_in_forked_child
from rl_otel.catalog import Kind, MetricSpec

if TYPE_CHECKING:  # the SDK's metrics package: loaded by collect() only, which the OTLP push calls
    from opentelemetry.sdk.metrics.export import Metric

Labels = tuple[tuple[str, str], ...]  # (name, value) pairs in the catalog entry's order, without run/rank
# a family as laid out for reading: its entry, the labels on every series, and (labels, held point) per series
HeldFamily = tuple[MetricSpec, Labels, Collection[tuple[Labels, list]]]
Item = tuple[MetricSpec, Labels, float]
T = TypeVar("T")
Collector = Callable[[], Iterable[Item]]


class HistogramValue(NamedTuple):
    """A histogram series frozen at collection time (what a scrape renders; ``Telemetry.value`` returns one):
    ``counts`` per bucket, not cumulative, one more than the bounds (the last counts values above the highest
    bound); ``sum``, ``count``, ``min``, ``max`` of the finite values observed (NaN/Inf are left out)."""

    counts: list[int]
    sum: float
    count: int  # type: ignore[assignment]  # a field named like tuple.count: the public name, shadowing on purpose
    min: float
    max: float


@dataclass(frozen=True)
class FamilyView:
    """One family at collection time: ``points`` pairs a series' labels (besides the ``base`` ones, run and
    rank; none for ``target_info``) with a float or a :class:`HistogramValue`. ``scrape_only``: an info family
    (:meth:`SeriesStore.write_info`), which the OTLP push leaves out."""

    spec: MetricSpec
    base: Labels
    start_ns: int
    points: list[tuple[Labels, float | HistogramValue]]
    scrape_only: bool = False


@dataclass
class _Family:
    spec: MetricSpec
    expires: bool
    # labels -> [value or BulkHistogram, time_ns, step of the value or None]; keyed by the router's label pairs
    # as they are, so that a write builds no tuple (the per-step path)
    points: dict[Labels, list] = field(default_factory=dict)
    start_ns: int = field(default_factory=time.time_ns)
    base: Labels | None = None  # labels on every series besides its own: None for the store's (run, rank)
    scrape_only: bool = False


class SeriesStore:
    """All of rl_otel's series, keyed by metric name and label pairs.

    ``max_series_per_metric`` bounds each family; a new label set past the cap is dropped and reported through
    ``on_drop(metric_name)`` (the caller warns once), called after the store's lock is released. ``ttl_s``
    expires series not written for that long (families marked ``expires=False`` - liveness, self-monitoring -
    never expire).
    """

    def __init__(self, base_labels: dict[str, str], *, max_series_per_metric: int, ttl_s: float | None,
                 dropped_spec: MetricSpec, on_drop: Callable[[str], None]) -> None:
        self._base: Labels = tuple(base_labels.items())
        self._max_series = max_series_per_metric
        self._ttl_ns = None if ttl_s is None else int(ttl_s * 1e9)
        self._dropped_spec = dropped_spec
        self._dropped: dict[str, list[float]] = {}  # metric name -> [count]: a held point, as the series' lists
        self._on_drop = on_drop
        self._families: dict[str, _Family] = {}
        self._start_ns = time.time_ns()
        self._lock = threading.Lock()
        self._collectors: tuple[Collector, ...] = ()  # copy-on-write: collect() iterates without the lock
        self._version = 0  # bumped under the lock by every change of the stored series
        self._settle: Callable[[], object] | None = None
        self._capped: list[str] = []  # metrics that refused a new series under the lock, for on_drop after it
        self._structure = 0  # bumped whenever a series is removed: a held point (see points()) is then stale
        self._layout = 0  # bumped whenever a series comes or goes: what laid_out() gave is then stale
        reset_in_forked_child(self)

    def _after_fork(self) -> None:
        """In a forked child: a fresh lock (a scrape or a logging thread of the parent may have held it)."""
        self._lock = threading.Lock()

    def set_settle(self, settle: Callable[[], object]) -> None:
        """Call ``settle()`` before every read (:meth:`settle`): the Telemetry's metrics worker waits there for
        the jobs submitted before the read, so a scrape never serves a step that is still being computed."""
        self._settle = settle

    def settle(self) -> None:
        """Let pending writes land (a bounded wait, see :meth:`set_settle`); readers call it before reading."""
        settle = self._settle
        if settle is not None:
            settle()

    @property
    def version(self) -> int:
        """A counter bumped by every write, increment and drop: equal versions mean equal stored series (until
        a TTL deadline, which :meth:`snapshot` reports)."""
        return self._version

    def add_collector(self, collector: Collector) -> None:
        """Call ``collector()`` at every collection for live ``(spec, labels, value)`` gauge items.

        Its series are never stored: a series it stops returning vanishes from the next scrape. It runs on the
        scrape thread outside the store's lock and must not raise (wrap it) nor block.
        """
        with self._lock:
            self._collectors = (*self._collectors, collector)

    def _point(self, spec: MetricSpec, labels: Labels, expires: bool) -> list | None:
        fam = self._families.get(spec.name)
        if fam is None:
            fam = self._families[spec.name] = _Family(spec, expires)
        point = fam.points.get(labels)
        if point is None:
            if len(fam.points) >= self._max_series:
                self._count_dropped(spec.name)
                self._capped.append(spec.name)  # reported by _report_capped once the lock is released
                return None
            point = fam.points[labels] = [None, 0, None]
            self._layout += 1
        return point

    def _report_capped(self) -> None:
        """Call ``on_drop`` for the series refused by the cap, outside the lock (the callback logs)."""
        if self._capped:
            with self._lock:
                capped, self._capped = self._capped, []
            for name in dict.fromkeys(capped):
                self._on_drop(name)

    def _count_dropped(self, metric_name: str) -> None:
        count = self._dropped.get(metric_name)
        if count is None:
            self._dropped[metric_name] = [1.0]
            self._layout += 1
        else:
            count[0] += 1

    def note_dropped(self, metric_name: str) -> None:
        """Count a value refused before the store (``rl_telemetry_dropped_series_total{metric=...}``)."""
        with self._lock:
            self._count_dropped(metric_name)
            self._version += 1

    def write(self, items: Iterable[tuple[MetricSpec, tuple[tuple[str, str], ...], object]], *,
              expires: bool = True, step: int | None = None) -> list[tuple[MetricSpec, int]]:
        """Store ``(spec, labels, value)`` items: a float for gauges and counters, a float, a 1-d float array or
        ``BucketCounts`` (bucketed against the entry's bounds) for histograms. Returns ``(spec, n)`` for each
        histogram item that had ``n`` non-finite values left out.

        With ``step``, a series already holding a newer step's value keeps it (a gauge is not set back, a counter
        does not decrease, a histogram does not take the older step's values): the step of a series' value never
        goes back. ``step=None`` always writes."""
        now = time.time_ns()
        with self._lock:
            self._version += 1
            dropped_non_finite = self._put(items, expires, step, now)
        if self._capped:
            self._report_capped()
        return dropped_non_finite

    def _put(self, items: Iterable[tuple[MetricSpec, Labels, object]], expires: bool, step: int | None,
             now: int) -> list[tuple[MetricSpec, int]]:
        """The item loop of :meth:`write` and :meth:`write_step` (the caller holds the lock)."""
        dropped_non_finite = []
        for spec, labels, value in items:
            point = self._point(spec, labels, expires)
            if point is None:
                continue
            if step is not None:
                if point[2] is not None and step < point[2]:
                    continue
                point[2] = step
            if spec.kind is Kind.HISTOGRAM:
                if point[0] is None:
                    point[0] = BulkHistogram(spec.buckets)
                left_out = point[0].add(value)
                if left_out:
                    dropped_non_finite.append((spec, left_out))
            else:
                point[0] = value
            point[1] = now
        return dropped_non_finite

    def _mark(self, marks: Iterable[tuple[MetricSpec, float, bool]], step: int, now: int) -> None:
        """Write the unlabelled, never-expiring ``(spec, value, keep_newest)`` marks of a step (lock held)."""
        for spec, value, keep_newest in marks:
            point = self._point(spec, (), False)
            if point is None or (keep_newest and point[2] is not None and step < point[2]):
                continue
            point[0], point[1], point[2] = value, now, step

    def write_step(self, items: Iterable[tuple[MetricSpec, Labels, object]], gone: Iterable[tuple[MetricSpec, Labels]],
                   *, step: int, marks: Iterable[tuple[MetricSpec, float, bool]]) -> list[tuple[MetricSpec, int]]:
        """One step as a whole, under one lock acquisition, so that a scrape sees all of it or none of it:
        ``items`` as :meth:`write` with ``step``, the gauge series in ``gone`` removed (a ``None`` logged), and
        the unlabelled ``marks`` - ``(spec, value, keep_newest)``: ``rl_step`` (its value never goes back) and the
        step's timestamp (always written) - which never expire."""
        now = time.time_ns()
        with self._lock:
            self._version += 1
            dropped_non_finite = self._put(items, True, step, now)
            for spec, labels in gone:
                fam = self._families.get(spec.name)
                if fam is not None and fam.points.pop(labels, None) is not None:
                    self._structure += 1
                    self._layout += 1
            self._mark(marks, step, now)
        if self._capped:
            self._report_capped()
        return dropped_non_finite

    def points(self, items: Iterable[tuple[MetricSpec, Labels]]) -> tuple[int, list[list]] | None:
        """The series of ``items`` (gauges and counters, created if new) as held points, with the structure
        version they are valid for: :meth:`write_points` then writes a whole step without a lookup per key.
        ``None`` if a series is refused by the cap (the caller writes item by item, which counts the refusals)."""
        held = []
        with self._lock:
            for spec, labels in items:
                fam = self._families.get(spec.name)
                point = fam.points.get(labels) if fam is not None else None
                if point is None:
                    if fam is not None and len(fam.points) >= self._max_series:
                        return None
                    point = self._point(spec, labels, True)
                    if point is None:
                        return None
                held.append(point)
            return self._structure, held

    def write_points(self, structure: int, points: list[list], values: Iterable[float], *, step: int | None,
                     newest: bool, marks: Iterable[tuple[MetricSpec, float, bool]] = ()) -> bool:
        """A whole step through held points (:meth:`points`), values already in base units, under one lock with
        the ``marks`` (see :meth:`write_step`). ``newest``: no series holds a newer step than ``step`` (the step
        check per series is skipped); ``step=None``: values outside any step, always written, as :meth:`write`.
        False, writing nothing, if a series was removed since the points were
        taken (the caller takes them again)."""
        now = time.time_ns()
        with self._lock:
            if structure != self._structure:
                return False
            self._version += 1
            if step is None:  # current values outside any step (a phase's keys): as write(step=None)
                for point, value in zip(points, values):  # noqa: B905 (equal lengths by construction)
                    point[0] = value
                    point[1] = now
            elif newest:
                for point, value in zip(points, values):  # noqa: B905 (equal lengths by construction)
                    point[0] = value
                    point[1] = now
                    point[2] = step
            else:
                for point, value in zip(points, values):  # noqa: B905
                    if point[2] is None or step >= point[2]:
                        point[0] = value
                        point[1] = now
                        point[2] = step
            if step is not None:
                self._mark(marks, step, now)
        return True

    def increment(self, spec: MetricSpec, labels: tuple[tuple[str, str], ...], amount: float = 1.0) -> None:
        """Add to a counter series (rl_otel's own counters, which never expire)."""
        with self._lock:
            self._version += 1
            point = self._point(spec, labels, False)
            if point is not None:
                point[0] = (point[0] or 0.0) + amount
                point[1] = time.time_ns()
        if self._capped:
            self._report_capped()

    def write_info(self, spec: MetricSpec, labels: Labels, *, base_labels: bool = True) -> None:
        """Set a constant series (1.0, never expires, outside the series cap) whose labels state facts about the
        process: ``rl_otel_build_info{version}``, and ``target_info`` from the OTel resource (``base_labels=False``:
        the series has only ``labels``). Info families are the scrape endpoint's: :meth:`collect` (the OTLP push)
        leaves them out - over OTLP the resource travels as itself, and build_info is an instrument of the OTLP
        pipeline's meter provider."""
        with self._lock:
            self._version += 1
            fam = self._families.get(spec.name)
            if fam is None:
                fam = self._families[spec.name] = _Family(spec, False, base=None if base_labels else (),
                                                          scrape_only=True)
            point = fam.points.get(labels)
            if point is None:  # a new series; else the same list, which a reader may hold (see laid_out())
                point = fam.points[labels] = [None, 0, None]
                self._layout += 1
            point[0], point[1] = 1.0, time.time_ns()

    def delete(self, spec: MetricSpec, labels: Labels) -> bool:
        """Remove one series (``labels`` as :meth:`write` got them): the next scrape no longer has it, so
        Prometheus marks it stale instead of repeating its last value. True if it existed."""
        with self._lock:
            fam = self._families.get(spec.name)
            if fam is None or fam.points.pop(labels, None) is None:
                return False
            self._version += 1
            self._structure += 1
            self._layout += 1
            return True

    def value(self, name: str, labels: Mapping[str, object] | Labels | None = None) -> float | HistogramValue | None:
        """What a scrape would serve now for one series, ``None`` for none: ``name`` is the family's name or its
        samples' (``_total`` of a counter), ``labels`` the series' labels besides the base ones (run, rank), as a
        dict or as the pairs :meth:`write` got. A histogram gives a :class:`HistogramValue` (a copy). Waits for
        pending writes (:meth:`settle`); live series are computed now."""
        self.settle()
        want = {str(k): str(v) for k, v in (labels.items() if isinstance(labels, Mapping) else labels or ())}
        now = time.time_ns()
        with self._lock:
            fam = self._families.get(name)
            if fam is None:
                fam = next((f for f in self._families.values() if f.spec.prometheus_name == name), None)
            if fam is not None:
                for key, point in fam.points.items():
                    if len(key) == len(want) and dict(key) == want:
                        if self._ttl_ns is not None and fam.expires and now - point[1] > self._ttl_ns:
                            return None  # expired: the next scrape leaves it out
                        return _histogram_value(point[0]) if fam.spec.kind is Kind.HISTOGRAM else point[0]
                return None
            if name in (self._dropped_spec.name, self._dropped_spec.prometheus_name) and list(want) == ["metric"]:
                dropped = self._dropped.get(want["metric"])
                return None if dropped is None else dropped[0]
        for view in self.live():
            if name in (view.spec.name, view.spec.prometheus_name):
                for key, value in view.points:
                    if dict(key) == want:
                        return value
        return None

    def series_count(self, name: str | None = None) -> int:
        with self._lock:
            fams = self._families.values() if name is None else [self._families.get(name)]
            return sum(len(f.points) for f in fams if f is not None)

    def live(self) -> list[FamilyView]:
        """The collectors' series, computed now (outside the lock: collectors never touch the store)."""
        live: dict[str, FamilyView] = {}
        for collector in self._collectors:
            for spec, labels, value in collector():
                fam = live.get(spec.name)
                if fam is None:
                    fam = live[spec.name] = FamilyView(spec, self._base, self._start_ns, [])
                fam.points.append((labels, value))
        return list(live.values())

    def snapshot(self) -> tuple[int, list[FamilyView], int | None]:
        """``(version, families, valid_until_ns)``: the stored families frozen at one version, stale series
        expired first; ``valid_until_ns`` is when the next series expires (``None``: never, without a write)."""
        self.settle()
        now = time.time_ns()
        families = []
        with self._lock:
            next_expiry = self._expire(now)
            for fam in self._families.values():
                if fam.points:
                    families.append(FamilyView(fam.spec, self._base if fam.base is None else fam.base, fam.start_ns,
                                               _frozen(fam), fam.scrape_only))
            if self._dropped:
                families.append(FamilyView(self._dropped_spec, self._base, self._start_ns,
                                           [((("metric", name),), n[0]) for name, n in self._dropped.items()]))
            return self._version, families, next_expiry

    def _expire(self, now: int) -> int | None:
        """Remove the series past their TTL (the caller holds the lock); when the next one expires."""
        if self._ttl_ns is None:
            return None
        next_expiry = None
        for fam in self._families.values():
            if fam.expires and fam.points:
                stale = [k for k, p in fam.points.items() if now - p[1] > self._ttl_ns]
                for k in stale:
                    del fam.points[k]
                if stale:
                    self._version += 1
                    self._structure += 1
                    self._layout += 1
                if fam.points:
                    oldest = min(p[1] for p in fam.points.values()) + self._ttl_ns + 1
                    next_expiry = oldest if next_expiry is None else min(next_expiry, oldest)
        return next_expiry

    def laid_out(self, lay_out: Callable[[Iterable[HeldFamily]], T]) -> tuple[int, T]:
        """``(layout, lay_out(families))``: ``lay_out`` called under the lock with the stored families as
        :meth:`snapshot` orders them (stale series expired first), each series with its held point - the store's
        own list, whose value :meth:`read` reads under the lock. A reader lays the families out once (the scrape
        endpoint compiles its rendering plan here) and reads each new version's values in one pass, as long as
        :meth:`read` accepts the ``layout``: it is bumped by every series that comes or goes.

        ``lay_out`` runs under the store's lock (a ``log()`` waits for it: it must be fast and must not call the
        store); it gets views, valid while it runs. The caller settles first."""
        with self._lock:
            self._expire(time.time_ns())
            base = self._base
            families: Iterable[HeldFamily] = ((fam.spec, base if fam.base is None else fam.base, fam.points.items())
                                              for fam in self._families.values() if fam.points)
            if self._dropped:
                dropped = [((("metric", name),), count) for name, count in self._dropped.items()]
                families = itertools.chain(families, [(self._dropped_spec, base, dropped)])
            return self._layout, lay_out(families)

    def read(self, layout: int, numbers: list[list], hists: list[list]) -> tuple[int, list, list, int | None] | None:
        """``(version, values, histograms, valid_until_ns)`` of held points of a :meth:`laid_out` (``numbers``: of
        gauges and counters; ``hists``: of histograms, as :class:`HistogramValue` s) read at one version, stale
        series expired first (see :meth:`snapshot`); ``None`` when the layout is stale (take it again). The
        caller settles first."""
        with self._lock:
            next_expiry = self._expire(time.time_ns())
            if layout != self._layout:
                return None
            return (self._version, [point[0] for point in numbers], [_histogram_value(p[0]) for p in hists],
                    next_expiry)

    def collect(self) -> list[Metric]:
        """Every family as an OTel ``Metric`` (cumulative), expiring stale series first: the live ones, then
        the stored ones; not the info families (:meth:`write_info`), which are the scrape endpoint's."""
        now = time.time_ns()
        return [_to_metric(fam, now) for fam in (*self.live(), *self.snapshot()[1]) if not fam.scrape_only]


def _histogram_value(h: BulkHistogram) -> HistogramValue:
    return HistogramValue(h.counts.tolist(), h.sum, h.count, h.min, h.max)


def _frozen(fam: _Family) -> list[tuple[Labels, float | HistogramValue]]:
    if fam.spec.kind is Kind.HISTOGRAM:
        return [(labels, _histogram_value(h)) for labels, (h, *_) in fam.points.items()]
    return [(labels, point[0]) for labels, point in fam.points.items()]  # floats: write() and increment() store floats


def _to_metric(fam: FamilyView, now: int) -> Metric:
    from opentelemetry.sdk.metrics.export import (
        AggregationTemporality,
        Gauge,
        Histogram,
        HistogramDataPoint,
        Metric,
        NumberDataPoint,
        Sum,
    )

    spec = fam.spec
    attrs = [(dict(fam.base + labels), value) for labels, value in fam.points]
    data: Histogram | Sum | Gauge
    if spec.kind is Kind.HISTOGRAM:
        bounds = [float(b) for b in spec.buckets]
        hists = cast("list[tuple[dict[str, str], HistogramValue]]", attrs)  # a histogram family holds HistogramValues
        hist_points = [
            HistogramDataPoint(attributes=a, start_time_unix_nano=fam.start_ns, time_unix_nano=now, count=h.count,
                               sum=h.sum, bucket_counts=h.counts, explicit_bounds=bounds,
                               min=h.min if h.count else 0.0, max=h.max if h.count else 0.0)
            for a, h in hists
        ]
        data = Histogram(data_points=hist_points, aggregation_temporality=AggregationTemporality.CUMULATIVE)
    else:
        numbers = cast("list[tuple[dict[str, str], float]]", attrs)  # the other families' points are floats
        points = [NumberDataPoint(attributes=a, start_time_unix_nano=fam.start_ns, time_unix_nano=now,
                                  value=float(v)) for a, v in numbers]
        if spec.kind is Kind.COUNTER:
            data = Sum(data_points=points, aggregation_temporality=AggregationTemporality.CUMULATIVE,
                       is_monotonic=True)
        else:
            data = Gauge(data_points=points)
    return Metric(name=spec.name, description=spec.description, unit=spec.unit, data=data)
