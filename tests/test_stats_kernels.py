"""How many device kernels ``ppo_stats`` launches on an accelerator, counted on a CPU: at most 40 a call.

On a GPU ``ppo_stats`` is launch-bound (issue 32: 263 kernels for veRL's names, 370 for ROLL's, 180 for TRL's at
B=512, T=4096, while the GPU was busy a fifth of the call), so the number of kernels is its cost there. No GPU
exists on CI, so the accelerator path (``_compact=False``: masks instead of a gather, one transfer) runs on the CPU
under a ``TorchDispatchMode`` that records every ATen operator the call dispatches.

Why this proxy, and how honest it is:

- Each operator the Python code issues reaches the dispatcher once; CUDA's implementation of each launches at least
  one kernel. The operators that launch none are left out: views and aliases (``OpOverload.is_view``: slicing,
  ``view``, ``expand``, ``detach``), allocations (``empty*``: the caching allocator, no kernel), Python scalars
  wrapped as CPU tensors (``scalar_tensor``, ``lift_fresh``: passed to the kernel by value), dtype queries.
- So the count is a lower bound of the kernels. It is the number of kernels where each counted operator launches
  exactly one, which the test also asserts of the call: no operator known to launch several or to synchronize
  (``nonzero``, ``count_nonzero``, boolean indexing, a reduction of a bool/int tensor, which CUDA casts in a kernel
  of its own first, a ``cat`` of mixed dtypes, which CUDA copies input by input). What the proxy cannot see:
  the ``cudaMemsetAsync`` of a reduction over more than one block per output, and the one device-to-host copy:
  neither is a kernel launch; ``benchmarks/bench_stats.py --device cuda`` counts both with torch's profiler.
- ``torch.profiler`` on a CPU is the worse proxy: it records an operator's nested calls (CPU kernels call other
  operators) and CPU-only work, not what a CUDA device would launch.

The same batches as the benchmark's (``benchmarks/bench_stats.py``: each framework's tensors prepared the way it
prepares them, with every optional input given), so the count is the benchmarked call's.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_stats

from rl_otel.stats import ppo_stats
from tests._host_reads import count_host_reads

TARGET = 40  # kernels a call (issue 32)
_NO_KERNEL = {"empty", "empty_like", "empty_strided", "new_empty", "scalar_tensor", "lift_fresh", "lift_fresh_copy",
              "promote_types", "result_type"}
_SEVERAL_KERNELS = {"nonzero", "count_nonzero", "index", "masked_select", "unique", "bincount", "_local_scalar_dense",
                    "item"}
_REDUCTIONS = {"sum", "amax", "amin", "aminmax", "linalg_vector_norm", "mean", "max", "min"}


class DeviceOps(TorchDispatchMode):
    """Records the operators a call dispatches that would launch a kernel on a CUDA device (see the module's
    docstring), with the dtypes of their tensor inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, tuple[torch.dtype, ...]]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        name = func.overloadpacket.__name__
        if not func.is_view and name not in _NO_KERNEL:
            flat = [a for arg in args for a in (arg if isinstance(arg, list | tuple) else (arg,))]
            self.ops.append((name, tuple(a.dtype for a in flat if isinstance(a, torch.Tensor))))
        return func(*args, **(kwargs or {}))


def device_ops(fn: Any) -> list[tuple[str, tuple[torch.dtype, ...]]]:
    fn()  # once before: constants made on first use (a device copy each, once a process) are not the call's
    with DeviceOps() as mode:
        fn()
    return mode.ops


@pytest.mark.parametrize("shape", [(64, 512), (512, 4096)])
@pytest.mark.parametrize("framework", bench_stats.FRAMEWORKS)
def test_the_accelerator_path_launches_at_most_40_kernels(framework, shape):
    case = bench_stats.Case(framework, *shape)
    ops = device_ops(lambda: ppo_stats(**case.kwargs, _compact=False))
    names = Counter(name for name, _ in ops)
    assert len(ops) <= TARGET, names
    assert not set(names) & _SEVERAL_KERNELS, names  # each counted operator: one kernel, no sync
    for name, dtypes in ops:
        if name in _REDUCTIONS:  # reductions of float tensors only (CUDA casts a bool/int input in a kernel first)
            assert dtypes[0].is_floating_point, (name, dtypes)
        if name == "cat":  # the one read: its parts in one dtype, one batched copy kernel
            assert len(set(dtypes)) == 1, dtypes
    # the frameworks' own metric code, counted the same way, launches several times as many
    theirs = device_ops(case.theirs)
    assert len(ops) * 3 < len(theirs), (len(ops), len(theirs))


def test_the_count_does_not_grow_with_the_batch():
    """A kernel covers a whole stacked round whatever its size: the counts at two shapes are the same."""
    for framework in bench_stats.FRAMEWORKS:
        small, large = bench_stats.Case(framework, 16, 64), bench_stats.Case(framework, 512, 4096)
        counts = [len(device_ops(lambda c=c: ppo_stats(**c.kwargs, _compact=False))) for c in (small, large)]
        assert counts[0] == counts[1], (framework, counts)


@pytest.mark.parametrize("framework", bench_stats.FRAMEWORKS)
def test_the_benchmarked_call_reads_back_once(monkeypatch, framework):
    """The benchmark's calls make one device -> host read (``tests/test_stats_ppo.py`` checks the other variants:
    distributions, ROLL's final mask and sequence-level ratios, veRL's response lengths)."""
    calls = count_host_reads(monkeypatch)
    case = bench_stats.Case(framework, 64, 512)
    ppo_stats(**case.kwargs, _compact=False)
    assert calls == ["cpu", "numpy"], calls  # .numpy() of the host copy


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (runs on the GPU machine)")
def test_on_a_gpu_the_kernels_are_counted_by_the_profiler():
    """The same bound, counted by torch's profiler on a real device (the benchmark's rows); time is the
    benchmark's business."""
    rows = bench_stats.gpu_comparison("cuda", rounds=3)
    assert {(r["framework"], r["shape"]) for r in rows} == {
        (fw, f"{b}x{t}") for fw in bench_stats.FRAMEWORKS for b, t in bench_stats.GPU_SHAPES}
    for row in rows:
        assert 0 < row["ours_kernels"] <= TARGET < row["theirs_kernels"], row
        assert row["ours_peak_bytes"] <= row["theirs_peak_bytes"], row
