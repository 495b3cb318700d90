"""slime: rl_otel's ``--custom-rollout-log-function-path`` / ``--custom-eval-rollout-log-function-path`` hooks,
called the way slime calls them, against a signature-faithful stand-in of ``slime.observability``
(``tests/data/standins``; the PyPI ``slime`` is an unrelated placeholder): the rollout keys slime's own logging
writes, at slime's step, while slime's own logging still gets exactly what it got without the hook; the run name
from ``--wandb-group``; options from ``configure()`` and ``$RL_OTEL_CONFIG``; a bad option; a slime of another
shape (warned once, nothing logged, slime unchanged); a failure that never reaches the rollout."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from rl_otel import ConfigurationError

pytestmark = pytest.mark.slow  # the slow layer (tests/conftest.py)

STANDINS = Path(__file__).resolve().parent / "data" / "standins"
LOCAL = {"prometheus": {"host": "127.0.0.1", "port": 0}}
HOOK = "rl_otel.integrations.slime.log_rollout_data"
EVAL_HOOK = "rl_otel.integrations.slime.log_eval_rollout_data"


def slime_args(**over):
    args = {"custom_rollout_log_function_path": HOOK, "custom_eval_rollout_log_function_path": EVAL_HOOK,
            "load_debug_rollout_data": None, "wandb_always_use_train_step": False, "rollout_batch_size": 4,
            "n_samples_per_prompt": 2, "global_batch_size": 8, "wandb_group": "slime-qwen-run3", "save": "/ckpt/qwen3"}
    args.update(over)
    return SimpleNamespace(**args)


SAMPLES = [SimpleNamespace(reward=1.0, response_length=10), SimpleNamespace(reward=0.0, response_length=30)]


@pytest.fixture
def slime(monkeypatch):
    """slime's rollout metrics module (the stand-in) and a fresh rl_otel slime hook state; cleaned up after."""
    import rl_otel.integrations.slime as hook

    monkeypatch.syspath_prepend(str(STANDINS))
    monkeypatch.setattr(hook, "_state", hook._State())
    monkeypatch.delenv("RL_OTEL_CONFIG", raising=False)
    import slime.observability.logging_utils as logging_utils
    import slime.observability.rollout_metrics as rollout_metrics

    logging_utils.LOGGED.clear()
    yield SimpleNamespace(metrics=rollout_metrics, logged=logging_utils.LOGGED, hook=hook)
    hook.close()
    for name in [n for n in sys.modules if n == "slime" or n.startswith("slime.")]:
        del sys.modules[name]


def test_rollouts_reach_rl_otel_and_slimes_own_logging_is_unchanged(slime):
    slime.hook.configure(**LOCAL)
    args = slime_args()
    slime.metrics.log_rollout_data(3, args, SAMPLES, {"rollout/extra": 7.0}, 2.0)
    tel = slime.hook.telemetry()
    assert tel is not None and tel.config.run == "slime-qwen-run3"  # --wandb-group
    # slime's default logging ran, with what it logs without the hook
    with_hook = list(slime.logged)
    slime.logged.clear()
    slime.metrics.log_rollout_data(3, slime_args(custom_rollout_log_function_path=None), SAMPLES,
                                   {"rollout/extra": 7.0}, 2.0)
    assert with_hook == slime.logged and len(with_hook) == 1
    logged, step_key = with_hook[0]
    assert step_key == "rollout/step" and logged["rollout/step"] == 3
    # rl_otel got the same keys (but the step key) at the same step
    assert tel.value("rl_step") == 3.0
    for key, value in logged.items():
        if key != "rollout/step":
            assert tel.value(key) == pytest.approx(value), key
    # an evaluation, slime's step under wandb_always_use_train_step (rollout_id * 4 * 2 // 8)
    args = slime_args(wandb_always_use_train_step=True)
    slime.metrics.log_eval_rollout_data(5, args, {"gsm8k": {"rewards": [1, 0, 1, 1], "truncated": [0, 0, 0, 1]}},
                                        {"eval/extra": 1.0})
    assert tel.value("eval/gsm8k") == 0.75
    assert tel.value("eval/gsm8k-truncated_ratio") == 0.25
    assert tel.value("rl_step") == 5.0
    assert slime.logged[-1][1] == "eval/step"  # slime's own eval logging ran too
    # --load-debug-rollout-data: slime logs nothing, nor does rl_otel
    slime.metrics.log_rollout_data(9, slime_args(load_debug_rollout_data="x"), SAMPLES, None, 1.0)
    assert tel.value("rl_step") == 5.0


def test_options_from_rl_otel_config_file(slime, tmp_path, monkeypatch):
    config = tmp_path / "rl_otel.yaml"
    config.write_text("prometheus: {host: 127.0.0.2, port: 0}\n")
    monkeypatch.setenv("RL_OTEL_CONFIG", str(config))
    slime.metrics.log_rollout_data(1, slime_args(), SAMPLES, None, 1.0)
    tel = slime.hook.telemetry()
    assert tel.config.prometheus.host == "127.0.0.2"
    assert tel.config.run == "slime-qwen-run3"  # the framework's run name is over the file's


def test_a_bad_option_is_refused(slime):
    with pytest.raises(ConfigurationError, match="prometheuss"):
        slime.hook.configure(prometheuss={})


def test_a_slime_of_another_shape_is_warned_about_once_and_left_alone(slime, monkeypatch, caplog):
    def compute_metrics_from_samples(args, groups):  # a slime that takes something else than samples
        return {}

    monkeypatch.setattr(slime.metrics, "compute_metrics_from_samples", compute_metrics_from_samples)
    slime.hook.configure(**LOCAL)
    with caplog.at_level(logging.WARNING, logger="rl_otel"):
        slime.metrics.log_rollout_data(1, slime_args(), SAMPLES, None, 1.0)
        slime.metrics.log_rollout_data(2, slime_args(), SAMPLES, None, 1.0)
    assert caplog.text.count("not the shape") == 1 and "compute_metrics_from_samples" in caplog.text
    assert slime.hook.telemetry() is None
    assert [m["rollout/step"] for m, _ in slime.logged] == [1, 2]  # slime's own logging unchanged


def test_a_failure_in_the_hook_never_reaches_the_rollout(slime, caplog):
    slime.hook.configure(**LOCAL)
    bad = [SimpleNamespace(reward=1.0)]  # no response_length: rl_otel's call of slime's metric fails
    with caplog.at_level(logging.WARNING, logger="rl_otel"):
        assert slime.hook.log_rollout_data(1, slime_args(), bad, None, 1.0) is False
        assert slime.hook.log_rollout_data(2, slime_args(), bad, None, 1.0) is False
    assert caplog.text.count("not logged") == 1
    slime.metrics.log_rollout_data(3, slime_args(), SAMPLES, None, 2.0)
    assert slime.hook.telemetry().value("rl_step") == 3.0
