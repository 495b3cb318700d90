"""The series store: last values of gauges, absolute values of counters, bulk histograms.

rl_otel aggregates here instead of in OTel SDK instruments because the SDK drops every non-finite measurement
(an alert must see a NaN loss), costs a few µs per attributed record (``benchmarks/bench_log.py``), and keeps a
vanished sync-gauge series forever. The store is bounded (series cap per metric, optional TTL).

It has one writer's method, :meth:`SeriesStore.write` (the recorder's ``record``; ``note_dropped`` and
``write_info`` are its two special cases), and one reader's, :meth:`SeriesStore.freeze`: an immutable
:class:`StoreSnapshot` of the stored series. Reading never changes the store: ``freeze`` takes the previous
snapshot the reader kept and returns it again while nothing changed (the memo is the reader's, see
``recorder.py``). Expired series are left out of a snapshot and removed by the next write. Thread-safe: one lock
guards all families.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from rl_otel._internal.pipeline.histogram import BulkHistogram
from rl_otel._internal.pipeline.records import Family, HistogramValue, Labels, Mark, Measurement, Point
from rl_otel._internal.pipeline.worker import reset_in_forked_child
from rl_otel.catalog import Kind, MetricSpec

__all__ = ["HistogramValue", "SeriesStore", "StoreSnapshot"]


@dataclass(slots=True)
class Series:
    """One stored series: its value (a float; a :class:`BulkHistogram` in a histogram family; ``None`` before
    the first write), when it was last written (the store's ``clock``) and the step of that write (``None``:
    written outside any step)."""

    value: float | BulkHistogram | None = None
    time_ns: int = 0
    step: int | None = None


class _ShapedFamily(NamedTuple):
    """A family of a layout without its values: where its values sit in a snapshot's ``numbers`` (or ``hists``,
    for a histogram family): ``first:stop``."""

    spec: MetricSpec
    base: Labels
    start_ns: int
    scrape_only: bool
    labels: list[Labels]
    histogram: bool
    first: int
    stop: int


class _Shape(NamedTuple):
    """The families and series of one layout, without their values: what snapshots of that layout share.
    ``numbers``/``hists``: the stored gauge and counter (and info) families, and the histogram families, whose
    series' values a snapshot copies in that order."""

    layout: int
    families: list[_ShapedFamily]
    numbers: list[_Family]
    hists: list[_Family]


class StoreSnapshot:
    """The stored families at one store version, immutable.

    ``numbers`` holds the values of the gauge, counter and info series, ``hists`` those of the histogram series
    (as :class:`HistogramValue` s), each in the order of :attr:`families`. ``layout`` is equal for two snapshots
    with the same families and series in the same order (a reader may keep what it compiled from one for the
    next; any hashable), ``None`` when it cannot be reused (expired series left out); ``valid_until_ns``: when the
    next series expires (``None``: never, without a write)."""

    __slots__ = ("_families", "_shape", "hists", "layout", "numbers", "valid_until_ns", "version")

    def __init__(self, version: int, valid_until_ns: int | None, *, shape: _Shape | None = None,
                 numbers: list[float] | None = None, hists: list[HistogramValue] | None = None,
                 families: tuple[Family, ...] | None = None, layout: object = None) -> None:
        self.version = version
        self.valid_until_ns = valid_until_ns
        self.layout: object = shape.layout if shape is not None else layout
        self._shape = shape
        self.numbers: list[float] = numbers or []
        self.hists: list[HistogramValue] = hists or []
        self._families = families

    @property
    def families(self) -> tuple[Family, ...]:
        """Every stored family with its series' values (made at the first read)."""
        if self._families is None:
            assert self._shape is not None  # made from a shape, or given its families
            numbers, hists = self.numbers, self.hists
            self._families = tuple([
                Family(f.spec, f.base, f.start_ns,
                       list(map(Point, f.labels, (hists if f.histogram else numbers)[f.first:f.stop])), f.scrape_only)
                for f in self._shape.families])
        return self._families

    def valid(self, now_ns: int) -> bool:
        """Whether no series of it has expired by ``now_ns``."""
        return self.valid_until_ns is None or now_ns < self.valid_until_ns


@dataclass
class _Family:
    spec: MetricSpec
    expires: bool
    series: dict[Labels, Series] = field(default_factory=dict)  # keyed by the router's label pairs as they are
    start_ns: int = field(default_factory=time.time_ns)
    base: Labels | None = None  # labels on every series besides its own: None for the store's (run, role, rank)
    scrape_only: bool = False
    capped: bool = True  # new series past max_series_per_metric are refused (not for rl_otel's own dropped counts)


class SeriesStore:
    """All of rl_otel's stored series, keyed by metric name and label pairs.

    ``base_labels`` are on every series (run, role, rank). ``max_series_per_metric`` bounds each family; a new
    label set past the cap is dropped, counted in ``dropped_spec`` and reported through ``on_drop(metric_name)``
    (the caller warns once), called after the store's lock is released. ``ttl_s`` expires series not written for
    that long (families written with ``expires=False`` - liveness, self-monitoring - never expire), by ``clock``.
    """

    def __init__(self, base_labels: Mapping[str, str], *, max_series_per_metric: int, ttl_s: float | None,
                 dropped_spec: MetricSpec, on_drop: Callable[[str], None],
                 clock: Callable[[], int] | None = None) -> None:
        # nanoseconds since the epoch (default: time.time_ns, looked up at each call): when a series was written,
        # and when it expires
        self.clock: Callable[[], int] = clock if clock is not None else _wall_clock
        self.base: Labels = tuple(base_labels.items())
        self._max_series = max_series_per_metric
        self._ttl_ns = None if ttl_s is None else int(ttl_s * 1e9)
        self._next_expiry_ns: int | None = None  # no series expires before it (the next write removes those past)
        self._dropped_spec = dropped_spec
        self._on_drop = on_drop
        self._families: dict[str, _Family] = {}
        self.start_ns = self.clock()
        self._lock = threading.Lock()
        self._version = 0  # bumped under the lock by every change of the stored series
        self._layout = 0  # bumped under the lock whenever a series comes or goes
        self._capped: list[str] = []  # metrics that refused a new series under the lock, for on_drop after it
        reset_in_forked_child(self)

    def _after_fork(self) -> None:
        """In a forked child: a fresh lock (a scrape or a logging thread of the parent may have held it)."""
        self._lock = threading.Lock()

    @property
    def version(self) -> int:
        """A counter bumped by every change: equal versions mean equal stored series (until a TTL deadline,
        which :class:`StoreSnapshot` reports)."""
        return self._version

    # -- writing ----------------------------------------------------------------------------------------------

    def write(self, measurements: Iterable[Measurement], *, step: int | None = None,
              gone: Iterable[tuple[MetricSpec, Labels]] = (), marks: Iterable[Mark] = (),
              expires: bool = True) -> list[tuple[MetricSpec, int]]:
        """Store measurements under one lock acquisition (a reader sees all of them or none). Returns
        ``(spec, n)`` for each histogram measurement that had ``n`` non-finite values left out.

        With ``step``, a series already holding a newer step's value keeps it (a gauge is not set back, a counter
        does not decrease, a histogram does not take the older step's values); ``step=None`` always writes.
        ``gone``: gauge series to remove (a ``None`` logged). ``marks``: the step's unlabelled series, which
        never expire (only with ``step``). ``expires=False``: the series never expire."""
        now = self.clock()
        left_out: list[tuple[MetricSpec, int]] = []
        with self._lock:
            self._version += 1
            if self._next_expiry_ns is not None and now >= self._next_expiry_ns:
                self._remove_expired(now)
            families = self._families
            for spec, labels, value in measurements:
                fam = families.get(spec.name)
                series = None if fam is None else fam.series.get(labels)
                if series is None:
                    series = self._series(spec, labels, expires, now)
                    if series is None:
                        continue
                if step is not None:
                    if series.step is not None and step < series.step:
                        continue
                    series.step = step
                if spec.kind is _HISTOGRAM:
                    hist = series.value
                    if hist is None:
                        hist = series.value = BulkHistogram(spec.buckets)
                    n = hist.add(value)  # type: ignore[union-attr,arg-type]  # a histogram family, a bucketed value
                    if n:
                        left_out.append((spec, n))
                else:
                    series.value = value  # type: ignore[assignment]  # a float (the pipeline coerced it)
                series.time_ns = now
            for spec, labels in gone:
                fam = self._families.get(spec.name)
                if fam is not None and fam.series.pop(labels, None) is not None:
                    self._layout += 1
            if step is not None:
                for spec, value, keep_newest in marks:
                    series = self._series(spec, (), False, now)
                    if series is None or (keep_newest and series.step is not None and step < series.step):
                        continue
                    series.value, series.time_ns, series.step = value, now, step
        if self._capped:
            self._report_capped()
        return left_out

    def note_dropped(self, metric_name: str) -> None:
        """Count a value refused before the store (``rl_telemetry_dropped_series_total{metric=...}``)."""
        now = self.clock()
        with self._lock:
            self._version += 1
            self._add(self._dropped_spec, (("metric", metric_name),), 1.0, now)

    def write_info(self, spec: MetricSpec, labels: Labels, *, base_labels: bool = True, value: float = 1.0) -> None:
        """Set a constant series (``value``, 1.0 unless told; never expires, outside the series cap) whose labels
        state facts about the process: ``rl_otel_build_info{version}``, ``target_info`` from the OTel resource
        (``base_labels=False``: the series has only ``labels``), ``rl_run_finished`` (0, then 1).
        Info families are the scrape endpoint's: the OTLP push leaves them out."""
        with self._lock:
            self._version += 1
            if spec.name not in self._families:
                self._families[spec.name] = _Family(spec, False, base=None if base_labels else (), scrape_only=True,
                                                    capped=False)
            series = self._series(spec, labels, False, self.clock())
            assert series is not None  # an uncapped family
            series.value, series.time_ns = value, self.clock()

    def _series(self, spec: MetricSpec, labels: Labels, expires: bool, now: int) -> Series | None:
        """The series of ``labels`` in ``spec``'s family, made if new; ``None`` if the cap refuses it (counted).
        The caller holds the lock."""
        fam = self._families.get(spec.name)
        if fam is None:
            fam = self._families[spec.name] = _Family(spec, expires, capped=spec is not self._dropped_spec)
        series = fam.series.get(labels)
        if series is None:
            if fam.capped and len(fam.series) >= self._max_series:
                self._add(self._dropped_spec, (("metric", spec.name),), 1.0, now)
                self._capped.append(spec.name)  # reported by _report_capped once the lock is released
                return None
            series = fam.series[labels] = Series()
            self._layout += 1
            if fam.expires and self._ttl_ns is not None and self._next_expiry_ns is None:
                self._next_expiry_ns = now + self._ttl_ns
        return series

    def _add(self, spec: MetricSpec, labels: Labels, amount: float, now: int) -> None:
        series = self._series(spec, labels, False, now)
        if series is not None:
            series.value = (series.value or 0.0) + amount  # type: ignore[operator]  # a counter holds floats
            series.time_ns = now

    def _remove_expired(self, now: int) -> None:
        """Remove the series past their TTL (a writer, holding the lock); note when the next one expires."""
        assert self._ttl_ns is not None
        ttl, oldest = self._ttl_ns, None
        for fam in self._families.values():
            if fam.expires and fam.series:
                stale = [labels for labels, s in fam.series.items() if now - s.time_ns > ttl]
                for labels in stale:
                    del fam.series[labels]
                if stale:
                    self._layout += 1
                if fam.series:
                    first = min(s.time_ns for s in fam.series.values())
                    oldest = first if oldest is None else min(oldest, first)
        self._next_expiry_ns = None if oldest is None else oldest + ttl + 1

    def _report_capped(self) -> None:
        """Call ``on_drop`` for the series refused by the cap, outside the lock (the callback logs)."""
        with self._lock:
            capped, self._capped = self._capped, []
        for name in dict.fromkeys(capped):
            self._on_drop(name)

    # -- reading ----------------------------------------------------------------------------------------------

    def freeze(self, previous: StoreSnapshot | None = None) -> StoreSnapshot:
        """The stored families now, series past their TTL left out. ``previous`` (the reader's last snapshot) is
        returned itself while nothing changed, and its layout's shape reused while no series came or went. Reads
        only: the store is the same before and after."""
        now = self.clock()
        if previous is not None and previous.version == self._version and previous.valid(now):
            return previous
        with self._lock:
            now, ttl = self.clock(), self._ttl_ns
            valid_until = None
            if ttl is not None:
                oldest = min((s.time_ns for fam in self._families.values() if fam.expires
                              for s in fam.series.values()), default=None)
                if oldest is not None and now - oldest > ttl:
                    return self._unexpired(now, ttl)
                valid_until = None if oldest is None else oldest + ttl + 1
            shape = previous._shape if previous is not None else None
            if shape is None or shape.layout != self._layout:
                shape = self._new_shape()
            return StoreSnapshot(
                self._version, valid_until, shape=shape,
                numbers=[s.value for fam in shape.numbers for s in fam.series.values()],  # type: ignore[misc]
                hists=[_histogram_value(s.value) for fam in shape.hists  # type: ignore[arg-type]
                       for s in fam.series.values()])

    def _new_shape(self) -> _Shape:
        """The shape of the current layout (the caller holds the lock)."""
        shaped: list[_ShapedFamily] = []
        numbers: list[_Family] = []
        hists: list[_Family] = []
        at = [0, 0]
        for fam in self._families.values():
            if fam.series:
                hist = fam.spec.kind is Kind.HISTOGRAM
                (hists if hist else numbers).append(fam)
                first = at[hist]
                at[hist] += len(fam.series)
                shaped.append(_ShapedFamily(fam.spec, self.base if fam.base is None else fam.base, fam.start_ns,
                                            fam.scrape_only, list(fam.series), hist, first, at[hist]))
        return _Shape(self._layout, shaped, numbers, hists)

    def _unexpired(self, now: int, ttl: int) -> StoreSnapshot:
        """A snapshot without the series past their TTL, which stay in the store until the next write removes
        them (the caller holds the lock); it has no layout."""
        families, valid_until = [], None
        for fam in self._families.values():
            items = [(labels, s) for labels, s in fam.series.items() if not fam.expires or now - s.time_ns <= ttl]
            if fam.expires and items:
                first = min(s.time_ns for _, s in items) + ttl + 1
                valid_until = first if valid_until is None else min(valid_until, first)
            if items:
                hist = fam.spec.kind is Kind.HISTOGRAM
                points = [Point(labels, _histogram_value(s.value) if hist else s.value)  # type: ignore[arg-type]
                          for labels, s in items]
                families.append(Family(fam.spec, self.base if fam.base is None else fam.base, fam.start_ns,
                                       points, fam.scrape_only))
        return StoreSnapshot(self._version, valid_until, families=tuple(families))


_HISTOGRAM = Kind.HISTOGRAM


def _wall_clock() -> int:
    return time.time_ns()


def _histogram_value(h: BulkHistogram) -> HistogramValue:
    return HistogramValue(h.counts.tolist(), h.sum, h.count, h.min, h.max)
