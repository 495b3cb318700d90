"""Live gauges computed at scrape time: process memory (psutil), the process's GPU memory (torch's allocator), the
device's GPU memory (NVML, with ``gpu_uuid`` to join DCGM's ``UUID``), and the phases now running
(``rl_phase_started_timestamp_seconds``, from the registry ``Telemetry.phase()`` writes).

Scrape-time callbacks stay fast: psutil and torch's allocator counters are microseconds, and NVML - which can
stall for seconds on a sick driver - is read by a background poller whose cached values the scrape serves; a
cache older than ``stale_after_s`` is served as nothing (absent series), never as a stale number. Neither torch
nor pynvml is imported unless the process already imported torch / pynvml is installed.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from rl_otel._internal.forks import reset_in_forked_child
from rl_otel._internal.probes.memory import CpuProbe
from rl_otel._internal.probes.torch_compat import AllocatorReader
from rl_otel.catalog import live as specs
from rl_otel.catalog import meta
from rl_otel.catalog.spec import MetricSpec

_log = logging.getLogger("rl_otel")

# what a live collector hands the recorder (its collectors, given to Recorder()): (spec, labels, value), never stored
Item = tuple[MetricSpec, tuple[tuple[str, str], ...], float]


def process_start_time() -> float | None:
    """This process's start, Unix time (psutil's ``create_time``; else ``/proc/self/stat`` and the boot time),
    ``None`` if neither can tell: where its goodput start-up begins."""
    try:
        import psutil

        return float(psutil.Process().create_time())
    except Exception:  # boundary: psutil (missing, or the OS refusing)
        pass
    try:  # field 22 of /proc/self/stat: start time in clock ticks after boot (proc(5)); the name may hold spaces
        with open("/proc/self/stat", encoding="ascii") as stat:
            ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat", encoding="ascii") as boot:
            btime = next(int(line.split()[1]) for line in boot if line.startswith("btime "))
        return btime + ticks / os.sysconf("SC_CLK_TCK")
    except Exception:  # boundary: the OS (/proc absent or of another shape)
        return None


def process_memory(probe: CpuProbe) -> Callable[[], list[Item]]:
    """A collector of ``rl_process_resident_memory_bytes`` and ``rl_process_virtual_memory_bytes``."""

    def collect() -> list[Item]:
        rss, vms = probe.memory()
        return [(specs.PROCESS_RSS, (), rss), (specs.PROCESS_VMS, (), vms)]

    return collect


def torch_process_memory() -> list[Item]:
    """``rl_gpu_process_memory_{allocated,reserved}_bytes`` per CUDA device, only once the process has
    initialized CUDA itself (a scrape must never create a CUDA context; ``is_initialized()`` is also False in a
    bad fork). One allocator read per device and scrape, through the one adapter
    (:class:`~rl_otel._internal.probes.torch_compat.AllocatorReader`), not two whole ``memory_stats()``."""
    cuda = getattr(sys.modules.get("torch"), "cuda", None)
    if cuda is None or not cuda.is_initialized():
        return []
    reader = _READERS.get(cuda)
    if reader is None:
        reader = _READERS[cuda] = AllocatorReader(cuda)
    items: list[Item] = []
    for device in range(cuda.device_count()):
        labels = (("device_id", str(device)),)
        stats = reader.read(device)
        items.append((specs.GPU_PROCESS_ALLOCATED, labels, float(stats.allocated)))
        items.append((specs.GPU_PROCESS_RESERVED, labels, float(stats.reserved)))
    return items


_READERS: weakref.WeakKeyDictionary[Any, AllocatorReader] = weakref.WeakKeyDictionary()  # per torch.cuda module


def load_nvml() -> Any | None:
    """The ``pynvml`` module (nvidia-ml-py) if installed or already imported, else ``None``."""
    module = sys.modules.get("pynvml")
    if module is not None:
        return module
    try:
        if importlib.util.find_spec("pynvml") is None:
            return None
        return importlib.import_module("pynvml")
    except Exception:  # boundary: importing pynvml (a broken install raises anything)
        return None


def visible_devices(nvml: Any) -> list[tuple[int, Any]]:
    """``(cuda ordinal, NVML handle)`` for the devices this process sees, honouring ``CUDA_VISIBLE_DEVICES``
    (indices or ``GPU-...`` UUIDs), so ``device_id`` means what it means to torch and in ROLL's keys."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is None:
        return [(i, nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(nvml.nvmlDeviceGetCount())]
    out = []
    for ordinal, entry in enumerate(e.strip() for e in env.split(",")):
        if not entry:
            break
        if entry.isdigit():
            out.append((ordinal, nvml.nvmlDeviceGetHandleByIndex(int(entry))))
        elif entry.startswith(("GPU-", "MIG-")):
            out.append((ordinal, nvml.nvmlDeviceGetHandleByUUID(entry.encode())))
        else:
            break  # CUDA stops at the first invalid entry
    return out


class RunningPhases:
    """The phases of one Telemetry now running, and since when: ``Telemetry.phase()`` enters and leaves them, a
    scrape serves ``rl_phase_started_timestamp_seconds{cluster, phase}`` (the earliest start of each running
    ``(cluster, phase)``; absent once none runs). Thread-safe; a few hundred nanoseconds per phase."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[tuple[str, str], list[float]] = {}
        reset_in_forked_child(self)  # every phase takes this lock: a forked child's phases must not hang on it

    def _after_fork(self) -> None:
        self._lock = threading.Lock()  # the parent's may have been held by another thread at the fork

    def enter(self, cluster: str, phase: str) -> float:
        """Record a start (Unix time, the clock Prometheus' ``time()`` reads); returns it for :meth:`leave`."""
        started = time.time()
        with self._lock:
            self._running.setdefault((cluster, phase), []).append(started)
        return started

    def leave(self, cluster: str, phase: str, started: float) -> None:
        with self._lock:
            starts = self._running.get((cluster, phase))
            if starts is None:
                return
            try:
                starts.remove(started)
            except ValueError:
                pass
            if not starts:
                del self._running[(cluster, phase)]

    def collect(self) -> list[Item]:
        with self._lock:
            running = [(key, min(starts)) for key, starts in self._running.items()]
        return [(meta.PHASE_STARTED, (("cluster", cluster), ("phase", phase)), started)
                for (cluster, phase), started in running]


# One registry per Telemetry: its phases and its live gauges share its CpuProbe, so the probe names it.
_RUNNING: weakref.WeakKeyDictionary[CpuProbe, RunningPhases] = weakref.WeakKeyDictionary()
_RUNNING_LOCK = threading.Lock()


def _new_running_lock() -> None:
    global _RUNNING_LOCK
    _RUNNING_LOCK = threading.Lock()  # the parent's may have been held by another thread at the fork


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_running_lock)


def running_phases(probe: CpuProbe) -> RunningPhases:
    """The :class:`RunningPhases` of the Telemetry whose CPU probe is ``probe`` (made at the first call)."""
    with _RUNNING_LOCK:
        registry = _RUNNING.get(probe)
        if registry is None:
            registry = _RUNNING[probe] = RunningPhases()
        return registry


class NvmlPoller:
    """Polls NVML memory info every ``interval_s`` in a daemon thread; ``collect()`` serves the cache.

    Thread-safe. ``close()`` stops the thread (joined with a deadline: a stalled NVML call cannot hold it).
    """

    def __init__(self, nvml: Any, *, interval_s: float = 5.0, stale_after_s: float = 30.0,
                 on_error: Callable[[str], None] = lambda reason: None) -> None:
        self._nvml = nvml
        self._interval = interval_s
        self._stale_after = stale_after_s
        self._on_error = on_error
        self._items: list[Item] = []
        self._polled_at = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._devices: list[tuple[int, str, Any]] = []
        self._thread = threading.Thread(target=self._run, name="rl_otel-nvml", daemon=True)
        self._thread.start()

    def wait_ready(self, timeout_s: float) -> bool:
        """True once the first poll finished (tests, and callers that want a first value)."""
        return self._ready.wait(timeout_s)

    def collect(self) -> list[Item]:
        with self._lock:
            fresh = time.monotonic() - self._polled_at <= self._stale_after
            items = self._items
        if items and not fresh:
            self._on_error("nvml_stale")
            return []
        return items

    def close(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        self._thread.join(timeout_s)
        if not self._thread.is_alive() and self._devices:
            try:
                self._nvml.nvmlShutdown()
            except Exception:  # boundary: NVML (shutdown)
                pass

    def _run(self) -> None:
        try:
            self._nvml.nvmlInit()
            for ordinal, handle in visible_devices(self._nvml):
                uuid = self._nvml.nvmlDeviceGetUUID(handle)
                self._devices.append((ordinal, uuid.decode() if isinstance(uuid, bytes) else str(uuid), handle))
        except Exception as exc:  # boundary: NVML (init, device enumeration)
            _log.debug("rl_otel: NVML is not usable (%s); device GPU memory gauges are off", exc)
            self._ready.set()
            return
        if not self._devices:
            _log.debug("rl_otel: NVML sees no GPU; device GPU memory gauges are off")
        while not self._stop.is_set():
            try:
                items = self._poll()
                with self._lock:
                    self._items, self._polled_at = items, time.monotonic()
            except Exception:  # boundary: the poller thread's loop (NVML calls)
                self._on_error("nvml")
            self._ready.set()
            self._stop.wait(self._interval)

    def _poll(self) -> list[Item]:
        nvml = self._nvml
        items: list[Item] = []
        v2 = getattr(nvml, "nvmlMemory_v2", None)
        for ordinal, uuid, handle in self._devices:
            labels = (("device_id", str(ordinal)), ("gpu_uuid", uuid))
            info = None
            if v2 is not None:
                try:
                    info = nvml.nvmlDeviceGetMemoryInfo(handle, version=v2)
                except Exception:  # driver without v2 memory info
                    info = None
            if info is None:
                info = nvml.nvmlDeviceGetMemoryInfo(handle)
            items.append((specs.GPU_DEVICE_USED, labels, float(info.used)))
            items.append((specs.GPU_DEVICE_TOTAL, labels, float(info.total)))
            reserved = getattr(info, "reserved", None)
            if reserved is not None:
                items.append((specs.GPU_DEVICE_RESERVED, labels, float(reserved)))
        return items


class LiveGauges:
    """The live collectors of a process (its memory, torch's, the running phases, NVML's poller when NVML loads):
    :attr:`collectors`, for the recorder; ``close()`` stops the NVML poller."""

    def __init__(self, cpu: CpuProbe, on_error: Callable[[str], None], *, nvml: Any | None = None) -> None:
        # the OS's and torch's reads are guarded here (counted under their own reason); the running phases and
        # the NVML poller's last poll are rl_otel's own bookkeeping (the NVML calls are guarded in its thread)
        collectors = [_safe(on_error, "process_memory", process_memory(cpu)),
                      _safe(on_error, "torch_memory", torch_process_memory),
                      running_phases(cpu).collect]
        nvml = nvml if nvml is not None else load_nvml()
        self.nvml: NvmlPoller | None = None
        if nvml is not None:
            self.nvml = NvmlPoller(nvml, on_error=on_error)
            collectors.append(self.nvml.collect)
        self.collectors: tuple[Callable[[], list[Item]], ...] = tuple(collectors)

    def close(self) -> None:
        if self.nvml is not None:
            self.nvml.close()


def _safe(on_error: Callable[[str], None], reason: str, fn: Callable[[], list[Item]]) -> Callable[[], list[Item]]:
    """``fn``, its failure counted as ``reason`` and its series left out of this collection."""
    def collect() -> list[Item]:
        try:
            return fn()
        except Exception:  # boundary: psutil/the OS, or torch's allocator
            on_error(reason)
            return []

    return collect
