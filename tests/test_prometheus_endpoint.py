"""Each pitfall of opentelemetry-exporter-prometheus 0.66b2 named in DESIGN.md, provoked and checked."""

from __future__ import annotations

import collections
import re
import threading

from opentelemetry import trace
from opentelemetry.sdk.metrics._internal.exemplar import AlwaysOffExemplarFilter
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from rl_otel.catalog import Kind, default_catalog
from tests.promtools import OPENMETRICS, promtool_check, scrape


def type_lines(text: str) -> list[str]:
    return re.findall(r"^# TYPE (\S+)", text, flags=re.M)


def test_no_duplicate_help_or_type_even_when_provoked(tel):
    # 1. keys that sanitize to one name, and a key that sanitizes onto a catalog name
    tel.log({"custom/a-x": 1.0, "custom/a_x": 2.0, "custom/A.X": 3.0, "rl_critic/loss": 4.0, "critic/loss": 5.0,
             "actor/pg_loss": 1.0, "actor/pg_loss@sum": 2.0, "actor/pg_loss@mean": 3.0}, step=0)
    # 2. SDK instruments on the same provider: one with a catalog name, two sharing a name with other units
    meter = tel._meter_provider.get_meter("intruder")
    meter.create_observable_gauge("rl_critic_loss", description="another description", unit="1",
                                  callbacks=[lambda _o: [trace_free_observation(7.0)]])
    meter.create_observable_gauge("rl_critic_loss", description="a third one", unit="s",
                                  callbacks=[lambda _o: [trace_free_observation(8.0)]])
    meter.create_counter("rl_dup", unit="By", description="one").add(1)
    meter.create_counter("rl_dup", unit="s", description="other").add(1)
    for _ in range(3):
        text = scrape(tel.metrics_url)
        om_text = scrape(tel.metrics_url, accept=OPENMETRICS)
        for body in (text, om_text):
            counts = collections.Counter(type_lines(body))
            assert [name for name, n in counts.items() if n > 1] == []
            helps = collections.Counter(re.findall(r"^# HELP (\S+)", body, flags=re.M))
            assert [name for name, n in helps.items() if n > 1] == []
        assert promtool_check(text) == ""
    assert "rl_critic_loss 5.0" in text.replace('{rank="0",run="test"}', "")
    assert re.search(r'rl_telemetry_errors_total\{rank="0",reason="duplicate_family",run="test",sink="prometheus"\}',
                     text)


def trace_free_observation(v):
    from opentelemetry.metrics import Observation

    return Observation(v, {"run": "test", "rank": "0"})


def test_no_otel_scope_labels(tel):
    tel.log({"actor/lr": 1.0, "env/reward_dist": [0.5]}, step=0)
    text = scrape(tel.metrics_url)
    assert "rl_actor_learning_rate" in text and "otel_scope" not in text


def test_histograms_use_the_catalogs_explicit_buckets(tel):
    tel.log({"tokens/responses_dist": [3, 100, 5000]}, step=0)
    text = scrape(tel.metrics_url)
    les = re.findall(r'rl_tokens_responses_length_dist_bucket\{le="([^"]+)"', text)
    spec = default_catalog().by_name("rl_tokens_responses_length_dist")
    assert spec.kind is Kind.HISTOGRAM
    assert [float(x) for x in les[:-1]] == list(spec.buckets) and les[-1] == "+Inf"
    assert "0.005" not in les  # none of the exporter's millisecond defaults


def test_exemplars_are_off(tel):
    assert isinstance(tel._meter_provider._sdk_config.exemplar_filter, AlwaysOffExemplarFilter)
    hist = tel._meter_provider.get_meter("probe").create_histogram("rl_probe_seconds", unit="s")
    ctx = SpanContext(trace_id=0x1234, span_id=0x5678, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    with trace.use_span(NonRecordingSpan(ctx)):
        hist.record(0.5)
    text = scrape(tel.metrics_url, accept=OPENMETRICS)
    assert "rl_probe_seconds_bucket" in text
    assert " # {" not in text and "trace_id" not in text


def test_concurrent_scrapes_each_see_every_series(tel):
    keys = {f"time/op{i}": float(i) for i in range(50)}
    tel.log(keys, step=0)
    stop = threading.Event()
    failures: list[str] = []

    def logger():
        step = 1
        while not stop.is_set():
            tel.log(keys, step=step)
            step += 1

    def scraper():
        for _ in range(25):
            text = scrape(tel.metrics_url)
            n = len(re.findall(r"^rl_operation_duration_seconds\{", text, flags=re.M))
            if n != 50 or "rl_step{" not in text:
                failures.append(f"scrape saw {n} of 50 series")

    log_thread = threading.Thread(target=logger)
    log_thread.start()
    scrapers = [threading.Thread(target=scraper) for _ in range(6)]
    for th in scrapers:
        th.start()
    for th in scrapers:
        th.join()
    stop.set()
    log_thread.join()
    assert failures == []


def test_gzip_is_served_when_asked(tel):
    import gzip
    import urllib.request

    tel.log({"actor/lr": 1.0}, step=0)
    req = urllib.request.Request(tel.metrics_url, headers={"Accept-Encoding": "gzip"})
    with urllib.request.urlopen(req) as resp:
        assert resp.headers.get("Content-Encoding") == "gzip"
        assert b"rl_actor_learning_rate" in gzip.decompress(resp.read())
