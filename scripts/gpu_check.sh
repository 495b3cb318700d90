#!/usr/bin/env bash
# The GPU checks in one run (issues 32, 39): the suite's GPU-relevant tests on the real CUDA path, then
# benchmarks/bench_gpu.py (phase cost, step overhead against a bare GPU step, GPU vs host phase time against CUDA
# events, ppo_stats wall time and kernels against the frameworks' code, and "first do no harm": no CUDA context in a
# process that never used CUDA, max_memory_allocated() unchanged by phase_peaks=False and nested phases, 10/10
# CUDA-graph captures right after phases with pending GPU work, the host syncs of a 50-key CUDA log()), each
# printing its target and whether it is met. Run it on a machine with an NVIDIA GPU and torch with CUDA, from a checkout, with rl_otel's dependencies
# importable (e.g. the wheels of the OpenTelemetry packages and google-crc32c unpacked on PYTHONPATH):
#
#   bash scripts/gpu_check.sh [OUT_DIR]
#
# It fails when no CUDA device is visible: a CPU run of these tests says nothing about a GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-.}"
mkdir -p "$out"
python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else "no CUDA device visible to torch")' \
    || exit 2
python3 - <<'PY'
import torch
print("torch", torch.__version__, "CUDA", torch.version.cuda, "device", torch.cuda.get_device_name(0))
PY
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD" PYTHONUNBUFFERED=1
status=0
python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/test_phases.py tests/test_phase_probes.py \
    tests/test_phase_writes.py tests/test_memory.py tests/test_live.py tests/test_gpu_time.py \
    tests/test_torch_compat.py tests/test_gpu_hazards.py tests/test_tracing.py tests/test_fork.py tests/test_catalog_served_names.py \
    tests/test_stats_kernels.py tests/test_stats_ppo.py tests/test_stats_ppo_verl.py tests/test_stats_ppo_roll.py \
    tests/test_stats_baselines.py tests/test_stats_histogram.py tests/test_stats_memory.py tests/test_submit.py 2>&1 | tee "$out/gpu_tests.log" \
    || status=1
python3 benchmarks/bench_gpu.py --check 2>&1 | tee "$out/bench_gpu.log" || status=1
exit $status
