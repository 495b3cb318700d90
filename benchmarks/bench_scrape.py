"""Scrape cost of a realistic node (8 GPUs, 5 clusters x 7 phases, PPO + rollout families, histograms):
rl_otel's endpoint against the stock OTel ``PrometheusMetricReader`` + prometheus_client on the same series.

    python benchmarks/bench_scrape.py [--repeat 21]

The node is fed through ``Telemetry.log`` / ``Telemetry.phase`` (``node.py``). The baseline records the very
same series (names, units, labels, values, histogram buckets) through plain OTel SDK instruments (sync gauges,
counters, histograms with the catalog's explicit buckets) read by a stock ``PrometheusMetricReader``
(``scope_info_enabled=False``, as rl_otel's) and rendered by prometheus_client's ``generate_latest``.

Measured in-process (the render, what the HTTP thread runs), in ``--repeat`` interleaved A/B rounds (the medians,
and the median of the per-round ratios):

- cold: the first scrape after a ``log()`` (rl_otel renders the store's families); the baseline has no cache,
  every scrape is cold;
- warm: a scrape between two steps (rl_otel serves the cached bytes; live gauges and SDK families fresh);
- gzip: the same with ``Accept-Encoding: gzip`` (what Prometheus sends);
- GIL: over HTTP, the longest pause and the total of the pauses of a concurrently running Python loop (a
  thread reading ``perf_counter`` in a loop) during one scrape (medians over the scrapes), each side served by
  its own HTTP server.
  CPython hands the GIL over every 5 ms (``sys.getswitchinterval()``) to a waiting thread, so a long render
  shows up as pauses of about that length, many of them; on a busy machine the OS adds its own.
"""

from __future__ import annotations

import argparse
import gzip
import statistics
import sys
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's rl_otel, not an installed one
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
from common import Row, metrics_url


def stock_reader(views):
    """A stock PrometheusMetricReader fed the same series through plain OTel instruments; its registry."""
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.sdk.metrics import Counter, Histogram, MeterProvider, _Gauge
    from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
    from prometheus_client import CollectorRegistry

    from rl_otel.catalog import Kind

    registry = CollectorRegistry(auto_describe=False)
    limits = dict.fromkeys((Counter, Histogram, _Gauge), 100000)  # the default 2,000 would fold GPU memory
    reader = PrometheusMetricReader(disable_target_info=False, scope_info_enabled=False, registry=registry,
                                    cardinality_limits=limits)  # type: ignore[arg-type]
    hist_views = [View(instrument_name=v.spec.name, aggregation=ExplicitBucketHistogramAggregation(v.spec.buckets))
                  for v in views if v.spec.kind is Kind.HISTOGRAM]
    provider = MeterProvider(metric_readers=[reader], views=hist_views)
    meter = provider.get_meter("bench")
    for view in views:
        spec = view.spec
        if spec.kind is Kind.INFO:  # target_info: the stock reader writes its own, from the provider's resource
            continue
        if spec.kind is Kind.HISTOGRAM:
            histogram = meter.create_histogram(spec.name, unit=spec.unit, description=spec.description)
            bounds = (*spec.buckets, spec.buckets[-1] + 1.0)
            for labels, h in view.points:
                attrs = dict(view.base + labels)
                for bound, n in zip(bounds, h.counts, strict=False):
                    for _ in range(min(n, 3)):  # every bucket that has values gets some: same lines
                        histogram.record(max(bound, 0.0), attrs)  # the SDK refuses negative values
        else:
            kw = {"unit": spec.unit, "description": spec.description}
            write = (meter.create_counter(spec.name, **kw).add if spec.kind is Kind.COUNTER else
                     meter.create_gauge(spec.name, **kw).set)
            for labels, value in view.points:
                if value == value:  # the SDK drops NaN anyway
                    write(value, dict(view.base + labels))
    return provider, registry


def gil_pauses_ms(url: str, scrapes: int, before_each=None) -> tuple[float, float]:
    """Medians, over ``scrapes`` HTTP scrapes of ``url`` (gzip, as Prometheus asks), of the longest pause and
    of the total of the pauses (ms, > 0.1 ms each) of a Python loop running beside the scrape, clipped to the
    scrape's window: how long the scrape kept the GIL from the training thread."""
    stop, gaps = threading.Event(), []

    def spin() -> None:
        last = time.perf_counter()
        while not stop.is_set():
            now = time.perf_counter()
            if now - last > 1e-4:
                gaps.append((last, now))
            last = now

    spinner = threading.Thread(target=spin)
    spinner.start()
    windows = []
    try:
        for i in range(scrapes):
            if before_each is not None:
                before_each(i)
            time.sleep(0.005)  # the loop runs again before the window opens: before_each's time is not counted
            start = time.perf_counter()
            urllib.request.urlopen(urllib.request.Request(url, headers={"Accept-Encoding": "gzip"})).read()
            windows.append((start, time.perf_counter()))
    finally:
        stop.set()
        spinner.join()
    inside = [[min(b, end) - max(a, start) for a, b in gaps if a < end and b > start] for start, end in windows]
    return (statistics.median(max(p, default=0.0) for p in inside) * 1e3,
            statistics.median(sum(p) for p in inside) * 1e3)


def _registry(tel):
    """The Telemetry's scrape registry (private)."""
    return tel._components.registry


UNKNOWN = 900  # keys without a catalog entry (the default cap is 1,000)


def unknown_step(rng) -> dict[str, float]:
    return {f"custom/group_{i // 30}/metric_{i}": float(v) for i, v in enumerate(rng.random(UNKNOWN))}


def hand_written(keys: list[str]):
    """prometheus_client as a user writes it for these keys: a Gauge each (run and rank labels), children cached."""
    import re

    from prometheus_client import CollectorRegistry, Gauge

    registry = CollectorRegistry(auto_describe=False)
    children = {k: Gauge(re.sub(r"[^a-zA-Z0-9_]", "_", k), k, ["run", "rank"], registry=registry).labels(
        run="bench", rank="0") for k in keys}
    return registry, children


def measure(repeat: int) -> dict[str, float]:
    import node
    from common import ab_rounds, paired_rounds
    from prometheus_client.exposition import generate_latest, start_http_server

    import rl_otel
    from rl_otel._internal.exporters.textformat import OPENMETRICS, TEXT

    tel = rl_otel.init(run="bench", prometheus={"host": "127.0.0.1", "port": 0}, handle_sigterm=False)
    out: dict[str, float] = {}
    try:
        node.feed(tel, steps=2)
        registry = _registry(tel)
        views = list(tel._components.recorder.collect().families)  # what one scrape reads
        provider, stock = stock_reader(views)
        keys, rng, ppo = node.node_keys(), np.random.default_rng(1), node.ppo_batch(1)

        def cold(fmt=TEXT, gzipped=False):
            tel.log(node.step_metrics(keys, rng, ppo))  # a new step, every value new: the next scrape renders
            t0 = time.perf_counter()
            registry.render(fmt, gzipped)
            return time.perf_counter() - t0

        def timed(fn):
            def run() -> float:
                t0 = time.perf_counter()
                fn()
                return time.perf_counter() - t0
            return run

        stock_text = timed(lambda: generate_latest(stock))
        stock_gzip = timed(lambda: gzip.compress(generate_latest(stock)))
        out["series"] = sum(len(v.points) for v in views)
        out["lines"] = registry.render(TEXT).count(b"\n")
        out["stock_lines"] = generate_latest(stock).count(b"\n")
        for label, fn, base in (("cold", cold, stock_text), ("cold_om", lambda: cold(OPENMETRICS), stock_text),
                                ("cold_gzip", lambda: cold(TEXT, True), stock_gzip)):
            t = paired_rounds([fn, base], repeat)
            out[f"{label}_ms"], out[f"{label}_base_ms"], out[f"{label}_ratio"] = (
                t.median(0) * 1e3, t.median(1) * 1e3, t.ratio(0, 1))
        for label, fn, base in (("warm", lambda: registry.render(TEXT), lambda: generate_latest(stock)),
                                ("warm_gzip", lambda: registry.render(TEXT, True),
                                 lambda: gzip.compress(generate_latest(stock)))):
            t = ab_rounds([fn, base], repeat)
            out[f"{label}_ms"], out[f"{label}_base_ms"], out[f"{label}_ratio"] = (
                t.median(0) * 1e3, t.median(1) * 1e3, t.ratio(0, 1))
        out["gil_cold_ms"], out["stall_cold_ms"] = gil_pauses_ms(
            metrics_url(tel), repeat, lambda i: tel.log(node.step_metrics(keys, rng, ppo)))
        out["gil_warm_ms"], out["stall_warm_ms"] = gil_pauses_ms(metrics_url(tel), repeat)
        server, _thread = start_http_server(0, addr="127.0.0.1", registry=stock)
        try:
            out["gil_stock_ms"], out["stall_stock_ms"] = gil_pauses_ms(
                f"http://127.0.0.1:{server.server_port}/metrics", repeat)
        finally:
            server.shutdown()
            server.server_close()
        provider.shutdown()
    finally:
        tel.close()
    out.update(measure_unknown(repeat))
    return out


def measure_unknown(repeat: int) -> dict[str, float]:
    """A store dominated by keys without a catalog entry: the first scrape after a ``log()``, and the first
    scrape after ``init()`` (a fresh Telemetry each round), against prometheus_client written by hand for the
    same keys (``generate_latest``: it has no cache, every scrape is cold)."""
    from common import paired_rounds
    from prometheus_client.exposition import generate_latest

    import rl_otel
    from rl_otel._internal.exporters.textformat import TEXT

    rng = np.random.default_rng(2)
    prom, children = hand_written(list(unknown_step(rng)))

    def theirs() -> float:
        for key, value in unknown_step(rng).items():
            children[key].set(value)
        t0 = time.perf_counter()
        generate_latest(prom)
        return time.perf_counter() - t0

    def first_after_init() -> float:
        tel = rl_otel.init(run="bench", prometheus={"host": "127.0.0.1", "port": 0}, handle_sigterm=False)
        try:
            tel.log(unknown_step(rng), step=0)
            t0 = time.perf_counter()
            _registry(tel).render(TEXT)
            return time.perf_counter() - t0
        finally:
            tel.close()

    out: dict[str, float] = {}
    t = paired_rounds([first_after_init, theirs], repeat)  # as many rounds as the other rows: a median of 10 wobbled
    out["first_ms"], out["first_base_ms"], out["first_ratio"] = t.median(0) * 1e3, t.median(1) * 1e3, t.ratio(0, 1)
    tel = rl_otel.init(run="bench", prometheus={"host": "127.0.0.1", "port": 0}, handle_sigterm=False)
    try:
        step = [0]

        def ours() -> float:
            step[0] += 1
            tel.log(unknown_step(rng), step=step[0])
            t0 = time.perf_counter()
            _registry(tel).render(TEXT)
            return time.perf_counter() - t0

        t = paired_rounds([ours, theirs], repeat)
        out["unknown_ms"], out["unknown_base_ms"], out["unknown_ratio"] = (
            t.median(0) * 1e3, t.median(1) * 1e3, t.ratio(0, 1))
    finally:
        tel.close()
    return out


def rows(quick: bool = False) -> list[Row]:
    return rows_from(measure(5 if quick else 21))


def rows_from(m: dict[str, float]) -> list[Row]:
    stock = "stock PrometheusMetricReader + generate_latest"

    def row(name: str, key: str) -> Row:
        # judged by the ratio only: an absolute bound (the earlier 10 ms) flips with the machine's load
        ratio = m[f"{key}_ratio"]
        return Row(name, m[f"{key}_ms"], m[f"{key}_base_ms"], "ms", "ratio <= 0.5", ratio <= 0.5, stock,
                   paired_ratio=ratio)

    hand = f"prometheus_client by hand, the same {UNKNOWN} keys"
    return [
        row(f"scrape render, first after log() ({m['series']:.0f} series, {m['lines']:.0f} lines)", "cold"),
        row("scrape render, first after log(), OpenMetrics", "cold_om"),
        row("scrape render + gzip, first after log()", "cold_gzip"),
        row("scrape render between steps (cached)", "warm"),
        row("scrape render + gzip between steps (cached)", "warm_gzip"),
        Row(f"scrape render, first after log(), store of {UNKNOWN} uncatalogued keys", m["unknown_ms"],
            m["unknown_base_ms"], "ms", "ratio <= 0.2", m["unknown_ratio"] <= 0.2, hand,
            paired_ratio=m["unknown_ratio"]),
        # information (issue #26): once per process, a fresh snapshot's plan compiled; a few ms nobody feels, and
        # the single write path that costs them holds every user-visible target
        Row(f"scrape render, first after init() + log(), {UNKNOWN} uncatalogued keys", m["first_ms"],
            m["first_base_ms"], "ms", "", None, hand, paired_ratio=m["first_ratio"]),
        *(Row(f"scrape over HTTP, {when}: {what} of a Python loop beside it", m[f"{key}_{at}_ms"],
              m[f"{key}_stock_ms"], "ms", "ratio <= 1", m[f"{key}_{at}_ms"] <= m[f"{key}_stock_ms"], "stock server")
          for at, when in (("cold", "first after log()"), ("warm", "between steps"))
          for key, what in (("gil", "longest pause"), ("stall", "total pauses"))),
    ]


def main() -> None:
    from common import table

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=21)
    args = parser.parse_args()
    m = measure(args.repeat)
    print(f"{m['series']:.0f} series, {m['lines']:.0f} lines (stock: {m['stock_lines']:.0f}); {args.repeat} rounds")
    print(table(rows_from(m)))


if __name__ == "__main__":
    main()
