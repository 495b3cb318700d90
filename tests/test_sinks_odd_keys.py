"""One odd key costs only itself in every tracker. A key holding a lone surrogate (bytes decoded with
``surrogateescape``: ``eval/gsm8k-\\udce9/accuracy/mean@4``) cannot be encoded as UTF-8; TensorBoard's protobuf,
WandB and the stdout file raised ``UnicodeEncodeError`` and the whole step was gone from them. The rule: the key is
written with the surrogate escaped as text, ``eval/gsm8k-\\udce9/accuracy/mean@4`` with a literal backslash
(``backslashreplace``), and every other key of the step is written as logged. Each sink is read back with its own
reader."""

from __future__ import annotations

import json

import pytest

import rl_otel

ODD = "eval/gsm8k-\udce9/accuracy/mean@4"
WRITTEN = "eval/gsm8k-\\udce9/accuracy/mean@4"  # the surrogate as six characters of text
STEP = {"actor/pg_loss": 0.25, "critic/score/mean": 0.5, ODD: 0.75, "eval/gsm8k-é/accuracy/mean@4": 1.0}
AS_WRITTEN = {WRITTEN if k == ODD else k: v for k, v in STEP.items()}


def _log(trackers: dict, steps=(0, 1)) -> None:
    tel = rl_otel.init(prometheus=False, handle_sigterm=False, trackers=trackers)
    for step in steps:
        tel.log(dict(STEP), step=step)
    tel.close()


def test_the_rule_escapes_only_lone_surrogates():
    from rl_otel.sinks.base import text_key, text_keys

    assert text_key(ODD) == WRITTEN and text_key("eval/gsm8k-é/x") == "eval/gsm8k-é/x"
    plain = {"a": 1.0}
    assert text_keys(plain) is plain  # the common case costs no copy
    # an escaped key spelled like a key of the step already: that key keeps its value, the odd one is left out
    assert text_keys({ODD: 1.0, WRITTEN: 2.0}) == {WRITTEN: 2.0}


def test_tensorboard_writes_every_key_of_the_step(tmp_path):
    pytest.importorskip("tensorboard")
    from tests._readers import tensorboard_scalars

    _log({"tensorboard": {"log_dir": str(tmp_path / "tb")}})
    scalars = tensorboard_scalars(str(tmp_path / "tb"))
    assert {k: [s for s, _ in v] for k, v in scalars.items()} == {k: [0, 1] for k in AS_WRITTEN}
    assert scalars[WRITTEN] == [(0, 0.75), (1, 0.75)]


def test_wandb_writes_every_key_of_the_step(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from tests._readers import wandb_history

    for name, value in {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true",
                        "WANDB_CONFIG_DIR": str(tmp_path / "config"),
                        "WANDB_CACHE_DIR": str(tmp_path / "cache")}.items():
        monkeypatch.setenv(name, value)
    _log({"wandb": {"project": "p", "dir": str(tmp_path)}})
    history = wandb_history(str(tmp_path))
    assert sorted(history) == [0, 1]
    for row in history.values():
        assert {k: row.get(k) for k in AS_WRITTEN} == AS_WRITTEN


def test_swanlab_writes_every_key_of_the_step(tmp_path, monkeypatch):
    pytest.importorskip("swanlab")
    from tests._readers import swanlab_scalars

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    _log({"swanlab": {"project": "p", "logdir": str(tmp_path / "swanlog"), "mode": "offline"}})
    scalars = swanlab_scalars(str(tmp_path / "swanlog"))
    assert scalars == {k: [(0, v), (1, v)] for k, v in AS_WRITTEN.items()}  # before: the odd key was dropped


@pytest.mark.parametrize("fmt", ["json", "table", "summary"])
def test_stdout_writes_every_key_of_the_step_in_every_format(tmp_path, fmt):
    out = tmp_path / "out.log"
    options = {"file": str(out), "format": fmt}
    if fmt == "summary":
        options["keys"] = [ODD, "actor/pg_loss"]  # the odd key shown too, as it is written
    _log({"stdout": options})
    text = out.read_text(encoding="utf-8")
    if fmt == "json":
        lines = [json.loads(line[len("metrics_tag: "):]) for line in text.splitlines()]
        assert [(line["step"], line["metrics"]) for line in lines] == [(0, AS_WRITTEN), (1, AS_WRITTEN)]
    elif fmt == "table":
        rows = [line.split() for line in text.splitlines() if not line.startswith("--")]
        assert sorted(rows) == sorted([k, f"{v:.4g}"] for k, v in AS_WRITTEN.items() for _ in (0, 1))
    else:
        assert text.splitlines() == [f"step {s}  {WRITTEN}=0.75 actor/pg_loss=0.25" for s in (0, 1)]
