"""Cost of one ``Telemetry.phase()`` (span contexts, CPU snapshots, ROLL keys through the catalog, histogram)
against what ROLL's ``state_offload_manager`` already pays for the same keys (perf_counter timings and psutil
snapshots into a dict, no spans, no Prometheus), and against an empty ``with`` block; on CPU, measured in one run.

Two ``phase()`` figures: without a span processor (the default: no ``tracing=``, so no SDK span is built, only the
root's and ``execute``'s span contexts), and with one (a ``SimpleSpanProcessor`` handing the four finished SDK
spans to an exporter that drops them: the cost of recording spans on the training thread, not of exporting them).

    python benchmarks/bench_phase.py [--n 20000]
"""

from __future__ import annotations

import argparse
import contextlib
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the checkout's rl_otel, not an install
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from common import Row
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

import rl_otel

TARGET_US = 1000.0  # 0.1% of a one-second phase


def per_call_us(make, n: int) -> float:
    for _ in range(min(n, 1000)):  # warm up caches (router, series)
        with make():
            pass
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            with make():
                pass
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best


def roll_style(metrics: dict[str, float]):
    """ROLL's state_offload_manager on a CPU: the timings and CPU memory keys of one phase, into a dict."""
    import psutil

    process = psutil.Process()
    infix = "actor_train/train_step"

    @contextlib.contextmanager
    def phase(onload, offload):
        t0 = time.perf_counter()
        mem = process.memory_info()
        metrics[f"memory/cpu/{infix}/start/rss"], metrics[f"memory/cpu/{infix}/start/vms"] = mem.rss / 2**30, \
            mem.vms / 2**30
        onload()
        t1 = time.perf_counter()
        yield
        t2 = time.perf_counter()
        offload()
        mem = process.memory_info()
        metrics[f"memory/cpu/{infix}/end/rss"], metrics[f"memory/cpu/{infix}/end/vms"] = mem.rss / 2**30, \
            mem.vms / 2**30
        t3 = time.perf_counter()
        metrics.update({f"time/{infix}/total": t3 - t0, f"time/{infix}/onload": t1 - t0,
                        f"time/{infix}/execute": t2 - t1, f"time/{infix}/offload": t3 - t2})

    return phase


class DropSpans(SpanExporter):
    """A span exporter that drops what it gets: the recording side of spans, without any export cost."""

    def export(self, spans):
        return SpanExportResult.SUCCESS


def measure(n: int) -> dict[str, float]:
    tel = rl_otel.init(run="bench", prometheus={"host": "127.0.0.1", "port": 0}, handle_sigterm=False)
    try:
        empty = per_call_us(contextlib.nullcontext, n)
        roll = roll_style({})
        base = per_call_us(lambda: roll(lambda: None, lambda: None), n)
        def make():
            return tel.phase("actor_train", "train_step", onload=lambda: None, offload=lambda: None)

        phase = per_call_us(make, n)
        tel.tracer_provider.add_span_processor(SimpleSpanProcessor(DropSpans()))
        spans = per_call_us(make, n)
        tel.take_phase_metrics()
    finally:
        tel.close()
    return {"empty": empty, "roll": base, "phase": phase, "spans": spans}


def rows(quick: bool = False) -> list[Row]:
    m = measure(2_000 if quick else 20_000)
    return [Row("phase(): timings, CPU memory, ROLL keys + histogram, no span processor", m["phase"], m["roll"],
                "us", f"<= {TARGET_US:g} us (0.1% of a 1 s phase)", m["phase"] <= TARGET_US,
                "ROLL-style timings + psutil"),
            Row("phase() with a span processor: + 4 recorded spans", m["spans"], m["roll"], "us",
                f"<= {TARGET_US:g} us (0.1% of a 1 s phase)", m["spans"] <= TARGET_US, "ROLL-style timings + psutil")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20_000, help="phases per timing round (best of 5)")
    args = parser.parse_args()
    m = measure(args.n)
    print(f"empty with block           : {m['empty']:8.3f} us")
    print(f"ROLL-style timings + psutil: {m['roll']:8.3f} us")
    print(f"tel.phase()                : {m['phase']:8.3f} us per phase (span contexts + snapshots + metrics, CPU, "
          "no span processor)")
    print(f"ratio to ROLL-style        : {m['phase'] / m['roll']:8.2f}x   (+{m['phase'] - m['roll']:.1f} us per phase)")
    print(f"tel.phase(), spans recorded: {m['spans']:8.3f} us per phase (a span processor: 4 SDK spans, dropped)")


if __name__ == "__main__":
    main()
