"""Print the pip arguments that pick the right torch build for this machine (used by the README's two commands).

On Linux, PyPI's ``torch`` wheel is the CUDA build: it pulls about 17 NVIDIA packages, several GB, which a machine
without an NVIDIA GPU never uses. PyTorch's CPU index (https://download.pytorch.org/whl/cpu) has the same release
as ``torch==2.13.0+cpu``, about 200 MB; a local version sorts above the plain one, so with that index added pip
takes the CPU build and every other package still comes from PyPI. This script prints

    --extra-index-url
    https://download.pytorch.org/whl/cpu

(one argument a line, so ``$(...)`` splits it in bash, zsh and fish) when the machine has no NVIDIA GPU and that
index answers, and prints nothing otherwise (a GPU: PyPI's CUDA build is the right one; macOS and Windows: PyPI's
wheel has no CUDA). It says what it chose on stderr.

The index is probed first (a few seconds at most) because pip, given an index it cannot reach, retries it for every
package it installs (5 tries each): an install that takes a minute then takes five.

Environment:
    RL_OTEL_TORCH             ``auto`` (default), ``cpu`` (the CPU index, even with a GPU; not probed) or
                              ``pypi`` (no extra index: PyPI's build).
    RL_OTEL_TORCH_CPU_INDEX   the CPU index to use (a mirror of https://download.pytorch.org/whl/cpu).

Standard library only: it runs with the ``python3`` that makes the virtual environment.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import urllib.error
import urllib.request

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PROBE_TIMEOUT_S = 3.0
CHOICES = ("auto", "cpu", "pypi")


def nvidia_gpus() -> list[str]:
    """The GPUs ``nvidia-smi -L`` lists (``GPU 0: NVIDIA H100 ... (UUID: ...)``); none without the driver's tool, or
    when it fails (installed without a GPU or a loaded driver)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        proc = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return []
    if proc.returncode != 0:
        return []
    return [line.strip() for line in proc.stdout.splitlines() if line.strip().startswith("GPU ")]


def answers(index: str, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether ``index`` serves torch's project page within ``timeout_s`` (HTTP 200; the environment's proxy is
    used, as pip uses it). A GET, as pip's, closed after the status line: the page itself is not read."""
    try:
        with urllib.request.urlopen(index.rstrip("/") + "/torch/", timeout=timeout_s) as response:
            return response.status == 200
    except (OSError, ValueError):  # URLError, HTTPError, timeouts and resets are OSErrors
        return False


def choose(mode: str, system: str, gpus: list[str], index: str) -> tuple[list[str], str]:
    """``(pip arguments, what to tell the user)`` for this machine."""
    if mode == "pypi":
        return [], "torch: from PyPI (RL_OTEL_TORCH=pypi)"
    if mode == "cpu":
        return ["--extra-index-url", index], f"torch: the CPU build from {index} (RL_OTEL_TORCH=cpu)"
    if system != "Linux":
        return [], f"torch: from PyPI (on {system} its wheel has no CUDA)"
    if gpus:
        return [], f"torch: from PyPI, the CUDA build ({gpus[0].split(' (UUID')[0]})"
    if answers(index):
        return (["--extra-index-url", index],
                f"torch: no NVIDIA GPU found, the CPU build from {index} (about 200 MB instead of several GB)")
    return [], (f"torch: no NVIDIA GPU found, but {index} is not reachable (waited {PROBE_TIMEOUT_S:g} s at most): "
                f"pip takes torch from PyPI, the CUDA build (several GB) unless a CPU build is in its cache or "
                f"find-links; RL_OTEL_TORCH_CPU_INDEX=<a mirror> names another CPU index")


def main() -> int:
    mode = os.environ.get("RL_OTEL_TORCH", "auto").strip().lower() or "auto"
    if mode not in CHOICES:
        print(f"torch_index: RL_OTEL_TORCH must be one of {', '.join(CHOICES)}, got {mode!r}", file=sys.stderr)
        return 2
    index = os.environ.get("RL_OTEL_TORCH_CPU_INDEX", "").strip() or CPU_INDEX
    gpus = nvidia_gpus() if mode == "auto" and platform.system() == "Linux" else []
    args, message = choose(mode, platform.system(), gpus, index)
    print(message, file=sys.stderr)
    for arg in args:
        print(arg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
