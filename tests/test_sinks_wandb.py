"""The WandB sink in offline mode, read back from the run's own ``.wandb`` file with wandb's protobufs."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("wandb")

from rl_otel.sinks.base import SinkError
from rl_otel.sinks.wandb import WandbSink
from tests._readers import wandb_history


@pytest.fixture
def wandb_env(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path


def test_explicit_steps_scalars_and_histograms(wandb_env):
    sink = WandbSink(run="r", project="p", dir=str(wandb_env), config={"lr": 1e-6, "api_key": "hidden"})
    logged = {}
    for step in (2, 3, 10):
        metrics = {"actor/pg_loss": 0.1 * step, "memory/actor_train/train_step/end/onload/allocated/0": 1.5,
                   "env/reward_dist": np.arange(step, dtype=np.float64)}
        sink.log(metrics, step)
        logged[step] = metrics
    sink.close()
    history = wandb_history(str(wandb_env))
    assert sorted(history) == [2, 3, 10]
    for step, row in history.items():
        assert row["_step"] == step
        assert row["actor/pg_loss"] == pytest.approx(logged[step]["actor/pg_loss"])
        assert row["memory/actor_train/train_step/end/onload/allocated/0"] == 1.5
        hist = row["env/reward_dist"]
        assert hist["_type"] == "histogram" and sum(hist["values"]) == step


def test_step_going_back_is_refused_by_us_not_dropped_by_wandb(wandb_env):
    sink = WandbSink(run="r", project="p", dir=str(wandb_env))
    sink.log({"a": 1.0}, 5)
    sink.log({"a": 2.0}, 5)  # the same step twice is fine (phase keys arrive in their own log() call)
    with pytest.raises(SinkError) as info:
        sink.log({"a": 3.0}, 4)
    assert info.value.reason == "step_out_of_order"
    sink.log({"a": 4.0}, 6)
    sink.close()
    history = wandb_history(str(wandb_env))
    assert 5 in history, history
    assert history[5]["a"] == 2.0 and 4 not in history
