from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import rl_otel
from rl_otel.cli import main

PUBLIC = ["Catalog", "ConfigurationError", "HistogramValue", "PortInUseError", "Sink", "Telemetry", "__version__",
          "default_catalog", "init", "register_sink"]


def test_public_names_are_pinned():
    assert rl_otel.__all__ == PUBLIC
    for name in rl_otel.__all__:
        assert getattr(rl_otel, name) is not None


def test_dir_shows_the_public_names_and_they_resolve_lazily():
    """``dir(rl_otel)`` is the public surface (the lazily imported names included), and listing it imports nothing
    heavy; each name resolves on access, to the object its module defines."""
    code = ("import sys, json, rl_otel; names = dir(rl_otel); "
            "heavy = sorted({'numpy', 'opentelemetry.sdk'} & set(sys.modules)); "
            "from rl_otel.telemetry import Telemetry; from rl_otel._internal.pipeline.store import HistogramValue; "
            "from rl_otel.catalog import Catalog, default_catalog; "
            "same = [rl_otel.Telemetry is Telemetry, rl_otel.HistogramValue is HistogramValue, "
            "rl_otel.Catalog is Catalog, rl_otel.default_catalog is default_catalog]; "
            "print(json.dumps([names, heavy, same]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    names, heavy, same = json.loads(out)
    assert names == PUBLIC and heavy == [] and all(same)
    assert {"Telemetry", "Catalog", "init"} <= set(dir(rl_otel))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        rl_otel.nope  # noqa: B018


def test_the_module_names_it_sends_to_telemetry_are_telemetrys():
    """``rl_otel.log`` (wandb's habit) says the name belongs to the Telemetry init() returns: every name so
    redirected is one a Telemetry has (a method, a property, or an attribute its constructor sets)."""
    from rl_otel import _TELEMETRY_METHODS
    from rl_otel.telemetry import Telemetry

    with rl_otel.init(run="names", prometheus=False, stack_dump_signal=None) as tel:
        missing = sorted(name for name in _TELEMETRY_METHODS if not hasattr(Telemetry, name) and
                         name not in vars(tel))
    assert not missing, f"rl_otel._TELEMETRY_METHODS names {missing}, which a Telemetry does not have"
    for name in sorted(_TELEMETRY_METHODS - set(vars(rl_otel))):  # rl_otel.catalog, once imported, is the package
        with pytest.raises(AttributeError, match=f"tel.{name}"):
            getattr(rl_otel, name)


def test_wheel_ships_py_typed(tmp_path):
    """PEP 561: the package says it is typed, in a wheel built from this checkout (setuptools' own backend, no
    network, no install)."""
    root = Path(__file__).resolve().parent.parent
    src = tmp_path / "src"
    shutil.copytree(root / "rl_otel", src / "rl_otel", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(root / name, src / name)
    code = "import sys; from setuptools import build_meta; print(build_meta.build_wheel(sys.argv[1]))"
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "dist")], cwd=src, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    wheel = tmp_path / "dist" / proc.stdout.strip().splitlines()[-1]
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    assert "rl_otel/py.typed" in names and "rl_otel/telemetry.py" in names


def test_import_is_light():
    code = ("import sys, rl_otel; heavy = {'torch', 'tensorboard', 'wandb', 'swanlab', 'pynvml', "
            "'opentelemetry.sdk', 'numpy'} & set(sys.modules); print(sorted(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_init_imports_no_optional_dependency():
    code = ("import sys, rl_otel; t = rl_otel.init(prometheus=False); t.log({'actor/lr': 1.0}, step=0); t.close(); "
            "print(sorted({'torch', 'tensorboard', 'wandb', 'swanlab', 'pynvml'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_cli_resolve_prints_one_json_object_per_key(capsys):
    keys = ["memory/actor_train/train_step/end/onload/max_allocated_frac/0", "eval/gsm8k/accuracy/mean@4/std",
            "my/custom_key"]
    assert main(["catalog", "resolve", *keys]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [d["key"] for d in lines] == keys
    assert [d["known"] for d in lines] == [True, True, False]
    assert lines[0]["prometheus_name"] == "rl_gpu_memory_peak_ratio"
    assert lines[0]["labels"] == {"cluster": "actor_train", "phase": "train_step", "kind": "max_allocated",
                                  "device_id": "0"}
    assert lines[1]["labels"]["across"] == "std" and lines[1]["unit"] == "1"
    assert lines[2]["prometheus_name"] == "rl_my_custom_key"


def test_cli_catalog_formats(capsys):
    from rl_otel.catalog import every_entry

    assert main(["catalog", "--format", "json"]) == 0  # every framework's entries
    assert len(json.loads(capsys.readouterr().out)) == len(every_entry()) > len(rl_otel.default_catalog())
    assert main(["catalog", "--format", "json", "--framework", "slime"]) == 0  # what a slime run resolves in
    assert len(json.loads(capsys.readouterr().out)) == len(rl_otel.default_catalog("slime"))
    assert main(["catalog", "--format", "markdown"]) == 0
    assert "| `rl_critic_score` |" in capsys.readouterr().out
    assert main(["catalog", "--framework", "nope"]) == 2


def test_console_script_is_installed():
    out = subprocess.run(["rl-otel", "catalog", "resolve", "actor/approxkl"], capture_output=True, text=True,
                         check=True).stdout
    assert json.loads(out)["prometheus_name"] == "rl_actor_approx_kl"
