"""What a logged step becomes: ``(key, value)`` pairs split into the two views of :class:`Routed`, the
measurements the store gets (routed through the catalog, in base units) and the dict the trackers get (every key
as logged, in the user's units).

Fault isolation is per key: a key whose text, value or bucketing raises (whatever it raises) costs that key only,
counted in ``rl_telemetry_errors_total{sink="input", reason=...}`` (``bad_key``, ``bad_value``) and said once; the
other keys of the step are stored and mirrored.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from rl_otel._internal.pipeline.diagnostics import Diagnostics
from rl_otel._internal.pipeline.records import Labels, Measurement
from rl_otel._internal.pipeline.router import Refusal, Route, Router
from rl_otel._internal.pipeline.values import (
    BadKey,
    BadValue,
    as_histogram,
    coerce,
    on_device,
    to_host,
    to_tracker_array,
)
from rl_otel.catalog import Kind, MetricSpec

KeyValues = Iterable[tuple[str, object]]
_HISTOGRAM = Kind.HISTOGRAM
_NEW = tuple.__new__  # a Measurement made from a tuple in C: a NamedTuple's own __new__ is 3x the per-key cost


@dataclass(slots=True)
class Routed:
    """The two views of what was logged: ``measurements`` for the store (routed through the catalog, in base
    units), ``gone``: the gauge series a ``None`` removes, and ``mirrored``: what the trackers get (every key as
    logged, in the user's units; ``None`` when nothing is mirrored)."""

    measurements: list[Measurement] = field(default_factory=list)
    gone: list[tuple[MetricSpec, Labels]] = field(default_factory=list)
    mirrored: dict[str, Any] | None = None
    refused: list[str] = field(default_factory=list)  # the metrics of the values the routing refused, to count


class Ingest:
    """Routes ``(key, value)`` pairs (thread-safe; never raises); a value the catalog routing refuses (a name
    collision, past ``max_unknown_keys``) is said once and listed in :attr:`Routed.refused`, for its writer to
    count."""

    def __init__(self, router: Router, diagnostics: Diagnostics) -> None:
        self.router = router
        self.diagnostics = diagnostics

    def route(self, metrics: KeyValues, *, mirror: bool = False) -> Routed:
        """Split ``(key, value)`` pairs into the two views of :class:`Routed`. With ``mirror``, the trackers' view
        is taken before any Prometheus rule: a key the catalog routing refuses (a name collision, past
        ``max_unknown_keys``) or a distribution logged for a gauge still reaches them."""
        routed = Routed(mirrored={} if mirror else None)
        deferred: list[tuple[str, object]] = []  # GPU tensors: read together once the other keys are routed
        mirrored, add, cached = routed.mirrored, routed.measurements.append, self.router.cached
        try:
            for key, raw in metrics:
                if raw.__class__ is float:  # the per-step case, written out here: a float for a known gauge or counter
                    route = cached(key)
                    if route.__class__ is Route and route.spec.kind is not _HISTOGRAM:
                        spec = route.spec
                        if mirrored is not None:
                            mirrored[key] = raw
                        add(_NEW(Measurement, (spec, route.labels, raw if spec.scale == 1.0 else raw * spec.scale)))
                        continue
                if on_device(raw):
                    deferred.append((key, raw))
                    continue
                self._route_safely(key, raw, routed)
        except Exception as exc:  # boundary: the user's mapping, whose iteration raises: keep the keys read
            self.diagnostics.bad("", f"the metrics dict could not be read past its first keys "
                                     f"({type(exc).__name__}); the keys read are logged", "bad_key")
        if deferred:
            try:  # one device-to-host copy per device (a host sync each on a GPU), not one per key
                deferred = to_host(deferred, self._histogram_of, keep_values=mirror)
            except Exception:  # boundary: torch/CUDA copies of the user's tensors; read key by key below
                pass
            for key, raw in deferred:
                self._route_safely(key, raw, routed)
        return routed

    def _route_safely(self, key: str, raw: object, routed: Routed) -> None:
        try:
            self._route_one(key, raw, routed)
        except Exception as exc:  # boundary: the user's value (a sparse tensor, a raising __float__): this key
            self.diagnostics.bad(key, f"{type(exc).__name__}: {exc}")

    def _histogram_of(self, key: str) -> tuple[tuple[float, ...], float] | None:
        """The bounds and scale of ``key``'s histogram, ``None`` if it routes to no histogram."""
        route = self.router.route(key)
        if isinstance(route, Route) and route.spec.kind is _HISTOGRAM:
            return tuple(route.spec.buckets), route.spec.scale
        return None

    def _route_one(self, key: str, raw: object, routed: Routed) -> None:
        if raw.__class__ is float:  # the per-step case first
            value: Any = raw
        elif type(raw) is BadKey:
            self.diagnostics.bad(key, raw.why, "bad_key")
            return
        else:
            try:
                value = coerce(raw, keep_tensors=True)
            except BadValue as exc:
                self.diagnostics.bad(key, str(exc))
                return
            if value is None:  # no value this step: the gauge's last one must not look current
                known = self.router.existing(key)
                if known is not None and known.spec.kind is Kind.GAUGE:
                    routed.gone.append((known.spec, known.labels))
                return
        scalar = value.__class__ is float or isinstance(value, float)
        mirrored = routed.mirrored
        if mirrored is not None:  # the trackers' view: the key as logged, whatever Prometheus makes of it
            if scalar:
                mirrored[key] = value
            else:
                # trackers draw their own histograms from the values: a tensor's values cross once more (only
                # when trackers are on); BucketCounts have no values left and stay Prometheus-only
                tracked = to_tracker_array(value)
                if tracked is not None:
                    mirrored[key] = tracked
        route = self.router.route(key)
        if isinstance(route, Refusal):
            routed.refused.append(route.metric)
            self.diagnostics.warn_once(route.reason, key, f"rl_otel: {route.detail}; it is not exported to Prometheus")
            return
        spec = route.spec
        if spec.kind is Kind.HISTOGRAM:
            try:
                routed.measurements.append(Measurement(spec, route.labels,
                                                       as_histogram(value, spec.buckets, spec.scale)))
            except BadValue as exc:
                self.diagnostics.bad(key, str(exc))
            if scalar and mirrored is not None:  # one value of a distribution: a histogram for the trackers too
                mirrored[key] = to_tracker_array(value)
            return
        if not scalar:
            self.diagnostics.bad(key, f"a distribution, but {spec.prometheus_name} is a {spec.kind.value}: log its "
                                      "mean/max/min, or a *_dist key")
            return
        routed.measurements.append(Measurement(spec, route.labels, value * spec.scale if spec.scale != 1.0 else value))
