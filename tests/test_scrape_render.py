"""The cached, direct rendering of the scrape: byte for byte the stock exporter's text, never stale, gzip right."""

from __future__ import annotations

import gzip
import itertools
import re
import threading
import time
import urllib.request

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.prometheus import _CustomCollector
from opentelemetry.sdk.metrics.export import MetricsData, ResourceMetrics, ScopeMetrics
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.utils import floatToGoString

import rl_otel
from rl_otel._internal.exporters.exposition import Renderer
from rl_otel._internal.exporters.otlp_push import to_metric
from rl_otel._internal.exporters.prometheus import families
from rl_otel._internal.exporters.textformat import EOF, OPENMETRICS, TEXT, go_float
from rl_otel.catalog import Kind, default_catalog, live
from tests.promtools import OPENMETRICS as OPENMETRICS_ACCEPT
from tests.promtools import promtool_check, scrape


def stock_text(views, fmt: str) -> str:
    """What the stock path writes for the store's families: OTel Metrics (``otlp_push.to_metric``) -> the
    exporter's translation -> prometheus_client's encoder (rl_otel's scrape path before it rendered directly);
    an info family (``target_info``) is the exporter's target_info of a resource with the series' labels."""
    chunks = []
    for info, group in itertools.groupby(views, key=lambda view: view.spec.kind is Kind.INFO):
        for part in ([[view] for view in group] if info else [list(group)]):
            text = _stock(part, fmt, info)
            chunks.append(text[:-len(EOF)] if fmt == OPENMETRICS else text)
    return "".join(chunks) + (EOF if fmt == OPENMETRICS else "")


def _stock(views, fmt: str, info: bool) -> str:
    collector = _CustomCollector(disable_target_info=not info, scope_info_enabled=False)
    if info:
        ((labels, _value),) = views[0].points
        metrics, resource = [], Resource(dict(views[0].base + labels))
    else:
        metrics, resource = [to_metric(view, time.time_ns()) for view in views], Resource.create({})
    scope = ScopeMetrics(scope=InstrumentationScope("rl_otel"), metrics=metrics, schema_url="")
    collector.add_metrics_data(MetricsData([ResourceMetrics(resource, [scope], schema_url="")]))
    fams = families(*collector.collect())
    return (generate_openmetrics(fams) if fmt == OPENMETRICS else generate_latest(fams)).decode()


@pytest.fixture
def fed(seed_keys):
    """Every seed key (every family of the references, histograms with negative and positive bounds), NaN and
    ±Inf, a label value that needs escaping, a counter, a refused key, phases, and the live gauges."""
    catalog = default_catalog()
    tel = rl_otel.init(run="re\"nder\\", rank=1, prometheus={"host": "127.0.0.1", "port": 0})
    metrics = {}
    for i, key in enumerate(seed_keys):
        hist = catalog.resolve(key).spec.kind is Kind.HISTOGRAM
        metrics[key] = [-3.5, 0.5, 1.0, float(i), 1e9, float("nan")] if hist else i * 1.37e-3 + 0.25
    metrics.update({"actor/pg_loss": float("nan"), "actor/lr": float("inf"), "critic/loss": -float("inf"),
                    "eval/we\"ird\\set\nx/accuracy/mean@4": 0.5, "system/samples": 12345678.0,
                    "custom/a-x": 1.0, "custom/a_x": 2.0, "tokens/responses_dist": [3, 100, 5000]})
    tel.log(metrics, step=3)
    with tel.phase("actor_train", "train_step"):
        pass
    yield tel
    tel.close()


@pytest.mark.parametrize("fmt", [TEXT, OPENMETRICS])
def test_direct_render_is_byte_for_byte_the_stock_exporters(fed, seed_keys, fmt):
    renderer = Renderer()  # one renderer across steps: its per-series caches must follow every change
    for step in range(3):
        views = fed._components.recorder.collect().families  # one collection for both (live values move)
        assert {view.spec.kind for view in views} == {Kind.GAUGE, Kind.COUNTER, Kind.HISTOGRAM, Kind.INFO}
        assert any(view.spec is live.PROCESS_RSS for view in views)
        ours = renderer.render(views, fmt, set()).text + (EOF if fmt == OPENMETRICS else "")
        assert ours.count("\n") > 500
        assert ours == stock_text(views, fmt)
        # half the keys change (histograms get more values), NaN stays NaN, the rest keep their values
        fed.log({key: [float(step)] if "dist" in key else float(step) for key in seed_keys[::2]}, step=4 + step)


@settings(max_examples=2000, deadline=None)
@given(st.one_of(st.floats(), st.integers(min_value=0, max_value=2**62),
                 st.sampled_from([0.0, -0.0, 1e6, 1234567.0, 12345678.0, 1e16, 1.5e-7, 2**53 + 0.0])))
def test_go_float_is_floattogostring(value):
    assert go_float(value) == floatToGoString(value)


def test_a_scrape_after_log_sees_the_new_values(tel):
    for step, accept, encoding in itertools.product(range(3), (None, OPENMETRICS_ACCEPT), (None, "gzip")):
        lr = step + (0.5 if accept else 0.0) + (0.25 if encoding else 0.0)
        tel.log({"actor/lr": lr}, step=step)
        text = fetch(tel.metrics_url, accept, encoding)
        assert re.search(rf'^rl_actor_learning_rate\{{rank="0",role="trainer",run="test"\}} {lr}$', text,
                         flags=re.M), text
        assert re.search(rf'^rl_step\{{rank="0",role="trainer",run="test"\}} {float(step)}$', text, flags=re.M)


def test_a_scrape_after_a_phase_sees_it_without_a_log(tel):
    tel.log({"actor/lr": 1.0}, step=0)
    for n in range(1, 4):
        with tel.phase("actor_train", "train_step"):
            pass
        text = fetch(tel.metrics_url, OPENMETRICS_ACCEPT, "gzip")
        assert re.search(rf'^rl_phase_duration_seconds_count\{{cluster="actor_train",part="total",phase="train_step",'
                         rf'rank="0",role="trainer",run="test"\}} {float(n)}$', text, flags=re.M), text


def test_live_gauges_are_fresh_at_every_scrape_between_steps():
    import contextlib

    from rl_otel._internal.exporters.prometheus import ScrapeEndpoint
    from rl_otel._internal.runtime.assembly import pipeline
    from rl_otel._internal.runtime.serving import scrape_registry

    calls = itertools.count(1)
    parts = pipeline(default_catalog(), {"run": "test", "role": "trainer", "rank": "0"},
                     collectors=[lambda: [(live.GPU_PROCESS_ALLOCATED, (("device_id", "9"),), float(next(calls)))]])
    endpoint = ScrapeEndpoint(scrape_registry(parts.reads.collect, lambda reason: None, parts.store.clock),
                              "127.0.0.1", 0)
    parts.log({"actor/lr": 1.0}, step=0)
    seen = []
    with contextlib.closing(endpoint):
        seen = _fresh_values(endpoint.url)
    assert seen == sorted(set(seen)) and len(seen) == 4  # a new value at each scrape, no log() in between


def _fresh_values(url: str) -> list[float]:
    seen = []
    for encoding in (None, "gzip", None, "gzip"):
        text = fetch(url, None, encoding)
        found = re.search(r'^rl_gpu_process_memory_allocated_bytes\{device_id="9",rank="0",role="trainer",'
                          r'run="test"\} (\S+)$', text, flags=re.M)
        assert found is not None, text
        seen.append(float(found.group(1)))
        assert "rl_actor_learning_rate{" in text
    return seen


def test_gzip_bodies_decompress_to_the_plain_scrape(tel):
    tel.log({"actor/lr": 1.0, "critic/loss": 2.0, "env/reward_dist": [0.5, 2.0]}, step=0)
    for accept in (None, OPENMETRICS_ACCEPT):
        plain = strip_live(fetch(tel.metrics_url, accept, None))
        for _ in range(3):  # the first compresses the cached render, the next ones reuse it
            assert strip_live(fetch(tel.metrics_url, accept, "gzip")) == plain
    assert promtool_check(fetch(tel.metrics_url, None, "gzip")) == ""


def test_series_past_their_ttl_leave_a_cached_scrape():
    """No write between two scrapes, a series' TTL passes: the second scrape leaves it out (the cached rendering
    does not outlive it), and the next write removes it from the store."""
    from rl_otel._internal.exporters.prometheus import ScrapeRegistry
    from rl_otel._internal.pipeline.records import Batch, Measurement
    from rl_otel._internal.runtime.assembly import pipeline

    now = [10**18]
    recorder = pipeline(default_catalog(), {"run": "ttl", "role": "trainer", "rank": "0"}, series_ttl_s=1.0,
                        clock=lambda: now[0])
    registry = ScrapeRegistry(on_duplicate=lambda name: None, collect=recorder.collect, clock=recorder.store.clock)
    lr = default_catalog().resolve("actor/lr").spec
    recorder.record(Batch([Measurement(lr, (), 1.0)], step=0))
    assert b"rl_actor_learning_rate{" in registry.render(TEXT)
    now[0] += 999_000_000
    assert b"rl_actor_learning_rate{" in registry.render(TEXT)  # within its TTL
    now[0] += 2_000_000
    text = registry.render(TEXT)  # no write in between: the cache must not outlive the series
    assert b"rl_actor_learning_rate{" not in text and b"rl_step{" in text  # rl_step never expires
    recorder.record(Batch([Measurement(lr, (), 2.0)], step=1))
    # back at its next write
    assert b'rl_actor_learning_rate{rank="0",role="trainer",run="ttl"} 2.0' in registry.render(TEXT)


def test_name_filters_are_served(tel):
    tel.log({"actor/lr": 1.0, "critic/loss": 2.0}, step=0)
    text = scrape(tel.metrics_url + "?name[]=rl_actor_learning_rate&name[]=rl_step")
    assert sorted(re.findall(r"^# TYPE (\S+)", text, flags=re.M)) == ["rl_actor_learning_rate", "rl_step"]
    assert 'rl_actor_learning_rate{rank="0",role="trainer",run="test"} 1.0' in text


def fetch(url: str, accept: str | None, encoding: str | None) -> str:
    headers = {k: v for k, v in (("Accept", accept), ("Accept-Encoding", encoding)) if v}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as response:
        body = response.read()
        assert response.headers.get("Content-Encoding") == encoding
        assert response.headers.get("Content-Type").startswith("application/openmetrics-text" if accept else
                                                               "text/plain")
    return (gzip.decompress(body) if encoding else body).decode()


def strip_live(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if not line.startswith("rl_process_"))


@pytest.mark.parametrize("fmt", [TEXT, OPENMETRICS])
def test_each_family_is_cut_whole_from_a_rendering(fed, fmt):
    """``?name[]=`` is served from the families it names: each family's cut is its part of the text, in order."""
    rendering = Renderer().render(fed._components.recorder.collect().families, fmt, set())
    parts = rendering.families()
    assert len(parts) > 80 and {p.state is not None for p in parts} == {True, False}  # histograms and others
    cuts = [rendering.text_of(set(part.samples)) for part in parts]
    assert "".join(cuts) == rendering.text == "".join(rendering.family_texts())
    for part, cut in zip(parts, cuts, strict=True):
        assert cut.startswith("# HELP ") and cut.count("# HELP ") == 1, cut
        assert all(line.split("{")[0].split(" ")[0] in part.samples for line in cut.splitlines()
                   if not line.startswith("#")), cut


def test_a_plan_is_compiled_once_per_set_of_series(tel, monkeypatch):
    """Steps with the same keys are filled into one compiled plan; a new series, a removed one (a None logged)
    compile it again - and every scrape serves the current values."""
    compiled: list[str] = []
    real = Renderer.compile

    def counting(self, families, fmt, seen):
        plan = real(self, families, fmt, seen)
        if any(isinstance(r, str) and r.startswith("rl_custom") for r in plan.records):
            compiled.append(fmt)
        return plan

    monkeypatch.setattr(Renderer, "compile", counting)
    registry = tel._components.registry
    assert registry is not None
    for step in range(3):
        tel.log({"custom/a": float(step), "custom/b": 2.0 * step}, step=step)
        assert f'rl_custom_a{{rank="0",role="trainer",run="test"}} {float(step)}\n'.encode() in registry.render(TEXT)
    assert compiled == [TEXT]
    tel.log({"custom/a": 5.0, "custom/b": 1.0, "custom/c": 7.0}, step=3)
    assert b'rl_custom_c{rank="0",role="trainer",run="test"} 7.0\n' in registry.render(TEXT)
    tel.log({"custom/a": 6.0, "custom/b": None, "custom/c": 8.0}, step=4)
    text = registry.render(OPENMETRICS)
    assert b'rl_custom_a{rank="0",role="trainer",run="test"} 6.0\n' in text and b"rl_custom_b{" not in text
    assert compiled == [TEXT, TEXT, OPENMETRICS]


def test_scrapes_while_new_series_keep_coming_are_whole_steps():
    """A step that adds series lays the store out again while scrapes read it: every scrape is one whole step, of
    every series logged so far, and parses."""
    from prometheus_client.parser import text_string_to_metric_families

    with rl_otel.init(run="grow", prometheus={"host": "127.0.0.1", "port": 0}, handle_sigterm=False) as tel:
        registry, done = tel._components.registry, threading.Event()
        assert registry is not None
        texts: list[str] = []

        def scrape_all() -> None:
            while not done.is_set():
                texts.append(registry.render(TEXT if len(texts) % 2 else OPENMETRICS).decode())

        scraper = threading.Thread(target=scrape_all)
        scraper.start()
        try:
            step = 0
            while step < 300 or len(texts) < 30:  # until the scrapes have seen many layouts
                tel.log({f"custom/k{i}": float(step) for i in range(width(step))}, step=step)
                step += 1
        finally:
            done.set()
            scraper.join()
        texts.append(registry.render(TEXT).decode())
    for text in texts:
        values = {s.name: s.value for f in text_string_to_metric_families(text.removesuffix(EOF))
                  for s in f.samples if s.name.startswith("rl_custom_k")}
        assert len(set(values.values())) <= 1, values  # one step
        if values:
            assert len(values) == width(int(next(iter(values.values()))))  # every series of that step
    assert f'rl_custom_k99{{rank="0",role="trainer",run="grow"}} {float(step - 1)}' in texts[-1]


def width(step: int) -> int:
    """Keys of a step in the test above: one more every third step, up to 400."""
    return min(step // 3 + 1, 400)


@pytest.mark.parametrize("odd", ["\u2028", "\x85", "\x1c", "\r"])
def test_name_filters_keep_series_whose_label_values_hold_line_separators_of_unicode(odd):
    """Before: ``?name[]=`` cut the text with ``str.splitlines()``, which also ends a line at U+2028, U+0085,
    \\x1c..., so a series with one in a label value was left out. The exposition's lines end at \\n only."""
    with rl_otel.init(run=f"a{odd}b", rank=0, prometheus={"host": "127.0.0.1", "port": 0},
                      handle_sigterm=False) as tel:
        tel.log({"actor/lr": 1.0}, step=3)
        whole = scrape(str(tel.metrics_url))
        cut = scrape(str(tel.metrics_url) + "?name[]=rl_actor_learning_rate&name[]=rl_step")
    expected = [line for line in whole.split("\n") if line.startswith(("rl_actor_learning_rate", "rl_step"))]
    assert len(expected) == 2 and f"a{odd}b" in expected[0]
    assert [line for line in cut.split("\n") if line and not line.startswith("#")] == expected
