"""One logged step, or one finished phase, through the pipeline: the trackers' view first (every key as logged),
then router → store, written on the caller's thread (the thread that logged the step or ended the phase, or the
metrics worker).

:class:`Pipeline` owns the step counter (:class:`Steps`), the per-key loop and the trackers' buffer of finished
phases. It imports only the catalog and the rest of the pipeline: the trackers are reached through the ``mirror``
callback the runtime sets (``Bridge.submit``); the endpoint and the OTLP push read the store's snapshots.

Fault isolation is per key: a key whose text, value or bucketing raises (whatever it raises) costs that key only,
counted in ``rl_telemetry_errors_total{sink="input", reason=...}`` (``bad_key``, ``bad_value``) and said once; the
other keys of the step are stored and mirrored. A step that is not an int in ``[0, 2**63-1]`` (``bad_step``: not a
number, negative, too large for TensorBoard's int64) is replaced by the previous valid step + 1, for every sink
alike; the steps after it are not affected.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rl_otel._internal.pipeline.diagnostics import Diagnostics
from rl_otel._internal.pipeline.router import Refusal, Route, Router
from rl_otel._internal.pipeline.store import Labels, Measurement, SeriesStore
from rl_otel._internal.pipeline.values import BadKey, BadValue, as_histogram, coerce, to_tracker_array
from rl_otel._internal.pipeline.worker import reset_in_forked_child
from rl_otel.catalog import Kind, MetricSpec, live, meta

_log = logging.getLogger("rl_otel")
_DURATION_LABELS_LIMIT = 64  # (cluster, phase) pairs whose duration labels are kept (a job has a handful)
MAX_STEP = 2**63 - 1  # the highest step every sink can hold (TensorBoard's and WandB's steps are int64)
Mirror = Callable[[dict[str, Any], int, bool], None]  # (metrics as logged, step, wait): the trackers' bridge
KeyValues = Iterable[tuple[str, object]]
_HISTOGRAM = Kind.HISTOGRAM


class PhaseBuffer:
    """ROLL-keyed values of the phases finished since the trackers' last step (they reach the trackers with the
    next step, as in ROLL; Prometheus has them at once)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._metrics: dict[str, float] = {}
        reset_in_forked_child(self)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()  # the parent's may have been held by another thread at the fork

    def add(self, metrics: Mapping[str, float]) -> None:
        with self._lock:
            self._metrics.update(metrics)

    def take(self) -> dict[str, float]:
        if not self._metrics:  # most steps: no lock, no copy (a phase ending now is taken next step)
            return {}
        with self._lock:
            taken, self._metrics = self._metrics, {}
        return taken


class Steps:
    """The steps handed out (what ``step=None`` continues from) and the highest step stored (a step below it is
    history). Thread-safe."""

    def __init__(self, diagnostics: Diagnostics) -> None:
        self._diag = diagnostics
        self._lock = threading.Lock()
        self.last: int | None = None  # the highest step handed out
        self._stored: int | None = None
        self._history_noted = False
        reset_in_forked_child(self)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()

    def next(self) -> int:
        """The step the next ``log()`` without a step gets."""
        return 0 if self.last is None else self.last + 1

    def advance(self, step: object) -> int:
        """The step a ``log()``/``submit()`` writes at: ``step`` as an int in ``[0, MAX_STEP]``; for ``None``, and in
        place of a step that is no such int (counted as ``bad_step``, said once), the highest valid step + 1. A
        bad step costs only its own call: the steps after it continue from the valid ones."""
        if step is not None and not (type(step) is int and 0 <= step <= MAX_STEP):
            step = self._valid(step)
        with self._lock:
            if step is None:
                step = 0 if self.last is None else min(self.last + 1, MAX_STEP)
            if self.last is None or step > self.last:
                self.last = step
            return step

    def store(self, step: int) -> bool:
        """Note ``step`` as stored; False if it is history (below the highest step stored; said once)."""
        with self._lock:
            current = self._stored is None or step >= self._stored
            if current:
                self._stored = step
            elif not self._history_noted:
                self._history_noted = True
                _log.info("rl_otel: step %d is below the highest step logged (%s): the trackers get it; on the "
                          "endpoint series keep the newer steps' values (said once)", step, self._stored)
        return current

    def _valid(self, step: object) -> int | None:
        """``step`` as an int in ``[0, MAX_STEP]`` (a 0-d tensor, a numpy int, a float like 3.0), else ``None``,
        counted and said once: every sink then gets the previous valid step + 1 (TensorBoard's steps are int64, an
        overflowing step would otherwise poison every automatic step after it)."""
        why = "not an int"
        if not isinstance(step, bool):
            try:
                number = int(step)  # type: ignore[call-overload]
            except Exception as exc:
                why = f"not an int ({type(exc).__name__})"
            else:
                if 0 <= number <= MAX_STEP:
                    return number
                why = "negative" if number < 0 else "above 2**63-1"
        self._diag.bad("", f"step must be an int in [0, 2**63-1], got {_safe_repr(step)} ({why}); using the "
                           "previous step + 1", "bad_step")
        return None


@dataclass(slots=True)
class Routed:
    """The two views of what was logged: ``measurements`` for the store (routed through the catalog, in base
    units), ``gone``: the gauge series a ``None`` removes, and ``mirrored``: what the trackers get (every key as
    logged, in the user's units; ``None`` when nothing is mirrored)."""

    measurements: list[Measurement] = field(default_factory=list)
    gone: list[tuple[MetricSpec, Labels]] = field(default_factory=list)
    mirrored: dict[str, Any] | None = None


class Pipeline:
    """Steps and phases → (trackers, store). Thread-safe; nothing here raises to its caller."""

    def __init__(self, store: SeriesStore, router: Router, diagnostics: Diagnostics) -> None:
        self.store = store
        self.router = router
        self.diagnostics = diagnostics
        self.steps = Steps(diagnostics)
        self.phases = PhaseBuffer()
        self.mirror: Mirror | None = None  # set when this process mirrors to trackers
        self._duration_labels: dict[tuple[str, ...], list[Labels]] = {}  # (cluster, phase, parts...) -> labels

    def log(self, metrics: KeyValues, step: int, timestamp: float, phases: dict[str, float] | None = None,
            wait: bool = False) -> None:
        """Store one step's ``(key, value)`` pairs and hand them to the trackers with the phases finished since
        the last step (``phases``: taken when the step was logged; ``None``: take them now). A step below the
        highest one stored is history: it sets no series back and removes none."""
        mirror = self.mirror
        routed = self.route(metrics, mirror=mirror is not None)
        current = self.steps.store(step)
        # the store keeps, per series, the newest step's value: whatever order concurrent writes land in
        self._note_left_out(self.store.write(
            routed.measurements, step=step, gone=routed.gone if current else (),
            marks=((meta.STEP, float(step), True), (meta.LAST_STEP_TIMESTAMP, timestamp, False))))
        mirrored = routed.mirrored
        if mirror is not None and mirrored is not None:
            # the phases finished since the last step reach the trackers at this step, as in ROLL (a history
            # step takes none: they belong to the step being trained)
            if phases is None and current:
                phases = self.phases.take()
            if phases:
                mirrored = {**phases, **mirrored}
            if mirrored:
                mirror(mirrored, step, wait)

    def record_phase(self, cluster: str, phase: str, metrics: dict[str, float], durations: dict[str, float]) -> None:
        """A finished phase, on the thread that ran it: its ROLL keys kept for the trackers' next step (when this
        process mirrors to trackers), and written to the store now as current values, with
        ``rl_phase_duration_seconds`` per part (never raises)."""
        try:
            if self.mirror is not None:
                self.phases.add(metrics)
            routed = self.route(metrics.items())
            routed.measurements += [(live.PHASE_DURATION, part, seconds) for part, seconds in
                                    zip(self._part_labels(cluster, phase, durations), durations.values(), strict=True)]
            self._note_left_out(self.store.write(routed.measurements, gone=routed.gone))
        except Exception:  # one phase's failure is counted (and logged once); training goes on
            self._phase_write_failed()

    def record_phase_gpu(self, cluster: str, phase: str, durations: dict[str, float]) -> None:
        """A finished phase's GPU seconds per part (CUDA events, resolved after it ended, on the GPU timer's
        thread): ``rl_phase_gpu_duration_seconds`` per part, and, when this process mirrors to trackers,
        ``time/{cluster}/{phase}/gpu/{part}`` for the trackers' next step (never raises)."""
        try:
            if self.mirror is not None:
                self.phases.add({f"time/{cluster}/{phase}/gpu/{part}": seconds for part, seconds in durations.items()})
            self._note_left_out(self.store.write(
                [(live.PHASE_GPU_DURATION, part, seconds) for part, seconds in
                 zip(self._part_labels(cluster, phase, durations), durations.values(), strict=True)]))
        except Exception:
            self._phase_write_failed()

    def _part_labels(self, cluster: str, phase: str, durations: dict[str, float]) -> list[Labels]:
        """The labels of a phase's parts, made once per (cluster, phase, parts)."""
        key = (cluster, phase, *durations)
        labels = self._duration_labels.get(key)
        if labels is None:
            if len(self._duration_labels) >= _DURATION_LABELS_LIMIT:
                self._duration_labels.clear()
            labels = self._duration_labels[key] = [
                (("cluster", cluster), ("phase", phase), ("part", part)) for part in durations]
        return labels

    def _phase_write_failed(self) -> None:
        """One phase's failure is counted (and logged once); training goes on."""
        self.diagnostics.count("phase", "internal")
        if self.diagnostics.warn_once("phase", "store", "rl_otel: writing a phase's metrics to the store failed; "
                                      "training goes on"):
            _log.debug("rl_otel: phase store write failure", exc_info=True)

    def route(self, metrics: KeyValues, *, mirror: bool = False) -> Routed:
        """Split ``(key, value)`` pairs into the two views of :class:`Routed`. With ``mirror``, the trackers' view
        is taken before any Prometheus rule: a key the catalog routing refuses (a name collision, past
        ``max_unknown_keys``) or a distribution logged for a gauge still reaches them."""
        routed = Routed(mirrored={} if mirror else None)
        mirrored, add, cached = routed.mirrored, routed.measurements.append, self.router.cached
        try:
            for key, raw in metrics:
                if raw.__class__ is float:  # the per-step case, written out here: a float for a known gauge or counter
                    route = cached(key)
                    if route.__class__ is Route and route.spec.kind is not _HISTOGRAM:
                        spec = route.spec
                        if mirrored is not None:
                            mirrored[key] = raw
                        add((spec, route.labels, raw if spec.scale == 1.0 else raw * spec.scale))
                        continue
                try:
                    self._route_one(key, raw, routed)
                except Exception as exc:  # whatever a value does (a sparse tensor, a raising __float__): this key only
                    self.diagnostics.bad(key, f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # a mapping whose iteration raises: keep the keys read so far
            self.diagnostics.bad("", f"the metrics dict could not be read past its first keys "
                                     f"({type(exc).__name__}); the keys read are logged", "bad_key")
        return routed

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
            self.store.note_dropped(route.metric)
            self.diagnostics.warn_once(route.reason, key, f"rl_otel: {route.detail}; it is not exported to Prometheus")
            return
        spec = route.spec
        if spec.kind is Kind.HISTOGRAM:
            try:
                routed.measurements.append((spec, route.labels, as_histogram(value, spec.buckets, spec.scale)))
            except BadValue as exc:
                self.diagnostics.bad(key, str(exc))
            if scalar and mirrored is not None:  # one value of a distribution: a histogram for the trackers too
                mirrored[key] = to_tracker_array(value)
            return
        if not scalar:
            self.diagnostics.bad(key, f"a distribution, but {spec.prometheus_name} is a {spec.kind.value}: log its "
                                      "mean/max/min, or a *_dist key")
            return
        routed.measurements.append((spec, route.labels, value * spec.scale if spec.scale != 1.0 else value))

    def _note_left_out(self, left_out: list[tuple[MetricSpec, int]]) -> None:
        for spec, n in left_out:
            self.diagnostics.count("input", "non_finite_in_distribution", n)
            self.diagnostics.warn_once("non_finite", spec.name, f"rl_otel: {n} NaN/Inf values left out of the "
                                                                f"histogram {spec.name} (Prometheus buckets cannot "
                                                                "hold them)")


def _safe_repr(value: object) -> str:
    try:
        text = repr(value)
    except Exception:
        return f"a {type(value).__name__}"
    return text if len(text) <= 80 else text[:80] + "..."
