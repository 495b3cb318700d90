"""One path for every step: a step serves the same whatever shape it is logged in (flat or nested, ints, numpy
scalars, ``None``, a value too large for a float, a history step), and a series removed by its TTL comes back at
its next write."""

from __future__ import annotations

import numpy as np

import rl_otel
from rl_otel._internal.runtime.assembly import pipeline
from rl_otel.catalog import default_catalog
from tests.promtools import scrape

KEYS = ["actor/pg_loss", "critic/score/mean", "time/actor_train/train_step/execute", "system/batch_size",
        "memory/cpu/actor_train/train_step/start/rss", "custom/my_metric", "actor/approxkl"]


# what differs between two endpoints fed the same steps: live values, clocks, the process's resource
_TIME_DEPENDENT = ("rl_process_", "rl_gpu_", "target_info", "rl_goodput_", "rl_otel_build_info",
                   "rl_last_step_timestamp", "rl_last_progress_timestamp")


def _served(tel) -> list[str]:
    return sorted(line for line in scrape(tel.metrics_url).splitlines()
                  if line and not line.startswith("#") and not line.startswith(_TIME_DEPENDENT))


def _steps(rng):
    for step in range(12):
        values = rng.random(len(KEYS))
        row: dict = {k: float(v) for k, v in zip(KEYS, values, strict=True)}
        row["system/batch_size"] = int(step + 1)  # an int, as ROLL logs it
        row["actor/approxkl"] = np.float32(values[-1]) if step % 3 else float("nan")
        if step == 5:
            row["actor/pg_loss"] = None  # no value this step: the series is removed
        if step == 7:
            row["critic/score/mean"] = 10**400  # an int too large for a float: refused
        yield step, row


def _nested(row: dict) -> dict:
    nested: dict = {"nested": {}}
    for key, value in row.items():
        head, _, tail = key.partition("/")
        nested.setdefault(head, {})[tail] = value
    return nested


def test_a_flat_step_and_the_same_step_nested_serve_the_same():
    flat = rl_otel.init(run="p", prometheus={"host": "127.0.0.1", "port": 0}, handle_sigterm=False)
    nested = rl_otel.init(run="p", prometheus={"host": "127.0.0.1", "port": 0}, handle_sigterm=False)
    try:
        for (step, row), (_, same) in zip(_steps(np.random.default_rng(3)), _steps(np.random.default_rng(3)),
                                          strict=True):
            flat.log(row, step=step)
            nested.log(_nested(same), step=step)
            assert _served(flat) == _served(nested), step
        assert "rl_actor_pg_loss{" in "".join(_served(flat))  # back after the step that removed it
        for step in (20, 15, 21):  # a history step (15) sets nothing back
            row = {k: float(step) for k in KEYS}
            flat.log(row, step=step)
            nested.log(_nested(row), step=step)
            assert _served(flat) == _served(nested), step
        assert 'rl_step{rank="0",role="trainer",run="p"} 21.0' in _served(flat)
    finally:
        flat.close()
        nested.close()


def test_a_series_removed_by_its_ttl_comes_back_at_its_next_write():
    now = [10**18]
    recorder = pipeline(default_catalog(), {"run": "ttl", "rank": "0"}, max_unknown_keys=100, series_ttl_s=1.0,
                        clock=lambda: now[0])
    row = {"actor/pg_loss": 1.0, "critic/score/mean": 2.0}
    recorder.log(row, 0)
    recorder.log(row, 1)
    layout = recorder.collect().stored.layout
    now[0] += 2_000_000_000
    snapshot = recorder.collect()
    assert snapshot.value("rl_actor_pg_loss") is None and snapshot.stored.layout is None  # expired: left out
    assert snapshot.value("rl_step") == 1.0  # liveness never expires
    recorder.log({"actor/pg_loss": 3.0}, 2)  # the write removes what expired, then writes
    snapshot = recorder.collect()
    assert snapshot.value("rl_actor_pg_loss") == 3.0 and snapshot.value("rl_critic_score", {"stat": "mean"}) is None
    assert snapshot.stored.layout is not None and snapshot.stored.layout != layout
