"""NeMo-RL: the ``LoggerInterface`` backend added to NeMo-RL's ``Logger`` by ``attach``, against a signature-faithful
stand-in of ``nemo_rl.utils.logger`` (``tests/data/standins``; the PyPI ``nemo-rl`` is an empty placeholder): the
keys as ``{prefix}/{name}``, GRPO's several calls per step (``step_finished`` on the last), the GPU monitor's
seconds-as-step calls that must not move the step, the run name from the config, ``finish()``, a bad option, a
``Logger`` of another shape, and a backend failure that never reaches the training loop."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

from rl_otel import ConfigurationError
from tests._sinks import Recorder

pytestmark = pytest.mark.slow  # the slow layer (tests/conftest.py)

STANDINS = Path(__file__).resolve().parent / "data" / "standins"
LOCAL = {"prometheus": {"host": "127.0.0.1", "port": 0}, "trackers": {"recorder": {}}}
MASTER = {"logger": {"log_dir": "logs/exp7", "wandb_enabled": False, "wandb": {"name": "grpo-llama-exp7"},
                     "monitor_gpus": True}}


@pytest.fixture
def nemo(monkeypatch):
    """NeMo-RL's logger module (the stand-in), imported as ``nemo_rl.utils.logger``; removed afterwards."""
    monkeypatch.syspath_prepend(str(STANDINS))
    import nemo_rl.utils.logger as module

    yield module
    for name in [n for n in sys.modules if n == "nemo_rl" or n.startswith("nemo_rl.")]:
        del sys.modules[name]


def test_grpo_step_through_nemos_logger(nemo):
    from rl_otel.integrations.nemo_rl import RLOtelLogger, attach

    logger = nemo.Logger(MASTER["logger"])
    backend = attach(logger, MASTER, **LOCAL)
    assert isinstance(backend, RLOtelLogger) and isinstance(backend, nemo.LoggerInterface)
    assert attach(logger, MASTER, **LOCAL) is backend and logger.loggers == [backend]  # idempotent
    tel = backend.telemetry
    assert tel.config.run == "grpo-llama-exp7"  # logger.wandb.name
    # one GRPO step (total_steps + 1 = 1), as grpo_train logs it
    logger.log_metrics({"loss": 0.5, "reward": 0.25}, 1, prefix="train")
    logger.log_metrics({"total_step_time": 3.0}, 1, prefix="timing/train")
    logger.log_metrics({"token_mult_prob_error": 1.01}, 1, prefix="", step_finished=True)
    # the GPU monitor: prefix "ray", seconds since the start as the step, the step_metric key among the metrics
    # (RayGpuMonitorLogger.flush puts the step under the step_metric name itself: "ray/ray_step")
    logger.log_metrics({"node.0.gpu.0.util": 0.9, "ray/ray_step": 1234.5}, 1234, prefix="ray",
                       step_metric="ray/ray_step")
    logger.log_metrics({"accuracy": 0.75}, 2, prefix="validation")
    logger.log_hyperparams({"lr": 1e-6})
    logger.log_histogram([1, 2], 2, "h")
    logger.log_plot(object(), 2, "p")
    assert tel.value("train/loss") == 0.5
    assert tel.value("timing/train/total_step_time") == 3.0
    assert tel.value("token_mult_prob_error") == 1.01
    assert tel.value("validation/accuracy") == 0.75
    assert tel.value("rl_step") == 2.0  # the monitor's 1234 did not move it
    tel.flush()
    rec = next(r for r in reversed(Recorder.instances) if r.steps)
    steps = [(step, sorted(metrics)) for step, metrics in rec.steps]
    assert steps == [(1, ["train/loss", "train/reward"]), (1, ["timing/train/total_step_time"]),
                     (1, ["token_mult_prob_error"]), (1, ["ray/node.0.gpu.0.util"]), (2, ["validation/accuracy"])]
    logger.finish()
    assert tel._closed
    backend.finish()  # idempotent
    logger.log_metrics({"loss": 1.0}, 3, prefix="train")  # after finish: ignored, never raises


def test_options_from_the_logger_config_and_a_bad_one(nemo):
    from rl_otel.integrations.nemo_rl import attach

    logger = nemo.Logger({})
    backend = attach(logger, {"log_dir": "logs", "rl_otel": {"run": "from-config", **LOCAL}})
    assert backend is not None and backend.telemetry.config.run == "from-config"
    backend.finish()
    other = nemo.Logger({})
    with pytest.raises(ConfigurationError, match="trackerz"):
        attach(other, MASTER, trackerz={})
    assert other.loggers == []


def test_a_logger_of_another_shape_gets_nothing(nemo, caplog):
    from rl_otel.integrations.nemo_rl import attach

    class OldLogger:  # no list of backends
        def finish(self):
            pass

    with caplog.at_level(logging.WARNING, logger="rl_otel"):
        assert attach(OldLogger(), MASTER, **LOCAL) is None
    assert "loggers" in caplog.text


def test_a_changed_interface_is_reported(nemo, caplog, monkeypatch):
    from rl_otel.integrations.nemo_rl import attach, check_logger

    assert check_logger(nemo.Logger({}), nemo.LoggerInterface) == []

    class NewInterface(nemo.LoggerInterface):
        @staticmethod
        def log_metrics(metrics, step, prefix="", step_finished=False):  # a parameter dropped
            pass

    problems = check_logger(nemo.Logger({}), NewInterface)
    assert any("log_metrics" in p for p in problems)
    monkeypatch.setattr(nemo, "LoggerInterface", NewInterface)
    with caplog.at_level(logging.WARNING, logger="rl_otel"):
        assert attach(nemo.Logger({}), MASTER, **LOCAL) is None
    assert "log_metrics" in caplog.text


def test_a_failure_on_the_logging_path_never_raises(nemo, caplog):
    from rl_otel.integrations.nemo_rl import attach

    logger = nemo.Logger({})
    backend = attach(logger, MASTER, **LOCAL)

    class Exploding(dict):
        def items(self):
            raise RuntimeError("bad metrics")

    with caplog.at_level(logging.WARNING, logger="rl_otel"):
        logger.log_metrics(Exploding(), 1, prefix="train")
        logger.log_metrics(Exploding(), 2, prefix="train")
    assert caplog.text.count("could not log") == 1  # logged once
    logger.log_metrics({"loss": 2.0}, 3, prefix="train")
    assert backend.telemetry.value("train/loss") == 2.0
    logger.finish()
