"""``rl-otel backfill``'s cost against the number of points, where each point writes a series of its own (an
evaluation per task, a key per prompt): linear in points, or quadratic when each point re-reads the whole store.

    python benchmarks/bench_backfill.py [--points 1000 4000]

Writes one JSONL run of N points (point i logs ``eval/task{i}/accuracy/mean@4`` and ``critic/score/mean``), backfills
it, and prints the seconds and the growth exponent between the two sizes: ~1 is linear, ~2 quadratic. Run it on two
checkouts to compare (``PYTHONPATH=<checkout> python <checkout>/benchmarks/bench_backfill.py``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's rl_otel, not an installed one


def backfill_seconds(points: int) -> float:
    from rl_otel.watch.backfill import backfill

    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        run.mkdir()
        with open(run / "metrics.jsonl", "w") as f:
            for i in range(points):
                f.write(json.dumps({"step": i, "timestamp": 1.7e9 + i, f"eval/task{i}/accuracy/mean@4": 0.5,
                                    "critic/score/mean": i / points}) + "\n")
        started = time.perf_counter()
        backfill([str(run)], Path(tmp) / "out.om", framework="verl")
        return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--points", type=int, nargs=2, default=[1000, 4000])
    small, large = parser.parse_args().points
    backfill_seconds(100)  # imports, caches
    a, b = backfill_seconds(small), backfill_seconds(large)
    print(f"{small} points: {a:.3f} s; {large} points: {b:.3f} s; growth exponent "
          f"{math.log(b / a) / math.log(large / small):.2f} (1: linear, 2: quadratic)")


if __name__ == "__main__":
    main()
