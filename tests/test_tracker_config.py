"""Tracker configuration: ROLL's track_with/tracker_kwargs, trackers keyed by name, YAML files, CLI, rank policy."""

from __future__ import annotations

import json
import logging

import pytest

import rl_otel
from rl_otel._internal.runtime.options import load_config_file
from rl_otel._internal.runtime.ranks import check_tracker_ranks, mirrors_to_trackers
from rl_otel._internal.trackers.config import TrackerSpec, normalize_trackers, redact, secret_values
from rl_otel.cli import main
from rl_otel.errors import ConfigurationError
from rl_otel.sinks import register_sink, registered_sinks

ROLL_SWANLAB = {"login_kwargs": {"api_key": "sk-123"}, "project": "roll-experiments", "logdir": "./swanlog",
                "experiment_name": "exp", "tags": ["roll", "rl", "experiment"]}


def test_roll_single_tracker_flat_kwargs():
    (spec,) = normalize_trackers("swanlab", ROLL_SWANLAB)
    assert spec == TrackerSpec("swanlab", ROLL_SWANLAB)
    (spec,) = normalize_trackers("wandb", {"api_key": "k", "project": "p", "tags": ["a"]})
    assert spec.kwargs["project"] == "p"
    assert normalize_trackers("stdout") == (TrackerSpec("stdout", {}),)


def test_several_trackers_kwargs_keyed_by_name():
    specs = normalize_trackers(["tensorboard", "stdout"], {"tensorboard": {"log_dir": "tb"}})
    assert specs == (TrackerSpec("tensorboard", {"log_dir": "tb"}), TrackerSpec("stdout", {}))
    assert normalize_trackers("tensorboard,stdout") == (TrackerSpec("tensorboard"), TrackerSpec("stdout"))
    assert normalize_trackers(["wandb"], {"wandb": {"project": "p"}}) == (TrackerSpec("wandb", {"project": "p"}),)


def test_trackers_mapping_and_list_forms():
    want = (TrackerSpec("tensorboard", {"log_dir": "tb"}), TrackerSpec("stdout", {}))
    assert normalize_trackers(trackers={"tensorboard": {"log_dir": "tb"}, "stdout": None}) == want
    assert normalize_trackers(trackers=[{"name": "tensorboard", "log_dir": "tb"}, "stdout"]) == want


@pytest.mark.parametrize(("args", "match"), [
    ({"track_with": "mlflow"}, "unknown tracker 'mlflow'"),
    ({"track_with": "stdout", "trackers": {"stdout": {}}}, "not both"),
    ({"tracker_kwargs": {"a": 1}}, "without track_with"),
    ({"track_with": ["tensorboard", "stdout"], "tracker_kwargs": {"log_dir": "x"}}, r"\['log_dir'\]"),
    ({"trackers": ["stdout", "stdout"]}, "given twice"),
    ({"track_with": 3}, "track_with must be"),
    ({"trackers": [{"log_dir": "x"}]}, "trackers entry"),
])
def test_bad_tracker_options_fail_naming_the_value(args, match):
    with pytest.raises(ConfigurationError, match=match):
        normalize_trackers(**args)


def test_secrets_redacted_in_repr_and_dicts():
    spec, = normalize_trackers("swanlab", ROLL_SWANLAB)
    assert "sk-123" not in repr(spec) and "sk-123" not in json.dumps(spec.to_dict())
    assert redact({"a": {"api_key": "x", "b": [{"token": "y"}]}}) == {"a": {"api_key": "***", "b": [{"token": "***"}]}}
    assert secret_values({"login_kwargs": {"api_key": "sk-1", "host": "h"}, "api_key": "k2"}) == {"sk-1", "h", "k2"}


def test_yaml_roll_pipeline_file_and_kwargs_override(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text("exp_name: grpo-7b\nrollout_batch_size: 64\ntrack_with: stdout\nprometheus: false\n"
                    "tracker_kwargs: {}\n")
    assert load_config_file(path) == {"track_with": "stdout", "tracker_kwargs": {}, "prometheus": False,
                                      "run": "grpo-7b"}
    with rl_otel.init(config=str(path), handle_sigterm=False) as tel:
        assert tel.config.run == "grpo-7b" and tel.trackers == ("stdout",) and tel.metrics_url is None
    tb = tmp_path / "tb"
    with rl_otel.init(config=str(path), run="mine", trackers={"tensorboard": {"log_dir": str(tb)}},
                      handle_sigterm=False) as tel:
        assert tel.config.run == "mine" and tel.trackers == ("tensorboard",)


def test_yaml_rl_otel_section_is_strict(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text("rl_otel:\n  trackers: {stdout: {}}\n  trak_with: wandb\n")
    with pytest.raises(ConfigurationError, match="trak_with"):
        load_config_file(path)
    with pytest.raises(ConfigurationError, match="cannot be read"):
        load_config_file(tmp_path / "missing.yaml")


def test_init_fails_fast_on_bad_sink_kwargs():
    with pytest.raises(ConfigurationError, match=r"tracker 'stdout'.*stream"):
        rl_otel.init(prometheus=False, track_with="stdout", tracker_kwargs={"stream": "nowhere"})


def test_rank_policy_is_one_pure_function():
    assert mirrors_to_trackers(0, check_tracker_ranks(0))
    assert not mirrors_to_trackers(1, check_tracker_ranks(0))
    assert mirrors_to_trackers(3, check_tracker_ranks("all"))
    assert mirrors_to_trackers(2, check_tracker_ranks([0, 2]))
    assert not mirrors_to_trackers(1, check_tracker_ranks([0, 2]))
    for bad in (-1, True, [], "some", 1.5):
        with pytest.raises(ConfigurationError, match="tracker_ranks"):
            check_tracker_ranks(bad)


def test_other_ranks_get_no_sinks(tmp_path):
    with rl_otel.init(rank=1, prometheus=False, trackers={"tensorboard": {"log_dir": str(tmp_path)}}) as tel:
        assert tel.trackers == ()
    assert not list(tmp_path.iterdir())


def test_registry_validates_and_warns_on_overwrite(caplog):
    def factory(*, run, **kw):
        return object()

    with pytest.raises(ValueError, match="sink name"):
        register_sink("Bad-Name", factory)
    with pytest.raises(TypeError, match="callable"):
        register_sink("ok_name", 3)
    register_sink("cfg_test_sink", factory)
    assert "cfg_test_sink" in registered_sinks()
    with caplog.at_level(logging.WARNING, logger="rl_otel"):
        register_sink("cfg_test_sink", lambda **kw: object())
    assert "registered before" in caplog.text


def test_cli_trackers_prints_redacted_config(tmp_path, capsys):
    path = tmp_path / "exp.yaml"
    path.write_text("track_with: swanlab\ntracker_kwargs:\n  login_kwargs:\n    api_key: sk-999\n  project: p\n")
    assert main(["trackers", "--config", str(path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["trackers"] == [{"name": "swanlab", "kwargs": {"login_kwargs": "***", "project": "p"}}]
    assert main(["trackers", "--config", str(path), "--tracker", 'tensorboard={"log_dir": "tb"}',
                 "--tracker", "stdout"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [t["name"] for t in out["trackers"]] == ["tensorboard", "stdout"]
    assert main(["trackers", "--track-with", "wandb", "--tracker-kwargs", '{"project": "q"}']) == 0
    assert json.loads(capsys.readouterr().out)["trackers"][0] == {"name": "wandb", "kwargs": {"project": "q"}}
    assert main(["trackers", "--track-with", "nope"]) == 2
    assert "unknown tracker" in capsys.readouterr().err


def test_public_names():
    assert {"init", "register_sink", "Sink"} <= set(rl_otel.__all__)
    assert rl_otel.register_sink is register_sink
