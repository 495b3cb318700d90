"""The recorder's one write and one read (issue 34): no read path writes. A scrape, an OTLP collection,
``tel.value()`` and a live gauge that fails leave the store's version, the router's cache and its fallback names as
they were; what a reader absorbs is counted outside the store and still served."""

from __future__ import annotations

import rl_otel
from rl_otel._internal.exporters.otlp_push import store_metrics
from rl_otel._internal.pipeline.recorder import Recorder
from rl_otel.catalog import default_catalog, live
from tests.promtools import samples, scrape


def _state(tel) -> tuple:
    recorder = tel._recorder
    return (recorder.store.version, dict(recorder.router._cache), dict(recorder.router._fallback_owner))


def test_reads_that_count_errors_leave_the_store_and_the_router_as_they_were():
    with rl_otel.init(run="reads", prometheus={"host": "127.0.0.1", "port": 0}, handle_sigterm=False) as tel:
        tel.log({"critic/score/mean": 0.5, "custom/known": 1.0}, step=1)
        recorder = tel._recorder

        def broken():
            raise RuntimeError("a live gauge's source failed")

        recorder.add_collector(broken)
        before = _state(tel)
        for _ in range(3):  # scrapes that each absorb an error
            text = scrape(tel.metrics_url)
            assert "rl_critic_score" in text
        store_metrics(recorder.collect())  # what the OTLP push reads
        assert tel.value("never/logged/key") is None  # a key that would claim a fallback name if it were written
        assert tel.value("critic/values/mean") is None  # a catalog key never logged
        assert tel.value("critic/score/mean") == 0.5
        assert _state(tel) == before
        # the errors were counted all the same, outside the store, and are served
        errors = samples(scrape(tel.metrics_url), "rl_telemetry_errors_total")
        counted = {dict(k)["reason"]: v for k, v in errors.items() if dict(k)["sink"] == "live"}
        assert counted == {"collector": 8.0}  # 3 + 1 scrapes, 1 OTLP collection, 3 value() reads
        assert _state(tel) == before


def test_collect_without_a_write_returns_the_same_stored_snapshot():
    recorder = Recorder(default_catalog(), {"run": "r", "role": "trainer", "rank": "0"})
    recorder.log({"critic/score/mean": 1.0}, 0)
    calls = iter(range(1, 100))
    recorder.add_collector(lambda: [(live.PROCESS_RSS, (), float(next(calls)))])
    first, second = recorder.collect(), recorder.collect()
    assert first.stored is second.stored  # nothing written: the same frozen families
    assert first.value("rl_process_resident_memory_bytes") != second.value("rl_process_resident_memory_bytes")
    recorder.log({"critic/score/mean": 2.0}, 1)
    third = recorder.collect()
    assert third.stored is not second.stored and third.value("rl_critic_score", {"stat": "mean"}) == 2.0
    assert second.value("rl_critic_score", {"stat": "mean"}) == 1.0  # a snapshot never changes once taken
