"""A histogram of 262,144 values: rl_otel's bulk bucketing vs a per-value OTel SDK ``Histogram.record()`` loop.

    python benchmarks/bench_histogram.py [--values 262144] [--repeat 30]

Prints, from one run: the SDK loop (timed once: it takes seconds), rl_otel's ``bucket()`` (bucketize + bincount
+ sum/min/max on the tensor's device, one transfer of the counts), the full ``Telemetry.log()`` path for a
histogram key, and a bare ``torch.bucketize`` over the same tensor (these three: medians of interleaved rounds,
one torch thread); the
ratios between them; and a check that the SDK's bucket counts equal rl_otel's. Values are importance ratios
(positive): the SDK histogram refuses negative values ("Record amount must be non-negative"), which rules it
out for advantages or log-probabilities anyway.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's rl_otel, not an installed one
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import Row, ab_rounds, torch_threads

import rl_otel
from rl_otel.catalog.define import IMPORTANCE_RATIO_BUCKETS
from rl_otel.stats import bucket

ATTRS = {"run": "bench", "rank": "0"}


def sdk_loop(values: list[float]) -> tuple[float, list[int]]:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader], views=[View(
        instrument_name="ratio", aggregation=ExplicitBucketHistogramAggregation(boundaries=IMPORTANCE_RATIO_BUCKETS))])
    histogram = provider.get_meter("bench").create_histogram("ratio")
    start = time.perf_counter()
    for v in values:
        histogram.record(v, ATTRS)
    seconds = time.perf_counter() - start
    data = reader.get_metrics_data()
    assert data is not None
    point = data.resource_metrics[0].scope_metrics[0].metrics[0].data.data_points[0]
    provider.shutdown()
    return seconds, list(point.bucket_counts)  # type: ignore[union-attr]  # a HistogramDataPoint


def measure(n_values: int, repeat: int) -> dict[str, float]:
    g = torch.Generator().manual_seed(0)
    x = torch.exp(0.2 * torch.randn(n_values, generator=g))  # float32 importance ratios
    bounds = torch.tensor(IMPORTANCE_RATIO_BUCKETS, dtype=x.dtype)

    t_sdk, sdk_counts = sdk_loop(x.tolist())
    ours = bucket(x, IMPORTANCE_RATIO_BUCKETS)
    assert ours.counts.tolist() == sdk_counts, (ours.counts.tolist(), sdk_counts)

    tel = rl_otel.init(run="bench", prometheus=False)
    try:
        with torch_threads(1):
            t = ab_rounds([lambda: bucket(x, IMPORTANCE_RATIO_BUCKETS), lambda: torch.bucketize(x, bounds),
                           lambda: tel.log({"actor/ratio_dist": x})], repeat)
    finally:
        tel.close()
    # the SDK loop takes seconds: timed once (its ratio to ours is ~1e-3, far from any target)
    return {"sdk": t_sdk, "bucket": t.median(0), "bare": t.median(1), "log": t.median(2)}


def rows(quick: bool = False) -> list[Row]:
    n = 65_536 if quick else 262_144
    m = measure(n, 10 if quick else 30)
    sdk = "OTel SDK Histogram.record() loop"
    return [
        Row(f"bulk histogram bucket() of {n:,} values", m["bucket"] * 1e3, m["sdk"] * 1e3, "ms", "ratio <= 0.01",
            m["bucket"] <= 0.01 * m["sdk"], sdk),
        Row(f"log() of a {n:,}-value histogram key", m["log"] * 1e3, m["sdk"] * 1e3, "ms", "ratio <= 0.01",
            m["log"] <= 0.01 * m["sdk"], sdk),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--values", type=int, default=262_144)
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args()
    m = measure(args.values, args.repeat)
    t_sdk, t_bucket, t_log, t_bare = m["sdk"], m["bucket"], m["log"], m["bare"]
    n = args.values
    print(f"{n:,} float32 values, {len(IMPORTANCE_RATIO_BUCKETS)} bounds, CPU ({torch.get_num_threads()} threads), "
          f"torch {torch.__version__}")
    print(f"  OTel SDK Histogram.record() loop: {t_sdk * 1e3:9.1f} ms  ({t_sdk / n * 1e6:.2f} us/value)")
    print(f"  rl_otel bucket():                 {t_bucket * 1e3:9.3f} ms  -> {t_sdk / t_bucket:,.0f}x faster; "
          "counts identical to the SDK's")
    print(f"  rl_otel Telemetry.log(tensor):    {t_log * 1e3:9.3f} ms  -> {t_sdk / t_log:,.0f}x faster")
    print(f"  bare torch.bucketize:             {t_bare * 1e3:9.3f} ms  -> bucket() is {t_bucket / t_bare:.2f}x the "
          "bare bucketize")


if __name__ == "__main__":
    main()
