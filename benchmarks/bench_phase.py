"""Cost of ``Telemetry.phase()`` (span contexts, CPU snapshots, ROLL keys through the catalog, histogram) against
what ROLL's ``state_offload_manager`` already pays for the same keys around the same body (perf_counter timings
and psutil snapshots into a dict, no spans, no Prometheus); on CPU, one torch thread.

Rows: an empty body; a real body (one ``torch.mm``); a step of 3 phases in a loop (each around a small matmul,
as a ROLL step runs them); and, for information, ``phase()`` with a
span processor (a ``SimpleSpanProcessor`` handing the four finished SDK spans to an exporter that drops them).
Method: interleaved A/B rounds of ``--n`` phases a side (``common.ab_rounds``), the median of the per-round ratios.

    python benchmarks/bench_phase.py [--n 500] [--rounds 15]
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
from opentelemetry import trace
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

import rl_otel


def roll_style(metrics: dict[str, float], infix: str = "actor_train/train_step"):
    """ROLL's state_offload_manager on a CPU: the timings and CPU memory keys of one phase, into a dict."""
    import psutil

    process = psutil.Process()

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


PHASES = (("actor_infer", "generate"), ("reference", "compute_log_probs"), ("actor_train", "train_step"))


def _sdk_tracer():
    """A bare SDK TracerProvider with the same processor and dropping exporter."""
    from opentelemetry.sdk.trace import TracerProvider

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(DropSpans()))
    return provider.get_tracer("bench")


def matmul_body(size: int = 192):
    """A real body: one ``torch.mm`` (one torch thread), a few hundred microseconds."""
    import torch

    a, b = torch.rand(size, size), torch.rand(size, size)
    return lambda: torch.mm(a, b)


def measure(n: int, rounds: int) -> dict[str, float]:
    """Microseconds per phase (per step for the 3-phase loop) of each side, and the median per-round ratios."""
    from common import ab_rounds, torch_threads

    tel = rl_otel.init(run="bench", prometheus={"host": "127.0.0.1", "port": 0}, handle_sigterm=False)
    out: dict[str, float] = {}
    try:
        roll = roll_style({})
        noop = lambda: None
        with torch_threads(1):
            for label, body in (("empty", noop), ("matmul", matmul_body())):
                def ours(body=body) -> None:
                    for _ in range(n):
                        with tel.phase("actor_train", "train_step", onload=noop, offload=noop):
                            body()

                def theirs(body=body) -> None:
                    for _ in range(n):
                        with roll(noop, noop):
                            body()

                def bare(body=body) -> None:
                    for _ in range(n):
                        body()

                t = ab_rounds([ours, theirs, bare], rounds, inner=1)
                out[f"{label}_ours"], out[f"{label}_roll"] = t.median(0) / n * 1e6, t.median(1) / n * 1e6
                out[f"{label}_bare"], out[f"{label}_ratio"] = t.median(2) / n * 1e6, t.ratio(0, 1)
            body = matmul_body(128)
            rolls = {f"{c}/{p}": roll_style({}, f"{c}/{p}") for c, p in PHASES}

            def step_ours() -> None:
                for _ in range(n):
                    for cluster, phase in PHASES:
                        with tel.phase(cluster, phase, onload=noop, offload=noop):
                            body()

            def step_theirs() -> None:
                for _ in range(n):
                    for cluster, phase in PHASES:
                        with rolls[f"{cluster}/{phase}"](noop, noop):
                            body()

            t = ab_rounds([step_ours, step_theirs], rounds, inner=1)
            out["loop_ours"], out["loop_roll"] = t.median(0) / n * 1e6, t.median(1) / n * 1e6
            out["loop_ratio"] = t.ratio(0, 1)
        tel.tracer_provider.add_span_processor(SimpleSpanProcessor(DropSpans()))
        tel.log({"actor/pg_loss": 0.0}, step=0)  # a step is known: the phases go under step 1's span at once

        def spans() -> None:
            for _ in range(n):
                with tel.phase("actor_train", "train_step", onload=noop, offload=noop):
                    pass

        def theirs_empty() -> None:
            for _ in range(n):
                with roll(noop, noop):
                    pass

        sdk_tracer = _sdk_tracer()

        def sdk_spans() -> None:  # the OTel SDK's own cost of the same four spans, nothing of rl_otel's
            for _ in range(n):
                root = sdk_tracer.start_span("actor_train/train_step")
                context = trace.set_span_in_context(root)
                for name in ("onload", "execute", "offload"):
                    sdk_tracer.start_span(name, context=context).end()
                root.end()

        t = ab_rounds([spans, theirs_empty, sdk_spans], rounds, inner=1)
        out["spans"], out["spans_roll"], out["spans_ratio"] = t.median(0) / n * 1e6, t.median(1) / n * 1e6, \
            t.ratio(0, 1)
        out["sdk_spans"], out["sdk_ratio"] = t.median(2) / n * 1e6, t.ratio(2, 1)
    finally:
        tel.close()
    return out


def rows_from(m: dict[str, float]) -> list[Row]:
    base = "ROLL-style timings + psutil around the same body"
    # information rows: microseconds a phase; what a user feels is the step overhead (bench_overhead.py)
    info = "(information)"
    return [
        Row("phase() around an empty body", m["empty_ours"], m["empty_roll"], "us", info, None, base,
            paired_ratio=m["empty_ratio"]),
        Row(f"phase() around a matmul body ({m['matmul_bare']:.0f} us alone)", m["matmul_ours"], m["matmul_roll"],
            "us", info, None, base, paired_ratio=m["matmul_ratio"]),
        Row("3 phases a step in a loop (matmul bodies), per step", m["loop_ours"], m["loop_roll"], "us", info, None,
            base, paired_ratio=m["loop_ratio"]),
        Row("phase() with a span processor (4 recorded spans, in their step's trace), empty body", m["spans"],
            m["spans_roll"], "us", "-", None, base, paired_ratio=m["spans_ratio"]),
        Row("the OTel SDK alone: the same 4 spans started and ended", m["sdk_spans"], m["spans_roll"], "us", "-",
            None, base, paired_ratio=m["sdk_ratio"]),
    ]


def rows(quick: bool = False) -> list[Row]:
    return rows_from(measure(200 if quick else 500, 7 if quick else 15))


def main() -> None:
    from common import table

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=500, help="phases (steps for the loop) per side per round")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    m = measure(args.n, args.rounds)
    print(f"{args.rounds} interleaved rounds of {args.n} phases a side; us per phase (per step for the loop); "
          f"the bodies alone: empty {m['empty_bare']:.2f} us, matmul {m['matmul_bare']:.0f} us")
    print(table(rows_from(m)))


if __name__ == "__main__":
    main()
