"""The typed records that cross modules, in the specs' words.

A writer hands the recorder :class:`Measurement` s (OpenTelemetry's word: one value of one instrument, with its
attributes); a reader gets :class:`Family` s (Prometheus' word: the series of one metric name, with one header),
each series a :class:`Point` (OpenTelemetry's data point: labels and a value). A histogram series' value is a
:class:`HistogramValue`. Each is a NamedTuple: cheap to make (a snapshot makes one per series) and immutable.
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


class Mark(NamedTuple):
    """One of a step's unlabelled, never-expiring series (``rl_step``, ``rl_last_step_timestamp_seconds``):
    ``keep_newest`` keeps the newest step's value when an older step is written after it."""

    spec: MetricSpec
    value: float
    keep_newest: bool


class HistogramValue(NamedTuple):
    """A histogram series frozen at collection time (what a scrape renders; ``Telemetry.value`` returns one):
    ``counts`` per bucket, not cumulative, one more than the bounds (the last counts values above the highest
    bound); ``sum``, ``count``, ``min``, ``max`` of the finite values observed (NaN/Inf are left out)."""

    counts: list[int]
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
    points: list[Point]
    scrape_only: bool = False
