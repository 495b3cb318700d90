"""Where one process's wall time goes (``rl_goodput_bucket_seconds_total{bucket}``, ``rl_goodput_wall_seconds_total``)
and how long this rank computed against how long it waited where ranks meet (``rl_rank_compute_seconds_total``,
``rl_collective_wait_seconds_total{point}``). ``docs/goodput.md`` is the user's account of it.

Three sources, and the same seconds never come from two of them:

- **start-up**: from the process's start (``begin()``, the runtime's reading of psutil's ``create_time``) to its
  first phase or first step; served as it runs.
- **the timeline**, in a process that runs phases or ``tel.collective()`` blocks: from then on every moment is in
  one bucket. Each thread has a stack of open frames - a phase in one of its parts (``onload``/``offload`` to
  ``offload``, ``execute`` to the phase's bucket), or a collective (``waiting``) - and the innermost one owns the
  time: *exclusive* time, so a phase nested in another counts once, in the inner one's bucket, and a collective
  inside a phase is waiting, not the phase's work (the phase's ``rl_phase_duration_seconds`` still covers it).
  Frames open on several threads at once divide the time evenly (the buckets still add up to the wall time); no
  open frame is ``waiting``. The wall time is the process's: start-up, then the clock.
- **timing keys**, in a process known only by what it logs (:mod:`~rl_otel._internal.pipeline.timing_keys`):
  each step adds its timers, and the wall time is the sum of the steps' (and start-up). From a process's first
  phase on its timing keys are no longer counted: its phases are (ROLL's driver logs ``time/step_*`` and runs no
  phase; its workers run phases and log nothing - and ROLL's own ``time/{cluster}/{phase}/*`` are no leaves).

Everything is computed at collection (a live collector of the recorder): a phase still running and the idle time
since the last one are in the counters at every scrape, and a counter never goes back (the collection reads the
clock under the same lock as the events, and the start-up it served is the least it can end at).

Cost: two lock-protected clock reads for a phase without ``onload``/``offload`` (four with both: the parts
change), two per collective; a step of a process with phases adds one attribute test, of a process without
phases one look per routed value at its entry's name (timing keys: a cached decision).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Sequence
from threading import get_ident
from time import perf_counter, time
from types import TracebackType

from rl_otel._internal.forks import reset_in_forked_child
from rl_otel._internal.pipeline.diagnostics import Diagnostics
from rl_otel._internal.pipeline.records import Batch, Labels, Measurement
from rl_otel._internal.pipeline.timing_keys import DURATIONS, STARTUP, WAITING, TimingKeys
from rl_otel.catalog import MetricSpec, live
from rl_otel.catalog.goodput import BUCKETS

__all__ = ["Collective", "Frame", "Goodput"]

_log = logging.getLogger("rl_otel")
OFFLOAD = "offload"
MAX_POINTS = 64  # distinct collective points served; later ones are counted under OTHER_POINT
OTHER_POINT = "other"
_BUCKET_LABELS = {bucket: (("bucket", bucket),) for bucket in BUCKETS}
Item = tuple[MetricSpec, Labels, float]


class Frame:
    """One open phase part or collective on one thread's stack: the bucket its time goes to now."""

    __slots__ = ("bucket", "busy", "ident", "point")

    def __init__(self, bucket: str, point: str | None) -> None:
        self.bucket = bucket
        self.point = point  # a collective's point (its time is a wait), else None
        self.busy = point is None and bucket != WAITING  # counted in this rank's compute time
        self.ident = get_ident()


class Collective:
    """``Telemetry.collective(point)``: a block where this rank waits for the others (an all-reduce, a barrier).
    Its time is ``waiting``, ``rl_collective_wait_seconds_total{point}``, and no compute time, even inside a
    phase. Never raises; the body's exceptions propagate. Reusable, one block at a time."""

    __slots__ = ("_account", "_frame", "point")

    def __init__(self, account: Goodput, point: str) -> None:
        self._account = account
        self.point = point
        self._frame: Frame | None = None

    def __enter__(self) -> Collective:
        self._frame = self._account.enter(WAITING, self.point)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        frame, self._frame = self._frame, None
        if frame is not None:
            self._account.leave(frame)


class Goodput:
    """The goodput accounting of one recorder. Thread-safe. The timeline's calls (:meth:`enter`, :meth:`switch`,
    :meth:`leave`), made on the training thread with no guard above them, never raise: a failure is counted in
    ``rl_telemetry_errors_total{sink="live", reason="goodput"}`` and the accounting goes on. :meth:`step` and
    :meth:`collect` run under the recorder's guards (a write's, a live collector's): pure bookkeeping, a bug in
    them raises in tests."""

    def __init__(self, diagnostics: Diagnostics | None = None, started: float | None = None) -> None:
        self._diag = diagnostics or Diagnostics()
        self._lock = threading.Lock()
        self.phased = False  # a phase or collective ran: the timeline accounts for this process (read unlocked)
        self._muted = False  # steps recorded now are not counted (rl-otel watch restoring the values it had read)
        self._buckets = dict.fromkeys(BUCKETS, 0.0)  # committed seconds
        self._wall = 0.0  # committed wall seconds (the timeline's run on from ``_since``)
        self._waits: dict[str, float] = {}
        self._compute = 0.0
        self._stacks: dict[int, list[Frame]] = {}  # thread -> its open frames, innermost last
        self._t: float | None = None  # perf_counter up to which the timeline's time is committed
        self._since: float | None = None  # perf_counter from which the wall time runs with the clock
        self._clock0 = (perf_counter(), time())  # converts a step's Unix time to the timeline's clock
        self._origin: tuple[float, float] | None = None  # (start-up seconds, perf_counter) at begin()
        self._startup_open = False  # start-up runs: served as it runs until the first phase or step
        self._startup_served = 0.0  # the most start-up served: where it ends at the least (counters never go back)
        self._serving = False  # something to serve
        self._logged = False  # a step was recorded
        self._keys = TimingKeys()
        reset_in_forked_child(self)
        self.begin(started)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()  # the parent's may have been held by another thread at the fork

    def begin(self, started: float | None) -> None:
        """Start-up runs from ``started`` (the process's start, Unix time; ``None``: unknown, no start-up is
        measured, as for a watched run)."""
        if started is None:
            return
        now_pc, now = perf_counter(), time()
        with self._lock:
            if self._serving:
                return
            self._origin = (max(0.0, now - started), now_pc)
            self._startup_open = self._serving = True

    # -- the timeline: phases and collectives ------------------------------------------------------------------

    def enter(self, bucket: str, point: str | None = None) -> Frame | None:
        """Open a frame on this thread whose time goes to ``bucket`` (``point``: a collective's); ``None`` if the
        accounting failed (counted)."""
        try:
            frame = Frame(bucket, point)
            with self._lock:
                t = perf_counter()
                last = self._t
                if not self.phased:
                    self._start_timeline(t)
                elif last is not None and t > last:  # _commit(t), written out: this runs at every phase
                    self._t = t
                    if self._stacks:
                        self._compute += self._spread(t - last, self._buckets, self._waits)
                    else:
                        self._buckets[WAITING] += t - last
                if point is not None and point not in self._waits:
                    if len(self._waits) >= MAX_POINTS:
                        frame.point = point = OTHER_POINT
                    self._waits.setdefault(point, 0.0)
                stack = self._stacks.get(frame.ident)
                if stack is None:
                    self._stacks[frame.ident] = [frame]
                else:
                    stack.append(frame)
            return frame
        except Exception:  # training thread: phase.py and Collective call this unguarded; a bug is counted
            self._failed()
            return None

    def switch(self, frame: Frame, bucket: str) -> None:
        """The frame's time goes to ``bucket`` from now (a phase's part changed)."""
        try:
            with self._lock:
                self._commit(perf_counter())
                frame.bucket = bucket
                frame.busy = frame.point is None and bucket != WAITING
        except Exception:  # training thread: phase.py calls this unguarded; a bug is counted, never raised
            self._failed()

    def leave(self, frame: Frame) -> None:
        """Close the frame (wherever it is on its thread's stack: blocks may end out of order)."""
        try:
            with self._lock:
                t = perf_counter()
                last = self._t
                if last is not None and t > last:  # _commit(t), written out: this runs at every phase
                    self._t = t
                    self._compute += self._spread(t - last, self._buckets, self._waits)
                stack = self._stacks.get(frame.ident)
                if stack is not None:
                    if stack and stack[-1] is frame:
                        stack.pop()
                    elif frame in stack:
                        stack.remove(frame)
                    if not stack:
                        del self._stacks[frame.ident]
        except Exception:  # training thread: phase.py and Collective call this unguarded; a bug is counted
            self._failed()

    def collective(self, point: str) -> Collective:
        """A :class:`Collective` block at ``point``."""
        return Collective(self, point)

    def known_bucket(self, bucket: object) -> str | None:
        """``bucket`` if it is one of :data:`~rl_otel.catalog.goodput.BUCKETS`, else ``None``, counted
        (``rl_telemetry_errors_total{sink="phase", reason="bad_bucket"}``) and said once: the phase's name then
        decides its bucket."""
        if isinstance(bucket, str) and bucket in _BUCKET_LABELS:
            return bucket
        self._diag.count("phase", "bad_bucket")
        self._diag.warn_once("bad_bucket", repr(bucket), f"rl_otel: phase(bucket={bucket!r}) is no goodput bucket "
                                                         f"(one of {', '.join(BUCKETS)}); the phase's name decides "
                                                         "its bucket")
        return None

    def _start_timeline(self, t: float) -> None:
        """The first phase or collective: the timeline runs from now, or from the end of start-up if no timed
        step came since (the time between is waiting); timing keys are no longer counted."""
        self.phased = self._serving = True
        if self._startup_open:
            self._end_startup(t)
            self._t = self._since = t
        elif self._t is None:
            self._t = self._since = t
        else:
            self._since = self._t
            self._commit(t)

    def _commit(self, t: float) -> None:
        last = self._t
        if last is None or t <= last:
            return
        self._t = t
        self._compute += self._spread(t - last, self._buckets, self._waits)

    def _spread(self, seconds: float, buckets: dict[str, float], waits: dict[str, float]) -> float:
        """Add ``seconds`` to the innermost frame of every thread (shared evenly), or to waiting when none is
        open; returns the compute seconds among them."""
        stacks = self._stacks
        if not stacks:
            buckets[WAITING] += seconds
            return 0.0
        if len(stacks) == 1:  # one thread in phases: the common case
            for stack in stacks.values():
                frame = stack[-1]
                buckets[frame.bucket] += seconds
                if frame.point is not None:
                    waits[frame.point] += seconds
                    return 0.0
                return seconds if frame.busy else 0.0
        share = seconds / len(stacks)
        busy = 0.0
        for stack in stacks.values():
            frame = stack[-1]
            buckets[frame.bucket] += share
            if frame.point is not None:
                waits[frame.point] += share
            elif frame.busy:
                busy += share
        return busy

    # -- timing keys ---------------------------------------------------------------------------------------------

    def step(self, measurements: Sequence[Measurement], step: int, at: float) -> None:
        """Recorded step ``step`` (``at``: its Unix time): its timing keys, unless phases account for this
        process."""
        if self.phased or self._muted:
            return
        keys = self._keys
        refused = keys.refused
        found = keys.timers(measurements)
        if keys.refused != refused:
            self._diag.count("input", "bad_duration", keys.refused - refused)
            self._diag.warn_once("bad_duration", "timer", "rl_otel: a timing key held a duration no clock can "
                                 "produce (NaN, infinite, negative or over 30 days); it is left out of the "
                                 "goodput buckets and counted (rl_telemetry_errors_total{sink=\"input\", "
                                 "reason=\"bad_duration\"})")
        # ``at`` is the wall clock's reading at log(): durations run on the monotonic clock, so ``at`` is moved
        # by however far the wall clock has been set since init() (NTP, an operator: +1 h would make the wall
        # time go down, a counter reset to Prometheus; -1 h would add an hour of waiting)
        pc, wall = perf_counter(), time()
        at -= wall - (self._clock0[1] + (pc - self._clock0[0]))
        with self._lock:
            if self.phased:
                return
            first, self._logged = not self._logged, True
            added = self._keys.account(found, step, at, first=first, measured_startup=self._origin is not None)
            t = self._clock0[0] + (at - self._clock0[1])
            if self._startup_open:
                self._end_startup(t, added.wall if added is not None else 0.0)
                self._t = t  # where the timeline would start (phases later): the time after start-up
            if added is not None:
                self._serving = True
                self._t = None  # timed steps account for the time from here: a timeline would start fresh
                for bucket, seconds in added.buckets.items():
                    self._buckets[bucket] += seconds
                self._wall += added.wall

    @contextlib.contextmanager
    def muted(self) -> Iterator[None]:
        """Steps recorded inside the block are not counted (``rl-otel watch`` replaying the values it served
        before a restart: their timing keys were counted by the process that read them first)."""
        self._muted = True
        try:
            yield
        finally:
            self._muted = False

    def recorded(self, batch: Batch) -> None:
        """The recorder's consumer: a recorded step's timing keys (in a process without phases; the timeline
        accounts for one with phases)."""
        if batch.step is None or batch.phase is not None or self.phased or self._muted:
            return
        self.step([m for m in batch.measurements if m.spec.name in DURATIONS], batch.step,
                  time() if batch.timestamp is None else batch.timestamp)

    def _end_startup(self, t: float, spent: float = 0.0) -> None:
        """Start-up ends at ``t`` (perf_counter), less the ``spent`` seconds of the first step's own timers."""
        assert self._origin is not None  # open only after begin()
        startup = max(self._startup_served, self._origin[0] + (t - self._origin[1]) - spent, 0.0)
        self._buckets[STARTUP] += startup
        self._wall += startup
        self._startup_open = False

    # -- the read ------------------------------------------------------------------------------------------------

    def collect(self) -> list[Item]:
        """The series now (a live collector of the recorder: the time running now included)."""
        t = perf_counter()
        phased = self.phased
        with self._lock:
            if not self._serving:
                return []
            buckets = self._buckets.copy()
            waits = self._waits.copy()
            compute, wall = self._compute, self._wall
            if self._startup_open:
                assert self._origin is not None
                startup = max(self._startup_served, self._origin[0] + (t - self._origin[1]))
                self._startup_served = startup  # the reader's memo: start-up never ends below what was served
                buckets[STARTUP] += startup
                wall += startup
            elif self._since is not None:
                wall += t - self._since
                if self._t is not None and t > self._t:
                    compute += self._spread(t - self._t, buckets, waits)
        items: list[Item] = [(live.GOODPUT_BUCKET, _BUCKET_LABELS[b], buckets[b]) for b in BUCKETS]
        items.append((live.GOODPUT_WALL, (), wall))
        if phased:
            items.append((live.RANK_COMPUTE, (), compute))
            items += [(live.COLLECTIVE_WAIT, (("point", point),), seconds) for point, seconds in waits.items()]
        return items

    def _failed(self) -> None:
        self._diag.count("live", "goodput")
        if self._diag.warn_once("goodput", "internal", "rl_otel: the goodput accounting failed; training goes on"):
            _log.debug("rl_otel: goodput accounting failure", exc_info=True)
