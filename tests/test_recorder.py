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


def _mutable_parts(obj: object, path: str = "snapshot") -> list[str]:
    """Where a snapshot holds something that could change after it was taken (a list, a dict, a set)."""
    from rl_otel._internal.pipeline.records import Family, HistogramValue, Point
    from rl_otel._internal.pipeline.snapshot import Snapshot
    from rl_otel._internal.pipeline.store import StoreSnapshot

    if isinstance(obj, (list, dict, set, bytearray)):
        return [f"{path}: a {type(obj).__name__}"]
    if isinstance(obj, Snapshot):
        return _mutable_parts(obj.stored, f"{path}.stored") + _mutable_parts(obj.live, f"{path}.live")
    if isinstance(obj, StoreSnapshot):
        return (_mutable_parts(obj.numbers, f"{path}.numbers") + _mutable_parts(obj.hists, f"{path}.hists")
                + _mutable_parts(obj.families, f"{path}.families"))
    if isinstance(obj, (Family, Point, HistogramValue)) or type(obj) is tuple:
        return [bad for i, item in enumerate(obj) for bad in _mutable_parts(item, f"{path}[{i}]")]
    return []


def test_a_snapshot_is_immutable_all_the_way_down():
    """Issue 40: what a reader gets holds no list, dict or set (a reader cannot change it, nor can a later write),
    and none of its attributes can be set; ``tel.value()`` hands a histogram's counts as the caller's own list."""
    import numpy as np
    import pytest

    from rl_otel._internal.pipeline.records import HistogramValue

    parts = pipeline(default_catalog(), {"run": "r", "role": "trainer", "rank": "0"},
                     collectors=[lambda: [(live.PROCESS_RSS, (), 1.0)]])
    parts.log({"critic/score/mean": 1.0, "actor/ratio_dist": np.array([0.5, 1.0, 1.5]), "my/own_key": 2.0}, 0)
    snapshot = parts.collect()
    assert snapshot.stored.families and snapshot.live, "the snapshot has both parts to look into"
    assert _mutable_parts(snapshot) == []
    with pytest.raises(AttributeError):
        snapshot.live = ()  # type: ignore[misc]
    with pytest.raises(AttributeError):
        snapshot.stored.numbers = ()  # type: ignore[misc]
    given = parts.value("actor/ratio_dist")
    assert isinstance(given, HistogramValue) and isinstance(given.counts, list) and given.count == 3
    given.counts.clear()  # the caller's own: the next read is whole
    again = parts.value("actor/ratio_dist")
    assert isinstance(again, HistogramValue) and sum(again.counts) == 3
    assert _mutable_parts([]) == ["snapshot: a list"]  # the walk finds what it looks for


def test_backfill_reads_only_the_series_each_point_wrote(tmp_path, monkeypatch):
    """Issue 40: a backfill is linear in its points: each point reads back the series it wrote (``collect(only=)``),
    never the whole store, however many series the run has made by then (benchmarks/bench_backfill.py times it)."""
    import json

    from rl_otel._internal.pipeline.recorder import Recorder
    from rl_otel.watch.backfill import backfill

    reads: list[int] = []
    real = Recorder.collect

    def counting(self, *, on_error=None, only=None):
        snapshot = real(self, on_error=on_error, only=only)
        reads.append(sum(len(fam.points) for fam in snapshot.stored.families))
        assert only is not None, "a point read the whole store"
        return snapshot

    monkeypatch.setattr(Recorder, "collect", counting)
    run = tmp_path / "run"
    run.mkdir()
    points = 300
    with open(run / "metrics.jsonl", "w") as f:
        for i in range(points):  # each point makes a series of its own: the store grows to 300 + 3 series
            f.write(json.dumps({"step": i, "timestamp": 1.7e9 + i, f"eval/task{i}/accuracy/mean@4": 0.5,
                                "critic/score/mean": 0.1}) + "\n")
    summary = backfill([str(run)], tmp_path / "out.om", framework="verl")
    assert summary.series > points
    assert len(reads) == points and max(reads) == 4  # its two keys, rl_step, rl_last_step_timestamp_seconds
