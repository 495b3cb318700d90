"""Trinity-RFT 0.6.0's own monitor registry, config loader and validator with ``rl_otel`` as the monitor.

The end-to-end test runs in a fresh process that never imports rl_otel itself, as Trinity's Explorer and Trainer
Ray actors are: Trinity's ``MONITOR`` imports the dotted ``monitor_type`` from the config, and the monitors are
built with the Explorer's and the Trainer's own call. The test scrapes both endpoints over HTTP, then checks that
shutdown (close, and the second close from ``__del__``) stops them.
"""

from __future__ import annotations

import os
from importlib.util import find_spec

import pytest
import yaml

from rl_otel import ConfigurationError
from tests._child import Child, port_closed
from tests.promtools import key_samples, samples, scrape

pytestmark = pytest.mark.slow  # the slow layer (tests/conftest.py)

needs_trinity = pytest.mark.skipif(find_spec("trinity") is None and not os.environ.get("RL_OTEL_TEST_ALL"),
                                   reason="trinity-rft is installed by scripts/test.sh (requirements-frameworks.txt)")

LOCAL = {"prometheus": {"host": "127.0.0.1", "port": 0}}
MONITOR_TYPE = "rl_otel.integrations.trinity.RLOtelMonitor"


TRINITY_CHILD = """
import sys
config_path, job_dir = sys.argv[1], sys.argv[2]
from trinity.common.config import load_config
from trinity.common.config_validator import MonitorConfigValidator
from trinity.utils.monitor import MONITOR

assert not MONITOR.modules, MONITOR.modules  # nothing registered beforehand
assert not [m for m in sys.modules if m.split(".")[0] == "rl_otel"]  # nor rl_otel imported
config = load_config(config_path)  # trinity/cli/launcher.py's load_config
config.checkpoint_job_dir = job_dir
MonitorConfigValidator().validate(config)  # the launcher's check: MONITOR.get(monitor_type), default_args()
# trinity/explorer/explorer.py:56-62
explorer = MONITOR.get(config.monitor.monitor_type)(
    project=config.project, group=config.group, name=config.name, role=config.explorer.name, config=config)
# trinity/trainer/trainer.py:43-49
trainer = MONITOR.get(config.monitor.monitor_type)(
    project=config.project, group=config.group, name=config.name, role=config.trainer.name, config=config)
explorer.log({"rollout/reward/mean": 0.5, "eval/gsm8k/accuracy/mean@4": 0.75}, step=2)
trainer.log({"actor/pg_loss": 0.125}, 3)
say(explorer=explorer.telemetry.metrics_url, trainer=trainer.telemetry.metrics_url,
    roles=[explorer.telemetry.config.role, trainer.telemetry.config.role], modules=list(MONITOR.modules))
wait()  # the test has scraped
explorer.close()  # Explorer.shutdown (explorer.py:564-566): close(), then drop it: Monitor.__del__ closes again
explorer = None
trainer.close()  # Trainer.shutdown (trainer.py:279-280)
trainer.close()

from rl_otel.integrations.trinity import RLOtelMonitor, register
register()
register()  # a plugin file loaded twice registers twice: no KeyError
say(done=True, short_name=MONITOR.get("rl_otel") is RLOtelMonitor)
wait()  # the test has checked the ports
"""


@needs_trinity
def test_monitor_type_reaches_explorer_and_trainer_in_a_fresh_process(tmp_path):
    run = "trinity-run"
    config = tmp_path / "trinity.yaml"
    config.write_text(yaml.safe_dump({"project": "proj", "name": run,
                                      "monitor": {"monitor_type": MONITOR_TYPE, "monitor_args": LOCAL}}))
    child = Child(TRINITY_CHILD, [str(config), str(tmp_path / "job")], tmp_path)
    try:
        report = child.expect()
        assert report["modules"] == [MONITOR_TYPE] and report["roles"] == ["explorer", "trainer"]
        explorer, trainer = report["explorer"], report["trainer"]
        assert explorer != trainer
        # the two roles of one run differ on every series and on the resource (an OTLP push of both never collides)
        explorer_step = {frozenset({("run", run), ("role", "explorer"), ("rank", "0")}): 2.0}
        assert samples(scrape(explorer), "rl_step") == explorer_step
        instances = {dict(key)["service_instance_id"] for url in (explorer, trainer)
                     for key in samples(scrape(url), "target_info")}
        assert len(instances) == 2 and {i.split("/")[-2] for i in instances} == {"explorer", "trainer"}, instances
        assert key_samples(explorer, "rollout/reward/mean", run) == {
            frozenset({("metric", "reward"), ("stat", "mean")}): 0.5}
        assert key_samples(explorer, "eval/gsm8k/accuracy/mean@4", run) == {
            frozenset({("taskset", "gsm8k"), ("metric", "accuracy"), ("stat", "mean"), ("k", "4")}): 0.75}
        trainer_step = {frozenset({("run", run), ("role", "trainer"), ("rank", "0")}): 3.0}
        assert samples(scrape(trainer), "rl_step") == trainer_step
        assert key_samples(trainer, "actor/pg_loss", run) == {frozenset(): 0.125}
        child.send()
        assert child.expect() == {"done": True, "short_name": True}
        assert port_closed(explorer) and port_closed(trainer)
        assert child.finish() == 0
    finally:
        child.kill()


def _config(**monitor_args):
    from trinity.common.config import Config

    config = Config()
    config.monitor.monitor_type = MONITOR_TYPE
    config.monitor.monitor_args = monitor_args
    return config


@needs_trinity
def test_monitor_base_signature_and_trinity_signature():
    from rl_otel.integrations.trinity import RLOtelMonitor

    config = _config(**LOCAL)
    # trinity.utils.monitor.Monitor's (project, name, role, config), positional
    base = RLOtelMonitor("proj", "base-run", "trainer", config)
    # the concrete monitors' (project, group, name, role, config), positional
    concrete = RLOtelMonitor("proj", "grp", "concrete-run", "explorer", config)
    try:
        assert (base.group, base.name, base.role, base.config) == ("", "base-run", "trainer", config)
        assert base.telemetry.config.run == "base-run" and base.telemetry.config.role == "trainer"
        assert (concrete.group, concrete.name, concrete.role) == ("grp", "concrete-run", "explorer")
        concrete.log_table("experiences", object(), step=1)  # tables are left to the other monitors
    finally:
        base.close()
        concrete.close()
    base.close()  # twice: safe


@needs_trinity
def test_register_is_idempotent_on_trinitys_registry():
    from trinity.utils.monitor import MONITOR

    from rl_otel.integrations.trinity import RLOtelMonitor, register

    assert register() is RLOtelMonitor
    assert register() is RLOtelMonitor  # Trinity's registry raises KeyError on a plain second registration
    assert MONITOR.get("rl_otel") is RLOtelMonitor
    assert MONITOR.get(MONITOR_TYPE) is RLOtelMonitor  # the dotted name resolves to the same class

    class Other:
        pass

    MONITOR.register_module("rl_otel_taken")(Other)
    with pytest.raises(KeyError):  # a different class holding the name is a real conflict: not overridden
        register(name="rl_otel_taken")
    assert MONITOR.get("rl_otel_taken") is Other


@needs_trinity
def test_monitor_args_refuse_an_unknown_option_by_name():
    from rl_otel.integrations.trinity import RLOtelMonitor

    with pytest.raises(ConfigurationError, match="log_dirr"):
        RLOtelMonitor(project="p", group="", name="n", role="explorer", config=_config(log_dirr="x"))


class TrinityRegistry:
    """A registry of one's own with Trinity's interface: ``register_module(name)`` decorates, ``get(name)``."""

    def __init__(self) -> None:
        self.modules: dict = {}

    def register_module(self, name: str):
        def decorate(cls):
            if name in self.modules:
                raise KeyError(f"{name} is already registered")
            self.modules[name] = cls
            return cls
        return decorate

    def get(self, name: str):
        return self.modules[name]


class _Args:
    def __init__(self, **kw):
        self.__dict__.update(kw)


def test_monitor_from_a_given_registry():
    from rl_otel.integrations.trinity import RLOtelMonitor, register

    monitor_registry = TrinityRegistry()
    register(monitor_registry)
    register(monitor_registry)
    cls = monitor_registry.get("rl_otel")
    assert cls is RLOtelMonitor and cls.default_args() == {}
    config = _Args(monitor=_Args(monitor_type="rl_otel", monitor_args=LOCAL))
    monitor = cls("proj", "group", "trinity-exp", "explorer", config)  # as Trinity builds it
    assert monitor.telemetry.config.role == "explorer"
    monitor.log({"eval/gsm8k/accuracy/mean@4": 0.75, "rollout/reward/mean": 0.5}, step=2, commit=True)
    monitor.log_table("experiences", object(), step=2)
    url = monitor.telemetry.metrics_url
    assert key_samples(url, "eval/gsm8k/accuracy/mean@4", "trinity-exp") == {
        frozenset({("taskset", "gsm8k"), ("metric", "accuracy"), ("stat", "mean"), ("k", "4")}): 0.75}
    monitor.close()
    assert port_closed(url)
