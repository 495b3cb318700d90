"""The TensorBoard sink's cost per step: rl_otel's writer vs TensorBoard's ``EventFileWriter`` + ``np.histogram``.

    python benchmarks/bench_tensorboard.py [--steps 50] [--repeat 5]

A step is what the demo logs: 100 scalars and 15 histograms of 693 values (64 bins). Two figures per writer:
``log()`` alone (per step, median), and ``log()`` of every step then ``flush()``, per step (the total: TensorBoard's
writer frames and CRCs its events on a thread of its own, holding the GIL, so its cost shows up there). The
baseline is the sink as it was before its own writer: the same events, histograms from ``np.histogram`` and
TensorBoard's ``EventFileWriter`` (pure-Python CRC32C on its thread).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's rl_otel, not an installed one
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import Row

from rl_otel.sinks.tensorboard import TensorBoardSink


class TensorBoardWriterSink(TensorBoardSink):
    """The baseline: the same events through np.histogram and TensorBoard's own EventFileWriter."""

    def __init__(self, *, log_dir: str, flush_secs: float) -> None:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        super().__init__(run="bench", log_dir=log_dir, flush_secs=flush_secs)
        assert self._writer is not None
        self._writer.close()
        self._writer = EventFileWriter(log_dir, max_queue_size=1024, flush_secs=flush_secs)
        self._add = self._writer.add_event

    def _histogram(self, arr):
        arr = arr[np.isfinite(arr)]
        counts, edges = np.histogram(arr, bins=self._bins)
        return self._Histogram(min=float(arr.min()), max=float(arr.max()), num=float(arr.size),
                               sum=float(arr.sum()), sum_squares=float(np.dot(arr, arr)),
                               bucket_limit=edges[1:].tolist(), bucket=counts.astype(np.float64).tolist())

    def log(self, metrics, step):  # TensorBoard's writer takes the Event, not its bytes
        value = self._Summary.Value
        values = [value(tag=k, histo=self._histogram(v)) if isinstance(v, np.ndarray) else
                  value(tag=k, simple_value=v) for k, v in metrics.items()]
        self._add(self._Event(wall_time=time.time(), step=step, summary=self._Summary(value=values)))


def demo_steps(n: int) -> list[dict]:
    rng = np.random.default_rng(0)
    return [{**{f"actor/k{i}": float(step + i) for i in range(100)},
             **{f"dist/h{j}": rng.standard_normal(693) for j in range(15)}} for step in range(n)]


def measure(make, steps: list[dict]) -> tuple[float, float]:
    """(median log() seconds, seconds per step of logging every step then flushing)."""
    with tempfile.TemporaryDirectory() as d:
        sink = make(d)
        for step, m in enumerate(steps[:5]):  # warm-up
            sink.log(m, step)
        sink.flush()
        times = []
        start = time.perf_counter()
        for step, m in enumerate(steps):
            t = time.perf_counter()
            sink.log(m, step)
            times.append(time.perf_counter() - t)
        sink.flush()
        total = (time.perf_counter() - start) / len(steps)
        sink.close()
    return statistics.median(times), total


def compare(n_steps: int, repeat: int) -> dict[str, float]:
    steps = demo_steps(n_steps)
    ours = lambda d: TensorBoardSink(run="bench", log_dir=d, flush_secs=3600)
    theirs = lambda d: TensorBoardWriterSink(log_dir=d, flush_secs=3600)
    runs: dict[str, list[float]] = {"log": [], "total": [], "tb_log": [], "tb_total": []}
    for r in range(repeat):  # interleaved rounds, the order alternating: a shared machine's drift hits both
        for prefix, make in ((("", ours), ("tb_", theirs)) if r % 2 == 0 else (("tb_", theirs), ("", ours))):
            log, total = measure(make, steps)
            runs[prefix + "log"].append(log)
            runs[prefix + "total"].append(total)
    out = {k: statistics.median(v) for k, v in runs.items()}
    for k in ("log", "total"):  # the median of the per-round ratios
        out[f"{k}_ratio"] = statistics.median(a / b for a, b in zip(runs[k], runs["tb_" + k], strict=True))
    return out


def rows(quick: bool = False) -> list[Row]:
    m = compare(20 if quick else 50, 3 if quick else 9)
    base = "TensorBoard's EventFileWriter + np.histogram"
    return [Row("TensorBoard sink log(), 100 scalars + 15x693-value histograms", m["log"] * 1e3, m["tb_log"] * 1e3,
                "ms", "ratio <= 0.5", m["log_ratio"] <= 0.5, base, paired_ratio=m["log_ratio"]),
            Row("TensorBoard sink log() + flush per step, same step", m["total"] * 1e3, m["tb_total"] * 1e3, "ms",
                "ratio <= 0.5", m["total_ratio"] <= 0.5, base, paired_ratio=m["total_ratio"])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    m = compare(args.steps, args.repeat)
    print(f"log() per step:          rl_otel {m['log'] * 1e3:.3f} ms   TensorBoard writer {m['tb_log'] * 1e3:.3f} ms"
          f"   ratio {m['log'] / m['tb_log']:.3f}")
    print(f"log() + flush, per step: rl_otel {m['total'] * 1e3:.3f} ms   TensorBoard writer "
          f"{m['tb_total'] * 1e3:.3f} ms   ratio {m['total'] / m['tb_total']:.3f}")


if __name__ == "__main__":
    main()
