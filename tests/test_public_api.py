from __future__ import annotations

import json
import subprocess
import sys

import rl_otel
from rl_otel.cli import main


def test_public_names_are_pinned():
    assert rl_otel.__all__ == ["Catalog", "ConfigurationError", "PortInUseError", "Sink", "Telemetry", "__version__",
                               "default_catalog", "init", "register_sink"]
    for name in rl_otel.__all__:
        assert getattr(rl_otel, name) is not None


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
    assert main(["catalog", "--format", "json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == len(rl_otel.default_catalog())
    assert main(["catalog", "--format", "markdown"]) == 0
    assert "| `rl_critic_score` |" in capsys.readouterr().out


def test_console_script_is_installed():
    out = subprocess.run(["rl-otel", "catalog", "resolve", "actor/approxkl"], capture_output=True, text=True,
                         check=True).stdout
    assert json.loads(out)["prometheus_name"] == "rl_actor_approx_kl"
