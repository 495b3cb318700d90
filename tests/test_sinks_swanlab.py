"""The SwanLab sink in offline mode (no network), read back with SwanLab's own DataStoreReader."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("swanlab")

from rl_otel.sinks.swanlab import SwanLabSink
from tests._readers import swanlab_scalars


def test_roll_kwargs_offline_read_back(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    # ROLL's tracker_kwargs, verbatim: login_kwargs, project, logdir, experiment_name, tags
    sink = SwanLabSink(run="r", login_kwargs={"api_key": "not-used-offline"}, project="roll-experiments",
                       logdir=str(tmp_path / "swanlog"), experiment_name="exp", tags=["roll", "rl"], mode="offline")
    logged = {}
    for step in (0, 1, 4):
        metrics = {"actor/pg_loss": 0.5 + step, "critic/score/mean": float(step),
                   "env/reward_dist": np.array([1.0, 2.0])}
        sink.log(metrics, step)
        logged[step] = metrics
    sink.close()
    scalars = swanlab_scalars(str(tmp_path / "swanlog"))
    assert set(scalars) == {"actor/pg_loss", "critic/score/mean"}  # SwanLab 0.10 has no histogram type
    for key, points in scalars.items():
        assert points == [(s, pytest.approx(logged[s][key])) for s in (0, 1, 4)]
