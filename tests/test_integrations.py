"""The framework integrations, each driven through its framework's interface: the real package where it installs
here (accelerate, transformers), the documented interface otherwise (ROLL, verl, Trinity-RFT)."""

from __future__ import annotations

import pytest

from rl_otel import ConfigurationError, default_catalog
from tests._readers import tensorboard_scalars
from tests.promtools import samples, scrape

LOCAL = {"prometheus": {"host": "127.0.0.1", "port": 0}}


def _value(url: str, key: str, run: str) -> dict[frozenset, float]:
    """Samples of ``key``'s Prometheus series for ``run``, labels without run/rank."""
    resolved = default_catalog().resolve(key).to_dict()
    found = samples(scrape(url), resolved["prometheus_name"])
    return {frozenset(kv for kv in k if kv[0] not in ("run", "rank")): v for k, v in found.items()
            if ("run", run) in k}


def test_roll_tracker_from_the_registry_by_track_with():
    from rl_otel.integrations.roll import RLOtelTracker, register

    tracker_registry: dict = {}  # ROLL's roll.utils.tracking.tracker_registry: name -> class
    register(tracker_registry)
    tracker = tracker_registry["rl_otel"]({"exp_name": "roll-exp", "track_with": "rl_otel"}, **LOCAL)
    assert isinstance(tracker, RLOtelTracker)
    tracker.log({"actor/pg_loss@sum": 0.5, "critic/score/mean": 0.25}, step=3, extra="ignored")
    url = tracker.telemetry.metrics_url
    assert _value(url, "actor/pg_loss", "roll-exp") == {frozenset(): 0.5}
    assert _value(url, "critic/score/mean", "roll-exp") == {frozenset({("stat", "mean")}): 0.25}
    # ROLL's BaseTracker.log_traces (trace records, not metrics) is accepted and changes no series
    def series(text: str) -> set[str]:
        return {line.rsplit(" ", 1)[0] for line in text.splitlines() if line and not line.startswith("#")}

    before = series(scrape(url))
    tracker.log_traces("rollout_traces", [{"messages": [{"role": "user", "content": "hi"}]}], step=3)
    assert series(scrape(url)) == before
    tracker.finish()
    tracker.finish()  # idempotent


def test_roll_tracker_refuses_an_unknown_option_by_name():
    from rl_otel.integrations.roll import RLOtelTracker

    with pytest.raises(ConfigurationError, match="log_dirr"):
        RLOtelTracker({}, log_dirr="x")


class VerlTracking:
    """verl's ``Tracking`` as documented: backends in ``self.logger``, ``log(data, step, backend=None)``."""

    def __init__(self, project_name: str, experiment_name: str) -> None:
        self.project_name, self.experiment_name = project_name, experiment_name
        self.logger: dict = {}

    def log(self, data: dict, step: int, backend: list | None = None) -> None:
        for name, instance in self.logger.items():
            if backend is None or name in backend:
                instance.log(data=data, step=step)

    def finish(self) -> None:
        for instance in self.logger.values():
            instance.finish()


def test_verl_backend_in_tracking():
    from rl_otel.integrations.verl import attach

    tracking = VerlTracking("proj", "verl-exp")
    backend = attach(tracking, **LOCAL)
    assert tracking.logger["rl_otel"] is backend
    tracking.log(data={"critic/vf_loss": 0.125, "response_length/mean": 42.0}, step=7)
    url = backend.telemetry.metrics_url
    assert _value(url, "critic/vf_loss", "verl-exp") == {frozenset(): 0.125}
    assert samples(scrape(url), "rl_step") == {frozenset({("run", "verl-exp"), ("rank", "0")}): 7.0}
    tracking.finish()
    with pytest.raises(TypeError, match="Tracking"):
        attach(object())


class TrinityRegistry:
    """Trinity-RFT's ``Registry``: ``register_module(name)`` decorates a class, ``get(name)`` returns it."""

    def __init__(self) -> None:
        self.modules: dict = {}

    def register_module(self, name: str):
        def decorate(cls):
            self.modules[name] = cls
            return cls
        return decorate

    def get(self, name: str):
        return self.modules[name]


class _Args:
    def __init__(self, **kw):
        self.__dict__.update(kw)


def test_trinity_monitor_from_the_registry():
    from rl_otel.integrations.trinity import RLOtelMonitor, register

    monitor_registry = TrinityRegistry()
    register(monitor_registry)
    cls = monitor_registry.get("rl_otel")
    assert cls is RLOtelMonitor and cls.default_args() == {}
    config = _Args(monitor=_Args(monitor_type="rl_otel", monitor_args=LOCAL))
    monitor = cls("proj", "group", "trinity-exp", "explorer", config)  # as Trinity builds it
    assert monitor.telemetry.config.role == "explorer"
    monitor.log({"eval/gsm8k/accuracy/mean@4": 0.75, "rollout/reward/mean": 0.5}, step=2, commit=True)
    monitor.log_table("experiences", object(), step=2)
    url = monitor.telemetry.metrics_url
    assert _value(url, "eval/gsm8k/accuracy/mean@4", "trinity-exp") == {
        frozenset({("taskset", "gsm8k"), ("metric", "accuracy"), ("stat", "mean"), ("k", "4")}): 0.75}
    monitor.close()


def test_accelerate_tracker_with_a_real_accelerator(tmp_path):
    accelerate = pytest.importorskip("accelerate")
    from rl_otel.integrations.accelerate import RLOtelTracker

    tracker = RLOtelTracker("acc-run", trackers={"tensorboard": {"log_dir": str(tmp_path)}}, **LOCAL)
    accelerator = accelerate.Accelerator(log_with=[tracker], cpu=True)
    accelerator.init_trackers("proj", config={"lr": 0.1})
    assert tracker.config == {"lr": 0.1}
    for step in range(3):
        accelerator.log({"critic/score/mean": 0.5 + step, "train/loss": 2.0 - step}, step=step)
    assert accelerator.get_tracker("rl_otel", unwrap=True) is tracker.tracker
    url = tracker.tracker.metrics_url
    assert _value(url, "critic/score/mean", "acc-run") == {frozenset({("stat", "mean")}): 2.5}
    accelerator.end_training()
    assert tensorboard_scalars(str(tmp_path))["train/loss"] == [(0, 2.0), (1, 1.0), (2, 0.0)]


def test_transformers_callback_in_a_real_trainer(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    from rl_otel.integrations.transformers import RLOtelCallback

    class Regressor(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(2, 1)

        def forward(self, x, labels):
            return {"loss": torch.nn.functional.mse_loss(self.linear(x).squeeze(-1), labels)}

    torch.manual_seed(0)
    data = [{"x": torch.randn(2), "labels": torch.tensor(1.0)} for _ in range(32)]
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=4, logging_steps=1,
                                          per_device_train_batch_size=8, report_to=[], run_name="hf-run",
                                          save_strategy="no", use_cpu=True, disable_tqdm=True)
    callback = RLOtelCallback(trackers={"tensorboard": {"log_dir": str(tmp_path / "tb")}}, **LOCAL)
    seen = {}

    class Scrape(transformers.TrainerCallback):  # scrapes while the callback still serves
        def on_log(self, args, state, control, logs=None, **kwargs):
            seen[state.global_step] = scrape(callback.telemetry.metrics_url)

    trainer = transformers.Trainer(model=Regressor(), args=args, train_dataset=data, callbacks=[callback, Scrape])
    trainer.train()
    assert callback.telemetry is None  # closed at on_train_end
    text = seen[4]
    assert samples(text, "rl_step") == {frozenset({("run", "hf-run"), ("rank", "0")}): 4.0}
    assert samples(text, "rl_loss"), "the trainer's loss is exported"
    losses = tensorboard_scalars(str(tmp_path / "tb"))["loss"]
    assert [s for s, _ in losses] == [1, 2, 3, 4]
