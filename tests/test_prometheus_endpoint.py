"""Each pitfall of opentelemetry-exporter-prometheus 0.66b2 named in DESIGN.md, provoked and checked."""

from __future__ import annotations

import collections
import copy
import re
import threading

import pytest
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families

import rl_otel
from rl_otel._internal.exporters.prometheus import families
from rl_otel.catalog import Kind, default_catalog
from tests.promtools import OPENMETRICS, promtool_check, scrape


def type_lines(text: str) -> list[str]:
    return re.findall(r"^# TYPE (\S+)", text, flags=re.M)


def test_no_duplicate_help_or_type_even_when_provoked(tel):
    # 1. keys that sanitize to one name, and a key that sanitizes onto a catalog name
    tel.log({"custom/a-x": 1.0, "custom/a_x": 2.0, "custom/A.X": 3.0, "rl_critic/loss": 4.0, "critic/loss": 5.0,
             "actor/pg_loss": 1.0, "actor/pg_loss@sum": 2.0, "actor/pg_loss@mean": 3.0}, step=0)
    # 2. a user's SDK instruments on the same endpoint (tel.meter_provider: an SDK PrometheusMetricReader on the
    # endpoint's registry, with a target_info of its own): one with a catalog name, two sharing a name with other
    # units
    meter = tel.meter_provider.get_meter("intruder")  # the documented way onto the same endpoint
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
    assert "rl_critic_loss 5.0" in text.replace('{rank="0",role="trainer",run="test"}', "")
    assert re.search(r'rl_telemetry_errors_total\{rank="0",reason="duplicate_family",role="trainer",run="test",'
                     r'sink="prometheus"\}', text)
    assert text.count("target_info{") == 1 and 'rl_run="test"' in text  # rl_otel's, not the intruder's


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
    ctx = SpanContext(trace_id=0x1234, span_id=0x5678, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    with trace.use_span(NonRecordingSpan(ctx)):  # values recorded inside a sampled span
        tel.log({"env/reward_dist": [0.5, 2.0], "actor/lr": 1.0}, step=0)
        with tel.phase("actor_train", "train_step"):
            pass
    text = scrape(tel.metrics_url, accept=OPENMETRICS)
    assert "rl_env_reward_dist_bucket" in text and "rl_phase_duration_seconds_bucket" in text
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


def test_build_info_and_target_info_are_store_families():
    """One pipeline: build_info and target_info (the OTel resource as Prometheus' target_info convention says: an
    info family in OpenMetrics, a gauge in the text format, the resource's attributes as labels, no run/rank) are
    written into the series store at init, served like every other family and readable with Telemetry.value."""
    with rl_otel.init(run="info", rank=3, role="actor", prometheus={"host": "127.0.0.1", "port": 0},
                      handle_sigterm=False) as tel:
        attrs = {k.replace(".", "_"): str(v) for k, v in tel.resource.attributes.items()}
        assert attrs["rl_run"] == "info" and attrs["rl_rank"] == "3" and attrs["rl_role"] == "actor"
        assert tel.value("rl_otel_build_info", version=rl_otel.__version__) == 1.0
        assert tel.value("target_info", **attrs) == 1.0
        text, om = scrape(tel.metrics_url), scrape(tel.metrics_url, accept=OPENMETRICS)
        assert promtool_check(text) == ""
    labels = ",".join(f'{k}="{v}"' for k, v in sorted(attrs.items()))
    assert f"# TYPE target_info gauge\ntarget_info{{{labels}}} 1.0\n" in text
    assert f"# HELP target Target metadata\n# TYPE target info\ntarget_info{{{labels}}} 1.0\n" in om
    build = f'rl_otel_build_info{{rank="3",role="actor",run="info",version="{rl_otel.__version__}"}} 1.0\n'
    assert f"# TYPE rl_otel_build_info gauge\n{build}" in text and build in om


@pytest.mark.parametrize("accept", [None, OPENMETRICS])
def test_name_filters_serve_what_prometheus_clients_restricted_registry_does(tel, accept):
    """``?name[]=`` cuts the rendered scrape to the named samples, as prometheus_client's restricted registry
    does to the full scrape's families (what the endpoint served when it parsed its own rendering back)."""
    tel.log({"actor/lr": 1.0, "critic/score/mean": 0.5, "env/reward_dist": [0.5, 2.0], "system/samples": 3,
             "tokens/responses_dist": [3, 100], "custom/x": 2.0}, step=0)
    tel.log({"actor/kl_loss": "bad"}, step=1)  # a counter sample: rl_telemetry_errors_total
    full = list(text_string_to_metric_families(scrape(tel.metrics_url, accept=OPENMETRICS)))
    encode = generate_openmetrics if accept else generate_latest
    filters = [["rl_actor_learning_rate"], ["rl_step", "rl_custom_x"], ["rl_env_reward_dist_bucket"],
               ["rl_tokens_responses_length_dist_count", "rl_tokens_responses_length_dist_sum"],
               ["rl_telemetry_errors_total", "rl_system_samples_total"], ["target_info", "rl_otel_build_info"],
               ["no_such_metric"]]
    for names in filters:
        kept = []
        for family in full:
            samples = [s for s in family.samples if s.name in names]
            if samples and not family.name.startswith("rl_process_"):  # live values move between scrapes
                family = copy.copy(family)
                family.samples = samples
                kept.append(family)
        query = "&".join(f"name[]={name}" for name in names)
        assert scrape(f"{tel.metrics_url}?{query}", accept=accept) == encode(families(*kept)).decode(), names
