"""The stdout sink: a short summary line per step on a terminal by default, ROLL's grep-able ``metrics_tag:`` JSON
line in a file or on request, or a table."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from rl_otel.sinks.stdout import TAG, StdoutSink, render_table


def test_one_json_line_per_step(capsys):
    sink = StdoutSink(run="r", format="json")
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
    sink = StdoutSink(run="r", file=str(out))  # a file gets the JSON line (programs read it)
    sink.log({"env/reward_dist": np.array([1.0, 2.0, 3.0]), "a": 1.0}, 0)
    sink.close()
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


ROLL_STEP = {"critic/score/mean": 0.41, "critic/score/max": 1.0, "actor/approxkl": 0.00312, "actor/pg_loss": -0.0042,
             "critic/entropy/mean": 1.31, "actor/ppo_ratio_clipfrac": 0.031, "system/tps": 8283.4,
             **{f"memory/actor_train/train_step/end/onload/allocated/{d}": 12.5 for d in range(8)},
             **{f"time/actor_train/train_step/{p}": 0.5 for p in ("total", "onload", "execute", "offload")},
             "actor/ratio_dist": np.linspace(0.5, 1.5, 4096)}


def test_the_default_on_a_stream_is_a_short_summary_line(capsys):
    """What a person reads: a few key values of the step, whatever framework named them; never the whole dict."""
    sink = StdoutSink(run="r")
    sink.log(ROLL_STEP, 40)
    sink.log({"reward": 0.5, "kl": 0.01, "entropy": 0.9, "loss": 0.2, "clip_ratio/region_mean": 0.1}, 41)  # TRL
    sink.log({"rollout/reward/mean": 0.7, "eval/gsm8k/accuracy/mean@4": 0.61, "my/own": 3.0}, 42)  # Trinity-RFT
    sink.close()
    lines = capsys.readouterr().out.splitlines()
    # the KL to the reference (TRL's kl) and the old->new policy KL (ROLL's approxkl) each by its own name
    assert lines == ["step 40  reward=0.41 kl_old=0.00312 entropy=1.31 loss=-0.0042 tok/s=8283",
                     "step 41  reward=0.5 kl_ref=0.01 entropy=0.9 loss=0.2",
                     "step 42  reward=0.7 eval=0.61"]


def test_every_n_steps_and_chosen_keys(capsys):
    sink = StdoutSink(run="r", every=10, keys=["actor/pg_loss", "custom/x", "actor/ratio_dist"])
    for step in range(25):
        sink.log({**ROLL_STEP, "custom/x": float(step)}, step)
    sink.close()
    assert capsys.readouterr().out.splitlines() == [
        f"step {s}  actor/pg_loss=-0.0042 custom/x={s} actor/ratio_dist=1" for s in (0, 10, 20)]


def test_a_terminal_line_clears_a_progress_bar_first():
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Tty()
    sink = StdoutSink(run="r")
    sink._file = out  # what the sink writes to (the user's terminal)
    sink.log({"reward": 1.0}, 0)
    assert out.getvalue() == "\r\x1b[Kstep 0  reward=1\n"


@pytest.mark.parametrize("kwargs, match", [
    ({"format": "yaml"}, "format"), ({"every": 0}, "every"), ({"every": True}, "every"), ({"keys": "reward"}, "keys"),
])
def test_bad_options_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        StdoutSink(run="r", **kwargs)


def test_the_full_dict_on_request_through_init(tmp_path, capsys):
    import rl_otel

    with rl_otel.init(run="r", prometheus=False, handle_sigterm=False,
                      trackers={"stdout": {"format": "json"}}) as tel:
        tel.log(ROLL_STEP, step=3)
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith(TAG))
    got = json.loads(line[len(TAG):])
    assert got["step"] == 3 and set(got["metrics"]) == set(ROLL_STEP)
