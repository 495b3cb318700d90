"""rl_otel's benchmark suite: each benchmark a ratio against a baseline measured in the same run, as one table.

    python benchmarks/run.py [--quick] [--only log stats ...] [--markdown] [--check]

``--quick`` runs smaller sizes (a smoke test, a few minutes); ``--markdown`` prints the table for the README;
``--check`` exits 1 if a row misses its target. Each benchmark module still runs alone with its own details
(``python benchmarks/bench_stats.py``).

Method, every row: the baseline is the code a user would otherwise run (the frameworks' own metric code, a
hand-written prometheus_client, ROLL's bookkeeping, TensorBoard's writer...), measured in the same run in
interleaved A/B rounds (the order alternating, so a drift of the machine's speed hits both sides alike), one torch
thread where torch runs small ops; ``ratio`` is the median of the per-round ratios (measured / baseline), and the
``measured`` and ``baseline`` columns are the medians over rounds. A target on a ratio holds on a loaded machine
as on a quiet one; the few absolute targets (``init()``, ``close()``) are the issue's and are marked as such.

Adding a benchmark: a module ``bench_x.py`` with ``rows(quick: bool = False) -> list[common.Row]`` (name,
measured, baseline, unit, target, passed, baseline name, and ``paired_ratio``), and one entry in ``BENCHMARKS``.

Profiling a hot path (not needed to run the suite): ``python benchmarks/bench_stats.py --profile verl:512x4096``
(cProfile + torch's profiler), or ``pip install pyinstrument==5.1.3``, then e.g. ``pyinstrument -i 0.0001
benchmarks/bench_phase.py --n 3000``.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's rl_otel, not an installed one
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import Row, table


def _module_rows(module: str) -> Callable[[bool], list[Row]]:
    def run(quick: bool = False) -> list[Row]:
        return __import__(module).rows(quick)

    return run


BENCHMARKS: dict[str, Callable[[bool], list[Row]]] = {
    "log": _module_rows("bench_log"),
    "bridge": _module_rows("bench_bridge"),
    "phase": _module_rows("bench_phase"),
    "stats": _module_rows("bench_stats"),
    "lifecycle": _module_rows("bench_lifecycle"),
    "overhead": _module_rows("bench_overhead"),
    "histogram": _module_rows("bench_histogram"),
    "tensorboard": _module_rows("bench_tensorboard"),
    "scrape": _module_rows("bench_scrape"),
    "pause": _module_rows("bench_pause"),
    "watch": _module_rows("bench_watch"),
    "auth": _module_rows("bench_auth"),
    "attack": _module_rows("bench_attack"),
    "demo": _module_rows("bench_demo"),
}


def machine() -> str:
    import os

    import torch

    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())  # a shared machine's load skews absolute figures
    return (f"{platform.node()}: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs (load {load}), "
            f"Python {platform.python_version()}, torch {torch.__version__} ({torch.get_num_threads()} threads)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes: a smoke test")
    parser.add_argument("--only", nargs="+", choices=sorted(BENCHMARKS), help="run only these benchmarks")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    parser.add_argument("--check", action="store_true", help="exit 1 if a row misses its target")
    args = parser.parse_args()
    import torch

    rows: list[Row] = []
    start = time.perf_counter()
    threads = torch.get_num_threads()
    for name in args.only or BENCHMARKS:
        print(f"running {name} ...", file=sys.stderr, flush=True)
        rows += BENCHMARKS[name](args.quick)
        torch.set_num_threads(threads)  # a benchmark that sets its own does not decide the next one's
    print(table(rows, markdown=args.markdown))
    met = sum(r.passed is True for r in rows)
    missed = [r.name for r in rows if r.passed is False]
    print(f"\ntargets: {met} met, {len(missed)} missed" + (f" ({'; '.join(missed)})" if missed else ""))
    print(f"{machine()}; {time.perf_counter() - start:.0f} s; `python benchmarks/run.py"
          f"{' --quick' if args.quick else ''}`")
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
