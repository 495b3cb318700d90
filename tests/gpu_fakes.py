"""Fakes at the torch.cuda and NVML boundaries (no GPU in CI); the same code paths run for real on a GPU box."""

from __future__ import annotations

import contextlib
import math
import threading
import types
from collections.abc import Iterator

GIB = 2**30


_POOLS = ("all", "large_pool", "small_pool")
_STAT_ARRAYS = ("allocation", "segment", "active", "inactive_split", "allocated_bytes", "reserved_bytes",
                "active_bytes", "inactive_split_bytes", "requested_bytes")


class FakeStream:
    """A CUDA stream: ``queued_ms`` is the GPU time at which the work queued on it so far ends."""

    def __init__(self, device: int) -> None:
        self.device = device
        self.queued_ms = 0.0


class FakeEvent:
    """``torch.cuda.Event(enable_timing=True)``: ``record()`` stamps it with the GPU time its stream reaches it at,
    ``query()`` says whether the GPU got there (``FakeCuda.gpu_now_ms``, which the test moves), ``elapsed_time()``
    raises as torch's does before both events completed. ``synchronize()`` fails the test: it would block."""

    def __init__(self, cuda: FakeCuda, enable_timing: bool = False, blocking: bool = False,
                 interprocess: bool = False) -> None:
        self.cuda, self.enable_timing = cuda, enable_timing
        self.device: int | None = None  # set by the first record, as torch's lazily created event
        self.stamp: float | None = None
        self.records = 0

    def record(self, stream: FakeStream | None = None) -> None:
        cuda = self.cuda
        stream = cuda.current_stream() if stream is None else stream
        if self.device is not None and self.device != stream.device:
            raise RuntimeError(f"Event device {self.device} does not match recording stream's device "
                               f"{stream.device}.")
        with cuda._lock:
            self.device = stream.device
            self.stamp = stream.queued_ms
            self.records += 1
            cuda.records += 1

    def query(self) -> bool:
        cuda = self.cuda
        with cuda._lock:
            cuda.queries += 1
            if cuda.query_error is not None:
                raise cuda.query_error
            return self.stamp is None or self.stamp <= cuda.gpu_now_ms

    def elapsed_time(self, end: FakeEvent) -> float:
        if not self.enable_timing or not end.enable_timing:
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
        if self.stamp is None or end.stamp is None or not (self.query() and end.query()):
            raise RuntimeError("CUDA error: device not ready")
        return end.stamp - self.stamp

    def synchronize(self) -> None:
        self.cuda.synchronizes += 1
        raise AssertionError("Event.synchronize() called: it blocks the calling thread until the GPU gets there")


class FakeCuda:
    """The slice of ``torch.cuda`` rl_otel calls, with an allocator whose peaks behave like torch's, and streams and
    timing events on a GPU clock the test moves.

    Allocator reads: every call that makes torch's allocator build its statistics counts one in
    ``allocator_reads`` (``memory_stats_as_nested_dict``, ``memory_stats``, and ``memory_allocated`` & co., which in
    torch each build the whole ``memory_stats()``). GPU time: ``launch(ms)`` queues work on the current stream;
    events recorded after it complete when ``gpu_now_ms`` (``math.inf``: everything done at once, the default)
    reaches their stamp."""

    def __init__(self, devices: int = 1, total: int = 80 * GIB, current: int = 0) -> None:
        self.devices, self.total, self.current = devices, total, current
        self.allocated = [0] * devices
        self.reserved = [0] * devices
        self.peak_allocated = [0] * devices
        self.peak_reserved = [0] * devices
        self.initialized = True
        self.resets = 0
        self.availability_checks = 0  # is_available() calls
        self.allocator_reads = 0
        self.property_reads = 0  # get_device_properties() calls
        self._lock = threading.Lock()
        self.gpu_now_ms = math.inf
        self.events_created = self.records = self.queries = self.synchronizes = 0
        self.query_error: BaseException | None = None  # raised by every query() while set
        self._default_streams = [FakeStream(d) for d in range(devices)]
        self._local = threading.local()  # each thread's current stream per device, as torch keeps it

    # -- the allocator ------------------------------------------------------------------------------------

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

    def set_device(self, d: int) -> None:
        self.current = d

    @contextlib.contextmanager
    def device(self, d: int) -> Iterator[None]:
        """``torch.cuda.device(d)``: ``d`` is current inside the block."""
        before = self.current
        self.current = d
        try:
            yield
        finally:
            self.current = before

    def is_current_stream_capturing(self) -> bool:
        return False  # tests.fake_cuda.HazardCuda models capture

    def memory_stats_as_nested_dict(self, d: int | None = None) -> dict:
        """torch's layout (``torch._C._cuda_memoryStats``): stat arrays per pool, plain counters."""
        return self._read(d)

    def _read(self, d: int | None) -> dict:
        self.allocator_reads += 1
        if not self.initialized:
            return {}
        d = self.current if d is None else d
        values = {"allocated_bytes": (self.allocated[d], self.peak_allocated[d]),
                  "reserved_bytes": (self.reserved[d], self.peak_reserved[d])}
        out: dict = {}
        for name in _STAT_ARRAYS:
            current, peak = values.get(name, (0, 0))
            out[name] = {pool: {"current": current, "peak": peak, "allocated": peak, "freed": peak - current}
                         for pool in _POOLS}
        for name in ("oversize_allocations", "oversize_segments"):
            out[name] = {"current": 0, "peak": 0, "allocated": 0, "freed": 0}
        out.update(num_alloc_retries=0, num_ooms=0, num_sync_all_streams=0, num_device_alloc=0, num_device_free=0,
                   max_split_size=-1)
        return out

    def memory_stats(self, d: int | None = None) -> dict:
        """torch's flattening of the nested dict (``"allocated_bytes.all.current"``...): one read."""
        flat: dict = {}

        def walk(prefix: str, obj: object) -> None:
            if isinstance(obj, dict):
                for k, v in obj.items():
                    walk(f"{prefix}.{k}" if prefix else k, v)
            else:
                flat[prefix] = obj

        walk("", self._read(d))
        return dict(sorted(flat.items()))

    def memory_allocated(self, d: int | None = None) -> int:
        return self.memory_stats(d).get("allocated_bytes.all.current", 0)

    def memory_reserved(self, d: int | None = None) -> int:
        return self.memory_stats(d).get("reserved_bytes.all.current", 0)

    def max_memory_allocated(self, d: int | None = None) -> int:
        return self.memory_stats(d).get("allocated_bytes.all.peak", 0)

    def max_memory_reserved(self, d: int | None = None) -> int:
        return self.memory_stats(d).get("reserved_bytes.all.peak", 0)

    def reset_peak_memory_stats(self, d: int | None = None) -> None:
        d = self.current if d is None else d
        self.resets += 1
        self.peak_allocated[d] = self.allocated[d]
        self.peak_reserved[d] = self.reserved[d]

    def get_device_properties(self, d: int) -> types.SimpleNamespace:
        self.property_reads += 1
        return types.SimpleNamespace(total_memory=self.total)

    # -- streams and events -------------------------------------------------------------------------------

    def Event(self, enable_timing: bool = False, blocking: bool = False,  # torch's name
              interprocess: bool = False) -> FakeEvent:
        with self._lock:
            self.events_created += 1
        return FakeEvent(self, enable_timing, blocking, interprocess)

    def Stream(self, device: int | None = None) -> FakeStream:  # torch's name
        return FakeStream(self.current if device is None else device)

    def current_stream(self, device: int | None = None) -> FakeStream:
        d = self.current if device is None else device
        return getattr(self._local, "streams", {}).get(d, self._default_streams[d])

    @contextlib.contextmanager
    def stream(self, s: FakeStream) -> Iterator[None]:
        """``torch.cuda.stream(s)``: ``s`` is this thread's current stream on its device inside the block."""
        streams = self._local.__dict__.setdefault("streams", {})
        before = streams.get(s.device)
        streams[s.device] = s
        try:
            yield
        finally:
            if before is None:
                del streams[s.device]
            else:
                streams[s.device] = before

    def synchronize(self, device: int | None = None) -> None:
        self.synchronizes += 1
        raise AssertionError("torch.cuda.synchronize() called: it blocks the calling thread until the GPU is idle")

    def launch(self, ms: float, stream: FakeStream | None = None) -> None:
        """Queue ``ms`` of GPU work on ``stream`` (the current one): events recorded after it complete later."""
        stream = self.current_stream() if stream is None else stream
        with self._lock:
            stream.queued_ms += ms

    def hold(self) -> None:
        """The GPU stops where it is: work launched from now on (and the events recorded after it) does not
        complete until :meth:`run_to`."""
        with self._lock:
            self.gpu_now_ms = max([s.queued_ms for s in self._default_streams] + [0.0])

    def run_to(self, ms: float = math.inf) -> None:
        """The GPU reaches ``ms`` (everything queued, by default)."""
        with self._lock:
            self.gpu_now_ms = ms


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


def legacy_snapshot(cuda, infix: str, stage: str, *, with_frac: bool = False) -> dict[str, float]:
    """What a phase's GPU snapshot gave before it read the allocator once (``GpuProbe.snapshot`` at 3124f14, the
    oracle of the values): torch's four public functions, one whole ``memory_stats()`` each."""
    device = cuda.current_device()
    allocated, reserved = cuda.memory_allocated(device), cuda.memory_reserved(device)
    max_allocated, max_reserved = cuda.max_memory_allocated(device), cuda.max_memory_reserved(device)
    prefix = f"memory/{infix}/{stage}/"
    out = {f"{prefix}allocated/{device}": allocated / GIB, f"{prefix}reserved/{device}": reserved / GIB,
           f"{prefix}max_allocated/{device}": max_allocated / GIB, f"{prefix}max_reserved/{device}": max_reserved / GIB}
    if with_frac:
        total = float(cuda.get_device_properties(device).total_memory)
        out[f"{prefix}max_allocated_frac/{device}"] = max_allocated / total
        out[f"{prefix}max_reserved_frac/{device}"] = max_reserved / total
    return out


def settle(tel, timeout_s: float = 30.0) -> bool:
    """True once every phase ``tel`` ended so far has its GPU times written and its root span ended (they resolve
    on the GPU timer's thread; at once in a process without CUDA)."""
    return tel._components.phase_runtime().flush(timeout_s)


def gpu_timer(tel):
    """The GPU timer of ``tel``'s phases (``GpuTimer``)."""
    return tel._components.phase_runtime().gpu_timer


def real_cuda():
    """The real ``torch`` when it sees a CUDA device; skips the test otherwise (it runs on a GPU machine)."""
    import pytest

    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device (runs on a GPU machine)")
    return torch


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
