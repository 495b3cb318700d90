"""SkyRL: the tracker ``BasePPOExp.get_tracker()`` returns, wrapped by rl_otel, against SkyRL's real ``Tracking``
(skyrl 0.3.0, ``skyrl.train.utils.tracking``) given SkyRL's config as a ``DictConfig``: the run name, SkyRL's own
backend still logging exactly as before, the sync (one call per step) and fully-async (two calls per step,
``commit=False`` then ``commit=True``) patterns, ``finish()``, the mixin, a bad option, a tracker of another shape.

``BasePPOExp`` itself does not import without a GPU stack (ray, vLLM...), so the mixin is tested on a class whose
``get_tracker()`` builds the tracker as ``BasePPOExp.get_tracker()`` does."""

from __future__ import annotations

import logging

import pytest

from rl_otel import ConfigurationError
from tests._sinks import Recorder

pytestmark = pytest.mark.slow  # the slow layer (tests/conftest.py)

tracking = pytest.importorskip("skyrl.train.utils.tracking")
omegaconf = pytest.importorskip("omegaconf")

LOCAL = {"prometheus": {"host": "127.0.0.1", "port": 0}, "trackers": {"recorder": {}}}


def skyrl_cfg(run_name: str = "skyrl-grpo", **trainer):
    """SkyRL's config as a ``DictConfig`` (``Tracking`` takes one; ``SkyRLTrainConfig()`` needs Python 3.12)."""
    return omegaconf.OmegaConf.create({"trainer": {"run_name": run_name, "project_name": "proj",
                                                   "logger": "console", "tags": [], **trainer}})


class CountingTracking(tracking.Tracking):
    """SkyRL's console Tracking, recording what reaches it (to show it gets exactly what the trainer logged)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[dict, int, bool]] = []
        self.finished = 0

    def log(self, data, step, commit=False):
        self.calls.append((dict(data), step, commit))
        super().log(data, step, commit=commit)

    def finish(self):
        self.finished += 1
        super().finish()


def base_get_tracker(cfg):
    """What ``BasePPOExp.get_tracker()`` returns for ``cfg``."""
    return CountingTracking(project_name=cfg.trainer.project_name, experiment_name=cfg.trainer.run_name,
                            backend=cfg.trainer.logger, config=cfg, tags=cfg.trainer.tags)


def recorder(tel) -> Recorder:
    tel.flush()
    return next(r for r in reversed(Recorder.instances) if r.steps)


def test_wrapped_tracker_serves_the_steps_and_keeps_skyrls_backend():
    from rl_otel.integrations.skyrl import RLOtelTracking, rl_otel_tracker

    cfg = skyrl_cfg()
    inner = base_get_tracker(cfg)
    tracker = rl_otel_tracker(cfg, inner, **LOCAL)
    assert isinstance(tracker, RLOtelTracking)
    tel = tracker.telemetry
    assert tel.config.run == "skyrl-grpo"  # trainer.run_name
    # the sync trainer: one call per step, commit=True
    tracker.log({"policy/policy_loss": 0.5, "reward/avg_raw_reward": 0.25}, step=1, commit=True)
    # the fully-async trainer: the step's metrics (commit=False), then its timings (commit=True)
    tracker.log({"policy/policy_loss": 0.4}, step=2, commit=False)
    tracker.log({"timing/step": 3.0}, step=2, commit=True)
    assert inner.calls == [({"policy/policy_loss": 0.5, "reward/avg_raw_reward": 0.25}, 1, True),
                           ({"policy/policy_loss": 0.4}, 2, False), ({"timing/step": 3.0}, 2, True)]
    assert tel.value("rl_step") == 2.0
    assert tel.value("policy/policy_loss") == 0.4
    assert tel.value("reward/avg_raw_reward") == 0.25
    assert tel.value("timing/step") == 3.0
    rec = recorder(tel)
    assert [step for step, _ in rec.steps] == [1, 2, 2]
    # SkyRL's tracker's other attributes are its own
    assert tracker.backend == "console"
    tracker.log_samples_to_table("k", ["a"], [(1,)], step=2)  # no-op for a non-wandb backend, as in SkyRL
    tracker.finish()
    tracker.finish()
    assert inner.finished == 2  # SkyRL's finish each time, as before
    assert tel._closed


def test_a_skyrl_tracker_exception_propagates_and_rl_otel_still_logs():
    from rl_otel.integrations.skyrl import rl_otel_tracker

    class Broken(CountingTracking):
        def log(self, data, step, commit=False):
            raise BrokenPipeError("wandb went away")

    cfg = skyrl_cfg("broken")
    tracker = rl_otel_tracker(cfg, Broken(project_name="p", experiment_name="broken", backend="console",
                                          config=cfg), **LOCAL)
    with pytest.raises(BrokenPipeError, match="wandb went away"):
        tracker.log({"policy/policy_loss": 1.5}, step=4, commit=True)
    assert tracker.telemetry.value("policy/policy_loss") == 1.5
    tracker.finish()


def test_mixin_wraps_the_experiments_own_tracker():
    from rl_otel.integrations.skyrl import RLOtelExpMixin, RLOtelTracking

    class Base:  # BasePPOExp's get_tracker(), as SkyRL writes it: Tracking(...) from self.cfg
        def __init__(self, cfg):
            self.cfg = cfg

        def get_tracker(self):
            return base_get_tracker(self.cfg)

    class Exp(RLOtelExpMixin, Base):
        rl_otel_options = LOCAL

    tracker = Exp(skyrl_cfg("mixin-run")).get_tracker()
    assert isinstance(tracker, RLOtelTracking) and isinstance(tracker.tracking, tracking.Tracking)
    assert tracker.telemetry.config.run == "mixin-run"
    tracker.log({"policy/policy_loss": 0.1}, step=1, commit=True)
    assert tracker.tracking.calls == [({"policy/policy_loss": 0.1}, 1, True)]
    tracker.finish()


def test_options_from_the_config_and_the_arguments():
    from rl_otel.integrations.skyrl import rl_otel_tracker

    cfg = skyrl_cfg("cfg-run", rl_otel={"run": "named-in-config", **LOCAL})
    tracker = rl_otel_tracker(cfg, base_get_tracker(cfg))
    assert tracker.telemetry.config.run == "named-in-config"
    tracker.finish()


def test_a_bad_option_is_refused_when_the_tracker_is_built():
    from rl_otel.integrations.skyrl import rl_otel_tracker

    cfg = skyrl_cfg()
    with pytest.raises(ConfigurationError, match="prometheuss"):
        rl_otel_tracker(cfg, base_get_tracker(cfg), prometheuss={})


def test_a_tracker_of_another_shape_is_returned_unchanged_with_a_warning(caplog):
    from rl_otel.integrations.skyrl import rl_otel_tracker

    class NotATracker:
        def log(self, payload):  # no step
            pass

    odd = NotATracker()
    with caplog.at_level(logging.WARNING, logger="rl_otel"):
        assert rl_otel_tracker(skyrl_cfg(), odd, **LOCAL) is odd
    assert "not the shape" in caplog.text and "finish" in caplog.text


def test_skyrls_tracking_is_the_shape_relied_on():
    """The contract, on SkyRL's class itself: fails loudly when SkyRL changes ``Tracking``."""
    from rl_otel.integrations.skyrl import check_tracker

    assert check_tracker(tracking.Tracking(project_name="p", experiment_name="e", backend="console")) == []
    import inspect

    assert list(inspect.signature(tracking.Tracking.log).parameters) == ["self", "data", "step", "commit"]
    assert list(inspect.signature(tracking.Tracking.__init__).parameters)[1:4] == [
        "project_name", "experiment_name", "backend"]
