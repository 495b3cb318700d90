"""What a reader reads: :class:`Snapshot`, every family a recorder serves at one moment, immutable.

It has two parts, because they change at different rates: ``stored``, the series store's
:class:`~rl_otel._internal.pipeline.store.StoreSnapshot` (the same object until the next write, so an encoder may
keep what it made of it), and ``live``, the families computed at collection time (process and GPU memory, the
running phases, rl_otel's own error counts). :attr:`Snapshot.families` is both, stored first; the first family of
a name wins.

:func:`merged` makes one snapshot of several recorders' (``rl-otel watch`` serves every run it follows from one
endpoint): each family once, every series with its own run, role and rank labels.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rl_otel._internal.pipeline.records import Family, HistogramValue, Labels, Point
from rl_otel._internal.pipeline.store import StoreSnapshot
from rl_otel.catalog import Kind


class Snapshot:
    """Every family of a recorder at one collection: ``stored`` (the store's snapshot) and ``live``; ``origin``
    tells the recorders of one process apart (what :func:`merged` keys a layout by)."""

    __slots__ = ("live", "origin", "stored")
    stored: StoreSnapshot
    live: tuple[Family, ...]
    origin: int

    def __init__(self, stored: StoreSnapshot, live: tuple[Family, ...] = (), origin: int = 0) -> None:
        object.__setattr__(self, "stored", stored)
        object.__setattr__(self, "live", live)
        object.__setattr__(self, "origin", origin)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"a Snapshot is immutable (setting {name!r})")

    @property
    def families(self) -> tuple[Family, ...]:
        """The stored families, then the live ones."""
        return self.stored.families + self.live if self.live else self.stored.families

    def family(self, name: str) -> Family | None:
        """The family named ``name``, or whose samples are (a counter's ``..._total``); the first family of a name
        wins (a lookup: ``tel.value()`` reads one series per call)."""
        families = self.families
        for fam in families:
            if fam.spec.name == name:
                return fam
        for fam in families:
            if fam.spec.prometheus_name == name:
                return fam
        return None

    def value(self, name: str, labels: Mapping[str, object] | Labels | None = None) -> float | HistogramValue | None:
        """One series' value: ``labels`` besides the family's base ones, as a dict or as pairs; ``None`` for
        none."""
        fam = self.family(name)
        if fam is None:
            return None
        want = {str(k): str(v) for k, v in (labels.items() if isinstance(labels, Mapping) else labels or ())}
        for key, value in fam.points:
            if len(key) == len(want) and dict(key) == want:
                return value
        return None


# what merged() made of one part's stored families, by the part's origin: (its StoreSnapshot, each family with
# its points labelled)
Relabelled = dict[int, tuple[StoreSnapshot, tuple[tuple[Family, tuple[Point, ...]], ...]]]


def merged(snapshots: Sequence[Snapshot], relabelled: Relabelled | None = None) -> Snapshot:
    """One snapshot of several: each family name once (the first spec of a name describes it), its points from
    every snapshot with their base labels made their own. Its stored part has a layout while every part has one
    (an encoder reuses what it compiled while no series of any part came or went). ``relabelled``: a cache the
    caller keeps between calls, so a part whose stored snapshot is the one of the last call is not labelled again
    (``rl-otel watch``: 5,000 runs, one of them writing, were 165,000 points made anew at every scrape, ~0.4 s);
    entries of parts gone are the caller's to drop."""
    layouts = tuple((s.origin, s.stored.layout) for s in snapshots)
    families: dict[str, tuple[Family, list[Point]]] = {}
    live: dict[str, tuple[Family, list[Point]]] = {}
    for snap in snapshots:
        for fam, own in _relabelled(snap, relabelled):
            entry = families.get(fam.spec.name)
            if entry is None:
                entry = families[fam.spec.name] = (fam, [])
            entry[1].extend(own)
        for fam in snap.live:
            got = live.get(fam.spec.name)
            if got is None:
                got = live[fam.spec.name] = (fam, [])
            got[1].extend(Point(fam.base + labels, value) for labels, value in fam.points)
    stored_families = tuple(Family(first.spec, (), first.start_ns, tuple(points), first.scrape_only)
                            for first, points in families.values())
    numbers = tuple(p.value for fam in stored_families if fam.spec.kind is not _HISTOGRAM for p in fam.points)
    hists = tuple(p.value for fam in stored_families if fam.spec.kind is _HISTOGRAM for p in fam.points)
    until = [s.stored.valid_until_ns for s in snapshots if s.stored.valid_until_ns is not None]
    reusable = all(layout is not None for _, layout in layouts)
    stored = StoreSnapshot(hash(tuple(s.stored.version for s in snapshots)), min(until) if until else None,
                           numbers=numbers, hists=hists,  # type: ignore[arg-type]
                           families=stored_families, layout=layouts if reusable else None)
    return Snapshot(stored, tuple(Family(first.spec, (), first.start_ns, tuple(points), first.scrape_only)
                                  for first, points in live.values()))


def _relabelled(snap: Snapshot, cache: Relabelled | None) -> tuple[tuple[Family, tuple[Point, ...]], ...]:
    """``snap``'s stored families, each with its points labelled with the family's base labels (from ``cache``
    while ``snap.stored`` is the snapshot they were made of: a store's snapshot is the same object until the next
    write)."""
    stored = snap.stored
    if cache is not None:
        got = cache.get(snap.origin)
        if got is not None and got[0] is stored:
            return got[1]
    own = tuple((fam, tuple([Point(fam.base + labels, value) for labels, value in fam.points]))
                for fam in stored.families)
    if cache is not None:
        cache[snap.origin] = (stored, own)
    return own


_HISTOGRAM = Kind.HISTOGRAM
