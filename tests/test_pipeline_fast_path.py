"""The one-vector write of a common step (a flat dict of numbers whose key set was seen before) serves exactly what
the key-by-key path serves, and gives way to it whenever a step is not of that kind."""

from __future__ import annotations

import numpy as np

import rl_otel
from tests.promtools import scrape

KEYS = ["actor/pg_loss", "critic/score/mean", "time/actor_train/train_step/execute", "system/batch_size",
        "memory/cpu/actor_train/train_step/start/rss", "custom/my_metric", "actor/approxkl"]


def _served(tel) -> list[str]:
    return sorted(line for line in scrape(tel.metrics_url).splitlines()
                  if line and not line.startswith("#") and not line.startswith(("rl_process_", "rl_gpu_", "target_info",
                                                                                 "rl_otel_build_info",
                                                                                 "rl_last_step_timestamp")))


def _steps(rng):
    for step in range(12):
        values = rng.random(len(KEYS))
        row: dict = {k: float(v) for k, v in zip(KEYS, values, strict=True)}
        row["system/batch_size"] = int(step + 1)  # an int, as ROLL logs it
        row["actor/approxkl"] = np.float32(values[-1]) if step % 3 else float("nan")
        if step == 5:
            row["actor/pg_loss"] = None  # no value this step: the per-key path removes the series
        if step == 7:
            row["critic/score/mean"] = 10**400  # an int too large for a float: refused on both paths
        yield step, row


def test_the_vector_write_serves_what_the_per_key_path_serves():
    fast = rl_otel.init(run="p", prometheus={"host": "127.0.0.1", "port": 0}, handle_sigterm=False)
    slow = rl_otel.init(run="p", prometheus={"host": "127.0.0.1", "port": 0}, handle_sigterm=False)
    try:
        for (step, row), (_, same) in zip(_steps(np.random.default_rng(3)), _steps(np.random.default_rng(3)),
                                          strict=True):
            fast.log(row, step=step)
            slow.log({"nested": {}, **same}, step=step)  # a nested dict: never the vector path
            assert _served(fast) == _served(slow), step
        for step in (20, 15, 21):  # a history step (15) sets nothing back on either path
            row = {k: float(step) for k in KEYS}
            fast.log(row, step=step)
            slow.log({"nested": {}, **row}, step=step)
            assert _served(fast) == _served(slow), step
    finally:
        fast.close()
        slow.close()


def test_a_series_removed_by_its_ttl_comes_back_on_the_vector_path():
    tel = rl_otel.init(run="ttl", prometheus={"host": "127.0.0.1", "port": 0}, series_ttl_s=0.05,
                       handle_sigterm=False)
    try:
        row = {"actor/pg_loss": 1.0, "critic/score/mean": 2.0}
        tel.log(row, step=0)
        tel.log(row, step=1)  # the key set's points are held from here on
        import time

        deadline = time.monotonic() + 30
        while tel.value("actor/pg_loss") is not None and time.monotonic() < deadline:  # expired by a read
            time.sleep(0.01)
        assert tel.value("actor/pg_loss") is None
        tel.log({"actor/pg_loss": 3.0, "critic/score/mean": 4.0}, step=2)
        assert tel.value("actor/pg_loss") == 3.0 and tel.value("critic/score/mean") == 4.0
    finally:
        tel.close()
