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
import weakref
from typing import Any, NamedTuple

from rl_otel._internal.forks import reset_in_forked_child
from rl_otel._internal.probes.torch_compat import AllocatorReader, AllocatorStats

_log = logging.getLogger("rl_otel")
GIB = float(2**30)
GPU_STAGES = ("start/offload", "start/onload", "end/onload", "end/offload")
GPU_KINDS = ("allocated", "reserved", "max_allocated", "max_reserved")
_KEYS_LIMIT = 1024  # (infix, stage, device) whose key strings are kept


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


class GpuReading(NamedTuple):
    """One read of torch's caching allocator (bytes) on the device that was current, with the device's total."""

    device: int
    stats: AllocatorStats
    total: float  # the device's memory (read once per device)


class GpuProbe:
    """GPU memory of this process on its current device, as ROLL's ``_get_gpu_memory_metrics`` reports it.

    One allocator read per snapshot (:class:`~rl_otel._internal.probes.torch_compat.AllocatorReader`): every key
    of a stage (and the fractions) comes from it, and a phase hands the same reading to the next stage when no
    user code ran between the two (no ``onload``: ``start/onload`` is ``start/offload``; no ``offload``:
    ``end/offload`` is ``end/onload``). The device's total memory is read once per device.

    Nothing is read, reset or asked of CUDA until the process itself initialized it (:meth:`live`:
    ``torch.cuda.is_initialized()``, False in a bad fork); then whether CUDA is usable is asked once per torch
    module and process (``is_available()`` does not change once answered); a process that imports torch later, or
    a forked child, is asked again. Peaks: only the outermost running phase of a device resets them
    (:meth:`begin_peaks`).
    """

    def __init__(self) -> None:
        self._total: dict[int, float] = {}
        self._announced = False
        self._lock = threading.Lock()
        self._known: tuple[Any, int, Any | None, AllocatorReader | None] | None = None  # (torch, pid, cuda, reader)
        self._keys: dict[tuple[str, str, int], tuple[str, ...]] = {}  # (infix, stage, device) -> its keys
        self._peak_holders: dict[int, int] = {}  # device -> phases running since the one that reset its peaks
        reset_in_forked_child(self)  # a phase in a forked child takes this lock

    def _after_fork(self) -> None:
        self._lock = threading.Lock()  # the parent's may have been held by another thread at the fork
        self._peak_holders = {}

    def live(self) -> Any | None:
        """``torch.cuda`` if the process itself has initialized CUDA, else ``None``: the gate of every CUDA call a
        phase makes. ``torch.cuda.is_initialized()`` initializes nothing, and is False in a child forked from a
        process that used CUDA (torch's "bad fork": ``torch/cuda/__init__.py``, ``is_initialized``), where every
        CUDA call would raise. Never ``current_device()`` first: it runs ``_lazy_init()``, which would put a
        context (hundreds of MB) on a GPU of a process that never used one (a Ray driver, a reward worker)."""
        cuda = getattr(sys.modules.get("torch"), "cuda", None)
        try:  # asked before is_available(), whose cuInit would already spoil a later fork of this process
            initialized = cuda is not None and cuda.is_initialized()
        except Exception:  # boundary: torch.cuda (a broken driver or a bad fork)
            initialized = False
        if not initialized:
            if not self._announced:
                self._announce("no CUDA device in use by this process (torch has not initialized CUDA here)")
            return None
        known = self._resolve()
        return None if known is None else known[2]

    def begin_peaks(self, *, reset: bool) -> int | None:
        """At a phase's start: reset torch's peak statistics of the current device if ``reset`` and no other phase
        of the process holds them on that device (the outermost phase: a nested phase's reset would corrupt the
        peaks of the phase around it, and a framework's own ``max_memory_allocated()``); returns the device reset
        (for :meth:`end_peaks`), ``None`` if none was."""
        cuda = self.live()
        if cuda is None or not reset:
            return None
        device = cuda.current_device()  # initialized: this initializes nothing
        with self._lock:
            held = self._peak_holders.get(device, 0)
            self._peak_holders[device] = held + 1
        if held:
            self.end_peaks(device)
            return None
        cuda.reset_peak_memory_stats(device)
        return device

    def end_peaks(self, device: int | None) -> None:
        """The phase that reset ``device``'s peaks ended (or raised)."""
        if device is None:
            return
        with self._lock:
            held = self._peak_holders.get(device, 0) - 1
            if held > 0:
                self._peak_holders[device] = held
            else:
                self._peak_holders.pop(device, None)

    def read(self) -> GpuReading | None:
        """One allocator read on the current device (``None`` unless the process initialized CUDA)."""
        cuda = self.live()
        if cuda is None:
            return None
        known = self._known
        if known is None or known[3] is None:
            return None
        device = cuda.current_device()
        total = self._total.get(device)
        if total is None:  # the device's memory size never changes: read it once
            total = self._total[device] = float(cuda.get_device_properties(device).total_memory)
        return GpuReading(device, known[3].read(device), total)

    def snapshot(self, infix: str, stage: str, out: dict[str, float], *, with_frac: bool = False,
                 reading: GpuReading | None = None, at_start: bool = False) -> GpuReading | None:
        """Add ``memory/{infix}/{stage}/{kind}/{device_id}`` (GiB) to ``out``, and the ``*_frac`` keys if asked,
        from ``reading`` if given (no user code ran since it was taken), else from a new read. ``at_start``: the
        reading is the phase's own start and its peaks were not reset (a nested phase, or ``phase_peaks=False``):
        the peak since the phase began is then its current value. Returns the reading used (``None`` without
        CUDA)."""
        if reading is None:
            reading = self.read()
            if reading is None:
                return None
        device, stats = reading.device, reading.stats
        keys = self._keys.get((infix, stage, device))
        if keys is None:
            keys = self._stage_keys(infix, stage, device)
        out[keys[0]] = stats.allocated / GIB
        out[keys[1]] = stats.reserved / GIB
        max_allocated, max_reserved = ((stats.allocated, stats.reserved) if at_start
                                       else (stats.max_allocated, stats.max_reserved))
        out[keys[2]] = max_allocated / GIB
        out[keys[3]] = max_reserved / GIB
        if with_frac and reading.total > 0:
            out[keys[4]] = max_allocated / reading.total
            out[keys[5]] = max_reserved / reading.total
        return reading

    def _stage_keys(self, infix: str, stage: str, device: int) -> tuple[str, ...]:
        if len(self._keys) >= _KEYS_LIMIT:  # a job has a handful of phases; a runaway set of names is not kept
            self._keys.clear()
        prefix = f"memory/{infix}/{stage}/"
        keys = self._keys[(infix, stage, device)] = tuple(
            f"{prefix}{kind}/{device}" for kind in (*GPU_KINDS, "max_allocated_frac", "max_reserved_frac"))
        return keys

    def cuda(self) -> Any | None:
        """``torch.cuda`` if torch is imported and a CUDA device is usable (asked once per torch and process)."""
        known = self._resolve()
        return None if known is None else known[2]

    def _resolve(self) -> tuple[Any, int, Any | None, AllocatorReader | None] | None:
        """``(torch, pid, torch.cuda or None, its reader)`` for the torch imported now, asked once per torch module
        and process; ``None`` before torch is imported (or while another thread is importing it)."""
        torch = sys.modules.get("torch")
        known = self._known
        if known is not None and known[0] is torch and known[1] == os.getpid():
            return known
        cuda = None
        known = None
        if torch is not None:
            cuda = torch_cuda()
            if getattr(torch, "cuda", None) is not None:  # not a torch still being imported by another thread
                self._total = {}  # another torch (or process): its devices are read afresh
                known = self._known = (torch, os.getpid(), cuda, AllocatorReader(cuda) if cuda is not None else None)
        if cuda is None and not self._announced:
            self._announce("no CUDA device visible to torch in this process")
        return known

    def _announce(self, why: str) -> None:
        with self._lock:
            if not self._announced:
                self._announced = True
                _log.info("rl_otel: %s; phase GPU memory metrics and GPU times are off while it is so (CPU memory "
                          "metrics stay on)", why)


class CpuProbe:
    """Resident and virtual memory of this process, as ROLL's ``_get_cpu_memory_metrics`` reports it (psutil's
    ``memory_info()``).

    On Linux the numbers are psutil's own source, ``/proc/self/statm`` (pages, times the page size), read with one
    ``pread`` on a descriptor kept open: ~1 us instead of psutil's ~11 us open/parse/close, and a phase reads it
    twice. Elsewhere, or when the file cannot be read, psutil, imported then (~7 ms a Linux process never pays).
    :meth:`close` closes the descriptor (later reads go through psutil).
    """

    def __init__(self) -> None:
        self._pid = os.getpid()
        self._process: Any = None  # psutil.Process(self._pid), made at the first read that needs it
        self._statm: _Statm | None = _Statm.open()

    def memory(self) -> tuple[float, float]:
        """``(rss, vms)`` in bytes."""
        if os.getpid() != self._pid:  # forked worker: measure the child, not the parent
            self._pid = os.getpid()
            self._process = None
            if self._statm is not None:
                self._statm.close()  # the parent's file, inherited
                self._statm = _Statm.open()
        statm = self._statm
        if statm is not None:
            try:
                return statm.read()
            except (OSError, ValueError, IndexError):
                self._statm = None
                statm.close()
        process = self._process
        if process is None:
            import psutil

            process = self._process = psutil.Process(self._pid)
        info = process.memory_info()
        return float(info.rss), float(info.vms)

    def close(self) -> None:
        """Close the ``/proc`` descriptor; idempotent."""
        statm, self._statm = self._statm, None
        if statm is not None:
            statm.close()

    def snapshot(self, infix: str, stage: str, out: dict[str, float]) -> None:
        """Add ``memory/cpu/{infix}/{stage}/rss|vms`` (GiB) to ``out``."""
        rss, vms = self.memory()
        out[f"memory/cpu/{infix}/{stage}/rss"] = rss / GIB
        out[f"memory/cpu/{infix}/{stage}/vms"] = vms / GIB


class _Statm:
    """An open ``/proc/self/statm``: ``size resident ...`` in pages, as psutil reads it for ``memory_info()``."""

    __slots__ = ("__weakref__", "_close", "_fd")

    _PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._close = weakref.finalize(self, os.close, fd)  # a probe dropped without close() leaks no descriptor

    @classmethod
    def open(cls) -> _Statm | None:
        if not sys.platform.startswith("linux"):
            return None
        try:
            statm = cls(os.open("/proc/self/statm", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)))
            statm.read()
        except (OSError, ValueError, IndexError):
            return None
        return statm

    def read(self) -> tuple[float, float]:
        """``(rss, vms)`` in bytes."""
        fields = os.pread(self._fd, 256, 0).split()
        return float(int(fields[1]) * self._PAGE), float(int(fields[0]) * self._PAGE)

    def close(self) -> None:
        self._close()
