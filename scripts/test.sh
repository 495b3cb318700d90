#!/usr/bin/env bash
# Installs what the tests need (Debian packages: prometheus for prometheus/promtool, victoria-metrics for the
# multi-node test, prometheus-alertmanager for amtool; pinned Python packages), runs ruff and mypy, then the suite. This is the README's test command; .ci/run calls it.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null \
    || ! command -v victoria-metrics >/dev/null || ! command -v vmalert >/dev/null \
    || ! command -v amtool >/dev/null || ! command -v prometheus-alertmanager >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  # victoria-metrics (with vmalert): the second central store of tests/test_multinode.py;
  # prometheus-alertmanager (amtool, prometheus-alertmanager): the Alertmanager tests of tests/test_deploy.py
  $SUDO apt-get install -y -qq --no-install-recommends prometheus victoria-metrics prometheus-alertmanager >/dev/null
  # the packages' services are not wanted: tests start their own servers
  $SUDO systemctl stop prometheus victoria-metrics prometheus-alertmanager 2>/dev/null || true
fi
python3 -m pip install -q --disable-pip-version-check -c requirements-test.txt -e '.[dev]'
# verl and Trinity-RFT without their declared dependencies (a CUDA torch, vLLM, ...): what their imports need is pinned
python3 -m pip install -q --disable-pip-version-check --no-deps -r requirements-frameworks.txt
# static checks first (seconds): lint and types; the dependency rule runs in tests/test_architecture.py
python3 -m ruff check rl_otel tests benchmarks examples
python3 -m mypy
python3 -m pytest -q -p no:cacheprovider "$@"
