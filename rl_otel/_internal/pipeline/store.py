"""The series store: last values of gauges, absolute values of counters, bulk histograms.

rl_otel aggregates here instead of in OTel SDK instruments because the SDK drops every non-finite measurement
(an alert must see a NaN loss), costs a few µs per attributed record (``benchmarks/bench_log.py``), and keeps a
vanished sync-gauge series forever. The store is bounded (series cap per metric, optional TTL).

It has one writer's method, :meth:`SeriesStore.write` of a :class:`~rl_otel._internal.pipeline.records.Batch`
(called by the recorder's ``record``), and one reader's, :meth:`SeriesStore.freeze`: an immutable
:class:`StoreSnapshot` of the stored series, made of tuples and NamedTuples only, which holds nothing of the
store. While nothing changed, ``freeze`` returns the snapshot it made last (its memo, kept under the store's
lock). Expired series are left out of a snapshot and removed by the next write. Thread-safe: one lock guards all
families.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from rl_otel._internal.forks import reset_in_forked_child
from rl_otel._internal.pipeline.histogram import BulkHistogram
from rl_otel._internal.pipeline.records import Batch, Family, HistogramValue, Info, Labels, Mark, Point
from rl_otel.catalog import Kind, MetricSpec, meta

__all__ = ["HistogramValue", "SeriesStore", "StoreSnapshot"]


class Written(NamedTuple):
    """What a write left out: ``(spec, n)`` for a histogram measurement with ``n`` NaN/Inf values (Prometheus
    buckets cannot hold them), and the metrics whose series cap refused a new series."""

    non_finite: tuple[tuple[MetricSpec, int], ...]
    capped: tuple[str, ...]


@dataclass(slots=True)
class Series:
    """One stored series: its value (a float; a :class:`BulkHistogram` in a histogram family; ``None`` before
    the first write), when it was last written (the store's ``clock``) and the step of that write (``None``:
    written outside any step)."""

    value: float | BulkHistogram | None = None
    time_ns: int = 0
    step: int | None = None
    order: int = 0  # when it was made, among the store's series: a family's series are served in this order


class _ShapedFamily(NamedTuple):
    """A family of a layout without its values: where its values sit in a snapshot's ``numbers`` (or ``hists``,
    for a histogram family): ``first:stop``."""

    spec: MetricSpec
    base: Labels
    start_ns: int
    scrape_only: bool
    labels: tuple[Labels, ...]
    histogram: bool
    first: int
    stop: int


class _Shape(NamedTuple):
    """The families and series of one layout, without their values: what snapshots of that layout share
    (immutable; the store keeps, beside it, which of its families' series fill ``numbers`` and ``hists``)."""

    layout: int
    families: tuple[_ShapedFamily, ...]


class StoreSnapshot:
    """The stored families at one store version, immutable.

    ``numbers`` holds the values of the gauge, counter and info series, ``hists`` those of the histogram series
    (as :class:`HistogramValue` s), each in the order of :attr:`families`; all of it tuples, nothing of it the
    store's. ``layout`` is equal for two snapshots
    with the same families and series in the same order (a reader may keep what it compiled from one for the
    next; any hashable), ``None`` when it cannot be reused (expired series left out); ``valid_until_ns``: when the
    next series expires (``None``: never, without a write)."""

    __slots__ = ("_families", "_shape", "hists", "layout", "numbers", "valid_until_ns", "version")

    def __init__(self, version: int, valid_until_ns: int | None, *, shape: _Shape | None = None,
                 numbers: tuple[float, ...] = (), hists: tuple[HistogramValue, ...] = (),
                 families: tuple[Family, ...] | None = None, layout: object = None) -> None:
        self.version = version
        self.valid_until_ns = valid_until_ns
        self.layout: object = shape.layout if shape is not None else layout
        self._shape = shape
        self.numbers = numbers
        self.hists = hists
        self._families = families

    def __setattr__(self, name: str, value: object) -> None:
        if hasattr(self, "_families"):  # set once, in __init__
            raise AttributeError(f"a StoreSnapshot is immutable (setting {name!r})")
        object.__setattr__(self, name, value)

    @property
    def families(self) -> tuple[Family, ...]:
        """Every stored family with its series' values (made at each read from the values and the shape: each
        reader reads it once per snapshot)."""
        if self._families is not None:
            return self._families
        assert self._shape is not None  # made from a shape, or given its families
        numbers, hists = self.numbers, self.hists
        return tuple([Family(f.spec, f.base, f.start_ns,
                             tuple(map(Point, f.labels, (hists if f.histogram else numbers)[f.first:f.stop])),
                             f.scrape_only)
                      for f in self._shape.families])

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
    order: int = 0  # when it was made, among the store's families: the order families are served in


class SeriesStore:
    """All of rl_otel's stored series, keyed by metric name and label pairs.

    ``base_labels`` are on every series (run, role, rank). ``max_series_per_metric`` bounds each family; a new
    label set past the cap is dropped, counted in ``rl_telemetry_dropped_series_total{metric}`` and named in what
    :meth:`write` returns (its writer warns once). ``ttl_s`` expires series not written for
    that long (rl_otel's own marks, counts and info series never expire), by ``clock``.
    """

    def __init__(self, base_labels: Mapping[str, str], *, max_series_per_metric: int, ttl_s: float | None,
                 clock: Callable[[], int] | None = None) -> None:
        # nanoseconds since the epoch (default: time.time_ns, looked up at each call): when a series was written,
        # and when it expires
        self.clock: Callable[[], int] = clock if clock is not None else _wall_clock
        self.base: Labels = tuple(base_labels.items())
        self.max_series_per_metric = max_series_per_metric
        self._ttl_ns = None if ttl_s is None else int(ttl_s * 1e9)
        self._next_expiry_ns: int | None = None  # no series expires before it (the next write removes those past)
        self._families: dict[str, _Family] = {}
        self.start_ns = self.clock()
        self._lock = threading.Lock()
        self._version = 0  # bumped under the lock by every change of the stored series
        self._layout = 0  # bumped under the lock whenever a series comes or goes
        self._made = 0  # series made so far
        self._memo: StoreSnapshot | None = None  # the snapshot freeze() made last
        self._shape: _Shape | None = None  # the shape of the memo's layout...
        self._shape_numbers: list[_Family] = []  # ...and the families whose series fill its numbers
        self._shape_hists: list[_Family] = []  # ...and its histograms
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

    def write(self, batch: Batch) -> Written:
        """Store a batch under one lock acquisition (a reader sees all of it or none). Returns what it left out:
        ``(spec, n)`` for each histogram measurement that had ``n`` non-finite values left out, and the metrics
        whose cap refused a new series.

        With ``batch.step``, a series already holding a newer step's value keeps it (a gauge is not set back, a
        counter does not decrease, a histogram does not take the older step's values), and the step's marks
        (``rl_step``, ``rl_last_step_timestamp_seconds``, never expiring) are set; ``step=None`` always writes.
        ``gone``: gauge series to remove (a ``None`` logged). ``counts``, ``infos``: rl_otel's own counters and
        info series (never expiring, outside the series cap)."""
        now = self.clock()
        measurements, step, timestamp, gone, counts, infos, _phase = batch  # one unpack, not seven lookups
        left_out: list[tuple[MetricSpec, int]] = []
        capped: list[str] = []
        with self._lock:
            self._version += 1
            if self._next_expiry_ns is not None and now >= self._next_expiry_ns:
                self._remove_expired(now)
            families = self._families
            for spec, labels, value in measurements:
                fam = families.get(spec.name)
                series = None if fam is None else fam.series.get(labels)
                if series is None:
                    series = self._series(spec, labels, True, now, capped)
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
                fam = families.get(spec.name)
                if fam is not None and fam.series.pop(labels, None) is not None:
                    self._layout += 1
            if step is not None:
                for spec, value, keep_newest in (Mark(meta.STEP, float(step), True),
                                                 Mark(meta.LAST_STEP_TIMESTAMP, time.time() if timestamp is None
                                                      else timestamp, False)):
                    series = self._series(spec, (), False, now)
                    if series is None or (keep_newest and series.step is not None and step < series.step):
                        continue
                    series.value, series.time_ns, series.step = value, now, step
            for spec, labels, amount in counts:
                self._add(spec, labels, amount, now)
            for info in infos:
                self._info(info, now)
        if not left_out and not capped:
            return _NOTHING_LEFT_OUT  # the per-step case: one object, made once
        return Written(tuple(left_out), tuple(dict.fromkeys(capped)))

    def _info(self, info: Info, now: int) -> None:
        """Set an info series (the caller holds the lock)."""
        spec = info.spec
        if spec.name not in self._families:
            self._made += 1
            self._families[spec.name] = _Family(spec, False, base=() if info.own_labels else None, scrape_only=True,
                                                capped=False, order=self._made)
        series = self._series(spec, info.labels, False, now)
        assert series is not None  # an uncapped family
        series.value, series.time_ns = info.value, now

    def _series(self, spec: MetricSpec, labels: Labels, expires: bool, now: int,
                capped: list[str] | None = None) -> Series | None:
        """The series of ``labels`` in ``spec``'s family, made if new; ``None`` if the cap refuses it (counted, and
        its name added to ``capped``). The caller holds the lock. rl_otel's own families (``expires=False``) are
        outside the cap."""
        fam = self._families.get(spec.name)
        if fam is None:
            self._made += 1
            fam = self._families[spec.name] = _Family(spec, expires, capped=expires, order=self._made)
        series = fam.series.get(labels)
        if series is None:
            if fam.capped and len(fam.series) >= self.max_series_per_metric:
                self._add(meta.DROPPED_SERIES, (("metric", spec.name),), 1.0, now)
                if capped is not None:
                    capped.append(spec.name)
                return None
            self._made += 1
            series = fam.series[labels] = Series(order=self._made)
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

    # -- reading ----------------------------------------------------------------------------------------------

    def freeze(self, only: Mapping[str, Collection[Labels]] | None = None) -> StoreSnapshot:
        """The stored families now, series past their TTL left out. The snapshot made last is returned itself
        while nothing changed, and its layout's shape reused while no series came or went. ``only``: just these
        series, by family name (``rl-otel backfill`` reads what one point wrote: a read as long as the point, not
        the store). Reads the series; what it keeps is its memo (under the lock)."""
        now = self.clock()
        memo = self._memo
        if only is None and memo is not None and memo.version == self._version and memo.valid(now):
            return memo
        with self._lock:
            if only is not None:
                return self._selected(only)
            now, ttl = self.clock(), self._ttl_ns
            valid_until = None
            if ttl is not None:
                oldest = min((s.time_ns for fam in self._families.values() if fam.expires
                              for s in fam.series.values()), default=None)
                if oldest is not None and now - oldest > ttl:
                    return self._unexpired(now, ttl)
                valid_until = None if oldest is None else oldest + ttl + 1
            if self._shape is None or self._shape.layout != self._layout:
                self._new_shape()
            assert self._shape is not None
            snapshot = self._memo = StoreSnapshot(
                self._version, valid_until, shape=self._shape,
                numbers=tuple([s.value for fam in self._shape_numbers  # type: ignore[misc]
                               for s in fam.series.values()]),
                hists=tuple([_histogram_value(s.value) for fam in self._shape_hists  # type: ignore[arg-type]
                             for s in fam.series.values()]))
            return snapshot

    def _new_shape(self) -> None:
        """The shape of the current layout, and which families fill it (the caller holds the lock)."""
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
                                            fam.scrape_only, tuple(fam.series), hist, first, at[hist]))
        self._shape = _Shape(self._layout, tuple(shaped))
        self._shape_numbers, self._shape_hists = numbers, hists

    def _selected(self, only: Mapping[str, Collection[Labels]]) -> StoreSnapshot:
        """A snapshot of the series named in ``only`` (the caller holds the lock); it has no layout."""
        families = []
        chosen = sorted(((fam, wanted) for name, wanted in only.items()
                         if (fam := self._families.get(name)) is not None),
                        key=lambda item: item[0].order)  # the store's own order, as a full snapshot has it
        for fam, wanted in chosen:
            hist = fam.spec.kind is Kind.HISTOGRAM
            found = sorted(((labels, s) for labels in wanted if (s := fam.series.get(labels)) is not None),
                           key=lambda item: item[1].order)  # the family's own order, as a full snapshot has it
            points = tuple(Point(labels, _histogram_value(s.value) if hist else s.value)  # type: ignore[arg-type]
                           for labels, s in found)
            if points:
                families.append(Family(fam.spec, self.base if fam.base is None else fam.base, fam.start_ns,
                                       points, fam.scrape_only))
        return StoreSnapshot(self._version, None, families=tuple(families))

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
                points = tuple(Point(labels, _histogram_value(s.value) if hist else s.value)  # type: ignore[arg-type]
                               for labels, s in items)
                families.append(Family(fam.spec, self.base if fam.base is None else fam.base, fam.start_ns,
                                       points, fam.scrape_only))
        return StoreSnapshot(self._version, valid_until, families=tuple(families))


_HISTOGRAM = Kind.HISTOGRAM
_NOTHING_LEFT_OUT = Written((), ())


def _wall_clock() -> int:
    return time.time_ns()


def _histogram_value(h: BulkHistogram) -> HistogramValue:
    return HistogramValue(tuple(h.counts.tolist()), h.sum, h.count, h.min, h.max)
