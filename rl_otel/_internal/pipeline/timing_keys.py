"""A logged step's timing keys as goodput: which of them count, in which bucket, and the wall time they divide.

For a process known only by what it logs (veRL's ``timing_s/*``, OpenRLHF, NeMo-RL, prime-rl, SkyRL, slime,
AReaL, Trinity-RFT, ROLL's driver ``time/*``), the catalog says per key (:func:`rl_otel.catalog.goodput.decision_of`)
whether it is a leaf and of which bucket, which process's time it is (Trinity-RFT's explorer, prime-rl's
orchestrator, slime's rollout manager log beside the trainer) and which key is a whole step. The containment facts
(:mod:`rl_otel.catalog.goodput_nesting`) add two things a step needs: which counted keys run outside the step key's
interval (veRL's ``testing``, SkyRL's ``eval``: they add wall time of their own) and which only ever run inside a
step (Trinity-RFT's ``wait_explore_step``: counted with the step key that covers them, when it comes).

Per process and per step:

- with its step key: the wall time is ``max(step, the leaves inside it)`` (a leaf logged with the step after the
  one it ran in, or ROLL RLVR's ``step_total``, the previous step's, must not make the buckets exceed the wall),
  the leaves go to their buckets, the remainder to the step key's ``rest`` bucket (``waiting`` unless the catalog
  says otherwise: prime-rl's orchestrator's is ``generation``); leaves logged since the previous step key and
  only ever inside a step wait for it (Trinity-RFT's explorer logs its sync interval every few steps);
- without one (AReaL, Trinity-RFT's trainer, ROLL's SFT and distill, slime's rollout manager): the wall time is
  the interval since the process's previous timed step, at least its leaves, the remainder ``waiting``. A step
  whose process logged no timer since a step that logged none (TRL's evaluation every N steps, between untimed
  steps) divides no interval: it is not counted (TRL's synchronous trainers are accounted by their phases only);
- a leaf running outside its process's step: its own seconds, to its bucket and to the wall.

A logged ``startup`` leaf (NeMo-RL's setup) is dropped where the process's own start-up is measured (a live
process): the measurement covers it. A step logged again with the same timers at the same step number (``rl-otel
watch`` records a run's first values once more when it starts serving it) is a replay, not new time.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass, field

from rl_otel._internal.pipeline.records import Labels, Measurement
from rl_otel.catalog import MetricSpec
from rl_otel.catalog.goodput import FAMILIES, Decision, decision_of

WAITING, STARTUP = "waiting", "startup"
DURATIONS = frozenset(FAMILIES)  # the duration entries: any other series is no timer
_CACHE_LIMIT = 4_096  # series remembered (a job logs a few dozen timers; beyond, decided afresh each step)
_UNSET = object()
# the longest duration a step's timer may hold: past it the value is no clock's (a unit bug, a corrupt file)
MAX_STEP_SECONDS = 30 * 86_400.0
Series = tuple[str, Labels]


@dataclass(frozen=True, slots=True)
class Timer:
    """How one logged duration counts: its catalog decision (a leaf's bucket, or a step key), whether it runs
    outside its process's step (``outside``: its own wall time) and whether it only ever runs inside one
    (``in_step``: it waits for the step key covering it)."""

    decision: Decision
    outside: bool = False
    in_step: bool = False


@dataclass(slots=True)
class StepTime:
    """What one step adds: seconds per bucket, and the wall seconds they divide (the two sums are equal)."""

    buckets: dict[str, float] = field(default_factory=dict)
    wall: float = 0.0

    def add(self, bucket: str, seconds: float) -> None:
        self.buckets[bucket] = self.buckets.get(bucket, 0.0) + seconds


@dataclass(slots=True)
class _Process:
    """One process's state across steps."""

    last_at: float | None = None  # Unix time of its previous timed step (None: no interval runs)
    stepped: bool = False  # its step key was seen: its other leaves wait for the next one
    pending: dict[str, float] = field(default_factory=dict)  # leaves waiting for the step key, per bucket
    last: tuple[int, list[tuple[Timer, float]]] | None = None  # its previous timed step: a replay is skipped


@functools.cache
def loop_facts() -> tuple[frozenset[Series], frozenset[Series]]:
    """``(outside, in_step)``: the series (entry name, labels) of the counted keys that run outside their loop's
    step key in every loop naming them, and of those only ever inside one (resolved once, from the concrete
    keys of :data:`rl_otel.catalog.goodput_nesting.LOOPS`). A key both inside one loop's step and outside
    another's (ROLL's ``time/val_step``: inside RLVR's step, before DPO's) is neither."""
    from rl_otel.catalog import default_catalog
    from rl_otel.catalog.goodput_nesting import LOOPS

    inside: set[Series] = set()
    top: set[Series] = set()
    stepless: set[Series] = set()
    for loop in LOOPS:
        catalog = default_catalog(loop.framework)

        def series(key: str, catalog: object = catalog) -> Series:
            res = catalog.resolve(key)  # type: ignore[attr-defined]
            return res.spec.name, res.labels

        if loop.step is None:
            stepless.update(map(series, loop.all_keys()))
            continue
        top.update(map(series, loop.top))
        nests = {nest.key: nest for nest in loop.nests}
        todo = [loop.step]
        while todo:
            key = todo.pop()
            inside.add(series(key))
            nest = nests.get(key)
            if nest is not None:
                todo += [*nest.parts, *nest.overlapping]
    return frozenset(top - inside - stepless), frozenset(inside - top - stepless)


class TimingKeys:
    """The timing-key accounting of one recorder. :meth:`timers` runs on the logging thread (no lock: a cache
    read per timer); :meth:`account` under the caller's lock."""

    def __init__(self) -> None:
        self._cache: dict[Series, Timer | None] = {}
        self._processes: dict[str, _Process] = {}
        self.refused = 0  # timer values refused by timers() (the recorder counts them as input errors)

    def timers(self, measurements: Iterable[Measurement]) -> list[tuple[Timer, float]] | None:
        """The counted timers among a step's measurements, with their seconds (``None``: none). A duration no clock
        can produce (NaN, infinite, negative, longer than :data:`MAX_STEP_SECONDS`) is no time: it is left out
        and counted in :attr:`refused` (one ``inf`` would make the counters ``inf`` for the rest of the run, a
        ``1e300`` freeze them: ``1e300 + 1 == 1e300``)."""
        found: list[tuple[Timer, float]] | None = None
        names, cache = DURATIONS, self._cache
        for spec, labels, value in measurements:
            if spec.name in names and value.__class__ is float:
                timer = cache.get((spec.name, labels), _UNSET)
                if timer is _UNSET:
                    timer = self._timer(spec, labels)
                if timer is not None:
                    if not 0.0 <= value <= MAX_STEP_SECONDS:  # NaN fails both comparisons
                        self.refused += 1
                        continue
                    if found is None:
                        found = []
                    found.append((timer, value))  # type: ignore[arg-type]
        return found

    def _timer(self, spec: MetricSpec, labels: Labels) -> Timer | None:
        decision = decision_of(spec, labels)
        timer = None
        if decision is not None and (decision.bucket is not None or decision.step):
            outside, in_step = loop_facts()
            series = (spec.name, labels)
            timer = Timer(decision, series in outside, series in in_step)
        if len(self._cache) < _CACHE_LIMIT:
            self._cache[(spec.name, labels)] = timer
        return timer

    def account(self, found: list[tuple[Timer, float]] | None, step: int, at: float, *, first: bool,
                measured_startup: bool) -> StepTime | None:
        """What step ``step``, logged at Unix time ``at``, adds (``None``: nothing). ``first``: the recorder's first
        step (a step-less process's leaves count without an interval); ``measured_startup``: logged start-up
        leaves are dropped."""
        if not found:  # an untimed step: no process's interval runs across it
            for process in self._processes.values():
                process.last_at = None
            return None
        by_process: dict[str, list[tuple[Timer, float]]] = {}
        for timer, value in found:
            by_process.setdefault(timer.decision.process, []).append((timer, value))
        out = StepTime()
        for name, timers in by_process.items():
            process = self._processes.get(name) or self._processes.setdefault(name, _Process())
            if process.last is not None and process.last[0] == step and process.last[1] == timers:
                continue  # the same step's timers again: a replay
            process.last = (step, timers)
            self._account_process(process, timers, at, first, measured_startup, out)
        return out

    @staticmethod
    def _account_process(process: _Process, timers: list[tuple[Timer, float]], at: float, first: bool,
                         measured_startup: bool, out: StepTime) -> None:
        step: float | None = None
        rest = WAITING
        inside: list[tuple[str, float, bool]] = []
        for timer, value in timers:
            decision = timer.decision
            if decision.step:
                step = value if step is None else max(step, value)
                rest = decision.rest
            elif decision.bucket == STARTUP and measured_startup:
                continue  # the process's own start-up is measured: it covers this
            elif timer.outside:
                out.add(decision.bucket, value)  # type: ignore[arg-type]  # a leaf: bucket set
                out.wall += value
            else:
                inside.append((decision.bucket, value, timer.in_step))  # type: ignore[arg-type]
        if step is not None:
            process.stepped = True
            covered = sum(process.pending.values())
            for bucket, value in process.pending.items():
                out.add(bucket, value)
            process.pending.clear()
            for bucket, value, _ in inside:
                out.add(bucket, value)
                covered += value
            out.add(rest, max(step, covered) - covered)
            out.wall += max(step, covered)
            return
        now: list[tuple[str, float]] = []
        for bucket, value, in_step in inside:
            if process.stepped or in_step:  # covered by the step key still to come
                process.pending[bucket] = process.pending.get(bucket, 0.0) + value
            else:
                now.append((bucket, value))
        if not now:
            return
        covered = float(sum(value for _, value in now))
        last_at, process.last_at = process.last_at, at
        if last_at is not None:
            wall = max(at - last_at, covered)
        elif first:
            wall = covered  # no interval to divide: the first step's leaves only
        else:
            return  # a new interval starts here
        for bucket, value in now:
            out.add(bucket, value)
        out.add(WAITING, wall - covered)
        out.wall += wall
