"""Memory snapshots at the torch.cuda / psutil boundary, in ROLL's state_offload_manager keys and units (GiB).

torch is never imported here: the GPU probe reads ``sys.modules["torch"]``, so a process that never imported
torch (it has no tensors on a GPU) pays nothing and gets no GPU metrics. Without a CUDA device the GPU keys are
absent - never zeros - and one info line says so.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import Any

import psutil

_log = logging.getLogger("rl_otel")
GIB = float(2**30)
GPU_STAGES = ("start/offload", "start/onload", "end/onload", "end/offload")
GPU_KINDS = ("allocated", "reserved", "max_allocated", "max_reserved")


def torch_cuda() -> Any | None:
    """``torch.cuda`` if the process imported torch and a CUDA device is usable, else ``None``."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is None:
        return None
    try:
        return cuda if cuda.is_available() and cuda.device_count() > 0 else None
    except Exception:  # a broken driver is "no GPU" for telemetry
        return None


class GpuProbe:
    """GPU memory of this process on its current device, as ROLL's ``_get_gpu_memory_metrics`` reports it."""

    def __init__(self) -> None:
        self._total: dict[int, float] = {}
        self._announced = False
        self._lock = threading.Lock()

    def reset_peaks(self) -> None:
        """Reset the allocator's peak statistics (done at phase start, as ROLL does)."""
        cuda = self._cuda()
        if cuda is not None:
            cuda.reset_peak_memory_stats()

    def snapshot(self, infix: str, stage: str, out: dict[str, float], *, with_frac: bool = False) -> None:
        """Add ``memory/{infix}/{stage}/{kind}/{device_id}`` (GiB) to ``out``; the ``*_frac`` keys too if asked."""
        cuda = self._cuda()
        if cuda is None:
            return
        device = cuda.current_device()
        allocated, reserved = cuda.memory_allocated(device), cuda.memory_reserved(device)
        max_allocated, max_reserved = cuda.max_memory_allocated(device), cuda.max_memory_reserved(device)
        prefix = f"memory/{infix}/{stage}/"
        out[f"{prefix}allocated/{device}"] = allocated / GIB
        out[f"{prefix}reserved/{device}"] = reserved / GIB
        out[f"{prefix}max_allocated/{device}"] = max_allocated / GIB
        out[f"{prefix}max_reserved/{device}"] = max_reserved / GIB
        if with_frac:
            total = self._device_total(cuda, device)
            if total > 0:
                out[f"{prefix}max_allocated_frac/{device}"] = max_allocated / total
                out[f"{prefix}max_reserved_frac/{device}"] = max_reserved / total

    def _cuda(self) -> Any | None:
        cuda = torch_cuda()
        if cuda is None and not self._announced:
            with self._lock:
                if not self._announced:
                    self._announced = True
                    _log.info("rl_otel: no CUDA device visible to torch in this process; phase GPU memory metrics "
                              "are off (CPU memory metrics stay on)")
        return cuda

    def _device_total(self, cuda: Any, device: int) -> float:
        total = self._total.get(device)
        if total is None:  # the device's memory size never changes: read it once
            total = self._total[device] = float(cuda.get_device_properties(device).total_memory)
        return total


class CpuProbe:
    """Resident and virtual memory of this process (psutil), as ROLL's ``_get_cpu_memory_metrics`` reports it."""

    def __init__(self) -> None:
        self._process = psutil.Process(os.getpid())
        self._pid = os.getpid()

    def memory(self) -> tuple[float, float]:
        """``(rss, vms)`` in bytes."""
        if os.getpid() != self._pid:  # forked worker: measure the child, not the parent
            self._pid = os.getpid()
            self._process = psutil.Process(self._pid)
        info = self._process.memory_info()
        return float(info.rss), float(info.vms)

    def snapshot(self, infix: str, stage: str, out: dict[str, float]) -> None:
        """Add ``memory/cpu/{infix}/{stage}/rss|vms`` (GiB) to ``out``."""
        rss, vms = self.memory()
        out[f"memory/cpu/{infix}/{stage}/rss"] = rss / GIB
        out[f"memory/cpu/{infix}/{stage}/vms"] = vms / GIB
