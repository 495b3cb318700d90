"""The watch loop: find files, read what was appended, record it, save the state; and the one endpoint that serves
every run.

Every run and rank has a recorder of its own (:class:`~rl_otel.watch.served.RunTarget`), and one scrape endpoint
serves them all (:func:`~rl_otel._internal.pipeline.snapshot.merged`: each family once, every series labelled with
its run, role and rank), so the watcher holds two server threads and a handful of descriptors whatever the number
of runs in a shared log directory; ``port_per_run`` gives each run an endpoint of its own instead. Files are opened
for each read only.

One thread does the reading (:meth:`Watcher.run`, or :meth:`Watcher.poll` called by a test): every ``interval_s``
(0.5 s) each followed file is stat'ed and what it gained is read (a quiet file less often), the watched paths are
walked for new files (a restarted training's new event file, a new run directory) every ``rescan_s`` while walks
find some, up to 10 ``rescan_s`` apart while they do not, and at once when a directory of directories changed
(:func:`~rl_otel.watch.scan.changed`), and every ``checkpoint_s`` the state file is saved if anything moved. A
backlog (a finished run, a restart) is read in 8 MB steps without waiting.
Nothing in the loop raises: a file that cannot be read is logged once and tried again at the next poll; a record
that is not what it should be is counted in ``rl_telemetry_errors_total{sink="watch", reason="corrupt_record"}``.
"""

from __future__ import annotations

import gc
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rl_otel._internal.exporters.admission import Limits
from rl_otel._internal.pipeline.diagnostics import Diagnostics
from rl_otel._internal.pipeline.snapshot import Relabelled, Snapshot, merged
from rl_otel._internal.pipeline.store import StoreSnapshot
from rl_otel._internal.runtime.serving import Served
from rl_otel.catalog import Catalog
from rl_otel.watch import events, jsonl, scan, state
from rl_otel.watch.records import RecordTail
from rl_otel.watch.served import Point, RunTarget, ServeOptions

_log = logging.getLogger("rl_otel.watch")


@dataclass
class WatchOptions:
    """The watcher's options: how runs are served, where the state lives (``None``: no state file), the poll,
    rescan and checkpoint periods, the JSONL step and time fields, and ``expire_s``: a run whose files have not
    grown for that long is closed, as a finished training process closes (``None``: served until the watcher
    stops; a hung training stops writing too, so expiry trades RLTrainerStalled for a clean end). ``freeze_gc``:
    the watcher owns its process (``rl-otel watch``), and moves what its runs hold out of the garbage collector's
    full collections (``gc.freeze``) as runs come; see :meth:`Watcher.poll`."""

    serve: ServeOptions = field(default_factory=ServeOptions)
    state_path: Path | None = None
    interval_s: float = 0.5
    rescan_s: float = 1.0
    checkpoint_s: float = 1.0
    step_keys: Sequence[str] = jsonl.STEP_KEYS
    time_keys: Sequence[str] = jsonl.TIME_KEYS
    expire_s: float | None = None
    freeze_gc: bool = False


class _Followed:
    """One followed file: where it is read from and which run it feeds."""

    def __init__(self, found: scan.Found, fs: state.FileState) -> None:
        self.found = found
        self.fs = fs
        self.tail: RecordTail | jsonl.LineTail = (RecordTail(found.path, fs.offset) if found.kind == "tfevents"
                                                  else jsonl.LineTail(found.path, fs.offset))
        self.failed = False
        self.grew_at = time.monotonic()  # when it last grew (or was first followed)
        self.next_check = 0.0  # monotonic time of its next stat (an idle file is looked at less often)


# A file that has not grown for QUIET_S is looked at every (its quiet time / 10) seconds, at most IDLE_MAX_S apart:
# a directory of thousands of finished runs costs a stat per file every 10 s, not at every poll (50,000 files at
# 0.5 s were ~40% of a core), while a file that grows is read at every poll
QUIET_S = 30.0
IDLE_MAX_S = 10.0

# The shared endpoint's CPU budget. A training process's endpoint may spend 4% of a core (what it takes is taken
# from training); serving is the watcher's own job, and one scrape of 5,000 runs costs ~0.3 s of CPU: at 4% that
# is 7 s of debt, and the next scrape waited that long before it started (scrapes of 3.5 to 8 s, with ~0.5 s of
# work each). Half a core, bursts of 4 s, still bounds what hostile clients make it spend.
FREEZE_S = 10.0  # gc.freeze() at most this often (see Watcher._freeze)
SHARED_LIMITS = Limits(cpu_share=0.5, cpu_burst_s=4.0)


class Watcher:
    """Follows TensorBoard event files and JSONL metric files under ``roots`` and serves their values (see the
    module). ``close()`` saves the state and stops serving. Raises ConfigurationError when the endpoint cannot
    start (its port and the ``port_search`` next ones taken) or its targets file cannot be written."""

    def __init__(self, roots: Sequence[str], options: WatchOptions | None = None,
                 catalog: Catalog | None = None) -> None:
        self.roots = [os.path.abspath(r) for r in roots]
        self.options = options or WatchOptions()
        self.catalog = catalog  # None: each run resolves its keys in its framework's catalog
        self.state = state.load(self.options.state_path) if self.options.state_path else state.State()
        self.runs: dict[tuple[str, int], RunTarget] = {}
        self.files: dict[str, _Followed] = {}
        self._dirty = False
        self._last_scan = self._last_save = float("-inf")
        self._rescan_every = self.options.rescan_s
        self._dirs: dict[str, tuple[int, int]] = {}  # the stamps of the directories of directories (scan.changed)
        self._no_tensorboard = False
        self._grew: dict[tuple[str, int], float] = {}  # run -> when its files last grew (for expire_s)
        self._followed_of: dict[tuple[str, int], int] = {}  # run -> how many of its files are followed
        self.diagnostics = Diagnostics()  # the shared endpoint's own errors
        self.served: Served | None = None  # the endpoint every run is served at (none with port_per_run)
        self._merged: tuple[tuple[object, ...], Snapshot] | None = None  # the last merged snapshot, by its parts
        self._relabelled: Relabelled = {}  # each run's stored families as merged() labelled them (by origin)
        self._frozen: tuple[int, float] = (0, float("-inf"))  # runs labelled at the last gc.freeze(), and when
        self._dropped = False  # a run was forgotten since the last gc.freeze()
        # a restored run is served once its files are read up to what they held at the restart (their sizes now)
        self._catch_up: dict[str, int] = {}
        for path in self.state.files:
            try:
                self._catch_up[path] = os.stat(path).st_size
            except OSError:
                pass
        for key, rs in self.state.runs.items():  # restored runs: their last values, served once caught up
            target = self.runs[key] = RunTarget(rs, self.options.serve, self.catalog)
            target.ready = False
            target.start()
            self._grew[key] = time.monotonic()
        if not self.options.serve.port_per_run:
            self._serve()

    def _serve(self) -> None:
        serve, diag = self.options.serve, self.diagnostics
        prom = serve.prometheus()
        self.served = Served(prom, self.collect, lambda reason: diag.count("prometheus", reason), time.time_ns,
                             host_name=socket.gethostname(), run="rl-otel-watch", rank=0, role="watch", labels={},
                             limits=SHARED_LIMITS)
        _log.info("rl_otel watch: serving every run at %s", self.served.url)

    def collect(self, *, settle: bool = False, on_error: Callable[[str], None] | None = None) -> Snapshot:
        """Every ready run's families, merged (the endpoint's read), with the endpoint's own error counts."""
        parts = [target.recorder.collect(on_error=on_error) for target in list(self.runs.values())
                 if target.ready and target.recorder is not None]
        errors = self.diagnostics.family(())
        key = tuple(part.stored for part in parts)
        last = self._merged
        if last is not None and len(last[0]) == len(key) and all(a is b for a, b in zip(last[0], key, strict=True)):
            stored = last[1].stored  # no run changed: the merged stored families of the last scrape
            snap = Snapshot(stored, merged([Snapshot(_EMPTY, p.live, p.origin) for p in parts]).live)
        else:
            cache = self._relabelled
            snap = merged(parts, cache)
            self._merged = (key, Snapshot(snap.stored))  # not its live part: 50,000 points kept for nothing
            if len(cache) > len(parts):  # runs gone: their entries go
                kept = {part.origin for part in parts}
                for origin in [o for o in cache if o not in kept]:
                    del cache[origin]
        return Snapshot(snap.stored, (*snap.live, errors) if errors is not None else snap.live)

    # -- the loop -------------------------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Poll until ``stop`` is set, then save the state (the caller closes)."""
        while not stop.is_set():
            more = self.poll()
            if not more:
                stop.wait(self.options.interval_s)
        self.checkpoint(force=True)

    def poll(self) -> bool:
        """One pass: rescan when due, read every file's new bytes, save the state when due. True when a backlog
        is left (poll again at once). Never raises."""
        more = False
        try:
            now = time.monotonic()
            # a walk that finds nothing new waits twice as long for the next (up to 10 rescan_s): walking thousands
            # of finished runs' directories every second costs a core's share by itself. A new run's directory
            # is seen at the next poll all the same: a stat of each directory of directories (scan.changed) says
            # one was added, and the walk is done at once (a new run waited up to 10 s for the backed-off walk)
            if now - self._last_scan >= self._rescan_every or scan.changed(self._dirs):
                self._last_scan = now
                found_new = self.rescan()
                self._rescan_every = (self.options.rescan_s if found_new
                                      else min(self._rescan_every * 2, 10 * self.options.rescan_s))
                for path in [p for p in self._catch_up if p not in self.files]:  # gone since the state was saved
                    del self._catch_up[path]
            for followed in list(self.files.values()):
                if followed.next_check > now:
                    continue
                more |= self._read(followed)
                quiet = now - followed.grew_at
                followed.next_check = now + min(IDLE_MAX_S, quiet / 10) if quiet > QUIET_S else 0.0
            if not all(target.ready for target in self.runs.values()):
                self._mark_ready()
            if self.options.expire_s is not None:
                self._expire(time.monotonic() - self.options.expire_s)
            if time.monotonic() - self._last_save >= self.options.checkpoint_s:
                self.checkpoint()
            if self.options.freeze_gc:
                self._freeze()
        except Exception:  # boundary: the watch loop's pass (files of any content)
            _log.exception("rl_otel watch: poll failed; going on")
        return more

    def _freeze(self) -> None:
        """Move every object now alive out of the collector's generations (``gc.freeze``), at most every
        FREEZE_S, once runs were labelled for the endpoint since the last time: thousands of runs' recorders are
        ~900,000 objects, and a full collection of them (~0.5 s, every other scrape of 5,000 runs while one
        writes) was most of a scrape's time. A frozen object is still freed when nothing refers to it; cycles are
        not: when a run was forgotten since, everything is unfrozen and collected once first."""
        now = time.monotonic()
        labelled = len(self._relabelled)
        if labelled == self._frozen[0] or now - self._frozen[1] < FREEZE_S:
            return
        if self._dropped:
            gc.unfreeze()
            gc.collect()
            self._dropped = False
        gc.freeze()
        self._frozen = (labelled, now)

    def _mark_ready(self) -> None:
        """Serve the restored runs none of whose files is still catching up."""
        behind = {(f.found.run, f.found.rank) for f in map(self.files.get, self._catch_up) if f is not None}
        for key, target in self.runs.items():
            if not target.ready and key not in behind:
                target.ready = True
                _log.info("rl_otel watch: run %r rank %d caught up after the restart: served", key[0], key[1])

    def _caught_up(self, path: str, offset: int, size: int) -> None:
        """Whether a file read up to ``offset`` (its size now: ``size``) holds no more of what it held at the
        restart (read up to that size, or to its end if it is shorter now: replaced or truncated)."""
        at_restart = self._catch_up.get(path)
        if at_restart is not None and offset >= min(at_restart, size):
            del self._catch_up[path]

    def rescan(self) -> bool:
        """Follow the files under the roots not followed yet (offsets from the state file when it knows them);
        True if there was one."""
        new = False
        dirs: dict[str, tuple[int, int]] = {}
        for found in scan.scan(self.roots, set(self.files), dirs):
            new = True
            fs = self.state.files.get(found.path)
            if fs is None:
                fs = self.state.files[found.path] = state.FileState()
            self.files[found.path] = _Followed(found, fs)
            key = (found.run, found.rank)
            self._followed_of[key] = self._followed_of.get(key, 0) + 1
            _log.debug("rl_otel watch: following %s (run %r, rank %d)", found.path, found.run, found.rank)
        self._dirs = dirs
        return new

    def checkpoint(self, force: bool = False) -> None:
        """Save the state file (offsets and last values together) if anything moved since the last save."""
        self._last_save = time.monotonic()
        if self.options.state_path is None or not (self._dirty or force):
            return
        for key, target in self.runs.items():
            self.state.runs[key] = target.snapshot()
        if state.save(self.state, self.options.state_path):
            self._dirty = False

    def _drop(self, key: tuple[str, int], why: str | None) -> None:
        """Stop serving run ``key`` and forget its values (a new file of it starts it anew)."""
        target = self.runs.pop(key, None)
        self.state.runs.pop(key, None)
        self._grew.pop(key, None)
        self._dirty = self._dropped = True
        if target is not None:
            target.close()
            if why is not None:
                _log.info("rl_otel watch: run %r rank %d: %s; forgotten", key[0], key[1], why)

    def _expire(self, before: float) -> None:
        """Close the runs whose files last grew before ``before``: their endpoint stops and their targets file
        goes, as a finished training's; the files' offsets stay, so a restart does not serve them again (a file
        that grows later starts the run anew)."""
        for key, grew in list(self._grew.items()):
            if grew < before:
                del self._grew[key]
                target = self.runs.pop(key, None)
                self.state.runs.pop(key, None)
                self._dirty = self._dropped = True
                if target is not None:
                    target.close()
                _log.info("rl_otel watch: run %r rank %d wrote nothing for %.0f s: closed", key[0], key[1],
                          self.options.expire_s)

    def targets(self) -> dict[tuple[str, int], str | None]:
        """``{(run, rank): metrics URL}`` of the runs served (the shared endpoint's URL, or each run's own with
        ``port_per_run``; ``None`` for one not served yet: not started, or catching up after a restart)."""
        shared = None if self.served is None else self.served.url
        return {key: (target.url or shared) if target.ready and target.recorder is not None else None
                for key, target in self.runs.items()}

    def close(self) -> None:
        """Save the state and stop serving (idempotent)."""
        self.checkpoint(force=True)
        for target in self.runs.values():
            target.close()
        if self.served is not None:
            self.served.close()
            self.served = None

    # -- one file ---------------------------------------------------------------------------------------------

    def _read(self, followed: _Followed) -> bool:
        found, fs, tail = followed.found, followed.fs, followed.tail
        if found.kind == "tfevents" and self._no_tensorboard:
            self._catch_up.pop(found.path, None)
            return False
        try:
            st = os.stat(found.path)
        except FileNotFoundError:
            del self.files[found.path]  # gone (a cleaned-up run): forget it, a new file of that name starts at 0
            self.state.files.pop(found.path, None)
            self._dirty = True
            key = (found.run, found.rank)
            left = self._followed_of.get(key, 1) - 1
            if left > 0:
                self._followed_of[key] = left
            else:  # the run's last file is gone: the run is forgotten (its series, its state)
                self._followed_of.pop(key, None)
                self._drop(key, "its files are gone")
            return False
        except OSError:
            return False
        if (fs.dev, fs.ino) != (st.st_dev, st.st_ino) or st.st_size < tail.offset:
            if fs.ino or tail.offset:  # replaced under the same name, or truncated: read it from the start
                _log.info("rl_otel watch: %s was replaced or truncated (a restarted run); reading it from the start "
                          "and serving the run anew", found.path)
                # a run restarted from step 0: its old values (at higher steps) would hold every series where it
                # was, since a lower step never sets a series back
                self._drop((found.run, found.rank), None)
            fs.dev, fs.ino, tail.offset = st.st_dev, st.st_ino, 0
            self._dirty = True
        if st.st_size == tail.offset:
            self._caught_up(found.path, tail.offset, st.st_size)
            return False
        try:
            points, corrupt, more = self._points(followed, st.st_size)
        except ImportError as exc:
            self._no_tensorboard = True
            _log.error("rl_otel watch: %s; event files are not read", exc)
            return False
        except OSError as exc:
            if not followed.failed:
                followed.failed = True
                _log.warning("rl_otel watch: %s cannot be read (%s); trying again", found.path, exc)
            return False
        followed.failed = False
        target = self._target(found)
        if tail.offset != fs.offset or points:  # it grew (a partial line or record waiting is no growth)
            self._grew[(found.run, found.rank)] = followed.grew_at = time.monotonic()
        if points:
            target.feed(points)
        target.count_error("corrupt_record", corrupt)
        if fs.offset != tail.offset:
            fs.offset = tail.offset
            self._dirty = True
        self._caught_up(found.path, tail.offset, st.st_size)
        return more

    def _points(self, followed: _Followed, size: int) -> tuple[list[Point], int, bool]:
        points: list[Point] = []
        tail = followed.tail
        if isinstance(tail, RecordTail):
            batch = tail.read(size)
            corrupt = batch.corrupt
            for data in batch.records:
                try:
                    found = events.scalars(data)
                except ImportError:
                    raise
                except Exception:  # boundary: protobuf decoding CRC-valid bytes that are no Event
                    corrupt += 1
                    continue
                if found is not None:
                    points.append(found)
            return points, corrupt, batch.more
        lines = tail.read(size)
        corrupt = lines.corrupt
        for line in lines.records:
            try:
                parsed = jsonl.parse(line, self.options.step_keys, self.options.time_keys)
            except (ValueError, RecursionError):  # what a line of any content raises: no JSON object, too deep
                corrupt += 1
                continue
            if parsed is not None:
                points.append(parsed)
        return points, corrupt, lines.more

    def _target(self, found: scan.Found) -> RunTarget:
        key = (found.run, found.rank)
        target = self.runs.get(key)
        if target is None:
            rs = self.state.runs.get(key) or state.RunState(found.run, found.rank)
            self.state.runs[key] = rs
            target = self.runs[key] = RunTarget(rs, self.options.serve, self.catalog)
        return target


_EMPTY = StoreSnapshot(0, None, families=())


def run_until_signalled(watcher: Watcher) -> None:
    """Run ``watcher`` until SIGTERM or SIGINT, then close it (the state saved, every endpoint stopped)."""
    import signal

    stop = threading.Event()
    previous: dict[signal.Signals, Any] = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        previous[sig] = signal.signal(sig, lambda *_: stop.set())
    try:
        watcher.run(stop)
    finally:
        watcher.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
