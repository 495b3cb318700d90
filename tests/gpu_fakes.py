"""Fakes at the torch.cuda and NVML boundaries (no GPU in CI); the same code paths run for real on a GPU box."""

from __future__ import annotations

import threading
import types

GIB = 2**30


class FakeCuda:
    """The slice of ``torch.cuda`` rl_otel calls, with an allocator whose peaks behave like torch's."""

    def __init__(self, devices: int = 1, total: int = 80 * GIB, current: int = 0) -> None:
        self.devices, self.total, self.current = devices, total, current
        self.allocated = [0] * devices
        self.reserved = [0] * devices
        self.peak_allocated = [0] * devices
        self.peak_reserved = [0] * devices
        self.initialized = True
        self.resets = 0
        self.availability_checks = 0  # is_available() calls

    def alloc(self, n: int, device: int | None = None) -> None:
        d = self.current if device is None else device
        self.allocated[d] += n
        self.reserved[d] = max(self.reserved[d], self.allocated[d])
        self.peak_allocated[d] = max(self.peak_allocated[d], self.allocated[d])
        self.peak_reserved[d] = max(self.peak_reserved[d], self.reserved[d])

    def free(self, n: int, device: int | None = None, release: bool = False) -> None:
        d = self.current if device is None else device
        self.allocated[d] -= n
        if release:
            self.reserved[d] = self.allocated[d]

    def is_available(self) -> bool:
        self.availability_checks += 1
        return True

    def is_initialized(self) -> bool:
        return self.initialized

    def device_count(self) -> int:
        return self.devices

    def current_device(self) -> int:
        return self.current

    def memory_allocated(self, d: int) -> int:
        return self.allocated[d]

    def memory_reserved(self, d: int) -> int:
        return self.reserved[d]

    def max_memory_allocated(self, d: int) -> int:
        return self.peak_allocated[d]

    def max_memory_reserved(self, d: int) -> int:
        return self.peak_reserved[d]

    def reset_peak_memory_stats(self, d: int | None = None) -> None:
        d = self.current if d is None else d
        self.resets += 1
        self.peak_allocated[d] = self.allocated[d]
        self.peak_reserved[d] = self.reserved[d]

    def get_device_properties(self, d: int) -> types.SimpleNamespace:
        return types.SimpleNamespace(total_memory=self.total)


def fake_torch(cuda: FakeCuda) -> types.ModuleType:
    module = types.ModuleType("torch")
    module.cuda = cuda
    return module


class NVMLError(Exception):
    """What pynvml raises (``NVMLError_GpuIsLost`` and friends subclass it)."""


class FakeNvml(types.ModuleType):
    """The slice of pynvml (nvidia-ml-py) rl_otel calls; clearing ``gate`` makes memory reads block until it is
    set again, ``failing = True`` makes them raise ``NVMLError`` (a GPU fallen off the bus) until it is reset."""

    nvmlMemory_v2 = 0x02000028

    def __init__(self, uuids: tuple[str, ...] = ("GPU-aaaa", "GPU-bbbb"), total: int = 80 * GIB,
                 fail_init: bool = False) -> None:
        super().__init__("pynvml")
        self.uuids, self.total, self.fail_init = uuids, total, fail_init
        self.used = {u: (i + 1) * GIB for i, u in enumerate(uuids)}
        self.gate = threading.Event()
        self.gate.set()
        self.failing = False
        self.shutdown_called = False

    def nvmlInit(self) -> None:
        if self.fail_init:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlShutdown(self) -> None:
        self.shutdown_called = True

    def nvmlDeviceGetCount(self) -> int:
        return len(self.uuids)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:
        return self.uuids[i]

    def nvmlDeviceGetHandleByUUID(self, uuid: bytes) -> str:
        return uuid.decode()

    def nvmlDeviceGetUUID(self, handle: str) -> bytes:
        return handle.encode()

    def nvmlDeviceGetMemoryInfo(self, handle: str, version: int | None = None) -> types.SimpleNamespace:
        self.gate.wait()
        if self.failing:
            raise NVMLError("GPU is lost")
        info = types.SimpleNamespace(total=self.total, used=self.used[handle], free=self.total - self.used[handle])
        if version == self.nvmlMemory_v2:
            info.reserved = 300 * 2**20
        return info


def wait_for_nvml(url: str, timeout_s: float = 30.0) -> bool:
    """True once the endpoint at ``url`` serves the NVML poller's first values (it polls on a thread of its own)."""
    import time

    from tests.promtools import scrape

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if "\nrl_gpu_device_memory_used_bytes{" in scrape(url):
            return True
        time.sleep(0.02)
    return False
