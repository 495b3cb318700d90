"""The structure docs/architecture.md describes holds: the dependency rule (import-linter's contracts in
pyproject.toml), one definition of the options, a public surface with the implementation behind ``_internal``."""

from __future__ import annotations

import inspect
import shutil
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

import rl_otel
from rl_otel._internal.runtime.config import TelemetryConfig
from rl_otel._internal.runtime.options import FILE_KEYS, INTEGRATION_OPTIONS, OPTIONS, UNSET, options_markdown

REPO = Path(__file__).resolve().parents[1]


def _lint_imports(root: Path) -> subprocess.CompletedProcess:
    exe = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    return subprocess.run([exe, "--no-cache", "--config", str(REPO / "pyproject.toml")], cwd=root,
                          capture_output=True, text=True, timeout=300, env={"PYTHONPATH": str(root), "PATH": ""})


def test_the_dependency_rule_holds():
    result = _lint_imports(REPO)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "Contracts: 4 kept, 0 broken." in result.stdout


def test_the_dependency_rule_catches_a_pipeline_module_importing_the_facade(tmp_path):
    """The check can fail: a copy of the package where the pipeline imports the facade breaks the layers."""
    shutil.copytree(REPO / "rl_otel", tmp_path / "rl_otel", ignore=shutil.ignore_patterns("__pycache__"))
    with open(tmp_path / "rl_otel" / "_internal" / "pipeline" / "router.py", "a") as f:
        f.write("\nfrom rl_otel.telemetry import Telemetry  # noqa: E402,F401\n")
    result = _lint_imports(tmp_path)
    assert result.returncode != 0
    assert "rl_otel._internal.pipeline is not allowed to import rl_otel.telemetry" in result.stdout


def test_init_names_exactly_the_defined_options_in_their_order():
    params = inspect.signature(rl_otel.init).parameters
    names = [n for n in params if n not in ("config", "catalog")]
    assert names == [o.name for o in OPTIONS]
    assert all(params[n].default is UNSET for n in names)  # defaults live in OPTIONS, nowhere else
    for option in OPTIONS:  # the docstring is built from the definitions
        assert f"{option.name}: {option.doc.split()[0]}" in rl_otel.init.__doc__


def test_the_resolved_config_and_the_integrations_cover_every_option():
    """One place per option: each is checked once (its Option's check) into the TelemetryConfig field of its name,
    and the typed config holds nothing else but what the environment says."""
    resolved = {f.name for f in fields(TelemetryConfig)}
    filled = {o.field or o.name for o in OPTIONS if o.field is not None}
    assert resolved == filled | {"host_name", "local_rank", "world_size"}
    assert all(o.check is not None for o in OPTIONS if o.field is not None)
    # the three tracker options are resolved together into TelemetryConfig.trackers
    assert {o.name for o in OPTIONS if o.field is None} == {"tracker_kwargs", "trackers"}
    assert set(INTEGRATION_OPTIONS) == {o.name for o in OPTIONS} | {"config"}
    assert "tracer_provider" not in FILE_KEYS and "run" in FILE_KEYS  # an object cannot come from a YAML file


def test_an_option_from_a_file_and_one_given_take_the_documented_precedence(tmp_path):
    path = tmp_path / "rl.yaml"
    path.write_text("rl_otel:\n  run: from-file\n  role: actor\n  prometheus: false\n  max_unknown_keys: 7\n")
    with rl_otel.init(config=path, role="critic") as tel:
        assert (tel.config.run, tel.config.role, tel.config.max_unknown_keys) == ("from-file", "critic", 7)
        assert tel.config.prometheus is None and tel.config.max_series_per_metric == 10_000  # the default


def test_docs_options_md_is_generated_from_the_definitions():
    assert (REPO / "docs" / "options.md").read_text() == options_markdown(), \
        "docs/options.md is stale: run python3 -m rl_otel.ops"


def test_the_public_surface():
    assert sorted(dir(rl_otel)) == sorted(rl_otel.__all__)
    assert {"init", "Telemetry", "Catalog", "HistogramValue", "ConfigurationError"} <= set(rl_otel.__all__)
    assert rl_otel.Telemetry is rl_otel.telemetry.Telemetry
    assert not any(name.startswith("_") for name in rl_otel.__all__ if name != "__version__")
    assert (REPO / "rl_otel" / "py.typed").exists()


@pytest.mark.parametrize("module", ["rl_otel.telemetry", "rl_otel.phases", "rl_otel.sinks", "rl_otel.stats"])
def test_public_modules_declare_what_they_export(module):
    import importlib

    mod = importlib.import_module(module)
    assert mod.__all__ and all(hasattr(mod, name) for name in mod.__all__)
