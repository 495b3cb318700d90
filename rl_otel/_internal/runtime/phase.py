"""``Telemetry.phase()``: ROLL's state_offload_manager, always on - spans, timings and memory snapshots.

One phase of a cluster (``actor_train/train_step``) is a span with three children, ``onload``, ``execute`` and
``offload``, and a dict of ROLL's keys: ``time/{infix}/total|execute|onload|offload`` (seconds),
``memory/{infix}/{stage}/{kind}/{device_id}`` (GiB, the four stages), the ``*_frac`` keys at ``end/onload``, and
``memory/cpu/{infix}/start|end/rss|vms`` (GiB). The timing windows are ROLL's: ``onload`` covers the start
snapshots and the load, ``offload`` the end snapshots and the offload, ``total`` all of it.

Cost: when the Telemetry's TracerProvider has no span processor (the default, no ``tracing=``), no SDK span is
built - spans nobody receives were most of a phase's cost. The root and ``execute`` then exist as span contexts
only (valid IDs: ``carrier()`` and user spans inside the block parent under them as before), and those are made
when first read (``DeferredSpan``: no ID is drawn, no sampler asked, for a phase nobody reads); ``onload`` and
``offload`` are skipped. A processor added later records the next phase's four spans.

GPU times: in a process that itself initialized CUDA a phase also records CUDA events at its edges
(``probes/gpu_time.py``: never a synchronize, never inside a CUDA-graph capture); the phase's thread queries them
at its later phase edges (and ``flush()``/``close()``) and, once the GPU has passed them, writes the GPU seconds per
part (``rl_phase_gpu_duration_seconds``, ``time/{infix}/gpu/{part}`` for the trackers); the root span, kept open
until then, gets ``rl.gpu_time.{part}_s`` attributes and ends at the host end time. ``init(phase_gpu_time=False)``
turns them off. GPU memory: one allocator read per snapshot, and one read serves two stages with no user code
between them (no ``onload``: ``start/onload`` is ``start/offload``'s read; no ``offload``: ``end/offload`` is
``end/onload``'s), ``probes/memory.py``; ``phase(..., memory=False)`` (or ``init(phase_memory=False)``) takes no
memory snapshot at all. Peaks: only the outermost running phase resets torch's peak statistics (a nested phase's
``max_*`` keys are the process's peak since then: exact when the peak rose inside it, an upper bound otherwise; its
start stage reads its current values), and ``init(phase_peaks=False)`` never resets them.

Goodput: a phase is a frame of the process's goodput timeline (``pipeline/goodput.py``) while it runs: its
``onload`` and ``offload`` parts count as ``offload``, its ``execute`` part in the bucket ``bucket=`` names or its
name's (``rl_otel.catalog.goodput.phase_bucket``); a phase without an ``onload`` (``offload``) callable has only
rl_otel's own snapshots in that part, microseconds, counted with ``execute``. A phase nested in it, or a
``tel.collective()`` block inside it, owns its own time (exclusive time).

Errors: the user's ``onload``/``offload`` and the body are the user's code - their exceptions propagate, the
spans end with an error status. If the body raises, ``offload`` is not called and no metrics are recorded (as in
ROLL, whose context manager stops at the ``yield``). Telemetry's own failures never raise: they are counted in
``rl_telemetry_errors_total{sink="phase"}`` and the phase goes on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from time import perf_counter, time_ns
from types import TracebackType
from typing import TYPE_CHECKING, Any, NamedTuple

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode

from rl_otel._internal.probes.gpu_time import END, EXECUTED, ONLOADED, GpuPhase, GpuTimer
from rl_otel._internal.probes.live import RunningPhases, running_phases
from rl_otel._internal.probes.memory import CpuProbe, GpuProbe, GpuReading
from rl_otel._internal.tracing.carriers import extract, inject
from rl_otel.catalog.goodput import phase_bucket

if TYPE_CHECKING:
    from rl_otel._internal.pipeline.goodput import Frame, Goodput
    from rl_otel._internal.tracing.contexts import PhaseTracer

PARTS = ("total", "execute", "onload", "offload")
GPU_ATTRIBUTES = {part: f"rl.gpu_time.{part}_s" for part in PARTS}  # the root span's GPU seconds per part
CLOSE_WAIT_S = 1.0  # how long close() gives the GPU times still pending to resolve
OFFLOAD = "offload"  # the goodput bucket of the onload and offload parts


class GpuPending(NamedTuple):
    """What a phase handed to the GPU timer needs when its events resolve (on its own thread, or at flush/close)."""

    cluster: str
    phase: str
    root: Span | None  # the recorded root span, ended then (at the host end time, ``end_ns``)
    end_ns: int


@dataclass
class PhaseRuntime:
    """What every phase of one Telemetry shares."""

    tracer: PhaseTracer
    rank: int
    gpu: GpuProbe
    cpu: CpuProbe
    next_step: Callable[[], int]
    record: Callable[[str, str, dict[str, float], dict[str, float]], None]
    fail: Callable[[str], None]  # count a telemetry failure (never raises)
    running: RunningPhases | None = None  # the phases now running (a live gauge serves them); default: the
    # registry of this Telemetry's CPU probe, which its live gauges read
    record_gpu: Callable[[str, str, dict[str, float]], None] | None = None  # GPU seconds per part of a finished
    # phase, called where its CUDA events resolve (its thread's later edges, flush, close); None: not GPU-timed
    count: Callable[[str], None] | None = None  # count a drop under its reason (sink="phase"); default: fail
    goodput: Goodput | None = None  # where the time goes: each phase's parts are frames of its timeline
    memory: bool = True  # init(phase_memory=...): memory snapshots by default (phase(..., memory=) per phase)
    peaks: bool = True  # init(phase_peaks=...): the outermost phase resets torch's peak statistics
    gpu_time: bool = True  # init(phase_gpu_time=...): CUDA events at the phases' edges
    gpu_timer: GpuTimer | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if self.running is None:
            self.running = running_phases(self.cpu)
        if self.record_gpu is not None and self.gpu_time:  # no event until a phase runs where CUDA is in use
            self.gpu_timer = GpuTimer(self.gpu.live, partial(_gpu_resolved, self.record_gpu),
                                      count=self.count or self.fail, fail=self.fail)

    def flush(self, timeout_s: float | None = None) -> bool:
        """Resolve (bounded) the GPU times of the phases ended so far, on the calling thread with each phase's
        device current, and write them. True if none is left."""
        timer = self.gpu_timer
        return True if timer is None else timer.wait(timeout_s)

    def close(self) -> None:
        """Stop GPU-timing new phases; the pending ones get :data:`CLOSE_WAIT_S` to resolve, the rest are ended
        without GPU times and counted (``gpu_time_unresolved``). Phases go on running (host times, spans)."""
        timer = self.gpu_timer
        if timer is not None:
            timer.close(CLOSE_WAIT_S)

    def open(self, cluster: str, phase: str, *, onload: Callable[[], Any] | None,
             offload: Callable[[], Any] | None, step: int | None, parent: Mapping[str, str] | None,
             bucket: str | None = None, memory: bool | None = None, policy_step: int | None = None) -> Phase:
        """A :class:`Phase` of this runtime (the facade reaches the class through here: importing it, and the
        OTel API with it, waits for the first phase)."""
        return Phase(self, cluster, phase, onload=onload, offload=offload, step=step, parent=parent, bucket=bucket,
                     memory=self.memory if memory is None else memory, policy_step=policy_step)


def _gpu_resolved(record_gpu: Callable[[str, str, dict[str, float]], None], timed: GpuPhase,
                  seconds: dict[str, float] | None) -> None:
    """Where a phase's events resolved (its thread, or flush/close): store the GPU seconds and end the root span
    (if it was kept open for them)."""
    pending: GpuPending = timed.payload
    try:
        if seconds is not None:
            record_gpu(pending.cluster, pending.phase, seconds)
    finally:
        root = pending.root
        if root is not None:
            if seconds is not None:
                root.set_attributes({GPU_ATTRIBUTES[part]: value for part, value in seconds.items()})
            root.end(end_time=pending.end_ns)


class Phase:
    """The context manager ``Telemetry.phase()`` returns. Not reusable; one per ``with`` block."""

    __slots__ = (
        "_attrs",
        "_bucket",
        "_frame",
        "_gpu",
        "_memory",
        "_offload",
        "_onload",
        "_parent",
        "_peak_device",
        "_policy_step",
        "_recording",
        "_root",
        "_root_ctx",
        "_rt",
        "_span",
        "_started",
        "_step",
        "_t0",
        "_t_exec",
        "_t_onloaded",
        "_token",
        "cluster",
        "metrics",
        "phase",
    )

    def __init__(self, runtime: PhaseRuntime, cluster: str, phase: str, *, onload: Callable[[], Any] | None,
                 offload: Callable[[], Any] | None, step: int | None, parent: Mapping[str, str] | None,
                 bucket: str | None = None, memory: bool = True, policy_step: int | None = None) -> None:
        self._rt = runtime
        self._memory = memory  # memory snapshots (ROLL's memory/ keys); False: times and events only
        self._peak_device: int | None = None  # the device whose peaks this phase reset (the outermost phase)
        self.cluster, self.phase = cluster, phase
        self._onload, self._offload = onload, offload
        self._step, self._parent = step, parent
        self._policy_step = policy_step  # the step whose policy made this phase's data (a link to its trace)
        self.metrics: dict[str, float] = {}  # ROLL keys of this phase, complete once the block exits cleanly
        self._attrs: dict[str, Any] = {}
        self._root: Span | None = None
        self._recording = False  # SDK spans (a processor is there to receive them) or span contexts only
        self._span: Span | None = None
        self._token: object = None
        self._started: float | None = None  # in the runtime's running phases, from __enter__ to the end of __exit__
        self._gpu: GpuPhase | None = None  # this phase's CUDA events (None: not GPU-timed)
        # the goodput bucket of the execute part: the user's, else the name's (rl_otel.catalog.goodput.PHASES)
        self._bucket: str = bucket or phase_bucket(phase) or "other"
        self._frame: Frame | None = None  # this phase's frame in the goodput timeline, while it runs

    @property
    def infix(self) -> str:
        """ROLL's ``metric_infix``: ``{cluster}/{phase}``."""
        return f"{self.cluster}/{self.phase}"

    def carrier(self) -> dict[str, str]:
        """A W3C ``traceparent`` dict for the span now running (``execute`` inside the block): pass it to a worker
        process, which hands it to its own ``phase(..., parent=...)``."""
        try:
            span = self._span or self._root
            ctx = trace.set_span_in_context(span) if span else None
            return inject(ctx)
        except Exception:  # boundary: the OTel propagators (the user's, set globally)
            self._fail("carrier")
            return {}

    # -- the with block -------------------------------------------------------------------------------------

    def __enter__(self) -> Phase:
        self._t0 = perf_counter()
        rt, infix, m = self._rt, self.infix, self.metrics
        gpu = rt.gpu
        try:
            self._started = rt.running.enter(self.cluster, self.phase)  # type: ignore[union-attr]  # __post_init__
        except Exception:  # boundary: the training thread, no guard above (the running phases' registry)
            self._fail("running")
        goodput = rt.goodput
        if goodput is not None:  # the onload part is offload time; without an onload, execute from the start
            self._frame = goodput.enter(OFFLOAD if self._onload is not None else self._bucket)
        # the telemetry side in a few try blocks, not a guarded call each: this runs at every phase
        try:
            self._start_root()
        except Exception:  # boundary: the OTel SDK (span processors, the user's provider)
            self._fail("start_span")
        reading: GpuReading | None = None
        if self._memory:
            try:
                self._peak_device = gpu.begin_peaks(reset=rt.peaks)
                reading = gpu.snapshot(infix, "start/offload", m, at_start=True)
            except Exception:  # boundary: torch.cuda's memory statistics
                self._fail("gpu_snapshot")
        timer = rt.gpu_timer
        if timer is not None:
            self._gpu = timer.begin()
        span = self._child("onload") if self._recording else None
        if self._onload is not None:
            self._call_user(self._onload, span)
            reading = None  # the user's code ran: start/onload is read afresh (else it is start/offload's read)
            if self._gpu is not None:
                self._gpu.mark(ONLOADED)
        self._snapshots("start/onload", "start", reading, at_start=reading is not None)
        self._t_onloaded = perf_counter()
        if self._onload is not None and self._frame is not None:
            rt.goodput.switch(self._frame, self._bucket)  # type: ignore[union-attr]  # a frame: a goodput
        if span is not None:
            self._end(span)
        try:
            root_ctx = self._root_ctx
            if self._recording:
                self._span = rt.tracer.tracer.start_span("execute", context=root_ctx, attributes=self._attrs)
            elif self._root is not None:
                self._span = rt.tracer.context_only("execute", root_ctx)
            if self._span is not None:
                self._token = otel_context.attach(trace.set_span_in_context(self._span, root_ctx))
        except Exception:  # boundary: the OTel SDK and its context
            self._fail("execute")
        self._t_exec = perf_counter()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        t_executed = perf_counter()
        rt, timed = self._rt, self._gpu
        if self._offload is not None and self._frame is not None and exc is None:
            rt.goodput.switch(self._frame, OFFLOAD)  # type: ignore[union-attr]  # a frame: a goodput
        if timed is not None:
            timed.mark(EXECUTED)
        if self._token is not None:
            self._guard(otel_context.detach, self._token)
        recording = self._recording
        if exc is not None:
            self._leave()
            self._release_gpu()
            self._error(self._span, exc)
            self._end(self._span)
            self._error(self._root, exc)
            self._end(self._root)
            return
        if recording:
            self._end(self._span)
        infix, m = self.infix, self.metrics
        span = self._child("offload") if recording else None
        reading: GpuReading | None = None
        if self._memory:
            try:
                reading = rt.gpu.snapshot(infix, "end/onload", m, with_frac=True)
            except Exception:  # boundary: torch.cuda's memory statistics
                self._fail("gpu_snapshot")
        if self._offload is not None:
            self._call_user(self._offload, span)
            reading = None  # the user's code ran: end/offload is read afresh (else it is end/onload's read)
            if timed is not None:
                timed.mark(END)
        self._snapshots("end/offload", "end", reading)
        t_end = perf_counter()
        if span is not None:
            self._end(span)
        durations = {"total": t_end - self._t0, "execute": t_executed - self._t_exec,
                     "onload": self._t_onloaded - self._t0, "offload": t_end - t_executed}
        for part in PARTS:
            m[f"time/{infix}/{part}"] = durations[part]
        self._leave()
        try:
            rt.record(self.cluster, self.phase, m, durations)
        except Exception:  # boundary: the training thread, no guard above (the phase's one record guard)
            self._fail("record")
        if timed is not None:
            self._gpu = None
            root = self._root if recording else None  # kept open until its GPU times are known (attributes)
            if timed.finish(GpuPending(self.cluster, self.phase, root, time_ns() if root is not None else 0)):
                return
        if recording:
            self._end(self._root)

    def _release_gpu(self) -> None:
        """The phase ended without host times (the user's code raised): its events go back unresolved."""
        timed, self._gpu = self._gpu, None
        if timed is not None:
            timed.release()

    def _leave(self) -> None:
        """Out of the running phases and the goodput timeline (once: the block ended, or the user's
        onload/offload raised)."""
        frame, self._frame = self._frame, None
        if frame is not None:
            self._rt.goodput.leave(frame)  # type: ignore[union-attr]  # a frame: a goodput
        device, self._peak_device = self._peak_device, None
        if device is not None:
            self._rt.gpu.end_peaks(device)
        started, self._started = self._started, None
        if started is not None:
            try:
                self._rt.running.leave(self.cluster, self.phase, started)  # type: ignore[union-attr]
            except Exception:  # boundary: the training thread, no guard above (the running phases' registry)
                self._fail("running")

    def _snapshots(self, gpu_stage: str, cpu_stage: str, reading: GpuReading | None, *,
                   at_start: bool = False) -> None:
        """The GPU and CPU snapshots taken after ``onload`` (start) and after ``offload`` (end); the GPU one from
        ``reading`` when no user code ran since it was taken (``at_start``: the phase's start reading)."""
        if not self._memory:
            return
        rt, infix, m = self._rt, self.infix, self.metrics
        try:
            rt.gpu.snapshot(infix, gpu_stage, m, reading=reading, at_start=at_start)
        except Exception:  # boundary: torch.cuda's memory statistics
            self._fail("gpu_snapshot")
        try:
            rt.cpu.snapshot(infix, cpu_stage, m)
        except Exception:  # boundary: psutil, the OS
            self._fail("cpu_snapshot")

    # -- helpers: the telemetry side never raises ---------------------------------------------------------

    def _start_root(self) -> None:
        tracer = self._rt.tracer
        parent = extract(self._parent) if self._parent else None
        self._recording = recording = tracer.recording()
        if recording:  # under its step's span (tracing/steps.py), unless a parent or a span is given
            self._attrs = {"cluster": self.cluster, "phase": self.phase, "rank": self._rt.rank}
            self._root, parent = tracer.start_root(self.infix, parent, self._step, self._attrs, self._policy_step)
        else:  # the parent is read now: the deferred IDs must not depend on what is current when they are made
            self._root = tracer.context_only(self.infix, parent if parent is not None else otel_context.get_current())
        self._root_ctx = trace.set_span_in_context(self._root, parent)

    def _child(self, name: str) -> Span | None:
        if self._root is None:
            return None
        return self._guard(self._rt.tracer.tracer.start_span, name, context=self._root_ctx, attributes=self._attrs)

    def _call_user(self, fn: Callable[[], Any], span: Span | None) -> None:
        try:
            fn()
        except BaseException as exc:  # boundary: the user's onload/offload; close our spans, then let it go
            self._leave()
            self._release_gpu()
            if self._token is not None:
                self._guard(otel_context.detach, self._token)
                self._token = None
            for s in (span, self._root):
                self._error(s, exc)
                self._end(s)
            raise

    def _error(self, span: Span | None, exc: BaseException) -> None:
        if span is not None:
            self._guard(span.record_exception, exc)
            self._guard(span.set_status, Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))

    def _end(self, span: Span | None) -> None:
        if span is not None:
            self._guard(span.end)

    def _guard(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception:  # boundary: the OTel SDK's span and context calls
            self._fail(getattr(fn, "__name__", "call"))
            return None

    def _fail(self, what: str) -> None:
        self._rt.fail(what)  # Diagnostics.phase_failed: counts and says once, never raises
