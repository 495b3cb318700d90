"""A fake ``torch.cuda`` that models CUDA's hazards for a library that watches a training process (no GPU in CI).

:class:`tests.gpu_fakes.FakeCuda` models the allocator and the GPU clock; :class:`HazardCuda` adds what goes wrong
on a real GPU when a library is careless, each behaviour citing the torch 2.13 / CUDA source it models (a fake
that encodes only our own idea of CUDA proves nothing):

- **Lazy initialization.** ``torch.cuda.current_device()`` runs ``_lazy_init()`` before ``_cuda_getDevice()``
  (``torch/cuda/__init__.py``, ``def current_device``, lines 1203-1206); ``reset_peak_memory_stats()`` without a
  device reads the current device through ``_get_device_index(None, optional=True)`` ->
  ``torch._utils._get_current_device_index`` -> ``current_device()`` (``torch/cuda/memory.py`` line 395,
  ``torch/_utils.py`` line 843); ``is_initialized()`` is ``_initialized and not _is_in_bad_fork()`` and
  initializes nothing (``torch/cuda/__init__.py`` lines 452-454); ``memory_stats_as_nested_dict()`` returns ``{}``
  before initialization (``torch/cuda/memory.py`` line 354). ``is_available()`` calls ``cudaGetDeviceCount``, which
  runs ``cuInit`` (``torch/cuda/__init__.py`` lines 185-189: the driver is then initialized in this process, and a
  later fork's child cannot use CUDA): counted in ``driver_inits``. Initialization makes the primary context of
  the initializing thread's current device (``torch._C._cuda_init``).
- **A current device per host thread.** CUDA's current device is per host thread, 0 in a new thread
  (``cudaSetDevice``: "sets device as the current device for the calling host thread"; torch keeps no other copy:
  ``torch.cuda.set_device`` -> ``torch._C._cuda_setDevice``, ``torch/cuda/__init__.py`` line 677). A runtime call
  that needs a context, on a thread whose current device has none, creates the primary context there: recorded in
  ``contexts_created`` as ``"context created on device N"``. ``Event.record`` and ``Event.elapsed_time`` set the
  event's device first (``CUDAGuard guard(device_index_)`` in ``c10/cuda/CUDAEvent.h``); ``Event.query`` does not
  (``c10/cuda/CUDAEvent.h``: "cudaEventQuery can be safely called from any device", no guard), so it runs on the
  calling thread's current device. ``torch.cuda.device(d)`` swaps the calling thread's device for a block
  (``torch/cuda/__init__.py`` lines 642-661, ``_exchange_device``).
- **Global capture mode.** ``torch.cuda.graph`` captures with ``capture_error_mode="global"`` by default
  (``torch/cuda/graphs.py`` lines 123 and 415): "global will error on actions in other threads"
  (the same file, lines 136-139); CUDA: in ``cudaStreamCaptureModeGlobal``, a thread is prohibited from potentially
  unsafe API calls "if any other thread has a concurrent capture sequence initiated with" global mode
  (``cudaThreadExchangeStreamCaptureMode``). ``cudaEventQuery`` is such a call: PyTorch's NCCL watchdog
  invalidated captures on other threads with it (pytorch#104555, #148594). Modelled: a query (or a
  ``synchronize``) from any thread while a global capture runs invalidates it (``capture.invalidated``), as does one
  from the capturing thread itself; ``is_current_stream_capturing()`` sees only the calling thread's current stream
  (``torch/cuda/graphs.py`` line 57, "on the current CUDA stream"). An event recorded into a capturing stream
  becomes a node of the user's graph (``cudaEventRecordWithFlags`` while capturing, ``c10/cuda/CUDAEvent.h``):
  counted in ``captured_records``, and it never gets a timestamp.
- **A bad fork.** In a child forked from a process that initialized CUDA, ``is_initialized()`` is False and
  ``_lazy_init()`` raises "Cannot re-initialize CUDA in forked subprocess" (``torch/cuda/__init__.py`` lines
  516-520): ``bad_fork = True``, and each call that would initialize is recorded in ``bad_fork_calls``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from tests.gpu_fakes import FakeCuda, FakeEvent, FakeStream


class Capture:
    """One stream capture (``torch.cuda.graph``'s ``capture_begin`` .. ``capture_end``)."""

    def __init__(self, stream: FakeStream, thread: int, mode: str) -> None:
        self.stream, self.thread, self.mode = stream, thread, mode
        self.invalidated: str | None = None  # why the capture is broken (None: the graph will be good)


class HazardEvent(FakeEvent):
    """``torch.cuda.Event`` with the device rules of ``c10/cuda/CUDAEvent.h``."""

    def record(self, stream: FakeStream | None = None) -> None:
        cuda: HazardCuda = self.cuda  # type: ignore[assignment]
        stream = cuda.current_stream() if stream is None else stream
        cuda.runtime_call("cudaEventRecord", device=stream.device)  # CUDAGuard guard(device_index_)
        capture = cuda.capture_of(stream)
        if capture is not None:  # a node of the user's graph, not a timestamp
            with cuda._lock:
                cuda.captured_records += 1
                self.device, self.stamp = stream.device, None
            return
        super().record(stream)

    def query(self) -> bool:
        cuda: HazardCuda = self.cuda  # type: ignore[assignment]
        cuda.runtime_call("cudaEventQuery", unsafe=True)  # no guard: the calling thread's current device
        return super().query()

    def elapsed_time(self, end: FakeEvent) -> float:
        cuda: HazardCuda = self.cuda  # type: ignore[assignment]
        if not (self.query() and end.query()):  # TORCH_CHECK(query() && other.query(), ...) comes first
            raise RuntimeError("Both events must be completed before calculating elapsed time.")
        cuda.runtime_call("cudaEventElapsedTime", device=self.device)  # CUDAGuard guard(device_index_)
        return super().elapsed_time(end)


class HazardCuda(FakeCuda):
    """:class:`FakeCuda` with lazy initialization, a current device per thread, global capture mode and a bad
    fork (see the module docstring for the source each models). Starts *not* initialized: ``init()`` (or any call
    that initializes) does it on the calling thread's current device."""

    def __init__(self, devices: int = 1, *, initialized: bool = False, device: int = 0, **kwargs: object) -> None:
        self._tls = threading.local()
        self.contexts: set[int] = set()
        self.contexts_created: list[str] = []
        self.driver_inits = 0
        self.bad_fork = False
        self.bad_fork_calls: list[str] = []
        self.captures: list[Capture] = []
        self.captured_records = 0
        self.unsafe_calls: list[tuple[str, int]] = []  # (call, thread id)
        super().__init__(devices=devices, **kwargs)  # type: ignore[arg-type]
        self.set_device(device)
        self.initialized = False
        if initialized:
            self.init()

    # -- the current device, per host thread ----------------------------------------------------------------

    @property  # type: ignore[override]
    def current(self) -> int:
        return getattr(self._tls, "device", 0)  # a new host thread's current device is 0

    @current.setter
    def current(self, d: int) -> None:
        self._tls.device = d

    # set_device() and device() are FakeCuda's: they set ``current``, this thread's

    # -- lazy initialization and the bad fork ---------------------------------------------------------------

    def is_initialized(self) -> bool:
        return self.initialized and not self.bad_fork

    def is_available(self) -> bool:
        self.driver_inits += 1  # cudaGetDeviceCount -> cuInit
        return super().is_available()

    def _lazy_init(self, why: str) -> None:
        if self.is_initialized():
            return
        if self.bad_fork:
            self.bad_fork_calls.append(why)
            raise RuntimeError("Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, "
                               "you must use the 'spawn' start method")
        self.initialized = True
        self.runtime_call(f"_lazy_init ({why})")

    def init(self) -> None:
        self._lazy_init("init")

    def current_device(self) -> int:
        self._lazy_init("current_device")
        return self.current

    def reset_peak_memory_stats(self, d: int | None = None) -> None:
        if d is None:
            d = self.current_device()
        super().reset_peak_memory_stats(d)

    def current_stream(self, device: int | None = None) -> FakeStream:
        self._lazy_init("current_stream")
        return super().current_stream(device)

    def synchronize(self, device: int | None = None) -> None:
        self.runtime_call("cudaDeviceSynchronize", unsafe=True)
        super().synchronize(device)

    def runtime_call(self, what: str, *, device: int | None = None, unsafe: bool = False) -> None:
        """A CUDA runtime call on the calling thread: on ``device`` (set by a guard first) or on the thread's
        current device; it makes that device's primary context if there is none, and an ``unsafe`` call breaks
        every global-mode capture running (and the calling thread's own)."""
        if self.bad_fork:
            self.bad_fork_calls.append(what)
            raise RuntimeError("CUDA error: initialization error (a CUDA call in a forked child)")
        d = self.current if device is None else device
        with self._lock:
            if d not in self.contexts:
                self.contexts.add(d)
                self.contexts_created.append(f"context created on device {d} by {what} on thread "
                                             f"{threading.current_thread().name}")
            if unsafe:
                self.unsafe_calls.append((what, threading.get_ident()))
                me = threading.get_ident()
                for capture in self.captures:
                    if capture.invalidated is None and (capture.mode == "global" or capture.thread == me):
                        capture.invalidated = f"{what} on thread {threading.current_thread().name}"

    # -- events and graph capture ---------------------------------------------------------------------------

    def Event(self, enable_timing: bool = False, blocking: bool = False,  # torch's name
              interprocess: bool = False) -> FakeEvent:
        with self._lock:
            self.events_created += 1
        return HazardEvent(self, enable_timing, blocking, interprocess)

    def capture_of(self, stream: FakeStream) -> Capture | None:
        with self._lock:
            return next((c for c in self.captures if c.stream is stream), None)

    def is_current_stream_capturing(self) -> bool:
        return self.is_initialized() and self.capture_of(self.current_stream()) is not None

    @contextlib.contextmanager
    def capture(self, mode: str = "global") -> Iterator[Capture]:
        """``with torch.cuda.graph(g, capture_error_mode=mode):`` on a side stream of the current device, made
        current for the block, as ``torch.cuda.graph`` does."""
        stream = FakeStream(self.current)
        capture = Capture(stream, threading.get_ident(), mode)
        with self._lock:
            self.captures.append(capture)
        try:
            with self.stream(stream):
                yield capture
        finally:
            with self._lock:
                self.captures.remove(capture)


def fork_child_of(cuda: HazardCuda) -> HazardCuda:
    """``cuda`` as a child forked from its process sees it: initialized in the parent, a bad fork here."""
    cuda.bad_fork = True
    return cuda


def device_tensor_class():
    """A ``torch.Tensor`` subclass standing for a CUDA tensor on a CPU machine: it counts the reads that copy a
    CUDA tensor to the host, each a host sync on a GPU (``torch.cuda.set_sync_debug_mode`` reports every one):
    ``item()`` (``_local_scalar_dense``: ``aten/src/ATen/native/cuda/CUDAScalar.cu``, a copy then a stream sync),
    ``tolist()``, ``cpu()``, ``to("cpu")``, ``float()``/``int()``/``bool()`` (a device-to-host ``copy_`` of pageable
    memory syncs the stream: ``aten/src/ATen/native/cuda/Copy.cu``). ``numpy()`` is not counted: on a CUDA tensor
    it raises, so a real path copies with ``cpu()`` first. ``DeviceTensor.copies`` is the count so far."""
    import torch

    copying = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.cpu, torch.Tensor.__float__,
               torch.Tensor.__int__, torch.Tensor.__bool__}

    class DeviceTensor(torch.Tensor):
        copies = 0
        __module__ = "torch"  # rl_otel recognises torch's tensors by their module, without importing torch

        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            to_host = func is torch.Tensor.to and any(
                str(a) == "cpu" or getattr(a, "type", None) == "cpu" for a in (*args[1:], *kwargs.values()))
            if func in copying or to_host:
                DeviceTensor.copies += 1
            return super().__torch_function__(func, types, args, kwargs)

    return DeviceTensor
