#!/usr/bin/env bash
# The README's test command; .ci/run calls it. About 20 minutes on 2 busy cores from nothing (17 of them pytest).
#
#   1. Debian packages the tests run for real: prometheus (prometheus, promtool), victoria-metrics (vmalert),
#      prometheus-alertmanager (amtool), installed with apt-get when missing.
#   2. A NEW virtual environment at $RL_OTEL_TEST_VENV (default: .venv-test in this checkout), removed and made
#      again on every run, so a missing install step fails here instead of hiding behind a leftover package.
#      Nothing is installed into the python3 you run this with. RL_OTEL_REUSE_VENV=1 keeps an existing one
#      (for a maintainer's second run; .ci/run never sets it).
#   3. Pinned packages only: requirements-test.txt and the frameworks of requirements-frameworks.txt with
#      --no-deps; scripts/check_env.py then checks that every installed package is pinned and the frameworks import.
#      torch==2.13.0 is the CPU build on a machine without an NVIDIA GPU (scripts/torch_index.py adds PyTorch's CPU
#      index: about 200 MB instead of the CUDA build's several GB), PyPI's CUDA build on one with a GPU
#      (RL_OTEL_TORCH=cpu or =pypi chooses).
#   4. ruff, mypy, then pytest on RL_OTEL_TEST_WORKERS processes (default 2, a test module per process: tests that
#      share a fixture's server stay together; 0 runs in this process). Extra arguments go to pytest. Every step
#      prints its elapsed time.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
step() { printf '\n==> [%4ds] %s\n' "$((SECONDS - start))" "$*"; }

step "Debian packages: prometheus, promtool, vmalert, amtool"
if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null \
    || ! command -v victoria-metrics >/dev/null || ! command -v vmalert >/dev/null \
    || ! command -v amtool >/dev/null || ! command -v prometheus-alertmanager >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends prometheus victoria-metrics prometheus-alertmanager >/dev/null
  # the packages' services are not wanted: tests start their own servers
  $SUDO systemctl stop prometheus victoria-metrics prometheus-alertmanager 2>/dev/null || true
else
  echo "already installed"
fi

venv="${RL_OTEL_TEST_VENV:-.venv-test}"
if [ "${RL_OTEL_REUSE_VENV:-0}" = 1 ] && [ -x "$venv/bin/python" ]; then
  step "reusing the virtual environment $venv (RL_OTEL_REUSE_VENV=1)"
else
  step "a new virtual environment: $venv (made from $(command -v python3), $(python3 --version))"
  rm -rf "$venv"
  python3 -m venv "$venv"
fi
venv="$(cd "$venv" && pwd)"
py="$venv/bin/python"
pip=("$py" -m pip install --disable-pip-version-check --progress-bar off)

step "pinned packages: requirements-test.txt and this checkout (-e '.[dev]')"
# torch first and alone, with the index that gives this machine's build (the CPU one without an NVIDIA GPU); the
# rest then finds torch installed, so only this step asks that index
# (its lines are words without spaces: --extra-index-url URL, or nothing; a bad RL_OTEL_TORCH stops here)
torch_index="$(python3 scripts/torch_index.py)"
# shellcheck disable=SC2086
"${pip[@]}" $torch_index -c requirements-test.txt torch
"${pip[@]}" -c requirements-test.txt -e '.[dev]'

step "frameworks with --no-deps: requirements-frameworks.txt (verl, Trinity-RFT and the light modules they import)"
"${pip[@]}" --no-deps -r requirements-frameworks.txt
# every installed package pinned, the frameworks importable: a missing or wrong pin fails now, not as a skipped
# or broken test later
"$py" scripts/check_env.py

step "static checks: ruff, mypy"
"$py" -m ruff check rl_otel tests benchmarks examples scripts
"$py" -m mypy

step "pytest"
# RL_OTEL_TEST_ALL: an optional package the suite imports must be importable (a skip for "not installed" fails)
workers="${RL_OTEL_TEST_WORKERS:-2}"
parallel=()
[ "$workers" = 0 ] || parallel=(-n "$workers" --dist loadfile)
RL_OTEL_TEST_ALL=1 PATH="$venv/bin:$PATH" "$py" -m pytest -q -p no:cacheprovider "${parallel[@]}" "$@"
step "done"
