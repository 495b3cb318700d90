"""One logged step through the pipeline: the trackers' view first (every key as logged), then router → store.

:class:`Pipeline` owns the step counter, the per-key route/coerce loop and the buffer of finished phases. It
imports only the catalog and the rest of the pipeline: the trackers are reached through the ``mirror`` callback
the runtime sets (``Bridge.submit``), the endpoint and the OTLP push read the store.

Fault isolation is per key: a key whose text, value or bucketing raises (whatever it raises) costs that key only,
counted in ``rl_telemetry_errors_total{sink="input", reason=...}`` (``bad_key``, ``bad_value``) and said once; the
other keys of the step are stored and mirrored. A step that is not an int in ``[0, 2**63-1]`` (``bad_step``: not a
number, negative, too large for TensorBoard's int64) is replaced by the previous valid step + 1, for every sink
alike; the steps after it are not affected.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from rl_otel._internal.pipeline.diagnostics import Diagnostics
from rl_otel._internal.pipeline.router import Refusal, Route, Router
from rl_otel._internal.pipeline.store import SeriesStore
from rl_otel._internal.pipeline.values import BadKey, BadValue, as_histogram, coerce, to_tracker_array
from rl_otel._internal.pipeline.worker import reset_in_forked_child
from rl_otel.catalog import Kind, live, meta

_log = logging.getLogger("rl_otel")
_UNWRITTEN_LIMIT = 64  # phases recorded before the training thread writes them itself (nobody reads the store)
_PLAN_LIMIT = 64  # key sets remembered (a training loop logs a handful: train steps, eval steps, phases)
MAX_STEP = 2**63 - 1  # the highest step every sink can hold (TensorBoard's and WandB's steps are int64)
Mirror = Callable[[dict[str, Any], int, bool], None]  # (metrics as logged, step, wait): the trackers' bridge
Pairs = Iterable[tuple[str, object]]


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

    def pending(self) -> dict[str, float]:
        with self._lock:
            return dict(self._metrics)

    def take(self) -> dict[str, float]:
        if not self._metrics:  # most steps: no lock, no copy (a phase ending now is taken next step)
            return {}
        with self._lock:
            taken, self._metrics = self._metrics, {}
        return taken


class _Plan:
    """A key set resolved once: the store's points of its keys, in order, and their unit scales."""

    __slots__ = ("points", "scales", "structure")

    def __init__(self, structure: int, points: list[list], scales: tuple[float, ...] | None) -> None:
        self.structure = structure
        self.points = points
        self.scales = scales  # None: every scale is 1


_UNPLANNABLE = _Plan(-1, [], None)  # a key set the fast path does not take (refused keys, histograms, ...)
_FLOAT = {float}
# what the fast path converts with float(), as coerce() does (bool is left to the per-key path)
_NUMBERS = frozenset({float, int, np.float64, np.float32, np.float16, np.int64, np.int32, np.int16, np.int8,
                      np.uint64, np.uint32, np.uint16, np.uint8})


class Pipeline:
    """Steps → (trackers, store). Thread-safe; nothing here raises to the caller of ``ingest``.

    The common step - a flat dict of floats whose key set was seen before, every key a gauge or counter - takes
    :meth:`ingest_flat`: the keys are resolved once per key set into the store's points, and the step is written
    as one vector under one lock. Anything else (nested dicts, tensors, ``None``, histograms, refused keys, a new
    series past its cap) takes :meth:`ingest`, key by key, with the same results.
    """

    def __init__(self, store: SeriesStore, router: Router, diagnostics: Diagnostics) -> None:
        self.store = store
        self.router = router
        self.diagnostics = diagnostics
        self.phases = PhaseBuffer()
        self.mirror: Mirror | None = None  # set when this process mirrors to trackers
        self._step_lock = threading.Lock()
        self._step: int | None = None  # the highest step handed out: what step=None continues from
        self._stored_lock = threading.Lock()
        self._stored: int | None = None  # the highest step stored: a step below it is history
        self._history_noted = False
        self._plans: dict[tuple, _Plan] = {}
        self._phase_series: dict[tuple[str, ...], list[tuple]] = {}  # (cluster, phase, parts...) -> items
        self._unwritten: deque[tuple[str, str, dict[str, float], dict[str, float]]] = deque()  # record_phase
        self._phase_lock = threading.Lock()
        reset_in_forked_child(self)

    def _after_fork(self) -> None:
        """In a forked child: fresh locks (a logging thread of the parent may have held one at the fork)."""
        self._step_lock = threading.Lock()
        self._stored_lock = threading.Lock()
        self._phase_lock = threading.Lock()

    @property
    def step(self) -> int | None:
        return self._step

    def next_step(self) -> int:
        """The step the next ``log()`` without a step gets."""
        return 0 if self._step is None else self._step + 1

    def advance(self, step: object) -> int:
        """The step a ``log()``/``submit()`` writes at: ``step`` as an int in ``[0, MAX_STEP]``; for ``None``, and in
        place of a step that is no such int (counted as ``bad_step``, said once), the highest valid step + 1. A
        bad step costs only its own call: the steps after it continue from the valid ones."""
        if step is not None and not (type(step) is int and 0 <= step <= MAX_STEP):
            step = self._valid_step(step)
        with self._step_lock:
            if step is None:
                step = 0 if self._step is None else min(self._step + 1, MAX_STEP)
            if self._step is None or step > self._step:
                self._step = step
            return step

    def _valid_step(self, step: object) -> int | None:
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
        self.diagnostics.bad("", f"step must be an int in [0, 2**63-1], got {_safe_repr(step)} ({why}); using the "
                                 "previous step + 1", "bad_step")
        return None

    def ingest(self, pairs: Pairs, step: int, timestamp: float, phases: dict[str, float] | None,
               wait: bool = False) -> None:
        """Store one step's ``(key, value)`` pairs and hand them to the trackers with the phases finished since
        the last step (``phases``: taken when the step was logged; ``None``: take them now). A step below the
        highest one stored is history: it sets no series back and removes none."""
        self.write_phases()  # the phases that ended before this step are written before it
        mirror = self.mirror
        items, gone, mirrored = self.prepare(pairs, mirror=mirror is not None)
        with self._stored_lock:
            current = self._stored is None or step >= self._stored
            if current:
                self._stored = step
        # the store keeps, per series, the newest step's value: whatever order concurrent writes land in
        left_out = self.store.write_step(items, gone if current else (), step=step,
                                         marks=((meta.STEP, float(step), True),
                                                (meta.LAST_STEP_TIMESTAMP, timestamp, False)))
        self._note_left_out(left_out)
        if not current:
            self._note_history(step)
        if mirror is not None and mirrored is not None:
            # the phases finished since the last step reach the trackers at this step, as in ROLL (a history
            # step takes none: they belong to the step being trained)
            if phases is None and current:
                phases = self.phases.take()
            if phases:
                mirrored = {**phases, **mirrored}
            if mirrored:
                mirror(mirrored, step, wait)

    def ingest_flat(self, metrics: Mapping[str, object], step: int, timestamp: float, wait: bool = False) -> bool:
        """:meth:`ingest` for the common step, written as one vector (see the class); False, having done nothing,
        when the step is not of that kind (the caller then takes :meth:`ingest`)."""
        self.write_phases()
        planned = self._planned(metrics)
        if planned is None:
            return False
        keys, plan, scaled = planned
        with self._stored_lock:
            current = self._stored is None or step >= self._stored
            if current:
                self._stored = step
        if not self.store.write_points(plan.structure, plan.points, scaled, step=step, newest=current,
                                       marks=((meta.STEP, float(step), True),
                                              (meta.LAST_STEP_TIMESTAMP, timestamp, False))):
            self._plans.pop(keys, None)  # a series was removed (a TTL, a None): resolve the key set again
            return False
        if not current:
            self._note_history(step)
        mirror = self.mirror
        if mirror is not None:
            mirrored: dict[str, Any] = dict(metrics)  # the trackers' own copy, every key as logged
            phases = self.phases.take() if current else None
            if phases:
                mirrored = {**phases, **mirrored}
            if mirrored:
                mirror(mirrored, step, wait)
        return True

    def _write_planned(self, metrics: Mapping[str, float]) -> bool:
        """A phase's keys (always the same set for a cluster and phase) as current values through a plan; False
        when they cannot take it (the caller writes them key by key)."""
        planned = self._planned(metrics)
        if planned is None:
            return False
        keys, plan, scaled = planned
        if not self.store.write_points(plan.structure, plan.points, scaled, step=None, newest=True):
            self._plans.pop(keys, None)
            return False
        return True

    def _planned(self, metrics: Mapping[str, object]) -> tuple[tuple, _Plan, Sequence[float]] | None:
        """The key set's plan and its values in base units, for a flat mapping of numbers whose every key takes
        the vector write; ``None`` otherwise (the caller takes the per-key path)."""
        values: tuple | list = tuple(metrics.values())
        types = set(map(type, values))
        if types != _FLOAT:
            if not types <= _NUMBERS:
                return None
            try:
                values = list(map(float, values))  # ints, numpy scalars: as the per-key path converts them
            except (OverflowError, ValueError, TypeError):
                return None
        keys = tuple(metrics)
        plan = self._plans.get(keys)
        if plan is None:
            plan = self._plan(keys)
        if plan is _UNPLANNABLE:
            return None
        scales = plan.scales
        return keys, plan, values if scales is None else [v * s for v, s in zip(values, scales)]  # noqa: B905

    def _plan(self, keys: tuple) -> _Plan:
        plan = _UNPLANNABLE
        routes = []
        for key in keys:
            route = self.router.route(key) if type(key) is str else None
            if not isinstance(route, Route) or route.spec.kind is Kind.HISTOGRAM:
                break
            routes.append(route)
        else:
            held = self.store.points((r.spec, r.labels) for r in routes)
            if held is not None:
                scales = tuple(r.spec.scale for r in routes)
                plan = _Plan(held[0], held[1], None if all(s == 1.0 for s in scales) else scales)
        if len(self._plans) >= _PLAN_LIMIT:
            self._plans.clear()
        self._plans[keys] = plan
        return plan

    def write_current(self, pairs: Pairs) -> None:
        """Route ``(key, value)`` pairs into the store as current values, no step, no mirror (phase metrics)."""
        items, gone, _ = self.prepare(pairs)
        self._note_left_out(self.store.write(items))
        for spec, labels in gone:
            self.store.delete(spec, labels)

    def record_phase(self, cluster: str, phase: str, metrics: dict[str, float], durations: dict[str, float]) -> None:
        """A finished phase: its ROLL keys for the trackers with the next step, and for the store - with
        ``rl_phase_duration_seconds`` per part - at the next read or write of the store (:meth:`write_phases`).

        The store's side waits because the training thread is the one place where time is the user's: after a
        phase's body (a wait on the GPU) the store's code runs on a cold CPU, for ~10x its warm cost. Every reader
        (a scrape, an OTLP export, ``tel.value()``) settles the store first, and every step written through the
        pipeline writes the phases before it, so what anyone reads and the order of the writes are as if the
        phase had been written at once; with no reader, at most ``_UNWRITTEN_LIMIT`` phases wait."""
        self.phases.add(metrics)
        unwritten = self._unwritten
        unwritten.append((cluster, phase, dict(metrics), durations))  # a copy: Phase.metrics is the user's
        if len(unwritten) >= _UNWRITTEN_LIMIT:
            self.write_phases()

    def write_phases(self) -> None:
        """Write the phases recorded and not yet written into the store, in order (any thread; never raises)."""
        if not self._unwritten:
            return
        with self._phase_lock:  # one writer at a time, so phases land in the order they ended
            unwritten = self._unwritten
            while unwritten:
                cluster, phase, metrics, durations = unwritten.popleft()
                try:
                    self._write_phase(cluster, phase, metrics, durations)
                except Exception:  # one phase's failure is counted (and logged once); the others are written
                    self.diagnostics.count("phase", "internal")
                    if self.diagnostics.warn_once("phase", "store", "rl_otel: writing a phase's metrics to the store "
                                                  "failed; training goes on"):
                        _log.debug("rl_otel: phase store write failure", exc_info=True)

    def _write_phase(self, cluster: str, phase: str, metrics: dict[str, float], durations: dict[str, float]) -> None:
        if not self._write_planned(metrics):
            self.write_current(metrics.items())
        series = self._phase_series.get((cluster, phase, *durations))
        if series is None:  # the labels of a phase's parts, made once
            if len(self._phase_series) >= _PLAN_LIMIT:
                self._phase_series.clear()
            series = self._phase_series[(cluster, phase, *durations)] = [
                (live.PHASE_DURATION, (("cluster", cluster), ("phase", phase), ("part", part)))
                for part in durations]
        self.store.write([(spec, labels, seconds)  # one item per part: the key holds the parts, in order
                          for (spec, labels), seconds in zip(series, durations.values(), strict=True)])

    def prepare(self, pairs: Pairs, *, mirror: bool = False) -> tuple[list, list, dict[str, Any] | None]:
        """Split ``(key, value)`` pairs into the two views of a step. With ``mirror``, what the trackers get: every
        key as logged, in the user's units, taken before any Prometheus rule - a key the catalog routing refuses
        (a name collision, past ``max_unknown_keys``) or a distribution logged for a gauge still reaches them.
        Then the Prometheus view, routed through the catalog: the store's items (scaled to base units) and the
        gauge series a ``None`` removes."""
        items: list = []
        gone: list = []
        mirrored: dict[str, Any] | None = {} if mirror else None
        iterator = iter(pairs)
        while True:
            try:
                key, raw = next(iterator)
            except StopIteration:
                break
            except Exception as exc:  # a mapping whose iteration raises: keep the keys read so far
                self.diagnostics.bad("", f"the metrics dict could not be read past its first keys "
                                         f"({type(exc).__name__}); the keys read are logged", "bad_key")
                break
            try:
                self._one(key, raw, items, gone, mirrored)
            except Exception as exc:  # whatever a value does (a sparse tensor, a raising __float__): this key only
                self.diagnostics.bad(key, f"{type(exc).__name__}: {exc}")
        return items, gone, mirrored

    def _one(self, key: str, raw: object, items: list, gone: list, mirrored: dict[str, Any] | None) -> None:
        if raw.__class__ is float:
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
                    gone.append((known.spec, known.labels))
                return
        scalar = value.__class__ is float or isinstance(value, float)
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
                items.append((spec, route.labels, as_histogram(value, spec.buckets, spec.scale)))
            except BadValue as exc:
                self.diagnostics.bad(key, str(exc))
            if scalar and mirrored is not None:  # one value of a distribution: a histogram for the trackers too
                mirrored[key] = to_tracker_array(value)
            return
        if not scalar:
            self.diagnostics.bad(key, f"a distribution, but {spec.prometheus_name} is a {spec.kind.value}: log its "
                                      "mean/max/min, or a *_dist key")
            return
        items.append((spec, route.labels, value * spec.scale if spec.scale != 1.0 else value))

    def _note_left_out(self, left_out: list) -> None:
        for spec, n in left_out:
            self.diagnostics.count("input", "non_finite_in_distribution", n)
            self.diagnostics.warn_once("non_finite", spec.name, f"rl_otel: {n} NaN/Inf values left out of the "
                                                                f"histogram {spec.name} (Prometheus buckets cannot "
                                                                "hold them)")

    def _note_history(self, step: int) -> None:
        if not self._history_noted:
            self._history_noted = True
            _log.info("rl_otel: step %d is below the highest step logged (%s): the trackers get it; on the endpoint "
                      "series keep the newer steps' values (said once)", step, self._stored)


def _safe_repr(value: object) -> str:
    try:
        text = repr(value)
    except Exception:
        return f"a {type(value).__name__}"
    return text if len(text) <= 80 else text[:80] + "..."
