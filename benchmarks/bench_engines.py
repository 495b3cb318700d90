"""What serving an in-process rollout engine's families costs a scrape: one vLLM V1 engine's families
(``rl_otel/ops/engines.py``'s table of ``vllm/v1/metrics/loggers.py``, 275 lines at max_model_len 4096) in
prometheus_client's registry, served by rl_otel's endpoint with ``engines=True`` against ``engines=False``.

    python benchmarks/bench_engines.py [--repeat 21] [--engines 1]

Measured in-process, in ``--repeat`` interleaved rounds (medians): ``collect()`` of the engine collector alone
(prometheus_client's ``registry.collect()`` and the conversion), and a whole scrape over HTTP (a warm one, between
two steps: the store's bytes cached, live families fresh) with the engine's families and without, rendered
in-process and over HTTP (where the endpoint's CPU governor paces a costly scrape).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _families(registry, engines: int) -> None:
    from prometheus_client import Counter, Gauge, Histogram

    from rl_otel.ops.engines import VLLM_FAMILIES, VLLM_FINISH_REASONS

    one_two_five = [m * 10 ** e for e in range(5) for m in (1, 2, 5) if m * 10 ** e <= 4096]
    labels = ["model_name", "engine"]
    for name, kind, buckets in VLLM_FAMILIES:
        if kind == "histogram":
            bounds = one_two_five if buckets == "1-2-5" else [float(i + 1) for i in range(int(buckets))]
            metric = Histogram(name, name, labels, registry=registry, buckets=bounds)
        else:
            metric = (Counter if kind == "counter" else Gauge)(name, name, labels, registry=registry)
        for e in range(engines):
            child = metric.labels("Qwen/Qwen2.5-7B", str(e))
            child.observe(3) if kind == "histogram" else (child.inc() if kind == "counter" else child.set(1))
    success = Counter("vllm:request_success", "requests", [*labels, "finished_reason"], registry=registry)
    for e in range(engines):
        for reason in VLLM_FINISH_REASONS:
            success.labels("Qwen/Qwen2.5-7B", str(e), reason).inc()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=21)
    parser.add_argument("--engines", type=int, default=1, help="engine cores (vLLM's engine label values)")
    args = parser.parse_args()

    from prometheus_client import REGISTRY, CollectorRegistry

    import rl_otel
    from rl_otel._internal.exporters.engines import EngineFamilies, EnginesConfig

    registry = CollectorRegistry()
    _families(registry, args.engines)
    REGISTRY.register(registry)
    collector = EngineFamilies(EnginesConfig(), rank=0, max_series_per_metric=10_000, count=lambda r: None)
    tels = {on: rl_otel.init(run=f"bench-{on}", prometheus={"host": "127.0.0.1", "port": 0}, engines=on,
                             handle_sigterm=False) for on in (True, False)}
    for tel in tels.values():
        tel.log({"actor/pg_loss": 0.1, "critic/score/mean": 1.0}, step=0)
    collect, scrape, render = [], {True: [], False: []}, {True: [], False: []}
    lines = 0
    for _ in range(args.repeat):
        t = time.perf_counter()
        lines = len(collector.collect())
        collect.append(time.perf_counter() - t)
        for on, tel in tels.items():
            t = time.perf_counter()
            tel._components.registry.render()  # what the HTTP thread runs (no governor, no transport)
            render[on].append(time.perf_counter() - t)
            t = time.perf_counter()
            urllib.request.urlopen(tel.metrics_url, timeout=10).read()
            scrape[on].append(time.perf_counter() - t)
    for tel in tels.values():
        tel.close()
    REGISTRY.unregister(registry)
    on, off = statistics.median(scrape[True]), statistics.median(scrape[False])
    print(f"engine series collected: {lines} (one vLLM V1 engine: {args.engines} engine core(s))")
    print(f"collect() of the engine families: {statistics.median(collect) * 1e3:.2f} ms (median)")
    r_on, r_off = statistics.median(render[True]), statistics.median(render[False])
    print(f"render in-process: {r_on * 1e3:.2f} ms with the engine's families, {r_off * 1e3:.2f} ms without")
    print("warm scrape over HTTP (the endpoint's CPU governor paces costly scrapes): "
          f"{on * 1e3:.2f} ms with the engine's families, {off * 1e3:.2f} ms without "
          f"(ratio {on / off:.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
