"""TensorBoard: one event per step holding every scalar (and a histogram per distribution).

A ROLL-style tracker calls ``SummaryWriter.add_scalar`` once per key: one proto, one event and one queue hop per
value. Here a step is one ``Summary`` with a value per key. Scalars are stored as ``simple_value`` (float32), as
``add_scalar`` stores them; a distribution as a ``HistogramProto`` of ``histogram_bins`` equal bins, counted as
``np.histogram`` counts them (:mod:`rl_otel.sinks.uniform_histogram`, at about half its cost).

Events go to an event file through :class:`rl_otel.sinks.tfevents.EventFileWriter`, on the bridge's worker thread
that calls the sink (TensorBoard's own writer adds a thread and a pure-Python CRC that held the GIL for ~3 ms per
step). Each step's event is written to the file (handed to the OS, one ``write``) as the sink logs it, so a
process killed by SIGKILL, the OOM killer or a segfault keeps every step the worker has written.
``flush_secs`` and ``max_queue`` (TensorBoard's flush interval and pending-event queue size) are still accepted, so
configurations written for earlier versions keep working, and unused: nothing waits in memory.

A failed write (a full disk) leaves the event file possibly ending in a partial record. The sink drops that writer
and opens a new event file (TensorBoard reads every file of a directory) on the first step ``reopen_secs`` later,
so mirroring resumes once space is freed; the steps in between are lost, each counted by the bridge
(``reason="disk_full"``).
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, cast

import numpy as np

from rl_otel._internal.trackers.bridge import error_reason
from rl_otel.sinks.base import Metrics, SinkError, missing_dependency
from rl_otel.sinks.uniform_histogram import uniform_histogram

if TYPE_CHECKING:
    from rl_otel.sinks.tfevents import EventFileWriter


class TensorBoardSink:
    """Writes TensorBoard event files under ``log_dir`` (default ``runs/<run>``)."""

    def __init__(self, *, run: str, log_dir: str | os.PathLike | None = None, logdir: str | None = None,
                 flush_secs: float = 10.0, max_queue: int = 1024, histogram_bins: int = 64,
                 filename_suffix: str = "", reopen_secs: float = 10.0) -> None:
        try:
            from tensorboard.compat.proto.event_pb2 import Event
            from tensorboard.compat.proto.summary_pb2 import HistogramProto, Summary
        except ImportError as e:
            raise missing_dependency("tensorboard", "tensorboard") from e
        if log_dir is not None and logdir is not None:
            raise ValueError("give log_dir or logdir, not both")
        if isinstance(histogram_bins, bool) or not isinstance(histogram_bins, int) or histogram_bins < 1:
            raise ValueError(f"histogram_bins must be a positive int, got {histogram_bins!r}")
        if isinstance(reopen_secs, bool) or not isinstance(reopen_secs, (int, float)) or reopen_secs < 0:
            raise ValueError(f"reopen_secs must be a number of seconds >= 0, got {reopen_secs!r}")
        self.log_dir = os.fspath(log_dir or logdir or os.path.join("runs", run))
        self._Event, self._Summary, self._Histogram = Event, Summary, HistogramProto
        self._bins = histogram_bins
        from rl_otel.sinks.tfevents import EventFileWriter

        self._open = lambda: EventFileWriter(self.log_dir, flush_secs=flush_secs, filename_suffix=filename_suffix)
        self._reopen_secs = float(reopen_secs)
        self._failed: tuple[float, BaseException] | None = None  # when the writer broke, and why
        self._writer: EventFileWriter | None = self._open()  # None while broken (see _drop_writer)

    def log(self, metrics: Metrics, step: int) -> None:
        value = self._Summary.Value
        values = []
        for key, v in metrics.items():
            if isinstance(v, np.ndarray):
                histo = self._histogram(v)
                if histo is not None:
                    values.append(value(tag=key, histo=histo))
            else:
                values.append(value(tag=key, simple_value=v))
        event = self._Event(wall_time=time.time(), step=step, summary=self._Summary(value=values))
        if self._writer is None:
            broke_at, error = cast("tuple[float, BaseException]", self._failed)  # set when the writer was dropped
            if time.monotonic() - broke_at < self._reopen_secs:  # counted under the first error's reason
                raise SinkError(error_reason(error), f"the event file writer failed ({error}); a new one is "
                                f"tried {self._reopen_secs:g} s after")
            try:
                self._writer = self._open()
            except Exception as exc:  # the disk is still full: wait reopen_secs again
                self._failed = (time.monotonic(), exc)
                raise
        writer = self._writer
        try:
            writer.add_event(event.SerializeToString())
        except Exception as exc:  # boundary: the OS (writing the event file)
            self._drop_writer(exc)
            raise SinkError(error_reason(exc), f"the event file writer failed ({exc}); the step is lost") from exc

    def _drop_writer(self, exc: BaseException) -> None:
        writer, self._writer = self._writer, None
        self._failed = (time.monotonic(), exc)
        if writer is None:  # never: it is dropped after it failed
            return
        try:
            writer.close()  # releases the file; the failed write's records are lost
        except Exception:  # boundary: the OS (closing the event file)
            pass

    def _histogram(self, arr: np.ndarray):
        h = uniform_histogram(arr, self._bins)
        if h is None:
            return None
        return self._Histogram(min=h.min, max=h.max, num=float(h.num), sum=h.sum, sum_squares=h.sum_squares,
                               bucket_limit=h.edges[1:].tolist(), bucket=h.counts.tolist())

    def flush(self) -> None:
        """The writer's flush (``Telemetry.flush()`` calls it on the sink's worker thread); rl_otel's writer holds
        nothing back: every step the sink logged is already in the file."""
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
