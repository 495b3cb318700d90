"""Hangs with evidence: when a phase has run far longer than it usually does, or when someone asks, this process
writes the stacks of all its threads to a file next to its logs and says where - a warning in the log,
``rl_stack_dumps_total{reason}`` and ``rl_stack_dump_info{path, cluster, phase, reason}`` - without stopping
training. ``rl_last_progress_timestamp_seconds`` tells a process alive but making no progress.

- **Stuck** (``reason="stuck"``): a watchdog thread, started by the first phase, reads the running-phases registry
  (the one ``rl_phase_started_timestamp_seconds`` is served from) every few seconds. A phase run older than its
  threshold - ``max(hang_factor x the hang_quantile of that (cluster, phase)'s past durations in this run,
  hang_min_s)``, only ``hang_min_s`` before its first run ended - gets one dump: one per episode (a run of a phase),
  however long it stays stuck; a phase that recovers and sticks again is a new episode. The defaults (5 x the p90,
  at least 600 s) are ``RLPhaseStuck``'s, so the dump is there when the alert fires.
- **On demand**: ``stack_dump_signal`` (SIGUSR1 by default) and ``GET /debug/stacks`` on the scrape endpoint (its
  basic auth and TLS apply; the answer is the dump's text). The signal is taken through ``faulthandler.register``
  writing into a pipe this module's thread reads: the kernel runs faulthandler's C handler on whichever thread
  receives the signal, so it is seen even while the main thread is stuck in native code (a Python-level handler
  would wait for the main thread to run bytecode again). Only a signal nothing else in the process handles is
  taken (:func:`~rl_otel._internal.probes.posix.signal_taken`). On-demand dumps are spaced
  :data:`ON_DEMAND_SPACING_S` apart: a second request in that window gets the last dump (py-spy stops the process
  while it reads native stacks, so a loop of requests must not stall training).

The training thread pays for one thing: the recorder's progress hook (:meth:`HangWatch.progressed`, a time read
and a deque append, at every step and finished phase). Everything else runs on the watchdog thread, the scrape
endpoint's worker (``/debug/stacks``) or a reader (:meth:`HangWatch.collect`).

A forked child keeps the series but no watchdog and no signal (its copy of the registration would wake the
parent's thread): SIGUSR1 does to a forked worker what it did before rl_otel.
"""

from __future__ import annotations

import faulthandler
import logging
import math
import os
import re
import select
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple

from rl_otel._internal.forks import reset_in_forked_child
from rl_otel._internal.pipeline.records import Batch
from rl_otel._internal.probes.live import Item, RunningPhases
from rl_otel._internal.probes.posix import faulthandler_holds
from rl_otel.catalog import meta

_log = logging.getLogger("rl_otel")

DUMP_DIR_ENV = "RL_OTEL_DUMP_DIR"
DEFAULT_DUMP_DIR = "rl_otel_dumps"
ON_DEMAND_SPACING_S = 10.0  # at most one on-demand dump (signal or HTTP) per this many seconds
HISTORY = 256  # past durations kept per (cluster, phase)
_PHASES_LIMIT = 256  # (cluster, phase) pairs with a history (a job has a handful)
_WAKE_S = 5.0  # the longest the thread sleeps (a watchdog pass, or a look at whether phases started)
PYSPY_TIMEOUT_S = 10.0  # py-spy's time to dump before it is killed
# GET /debug/stacks runs on the endpoint's one worker: its dump is made on a thread of its own and waited for this
# long at most, so a slow py-spy or disk never holds the scrapes behind it longer
HTTP_WAIT_S = 1.0
# dump files one Telemetry (in a training, one per process) writes at most (a signal every 10 s would write 8,640
# a day; 48 stuck phases, 48 files): past it a dump is still answered (GET /debug/stacks) but not written, and each
# one not written is counted (rl_telemetry_errors_total{sink="hangs", reason="dump_dropped"}) and the first logged
MAX_DUMP_FILES = 32
_NAME_PART = re.compile(r"[^A-Za-z0-9._-]+")


# HangWatches that found their signal taken by another HangWatch of this process: when that one gives the signal
# back at its close, the first of them still open takes it (a second Telemetry keeps its dumps on demand)
_WAITING: list[HangWatch] = []
_HOLDERS: list[HangWatch] = []  # the HangWatches holding a signal (one per signal)


class Threshold(NamedTuple):
    """How long a run of a phase may last before it is stuck, and what that was computed from."""

    seconds: float
    usual: float | None  # the quantile of its past durations (None: no run finished yet)
    runs: int


class Dump(NamedTuple):
    """A dump written (``path``: ``None`` if the file could not be written; the text is still answered)."""

    path: str | None
    cluster: str
    phase: str
    reason: str
    text: str
    at: float  # time.monotonic()


class PhaseHistory:
    """The last :data:`HISTORY` durations of each (cluster, phase) that finished in this process."""

    def __init__(self) -> None:
        self._runs: dict[tuple[str, str], deque[float]] = {}

    def add(self, cluster: str, phase: str, seconds: float) -> None:
        runs = self._runs.get((cluster, phase))
        if runs is None:
            if len(self._runs) >= _PHASES_LIMIT:
                return
            runs = self._runs.setdefault((cluster, phase), deque(maxlen=HISTORY))
        runs.append(seconds)

    def threshold(self, cluster: str, phase: str, factor: float, quantile: float, floor: float) -> Threshold:
        """``max(factor x the quantile of the past durations, floor)`` (nearest rank), ``floor`` with no history."""
        runs = self._runs.get((cluster, phase))
        values = sorted(runs) if runs else []  # copied in one C call: the training thread may append meanwhile
        if not values:
            return Threshold(floor, None, 0)
        usual = values[min(len(values) - 1, max(0, math.ceil(quantile * len(values)) - 1))]
        return Threshold(max(factor * usual, floor), usual, len(values))


def dump_dir(option: str | os.PathLike | None, tracker_dirs: Iterable[str], environ: Mapping[str, str]) -> str:
    """Where dumps go (an absolute path, made at the first dump): ``stack_dump_dir``, else ``$RL_OTEL_DUMP_DIR``,
    else the first tracker log directory, else ``./rl_otel_dumps``."""
    chosen = option if option is not None else environ.get(DUMP_DIR_ENV) or next(iter(tracker_dirs), None)
    return os.path.abspath(os.fspath(chosen if chosen else DEFAULT_DUMP_DIR))


def _seconds(value: float) -> str:
    return f"{value:.3g} s" if value < 100 else f"{value:.0f} s"


def _part(text: str) -> str:
    return _NAME_PART.sub("_", text)[:64] or "_"


class _PipeEnd:
    """The write end of the signal's pipe as faulthandler's ``file``: faulthandler keeps a reference to the object
    it writes to, and drops it when someone registers the signal again (a program's own ``faulthandler.register``),
    which is how :meth:`HangWatch._give_back_signal` knows whether the registration is still rl_otel's."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def fileno(self) -> int:
        return self.fd

    def flush(self) -> None:
        pass


class HangWatch:
    """One Telemetry's stack dumps: the watchdog (:meth:`watch`), the signal (:meth:`listen`), the HTTP answer
    (:meth:`http_text`), the progress hook (:meth:`progressed`) and their series (:meth:`collect`).

    ``base``: run, role, rank (in the file names and headers); ``min_s``: the floor of the stuck threshold
    (``None``: no watchdog); ``count(reason)``: count a failure (``rl_telemetry_errors_total{sink="hangs"}``)."""

    def __init__(self, *, base: Mapping[str, str], factor: float, quantile: float, min_s: float | None,
                 directory: str, count: Callable[[str], None], pyspy_timeout_s: float = PYSPY_TIMEOUT_S,
                 redact: Callable[[str], str] | None = None,
                 describe: Callable[[float], list[str]] | None = None) -> None:
        self._base = dict(base)
        self._redact = redact
        self.describe = describe  # more header lines (this rank's collectives), read at a dump
        self.factor, self.quantile, self.min_s = factor, quantile, min_s
        self.directory = directory
        self._count = count
        self._pyspy_timeout_s = pyspy_timeout_s
        self.interval_s = _WAKE_S if min_s is None else min(_WAKE_S, max(0.05, min_s / 10))
        self.history = PhaseHistory()
        self.last_progress: float | None = None
        self._last_progress_mono: float | None = None
        self.progress_events = 0  # rl_progress_total: with last_progress, the mean interval between progress
        self.checks = 0  # watchdog passes done (tests wait on it)
        self.max_files, self.files_written, self.files_dropped = MAX_DUMP_FILES, 0, 0
        self._counts = dict.fromkeys(meta.STACK_DUMP_REASONS, 0)
        self._last: Dump | None = None
        self._last_on_demand: Dump | None = None
        self._episodes: set[tuple[str, str, float]] = set()  # stuck phase runs already dumped
        self._seen: dict[tuple[str, str, float], tuple[float, float]] = {}  # run -> (monotonic, its age) first seen
        self._running: RunningPhases | None = None
        self._signal: int | None = None
        self._pipe: tuple[int, int] | None = None  # faulthandler writes into [1] on the signal; the thread reads [0]
        self._pipe_end: _PipeEnd | None = None  # [1] as faulthandler's file (see _PipeEnd)
        self._read_fd: int | None = None  # [0], closed by the thread as it ends (or by close() without one)
        self._parked: tuple[bytes, float] | None = None  # (faulthandler's action, monotonic time to put it back)
        self._handler_address: int | None = None  # the OS handler faulthandler installed for us
        self._wants_signal: int | None = None  # a signal another HangWatch of this process held at listen()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._start_lock = threading.Lock()
        self._dump_lock = threading.Lock()  # one dump at a time (py-spy may take seconds: never on the training path)
        self._http_lock = threading.Lock()
        self._http_pending: threading.Thread | None = None  # the thread making GET /debug/stacks' dump
        self._http_failed: list[BaseException] = []
        reset_in_forked_child(self)

    # -- the training thread's one call ---------------------------------------------------------------------

    def recorded(self, batch: Batch) -> None:
        """The recorder's consumer: a finished phase, or a recorded step, is progress."""
        if batch.phase is not None:
            self.progressed(*batch.phase)
        elif batch.step is not None:
            self.progressed("", "", 0.0)

    def progressed(self, cluster: str, phase: str, seconds: float) -> None:
        """A step was recorded (``cluster`` empty) or a phase finished after ``seconds`` (the recorder's hook)."""
        now = time.monotonic()
        last, self._last_progress_mono = self._last_progress_mono, now
        if last is not None:
            self.history.add("", "", now - last)  # the intervals between progress: a stall's usual bound
        self.last_progress = time.time()
        self.progress_events += 1
        if self._thread is None and self.min_s is not None:  # the first progress: a stall is watched from now
            self._start()
        if cluster:
            self.history.add(cluster, phase, seconds)

    # -- starting -------------------------------------------------------------------------------------------

    def listen(self, signum: int) -> bool:
        """Dump on ``signum``, unless something in this process already handles it. True if taken."""
        from rl_otel._internal.probes.posix import signal_taken  # ctypes: loaded by init() only for a signal

        if any(other._signal == signum for other in _HOLDERS):
            self._wants_signal = signum  # another Telemetry of this process has it: this one takes it over later
            _WAITING.append(self)
            return False
        if signal_taken(signum):
            _log.info("rl_otel: %s already has a handler in this process; rl_otel leaves it alone (stack dumps on "
                      "demand: GET /debug/stacks on the scrape endpoint)", signal.Signals(signum).name)
            return False
        read_end, write_end = os.pipe()
        try:
            os.set_blocking(read_end, False)
            os.set_blocking(write_end, False)  # a full pipe drops faulthandler's text: we only need to wake up
            # the current thread's frames only: with all_threads the C handler walks the other threads' frames
            # without the GIL, which CPython says may crash while they run (a fresh-clone run beside a CPU hog saw
            # the process die by SIGSEGV right after a signal's dump). The dump itself is the watchdog thread's,
            # with the GIL.
            pipe_end = _PipeEnd(write_end)
            faulthandler.register(signum, file=pipe_end, all_threads=False, chain=False)
        except (OSError, RuntimeError, ValueError) as exc:
            os.close(read_end)
            os.close(write_end)
            _log.info("rl_otel: stack dumps on %s are off (%s)", signal.Signals(signum).name, exc)
            return False
        from rl_otel._internal.probes.posix import os_handler

        self._signal, self._pipe, self._pipe_end = signum, (read_end, write_end), pipe_end
        self._read_fd = read_end
        self._handler_address = os_handler(signum)
        _HOLDERS.append(self)
        self._start()
        return True

    def watch(self, running: RunningPhases, *, start: bool = True) -> None:
        """Watch ``running`` (called when the first phase runs; the watchdog thread starts then, unless ``start``
        is False: a test drives :meth:`check` itself)."""
        if self.min_s is None or self._running is not None:
            return
        self._running = running
        if start:
            self._start()

    def _start(self) -> None:
        with self._start_lock:
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._run, name="rl_otel-hangs", daemon=True)
                self._thread.start()

    # -- the watchdog thread --------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                wait = self.interval_s  # also while only a signal is awaited: then the first phase needs no wake-up
                read_fd = self._read_fd  # read each pass: a signal taken over from another Telemetry comes later
                if read_fd is not None:
                    if self._parked is not None:
                        wait = max(0.0, min(wait, self._parked[1] - time.monotonic()))
                    readable, _, _ = select.select([read_fd], [], [], wait)
                    if self._stop.is_set():
                        break
                    if readable and self._drain(read_fd):
                        self._park()
                        self.on_demand("signal")
                    self._unpark_when_due()
                elif self._stop.wait(wait):
                    break
                if self._running is not None or self._last_progress_mono is not None:
                    self.check()
        except Exception:  # the thread ends; training goes on
            self._count("internal")
            _log.debug("rl_otel: the hang watchdog failed", exc_info=True)
        finally:
            with self._start_lock:
                read_fd, self._read_fd = self._read_fd, None
            if read_fd is not None:
                os.close(read_fd)

    # A flood of the signal (a loop of kill -USR1) must not crash the process: faulthandler's C handler walks the
    # frames of the thread it interrupts, which CPython says may crash while that thread changes them (37 floods of
    # ~700k signals: 3 died by SIGSEGV). After a signal the kernel is told to ignore it (SIG_IGN, through sigaction:
    # from this thread, no Python handler, no set_wakeup_fd) for ON_DEMAND_SPACING_S - a second request in that
    # window would get the same dump anyway - and faulthandler's handler is put back after, if nobody changed it.

    def _park(self) -> None:
        signum = self._signal
        if signum is None or self._parked is not None:
            return
        from rl_otel._internal.probes.posix import ignore_signal, os_handler

        if os_handler(signum) != self._handler_address:
            return  # no longer faulthandler's: not ours to park
        action = ignore_signal(signum)
        if action is not None:
            self._parked = (action, time.monotonic() + ON_DEMAND_SPACING_S)

    def _unpark_when_due(self, force: bool = False) -> None:
        parked, signum = self._parked, self._signal
        if parked is None or (not force and time.monotonic() < parked[1]):
            return
        self._parked = None
        if signum is None:
            return
        from rl_otel._internal.probes.posix import os_handler, set_os_action

        if os_handler(signum) == 1:  # still the SIG_IGN we set: faulthandler's handler back
            set_os_action(signum, parked[0])

    @staticmethod
    def _drain(fd: int) -> bool:
        got = False
        while True:
            try:
                chunk = os.read(fd, 1 << 16)
            except BlockingIOError:
                return got
            if not chunk:
                return got
            got = True

    def check(self, now: float | None = None) -> None:
        """One watchdog pass: dump each running phase past its threshold, once per episode (``now``: Unix time,
        default the clocks': the wall clock for a phase first seen, the monotonic clock from then on)."""
        running, floor = self._running, self.min_s
        if floor is None:
            return
        wall, mono = (time.time(), time.monotonic()) if now is None else (now, None)
        current = set()
        try:
            for _spec, labels, started in running.collect() if running is not None else ():
                names = dict(labels)
                cluster, phase = names["cluster"], names["phase"]
                episode = (cluster, phase, started)
                current.add(episode)
                if mono is None:  # the caller's clock (a test)
                    age = wall - started
                else:
                    # a phase's start is Unix time (what Prometheus' time() compares it with); its age runs on the
                    # monotonic clock from the first pass that saw it, so a wall clock set forward (NTP, an
                    # operator) never makes an 8 s phase look stuck
                    seen = self._seen.get(episode)
                    if seen is None:
                        seen = self._seen[episode] = (mono, max(0.0, wall - started))
                    age = seen[1] + (mono - seen[0])
                if age <= floor or episode in self._episodes:
                    continue
                limit = self.history.threshold(cluster, phase, self.factor, self.quantile, floor)
                if age > limit.seconds:
                    self._episodes.add(episode)
                    self._dump("stuck", cluster, phase, self._stuck_line(cluster, phase, age, limit))
            stalled = self._stalled(mono, floor) if mono is not None and not current else None
            if stalled is not None:
                current.add(stalled[0])
                if stalled[0] not in self._episodes:
                    self._episodes.add(stalled[0])
                    self._dump("stuck", "", "", stalled[1])
            self._episodes &= current
            for gone in self._seen.keys() - current:
                del self._seen[gone]
        except Exception:  # boundary: dumps (files, py-spy, callbacks): one failed pass must not end the watchdog
            self._count("internal")
            _log.debug("rl_otel: a hang check failed", exc_info=True)
        self.checks += 1

    def _stalled(self, mono: float, floor: float) -> tuple[tuple[str, str, float], str] | None:
        """No phase runs and no progress came for longer than the usual interval between progress allows (a rank
        hung between phases: in a collective outside any phase, on a lock, in a data loader): the episode (keyed
        by the last progress) and its line, else ``None``."""
        last = self._last_progress_mono
        if last is None:
            return None
        age = mono - last
        if age <= floor:
            return None
        limit = self.history.threshold("", "", self.factor, self.quantile, floor)
        if age <= limit.seconds:
            return None
        usual = ("" if limit.usual is None else
                 f"{self.factor:g} x its p{self.quantile * 100:g} interval of {_seconds(limit.usual)}; ")
        return (("", "", last), f"no progress (a step or a finished phase) for {_seconds(age)} and no phase "
                                f"running, past {_seconds(limit.seconds)} ({usual}at least {floor:g} s)")

    def _stuck_line(self, cluster: str, phase: str, age: float, limit: Threshold) -> str:
        if limit.usual is None:
            usual = "no run of it has finished yet"
        else:
            usual = (f"{self.factor:g} x its p{self.quantile * 100:g} of {_seconds(limit.usual)} over its last "
                     f"{limit.runs} runs")
        return (f"phase {cluster}/{phase} has run {_seconds(age)}, past {_seconds(limit.seconds)} ({usual}; at "
                f"least {self.min_s:g} s)")

    # -- on demand ------------------------------------------------------------------------------------------

    def on_demand(self, reason: str) -> Dump:
        """A dump asked for (``reason``: signal, http), or the last one if it is under
        :data:`ON_DEMAND_SPACING_S` old."""
        last = self._last_on_demand
        if last is not None and time.monotonic() - last.at < ON_DEMAND_SPACING_S:
            return last
        cluster = phase = ""
        running = self._running
        if running is not None:
            items = sorted(running.collect(), key=lambda item: item[2])
            if items:
                names = dict(items[0][1])
                cluster, phase = names["cluster"], names["phase"]
        asked = {"signal": f"asked by {signal.Signals(self._signal).name if self._signal else 'a signal'}",
                 "http": "asked by GET /debug/stacks"}.get(reason, reason)
        dump = self._dump(reason, cluster, phase, f"stacks {asked}")
        self._last_on_demand = dump
        return dump

    def http_text(self) -> str:
        """``GET /debug/stacks``: a dump (or the last one, within :data:`ON_DEMAND_SPACING_S`) as text. The dump is
        made on a thread of its own, waited for :data:`HTTP_WAIT_S` at most (the endpoint's scrapes queue behind
        this call); past that, the answer is faulthandler's stacks of now, and the file follows."""
        try:
            with self._http_lock:
                pending = self._http_pending
                started = pending is None or not pending.is_alive()
                if started:
                    failed: list[BaseException] = []
                    pending = threading.Thread(target=self._http_dump, args=(failed,), daemon=True,
                                               name="rl_otel-stack-dump")
                    self._http_pending, self._http_failed = pending, failed
                    pending.start()
                failed = self._http_failed
            assert pending is not None
            # only the request that started a dump waits for it: while one is still being made (a py-spy that
            # hangs until its timeout), the others are answered at once, so they never hold the endpoint's worker
            pending.join(HTTP_WAIT_S if started else 0.0)
            if pending.is_alive():
                from rl_otel._internal.probes.stacks import faulthandler_text, thread_names

                return (f"# being written to {self.directory} (py-spy or the disk is slow); rl_stack_dump_info names "
                        f"the file once it is there. The stacks of now:\n{thread_names()}\n{faulthandler_text()}")
            if failed:
                raise failed[0]
            dump = self._last_on_demand
            assert dump is not None
        except Exception as exc:  # never break the endpoint
            self._count("internal")
            return f"# rl_otel: the stack dump failed: {type(exc).__name__}: {exc}\n"
        where = dump.path or f"not written (see rl_telemetry_errors_total{{sink=\"hangs\"}}; {self.directory})"
        return f"# written to {where}\n{dump.text}"

    def _http_dump(self, failed: list[BaseException]) -> None:
        try:
            self.on_demand("http")
        except BaseException as exc:  # told to the request waiting for it
            failed.append(exc)

    # -- writing --------------------------------------------------------------------------------------------

    def _dump(self, reason: str, cluster: str, phase: str, line: str) -> Dump:
        with self._dump_lock:
            now = time.time()
            header = self._header(reason, line, now)
            from rl_otel._internal.probes.stacks import stacks_text  # at the first dump

            text = stacks_text(header, self._pyspy_timeout_s)
            if self._redact is not None:  # py-spy prints the command line, and with it any --api-key=...
                text = self._redact(text)
            path = self._write(reason, cluster, phase, now, text)
            dump = Dump(path, cluster, phase, reason, text, time.monotonic())
            if path is not None:
                self._counts[reason] += 1
                self._last = dump
                _log.warning("rl_otel: %s: the stacks of every thread are in %s (training goes on)", line, path)
            return dump

    def _header(self, reason: str, line: str, now: float) -> str:
        base = self._base
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
        lines = [f"# rl_otel stack dump ({reason}): {line}",
                 f"run {base.get('run')}, role {base.get('role')}, rank {base.get('rank')}, pid {os.getpid()}, "
                 f"at {stamp}"]
        running = self._running
        if running is not None:
            for _spec, labels, started in sorted(running.collect(), key=lambda item: item[2]):
                names = dict(labels)
                lines.append(f"running: {names['cluster']}/{names['phase']} for {now - started:.1f} s")
        if self.last_progress is not None:
            lines.append(f"last progress (a step or a finished phase): {now - self.last_progress:.1f} s ago")
        if self.describe is not None:
            try:
                lines += self.describe(now)
            except Exception:  # boundary: the describe callback
                self._count("internal")
        return "\n".join(lines) + "\n"

    def _write(self, reason: str, cluster: str, phase: str, now: float, text: str) -> str | None:
        base = self._base
        what = f"{_part(cluster)}.{_part(phase)}" if cluster else "no-phase"
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)) + f".{int(now * 1000) % 1000:03d}Z"
        name = (f"stacks-{_part(base.get('run', ''))}-{_part(base.get('role', ''))}-rank{_part(base.get('rank', ''))}"
                f"-{what}-{reason}-{stamp}")
        # (the dump lock is held: one writer at a time)
        if self.files_written >= self.max_files:
            self.files_dropped += 1
            self._count("dump_dropped")
            if self.files_dropped == 1:
                _log.warning("rl_otel: %d stack dumps written by this process, the most it writes; this one (%s "
                             "%s) and later ones are not written, only counted in rl_telemetry_errors_total"
                             "{sink=\"hangs\", reason=\"dump_dropped\"} (GET /debug/stacks still answers)",
                             self.max_files, reason, f"{cluster}/{phase}" if cluster else "no phase")
            return None
        try:
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            for n in range(1, 100):
                path = os.path.join(self.directory, f"{name}{'' if n == 1 else f'-{n}'}.txt")
                try:
                    # 0600: a dump shows the process's code, paths and (py-spy) command line
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
                except FileExistsError:
                    continue
                self.files_written += 1
                with open(fd, "w", encoding="utf-8") as f:
                    f.write(text)
                return path
            raise FileExistsError(f"{name}*.txt")
        except OSError as exc:
            self._count("dump_write")
            _log.warning("rl_otel: the stack dump could not be written to %s (%s: %s); training goes on",
                         self.directory, type(exc).__name__, exc)
            return None

    # -- reading --------------------------------------------------------------------------------------------

    def collect(self) -> list[Item]:
        """The live series: dumps written per reason, the last dump, the last progress (a reader's call)."""
        items: list[Item] = [(meta.STACK_DUMPS, (("reason", reason),), float(n))
                             for reason, n in self._counts.items()]
        last = self._last
        if last is not None and last.path is not None:
            items.append((meta.STACK_DUMP_INFO, (("reason", last.reason), ("cluster", last.cluster),
                                                 ("phase", last.phase), ("path", last.path)), 1.0))
        progress = self.last_progress
        if progress is not None:
            items.append((meta.LAST_PROGRESS, (), progress))
            items.append((meta.PROGRESS, (), float(self.progress_events)))
        return items

    # -- ending ---------------------------------------------------------------------------------------------

    def close(self, timeout_s: float = 1.0) -> None:
        """Stop the thread (a dump in progress finishes on its own) and give the signal back."""
        self._stop.set()
        released = self._give_back_signal()
        pipe = self._pipe
        if pipe is not None:
            try:
                os.write(pipe[1], b"\0")  # wakes the thread's select
            except OSError:
                pass
        with self._start_lock:  # no thread starts after this
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)
        if pipe is not None:
            self._pipe = None
            if released:  # else faulthandler may still write into it: left open (two descriptors, not a crash)
                os.close(pipe[1])
        if thread is None or not thread.is_alive():  # else the read end is the thread's, closed as it ends
            with self._start_lock:
                read_fd, self._read_fd = self._read_fd, None
            if read_fd is not None:
                os.close(read_fd)

    def _give_back_signal(self) -> bool:
        """Unregister the signal where the registration is still ours; put back a handler set since (a program's
        ``signal.signal``, a C extension's), which ``faulthandler.unregister`` alone would overwrite with the one
        from before ``init()``; leave a program's own ``faulthandler.register`` of it since alone. Then another
        HangWatch of this process waiting for the signal takes it. True if faulthandler no longer writes to our
        pipe (it may be closed)."""
        if self in _WAITING:
            _WAITING.remove(self)
        signum, self._signal = self._signal, None
        if signum is None:
            return True
        if self in _HOLDERS:
            _HOLDERS.remove(self)
        from rl_otel._internal.probes.posix import os_action, os_handler, set_os_action

        pipe_end, self._pipe_end = self._pipe_end, None
        if pipe_end is not None and not faulthandler_holds(pipe_end):
            return True  # the program registered the signal with faulthandler since: its own, left as it is
        if self._parked is not None and os_handler(signum) == 1:  # our own SIG_IGN of a flood: ours
            parked, self._parked = self._parked, None
            set_os_action(signum, parked[0])
        current, action = os_handler(signum), os_action(signum)
        try:
            faulthandler.unregister(signum)
        except Exception:  # boundary: faulthandler (signals)
            return False
        if current not in (None, self._handler_address) and action is not None:
            set_os_action(signum, action)  # a handler set since our registration: it stays
        elif current == self._handler_address:
            for waiting in list(_WAITING):
                _WAITING.remove(waiting)
                wanted = waiting._wants_signal
                if wanted is not None and not waiting._stop.is_set() and waiting.listen(wanted):
                    break
        return True

    def _after_fork(self) -> None:
        """In a forked child: no thread, no signal (see the module's doc); the series stay."""
        self._start_lock = threading.Lock()  # the parent's may have been held by another thread at the fork
        self._dump_lock = threading.Lock()
        self._http_lock = threading.Lock()
        self._http_pending = None
        self._thread = None
        self._running = None
        self._stop = threading.Event()  # (the parent's Event holds a lock too)
        self._stop.set()
        _WAITING.clear()  # no signal is taken over in a forked child
        self._give_back_signal()
        pipe, self._pipe = self._pipe, None
        self._read_fd = None  # (one of pipe's, closed below)
        if pipe is not None:
            for fd in pipe:
                try:
                    os.close(fd)
                except OSError:
                    pass
