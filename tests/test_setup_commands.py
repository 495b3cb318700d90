"""The README's two set-up commands pick the torch build the machine can use (scripts/torch_index.py).

Without an NVIDIA GPU, pip must be given PyTorch's CPU index (else it downloads the CUDA build, several GB); with
one, nothing; and an index that does not answer must not be given to pip (pip retries it for every package). The
index here is a local HTTP server (``RL_OTEL_TORCH_CPU_INDEX``), the GPU a fake ``nvidia-smi`` first on PATH, and
the commands run as the README prints them with a ``python3`` that hands out recording virtual environments: what
they would install is checked, nothing is installed.
"""

from __future__ import annotations

import http.server
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "torch_index.py"
README = (ROOT / "README.md").read_text()

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(platform.system() != "Linux", reason="the CUDA wheel question is Linux's")]

NO_DRIVER = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
H100 = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0d2c7a4e-3f1b-4c55-9c8e-1b2a3c4d5e6f)"


class _Index(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # the http.server API
        found = self.path == "/whl/cpu/torch/"
        self.send_response(200 if found else 404)
        self.end_headers()
        if found:
            self.wfile.write(b'<a href="torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl">torch</a>')

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def index() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Index)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/whl/cpu"
    server.shutdown()
    server.server_close()


def _fake_smi(bin_dir: Path, gpu: bool) -> None:
    """``nvidia-smi`` as the driver's tool answers: ``-L`` lists the GPUs, or fails without a driver."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\necho '{H100}'\n" if gpu else f"#!/bin/sh\necho '{NO_DRIVER}'\nexit 9\n")
    smi.chmod(0o755)


def _env(tmp_path: Path, index: str, gpu: bool | None, **extra: str) -> dict[str, str]:
    """The environment of a machine with (``gpu=True``), without (``False``: the tool fails) or with no
    ``nvidia-smi`` at all (``None``)."""
    path = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d and not (Path(d) / "nvidia-smi").exists()]
    if gpu is not None:
        _fake_smi(tmp_path / "smi", gpu)
        path.insert(0, str(tmp_path / "smi"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RL_OTEL_TORCH")}
    return {**env, "PATH": os.pathsep.join(path), "RL_OTEL_TORCH_CPU_INDEX": index, **extra}


def _choose(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("gpu", [None, False], ids=["no nvidia-smi", "nvidia-smi without a driver"])
def test_without_a_gpu_pip_gets_the_cpu_index(tmp_path, index, gpu):
    proc = _choose(_env(tmp_path, index, gpu))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["--extra-index-url", index]
    assert "no NVIDIA GPU found, the CPU build" in proc.stderr


def test_with_a_gpu_pip_gets_pypis_cuda_build(tmp_path, index):
    proc = _choose(_env(tmp_path, index, gpu=True))
    assert proc.returncode == 0 and proc.stdout == "", proc
    assert "the CUDA build (GPU 0: NVIDIA H100 80GB HBM3)" in proc.stderr


def test_an_index_that_does_not_answer_is_left_out(tmp_path):
    """A connection that is accepted and never answered (a firewall that drops, a dead proxy) and one that is
    refused: pip is not given the index, and the user is told what pip will download instead."""
    with socket.socket() as silent, socket.socket() as closed:
        silent.bind(("127.0.0.1", 0))
        silent.listen()  # the kernel accepts into the backlog; nothing ever answers
        closed.bind(("127.0.0.1", 0))  # bound, never listening: refused
        for sock in (silent, closed):
            url = f"http://127.0.0.1:{sock.getsockname()[1]}/whl/cpu"
            proc = _choose(_env(tmp_path, url, gpu=False))
            assert proc.returncode == 0 and proc.stdout == "", proc
            assert f"{url} is not reachable" in proc.stderr and "the CUDA build (several GB)" in proc.stderr


def test_the_user_decides_with_rl_otel_torch(tmp_path, index):
    cpu = _choose(_env(tmp_path, index, gpu=True, RL_OTEL_TORCH="cpu"))
    assert cpu.stdout.splitlines() == ["--extra-index-url", index]
    pypi = _choose(_env(tmp_path, index, gpu=False, RL_OTEL_TORCH="pypi"))
    assert pypi.returncode == 0 and pypi.stdout == ""
    bad = _choose(_env(tmp_path, index, gpu=False, RL_OTEL_TORCH="cuda12"))
    assert bad.returncode == 2 and "RL_OTEL_TORCH must be one of auto, cpu, pypi, got 'cuda12'" in bad.stderr


# A python3 that makes "virtual environments" whose python, pip and rl-otel record their arguments; anything else
# goes to the real interpreter (scripts/torch_index.py runs for real).
_PYTHON3 = """#!{python}
import json, os, sys
args = sys.argv[1:]
if args[:2] == ["-m", "venv"]:
    bin_dir = os.path.join(args[2], "bin")
    os.makedirs(bin_dir, exist_ok=True)
    for tool in ("python", "pip", "rl-otel"):
        path = os.path.join(bin_dir, tool)
        with open(path, "w") as f:
            f.write("#!{python}\\nimport json, sys\\n"
                    "open({log!r}, 'a').write(json.dumps([%r] + sys.argv[1:]) + '\\\\n')\\n" % tool)
        os.chmod(path, 0o755)
    sys.exit(0)
os.execv({python!r}, [{python!r}, *args])
"""


def _recording_machine(tmp_path: Path, env: dict[str, str]) -> tuple[Path, dict[str, str], Path]:
    """A checkout's scripts and pins in ``tmp_path/checkout``, the recording python3 (and stand-ins for the Debian
    servers test.sh checks for) first on PATH. Returns the checkout, the environment and the record file."""
    checkout, fake = tmp_path / "checkout", tmp_path / "fake-bin"
    (checkout / "scripts").mkdir(parents=True)
    fake.mkdir()
    for name in ("torch_index.py", "test.sh", "check_env.py"):
        shutil.copy(ROOT / "scripts" / name, checkout / "scripts" / name)
    shutil.copy(ROOT / "requirements-test.txt", checkout)
    log = tmp_path / "record.jsonl"
    (fake / "python3").write_text(_PYTHON3.format(python=sys.executable, log=str(log)))
    for server in ("prometheus", "promtool", "victoria-metrics", "vmalert", "amtool", "prometheus-alertmanager"):
        (fake / server).write_text("#!/bin/sh\nexit 0\n")
    for path in fake.iterdir():
        path.chmod(0o755)
    return checkout, {**env, "PATH": f"{fake}{os.pathsep}{env['PATH']}"}, log


def _records(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def _readme_commands() -> list[str]:
    section = README.split("## Set-up: the two commands", 1)[1].split("\n## ", 1)[0]
    return [code.strip() for code in re.findall(r"```bash\n(.*?)```", section, re.S)]


@pytest.mark.parametrize("gpu", [False, True], ids=["no GPU", "GPU"])
def test_the_readme_demo_command_installs_the_machines_torch(tmp_path, index, gpu):
    demo, _ = _readme_commands()
    checkout, env, log = _recording_machine(tmp_path, _env(tmp_path, index, gpu))
    proc = subprocess.run(["bash", "-c", demo], cwd=checkout, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    pip, rl_otel = _records(log)
    expected = [] if gpu else ["--extra-index-url", index]
    assert pip == ["pip", "install", *expected, "-c", "requirements-test.txt", "-e", ".[demo]"]
    assert rl_otel == ["rl-otel", "demo"]


@pytest.mark.parametrize("gpu", [False, True], ids=["no GPU", "GPU"])
def test_the_test_command_installs_the_machines_torch_and_asks_that_index_for_torch_only(tmp_path, index, gpu):
    _, test = _readme_commands()
    assert test == "bash scripts/test.sh"
    checkout, env, log = _recording_machine(tmp_path, _env(tmp_path, index, gpu))
    env = {**env, "RL_OTEL_TEST_VENV": str(tmp_path / "venv")}
    env.pop("RL_OTEL_REUSE_VENV", None)
    proc = subprocess.run(["bash", "-c", test], cwd=checkout, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    installs = [r[4:] for r in _records(log) if r[:4] == ["python", "-m", "pip", "install"]]
    flags = ["--disable-pip-version-check", "--progress-bar", "off"]
    expected = [] if gpu else ["--extra-index-url", index]
    assert installs[0] == [*flags, *expected, "-c", "requirements-test.txt", "torch"]
    assert all("--extra-index-url" not in args for args in installs[1:]), installs
    assert installs[1] == [*flags, "-c", "requirements-test.txt", "-e", ".[dev]"]
