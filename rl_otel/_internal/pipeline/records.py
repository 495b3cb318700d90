"""The typed records that cross modules, in the specs' words.

A writer hands the recorder a :class:`Batch`: :class:`Measurement` s (OpenTelemetry's word: one value of one
instrument, with its attributes), and what else a write carries (the step, gauge series a ``None`` removed,
rl_otel's own counts, info series, a finished phase); a reader gets :class:`Family` s (Prometheus' word: the
series of one metric name, with one header), each series a :class:`Point` (OpenTelemetry's data point: labels and
a value). A histogram series' value is a :class:`HistogramValue`. Each is a NamedTuple: cheap to make (a snapshot
makes one per series) and immutable, down to its tuples.
"""

from __future__ import annotations

from typing import NamedTuple

from rl_otel.catalog import MetricSpec

Labels = tuple[tuple[str, str], ...]
"""``(name, value)`` pairs of a series, in its catalog entry's order, without the base labels (run, role, rank)."""


class Measurement(NamedTuple):
    """One value for one series, as a writer hands it to the recorder: a float for a gauge or counter; for a
    histogram a float, a 1-d float array or ``BucketCounts`` (bucketed against the entry's bounds). The value is in
    base units (the router applied the entry's scale)."""

    spec: MetricSpec
    labels: Labels
    value: object


class Count(NamedTuple):
    """An amount added to one of rl_otel's own counters (``rl_telemetry_dropped_series_total{metric}``: a value
    refused before the store). Never expires, outside the series cap."""

    spec: MetricSpec
    labels: Labels
    amount: float = 1.0


class Info(NamedTuple):
    """A constant series stating facts about the process (``rl_otel_build_info{version}``, ``target_info`` from the
    OTel resource, ``rl_run_finished``): never expires, outside the series cap, served on the scrape endpoint only
    (over OTLP the resource travels as itself). ``own_labels``: the series has only ``labels`` (no run, role,
    rank: ``target_info``)."""

    spec: MetricSpec
    labels: Labels
    value: float = 1.0
    own_labels: bool = False


class PhaseEnd(NamedTuple):
    """A phase that finished (the batch holds its measurements): what the hang watch learns from it."""

    cluster: str
    phase: str
    seconds: float  # its total


class Batch(NamedTuple):
    """One write, stored at once (a reader sees all of it or none) and then handed to the recorder's consumers.

    ``step``: the step it belongs to (a series holding a newer step's value keeps it; ``rl_step`` and
    ``rl_last_step_timestamp_seconds`` are set, at ``timestamp``, the step's Unix time, default now); ``None``:
    written outside any step. ``gone``: gauge series a ``None`` removed. ``counts``, ``infos``: rl_otel's own
    counters and info series. ``phase``: the phase whose end this is."""

    measurements: list[Measurement]
    step: int | None = None
    timestamp: float | None = None
    gone: tuple[tuple[MetricSpec, Labels], ...] | list[tuple[MetricSpec, Labels]] = ()
    counts: tuple[Count, ...] | list[Count] = ()
    infos: tuple[Info, ...] = ()
    phase: PhaseEnd | None = None


class Mark(NamedTuple):
    """One of a step's unlabelled, never-expiring series (``rl_step``, ``rl_last_step_timestamp_seconds``):
    ``keep_newest`` keeps the newest step's value when an older step is written after it."""

    spec: MetricSpec
    value: float
    keep_newest: bool


class HistogramValue(NamedTuple):
    """A histogram series frozen at collection time (what a scrape renders; ``Telemetry.value`` returns one):
    ``counts`` per bucket, not cumulative, one more than the bounds (the last counts values above the highest
    bound); ``sum``, ``count``, ``min``, ``max`` of the finite values observed (NaN/Inf are left out). In a
    snapshot ``counts`` is a tuple (a snapshot is immutable all the way down); ``Telemetry.value`` hands the caller
    a list of its own, as it always did."""

    counts: tuple[int, ...] | list[int]
    sum: float
    count: int  # type: ignore[assignment]  # a field named like tuple.count: the public name, shadowing on purpose
    min: float
    max: float


class Point(NamedTuple):
    """One series of a family at collection time: its labels (besides the family's ``base``) and its value."""

    labels: Labels
    value: float | HistogramValue


class Family(NamedTuple):
    """One metric family at collection time. ``base``: the labels every series of it carries (run, role, rank;
    none for ``target_info``, or when each point carries its own, as in a merged collection). ``scrape_only``: an
    info family, which the OTLP push leaves out (over OTLP the resource travels as itself)."""

    spec: MetricSpec
    base: Labels
    start_ns: int
    points: tuple[Point, ...]
    scrape_only: bool = False
