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
from rl_otel._internal.runtime.options import (
    FILE_KEYS,
    INTEGRATION_OPTIONS,
    OPTIONS,
    PROMETHEUS_DEFAULTS,
    UNSET,
    options_markdown,
)

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


def test_no_config_field_carries_a_default_of_its_own():
    """An option's default is written once, in OPTIONS (the prometheus settings' in PROMETHEUS_DEFAULTS):
    TelemetryConfig has no field default (build_config fills every field), PrometheusConfig none for a setting
    whose default is a value (``None`` there means the feature is off)."""
    from dataclasses import MISSING

    from rl_otel._internal.runtime.config import PrometheusConfig

    with_default = [f.name for f in fields(TelemetryConfig)
                    if f.default is not MISSING or f.default_factory is not MISSING]
    assert not with_default, f"TelemetryConfig fields with a default of their own: {with_default}"
    valued = {k for k, v in PROMETHEUS_DEFAULTS.items() if v is not None} & {f.name for f in fields(PrometheusConfig)}
    assert valued == {"host", "port", "port_search"}
    assert all(f.default is MISSING for f in fields(PrometheusConfig) if f.name in valued)


# A default still written twice in a file of the core's rewrite (issue 40), which removes it: delete each entry
# with its copy (the test fails on an entry whose copy is gone, so the list only shrinks).
_COPIES_PENDING: set[tuple[str, str]] = set()


def _written_defaults(root: Path) -> list[tuple[str, str, int, object]]:
    """``(path, name, line, value)`` of every literal that rl_otel's code, ``options.py`` aside, gives a name of an
    option or of a prometheus setting as its default: a parameter's default, a class or module assignment (a
    leading ``_`` and ``default_`` ignored: ``_DEFAULT_PORT``), an argparse ``--flag``'s ``default=``."""
    import ast

    def literal(node: ast.AST) -> object:
        try:
            return ast.literal_eval(node)
        except ValueError:
            return None

    def name_of(name: str) -> str:
        name = name.lstrip("_").lower()
        return name[len("default_"):] if name.startswith("default_") else name

    found = []
    for path in sorted((root / "rl_otel").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel == "rl_otel/_internal/runtime/options.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            pairs: list[tuple[str, ast.AST]] = []
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                a = node.args
                positional = [*a.posonlyargs, *a.args]
                pairs += zip([p.arg for p in positional[len(positional) - len(a.defaults):]], a.defaults, strict=True)
                pairs += [(p.arg, d) for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True) if d is not None]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                pairs.append((node.target.id, node.value))
            elif isinstance(node, ast.Assign):
                pairs += [(t.id, node.value) for t in node.targets if isinstance(t, ast.Name)]
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "add_argument"):
                flags = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
                         and a.value.startswith("--")]
                pairs += [(flags[0][2:].replace("-", "_"), k.value) for k in node.keywords
                          if k.arg == "default" and flags]
            for name, value_node in pairs:
                name = name_of(name)
                if name in _DEFAULTS:
                    value = literal(value_node)
                    default = _DEFAULTS[name]
                    if value is not None and type(value) is type(default) and value == default:
                        found.append((rel, name, value_node.lineno, value))
    return found


# a default that switches something off (None; port_search's 0: no search) is every API's neutral value, no copy
_DEFAULTS = {**{o.name: o.default for o in OPTIONS if o.default is not None},
             **{k: v for k, v in PROMETHEUS_DEFAULTS.items() if v is not None and k != "port_search"}}
# the same name and value meaning something else
_NOT_COPIES = {("rl_otel/ops/promtests.py", "role")}  # the role label of promtool's synthetic series


def test_no_default_of_an_option_is_written_a_second_time():
    """A default written twice drifts: every other place reads it from OPTIONS (``BY_NAME[name].default``,
    ``DEFAULT_HOST``, ``DEFAULT_PORT``)."""
    found = _written_defaults(REPO)
    copies = [f"{path}:{line}: {name} = {value!r}, a copy of options.py's default"
              for path, name, line, value in found if (path, name) not in _COPIES_PENDING | _NOT_COPIES]
    assert not copies, "\n".join(copies)
    gone = _COPIES_PENDING - {(path, name) for path, name, _, _ in found}
    assert not gone, f"no longer a copy: remove {sorted(gone)} from _COPIES_PENDING"


def test_the_copy_finder_finds_each_way_of_writing_a_default(tmp_path):
    (tmp_path / "rl_otel").mkdir()
    (tmp_path / "rl_otel" / "m.py").write_text(
        "_DEFAULT_PORT = 9464\n"
        "def f(a, close_timeout_s=10.0, *, max_unknown_keys: int = 1_000): ...\n"
        "class C:\n    host: str = '0.0.0.0'\n    hang_factor: float = 5\n"
        "parser.add_argument('--sink-queue-size', type=int, default=64)\n"
        "port = 9465\n")
    found = {(name, line) for _, name, line, _ in _written_defaults(tmp_path)}
    # hang_factor = 5 (an int) is no copy of 5.0, port 9465 not of 9464
    assert found == {("port", 1), ("close_timeout_s", 2), ("max_unknown_keys", 2), ("host", 4),
                     ("sink_queue_size", 6)}


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
