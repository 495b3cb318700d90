"""The stdout sink: one grep-able ``metrics_tag:`` JSON line per step, an optional table."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rl_otel.sinks.stdout import TAG, StdoutSink, render_table


def test_one_json_line_per_step(capsys):
    sink = StdoutSink(run="r")
    sink.log({"actor/pg_loss": 0.5, "critic/score/mean": float("nan")}, 3)
    sink.log({"actor/pg_loss": 0.25}, 4)
    sink.close()
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith(TAG)]
    assert len(lines) == 2
    first = json.loads(lines[0][len(TAG):])
    assert first["step"] == 3 and first["metrics"]["actor/pg_loss"] == 0.5
    assert np.isnan(first["metrics"]["critic/score/mean"])
    assert json.loads(lines[1][len(TAG):]) == {"step": 4, "metrics": {"actor/pg_loss": 0.25}}


def test_distribution_as_summary_and_table(tmp_path):
    out = tmp_path / "train.log"
    sink = StdoutSink(run="r", file=str(out), table=True)
    sink.log({"env/reward_dist": np.array([1.0, 2.0, 3.0]), "a": 1.0}, 0)
    sink.close()
    text = out.read_text()
    line = next(x for x in text.splitlines() if x.startswith(TAG))
    assert json.loads(line[len(TAG):])["metrics"]["env/reward_dist"] == {"count": 3, "mean": 2.0, "min": 1.0,
                                                                          "max": 3.0}
    assert "-- step 0" in text and "2 [1, 3] n=3" in text


def test_table_alignment():
    table = render_table({"a": 1.0, "long/key": 0.123456}, 9)
    lines = table.splitlines()
    assert lines[0].startswith("-- step 9")
    assert lines[1] == "a         1" and lines[2] == "long/key  0.1235"


def test_bad_stream_is_refused():
    with pytest.raises(ValueError, match="stream"):
        StdoutSink(run="r", stream="stdlog")
