"""The recorder's one write and one read (issue 34): no read path writes. A scrape, an OTLP collection,
``tel.value()`` and a live gauge that fails leave the store's version, the router's cache and its fallback names as
they were; what a reader absorbs is counted outside the store and still served."""

from __future__ import annotations

import contextlib

from rl_otel._internal.exporters.otlp_push import store_metrics
from rl_otel._internal.exporters.prometheus import ScrapeEndpoint
from rl_otel._internal.runtime.assembly import Pipeline, pipeline
from rl_otel._internal.runtime.serving import scrape_registry
from rl_otel.catalog import default_catalog, live
from tests.promtools import samples, scrape


def _state(parts: Pipeline) -> tuple:
    router = parts.ingest.router
    return (parts.store.version, dict(router._cache), dict(router._fallback_owner))


def test_reads_that_count_errors_leave_the_store_and_the_router_as_they_were():
    def broken():
        raise RuntimeError("a live gauge's source failed")

    parts = pipeline(default_catalog(), {"run": "reads", "role": "trainer", "rank": "0"}, collectors=[broken])
    diag = parts.diagnostics
    registry = scrape_registry(parts.reads.collect, lambda reason: diag.count("prometheus", reason), parts.store.clock)
    endpoint = ScrapeEndpoint(registry, "127.0.0.1", 0)
    with contextlib.closing(endpoint):
        parts.log({"critic/score/mean": 0.5, "custom/known": 1.0}, step=1)
        before = _state(parts)
        for _ in range(3):  # scrapes that each absorb an error
            text = scrape(endpoint.url)
            assert "rl_critic_score" in text
        store_metrics(parts.recorder.collect())  # what the OTLP push reads
        assert parts.value("never/logged/key") is None  # a key that would claim a fallback name if it were written
        assert parts.value("critic/values/mean") is None  # a catalog key never logged
        assert parts.value("critic/score/mean") == 0.5
        assert _state(parts) == before
        # the errors were counted all the same, outside the store, and are served
        errors = samples(scrape(endpoint.url), "rl_telemetry_errors_total")
        counted = {dict(k)["reason"]: v for k, v in errors.items() if dict(k)["sink"] == "live"}
        assert counted == {"collector": 8.0}  # 3 + 1 scrapes, 1 OTLP collection, 3 value() reads
        assert _state(parts) == before


def test_collect_without_a_write_returns_the_same_stored_snapshot():
    calls = iter(range(1, 100))
    recorder = pipeline(default_catalog(), {"run": "r", "role": "trainer", "rank": "0"},
                        collectors=[lambda: [(live.PROCESS_RSS, (), float(next(calls)))]])
    recorder.log({"critic/score/mean": 1.0}, 0)
    first, second = recorder.collect(), recorder.collect()
    assert first.stored is second.stored  # nothing written: the same frozen families
    assert first.value("rl_process_resident_memory_bytes") != second.value("rl_process_resident_memory_bytes")
    recorder.log({"critic/score/mean": 2.0}, 1)
    third = recorder.collect()
    assert third.stored is not second.stored and third.value("rl_critic_score", {"stat": "mean"}) == 2.0
    assert second.value("rl_critic_score", {"stat": "mean"}) == 1.0  # a snapshot never changes once taken
