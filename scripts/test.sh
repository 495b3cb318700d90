#!/usr/bin/env bash
# Installs what the tests need (the Debian prometheus package for prometheus/promtool, pinned Python packages)
# and runs the suite. This is the README's test command; .ci/run calls it.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  # the package's service is not wanted: tests start their own servers
  $SUDO systemctl stop prometheus 2>/dev/null || true
fi
python3 -m pip install -q --disable-pip-version-check -c requirements-test.txt -e '.[dev]'
# verl and Trinity-RFT without their declared dependencies (a CUDA torch, vLLM, ...): what their imports need is pinned
python3 -m pip install -q --disable-pip-version-check --no-deps -r requirements-frameworks.txt
python3 -m pytest -q -p no:cacheprovider "$@"
