"""verl 0.9.1's own ``Tracking`` with ``rl_otel`` among its backends, selected the way verl's config selects them.

The end-to-end tests run in a fresh process, so that ``import verl`` itself loads rl_otel's ``verl.plugins`` entry
point (nothing calls rl_otel first); the test scrapes the child's endpoint over HTTP and checks that the port is
closed once the Tracking is finished, or collected. The contract test fails when a verl release changes what the
plugin patches.
"""

from __future__ import annotations

import inspect
import logging
import os
import subprocess
import sys
from importlib.metadata import entry_points
from importlib.util import find_spec

import pytest

from rl_otel import ConfigurationError
from tests._child import Child, port_closed
from tests.promtools import key_samples, samples, scrape

pytestmark = pytest.mark.slow  # the slow layer (tests/conftest.py)

needs_verl = pytest.mark.skipif(find_spec("verl") is None and not os.environ.get("RL_OTEL_TEST_ALL"),
                                reason="verl is installed by scripts/test.sh (requirements-frameworks.txt)")

LOCAL = {"prometheus": {"host": "127.0.0.1", "port": 0}}


# A trainer's Tracking, in a process of its own. mode "finish": built as in the brief's call and finished;
# "collect": the same, then dropped (Tracking.__del__); "v1": verl's real ppo_trainer config composed by Hydra
# with the overrides a user writes, the Tracking built and finished exactly as verl's V1 trainer does.
VERL_CHILD = """
import gc, os, sys
mode, exp = sys.argv[1], sys.argv[2]
import verl  # verl/__init__.py loads every "verl.plugins" entry point: rl_otel's among them
from verl.utils.tracking import Tracking

from rl_otel.integrations.verl import install
install()  # idempotent: the plugin already did it
local = {"host": "127.0.0.1", "port": 0}
if mode == "v1":
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf
    with initialize_config_dir(config_dir=os.path.join(os.path.dirname(verl.__file__), "trainer", "config"),
                               version_base=None):
        config = compose("ppo_trainer", overrides=[
            "trainer.logger=[console,rl_otel]", "+trainer.rl_otel.prometheus.host=127.0.0.1",
            "+trainer.rl_otel.prometheus.port=0", "trainer.project_name=proj", f"trainer.experiment_name={exp}"])
    # verl/trainer/ppo/v1/trainer_base.py:423
    tracking = Tracking(project_name=config.trainer.project_name, experiment_name=config.trainer.experiment_name,
                        default_backend=config.trainer.logger, config=OmegaConf.to_container(config, resolve=True))
else:
    config = {"trainer": {"project_name": "proj", "experiment_name": exp, "logger": ["console", "rl_otel"],
                          "rl_otel": {"prometheus": local}}}
    tracking = Tracking("proj", exp, default_backend=["console", "rl_otel"], config=config)
tracking.log(data={"critic/vf_loss": 0.25, "critic/score/mean": 0.5}, step=1)
tracking.log(data={"critic/vf_loss": 0.125, "response_length/mean": 42.0}, step=2)
say(url=tracking.logger["rl_otel"].telemetry.metrics_url, backends=list(tracking.logger),
    supported=Tracking.supported_backend.count("rl_otel"),
    wrapped_once=not hasattr(Tracking.__init__.__wrapped__, "__wrapped__"))
wait()  # the test has scraped
if mode == "collect":
    del tracking
    gc.collect()
else:
    tracking.finish(exit_code=0)  # verl/trainer/main_ppo.py:158-161 (TaskRunnerV1.run's finally)
    tracking.finish()
say(done=True)
wait()  # the test has checked the port
"""


@needs_verl
@pytest.mark.parametrize("mode", ["finish", "collect", "v1"])
def test_trainer_logger_selects_rl_otel_in_a_fresh_process(tmp_path, mode):
    if mode == "v1":
        pytest.importorskip("hydra", reason="verl's config is composed by Hydra (hydra-core)")
    experiment = f"verl-{mode}"
    child = Child(VERL_CHILD, [mode, experiment], tmp_path,
                  env={"VERL_USE_EXTERNAL_PLUGINS": "auto", "VERL_USE_EXTERNAL_MODULES": "", "RL_OTEL_RUN": ""})
    try:
        report = child.expect()
        assert report["backends"] == ["console", "rl_otel"]
        assert report["supported"] == 1 and report["wrapped_once"]  # installed once, however often applied
        url = report["url"]
        # the run label is the experiment name; both log() calls arrived
        assert samples(scrape(url), "rl_step") == {
            frozenset({("run", experiment), ("role", "trainer"), ("rank", "0")}): 2.0}
        assert key_samples(url, "critic/vf_loss", experiment) == {frozenset(): 0.125}
        assert key_samples(url, "critic/score/mean", experiment) == {frozenset({("stat", "mean")}): 0.5}
        assert key_samples(url, "response_length/mean", experiment) == {frozenset({("stat", "mean")}): 42.0}
        child.send()
        assert child.expect() == {"done": True}
        assert port_closed(url), f"{mode}: the endpoint still serves while the process lives"
        assert child.finish() == 0
    finally:
        child.kill()


def test_the_entry_point_is_declared():
    (ep,) = [ep for ep in entry_points(group="verl.plugins") if ep.name == "rl_otel"]
    assert ep.value == "rl_otel.integrations.verl_plugin"  # pip install -e . registers it


@needs_verl
def test_verl_tracking_is_what_the_plugin_patches():
    """Fails when verl changes what rl_otel.integrations.verl.install() relies on (read off verl 0.9.1)."""
    import verl
    from verl.utils import tracking as tracking_module
    from verl.utils.tracking import Tracking

    from rl_otel.integrations.verl import INIT_PARAMETERS, check_tracking

    check_tracking(Tracking)
    original = getattr(Tracking.__init__, "__wrapped__", Tracking.__init__)
    assert list(inspect.signature(original).parameters) == ["self", *INIT_PARAMETERS]
    assert list(inspect.signature(Tracking.log).parameters) == ["self", "data", "step", "backend"]
    assert "logger_instance.log(data=data, step=step)" in inspect.getsource(Tracking.log)
    finish = getattr(Tracking.finish, "__wrapped__", Tracking.finish)
    assert list(inspect.signature(finish).parameters) == ["self", "exit_code"]
    assert "self.finish()" in inspect.getsource(Tracking.__del__)
    assert isinstance(Tracking.supported_backend, list) and "console" in Tracking.supported_backend
    # __init__ checks every name against the class-level list (an unknown one is refused)...
    assert "assert backend in self.supported_backend" in inspect.getsource(original)
    with pytest.raises(AssertionError, match="not_a_backend is not supported"):
        Tracking("p", "e", default_backend=["not_a_backend"])
    # ... and keeps the experiment name nowhere (hence the wrapped __init__)
    assert not {"experiment_name", "project_name"} & set(vars(Tracking("p", "e", default_backend=[])))
    # `import verl` loads the "verl.plugins" entry points (VERL_USE_EXTERNAL_PLUGINS, default auto)
    source = inspect.getsource(verl)
    assert 'entry_points(group="verl.plugins")' in source and "VERL_USE_EXTERNAL_PLUGINS" in source
    assert tracking_module.Tracking is Tracking


def test_a_changed_tracking_is_reported_not_patched(caplog):
    from rl_otel.integrations.verl import (
        VerlIncompatibleError,
        install,
        install_from_plugin,
    )

    class Changed:  # a Tracking without the class-level list, and a renamed constructor argument
        def __init__(self, project_name, run_name, default_backend="console", config=None):
            self.logger = {}

        def log(self, data, step):
            pass

        def finish(self):
            pass

    with pytest.raises(VerlIncompatibleError, match=r"supported_backend.*experiment_name"):
        install(Changed)
    assert not hasattr(Changed, "_rl_otel_installed") and not hasattr(Changed.__init__, "__wrapped__")
    with caplog.at_level(logging.WARNING, logger="rl_otel"):
        install_from_plugin(Changed)  # what `import verl` runs: a warning, no exception
    assert "cannot use 'rl_otel'" in caplog.text and "supported_backend" in caplog.text


@needs_verl
def test_trainer_rl_otel_refuses_an_unknown_option_by_name():
    import verl  # noqa: F401  (loads the plugin)
    from verl.utils.tracking import Tracking

    with pytest.raises(ConfigurationError, match="log_dirr"):
        Tracking("p", "e", default_backend=["rl_otel"], config={"trainer": {"rl_otel": {"log_dirr": "x"}}})
    with pytest.raises(ConfigurationError, match=r"trainer\.rl_otel must be a mapping"):
        Tracking("p", "e", default_backend=["rl_otel"], config={"trainer": {"rl_otel": 9464}})


@needs_verl
def test_attach_to_a_tracking_built_without_rl_otel():
    import verl  # noqa: F401
    from verl.utils.tracking import Tracking

    from rl_otel.integrations.verl import RLOtelBackend, attach

    tracking = Tracking("proj", "verl-attached", default_backend=[])
    backend = attach(tracking, experiment_name="verl-attached", **LOCAL)
    assert tracking.logger == {"rl_otel": backend} and isinstance(backend, RLOtelBackend)
    tracking.log(data={"critic/vf_loss": 0.125}, step=7)
    url = backend.telemetry.metrics_url
    assert key_samples(url, "critic/vf_loss", "verl-attached") == {frozenset(): 0.125}
    assert samples(scrape(url), "rl_step") == {
        frozenset({("run", "verl-attached"), ("role", "trainer"), ("rank", "0")}): 7.0}
    tracking.finish()
    assert port_closed(url)
    with pytest.raises(TypeError, match="Tracking"):
        attach(object())


class VerlTracking:
    """A Tracking-like object of one's own: backends in ``self.logger``, ``log(data, step, backend=None)``."""

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


def test_attach_to_a_tracking_like_object():
    from rl_otel.integrations.verl import attach

    tracking = VerlTracking("proj", "verl-exp")
    backend = attach(tracking, **LOCAL)  # the run is named after its experiment_name attribute
    assert tracking.logger["rl_otel"] is backend
    tracking.log(data={"critic/vf_loss": 0.125, "response_length/mean": 42.0}, step=7)
    url = backend.telemetry.metrics_url
    assert key_samples(url, "critic/vf_loss", "verl-exp") == {frozenset(): 0.125}
    assert samples(scrape(url), "rl_step") == {
        frozenset({("run", "verl-exp"), ("role", "trainer"), ("rank", "0")}): 7.0}
    tracking.finish()
    assert port_closed(url)


# A Tracking left to verl's own Tracking.__del__ at interpreter exit (never finished, never collected before).
VERL_EXIT = """
import sys
import verl  # loads rl_otel's plugin: Tracking.finish is rl_otel's wrapper
from verl.utils.tracking import Tracking

backends = sys.argv[1].split(",")
config = {"trainer": {"rl_otel": {"prometheus": {"host": "127.0.0.1", "port": 0}}}}
t = Tracking("p", "e", default_backend=backends, config=config)
t.log(data={"critic/vf_loss": 0.25}, step=1)
print("logged", flush=True)
"""


@needs_verl
@pytest.mark.parametrize("backends", ["console", "console,rl_otel"])
def test_nothing_is_printed_at_exit(tmp_path, backends):
    """Once rl_otel is installed, a Tracking that verl's __del__ finishes at interpreter shutdown (when module
    globals are already None) exits cleanly: no 'Exception ignored in Tracking.__del__' on stderr."""
    env = {**os.environ, "VERL_USE_EXTERNAL_PLUGINS": "auto", "VERL_USE_EXTERNAL_MODULES": "", "RL_OTEL_RUN": ""}
    done = subprocess.run([sys.executable, "-c", VERL_EXIT, backends], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.endswith("logged\n"), done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr[-3000:]
