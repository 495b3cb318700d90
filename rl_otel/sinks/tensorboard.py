"""TensorBoard: one event per step holding every scalar (and a histogram per distribution).

A ROLL-style tracker calls ``SummaryWriter.add_scalar`` once per key: one proto, one event and one queue hop per
value. Here a step is one ``Summary`` with a value per key, written by TensorBoard's own ``EventFileWriter``.
Scalars are stored as ``simple_value`` (float32), as ``add_scalar`` stores them.
"""

from __future__ import annotations

import os
import time

import numpy as np

from rl_otel.sinks.base import Metrics, missing_dependency


class TensorBoardSink:
    """Writes TensorBoard event files under ``log_dir`` (default ``runs/<run>``)."""

    def __init__(self, *, run: str, log_dir: str | os.PathLike | None = None, logdir: str | None = None,
                 flush_secs: float = 10.0, max_queue: int = 1024, histogram_bins: int = 64,
                 filename_suffix: str = "") -> None:
        try:
            from tensorboard.compat.proto.event_pb2 import Event
            from tensorboard.compat.proto.summary_pb2 import HistogramProto, Summary
            from tensorboard.summary.writer.event_file_writer import EventFileWriter
        except ImportError as e:
            raise missing_dependency("tensorboard", "tensorboard") from e
        if log_dir is not None and logdir is not None:
            raise ValueError("give log_dir or logdir, not both")
        if isinstance(histogram_bins, bool) or not isinstance(histogram_bins, int) or histogram_bins < 1:
            raise ValueError(f"histogram_bins must be a positive int, got {histogram_bins!r}")
        self.log_dir = os.fspath(log_dir or logdir or os.path.join("runs", run))
        self._Event, self._Summary, self._Histogram = Event, Summary, HistogramProto
        self._bins = histogram_bins
        self._writer = EventFileWriter(self.log_dir, max_queue_size=max_queue, flush_secs=flush_secs,
                                       filename_suffix=filename_suffix)

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
        self._writer.add_event(self._Event(wall_time=time.time(), step=step,
                                           summary=self._Summary(value=values)))

    def _histogram(self, arr: np.ndarray):
        arr = arr[np.isfinite(arr)]
        if arr.size == 0:
            return None
        counts, edges = np.histogram(arr, bins=self._bins)
        return self._Histogram(min=float(arr.min()), max=float(arr.max()), num=float(arr.size),
                               sum=float(arr.sum()), sum_squares=float(np.dot(arr, arr)),
                               bucket_limit=edges[1:].tolist(), bucket=counts.astype(np.float64).tolist())

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()
