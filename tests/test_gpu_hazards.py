"""On a GPU, first do no harm: each CUDA hazard a library watching a training process can cause, on a fake
``torch.cuda`` that models it (``tests/fake_cuda.py``, each behaviour citing the torch/CUDA source it models).

Each test here failed on 3effae0 (a phase initialized CUDA, a resolver thread queried events on device 0 and
while another thread captured, every phase reset the peaks, ``log()`` copied each CUDA scalar on its own) and
passes now. The same checks run for real on a GPU in ``scripts/gpu_check.sh`` / ``benchmarks/bench_gpu.py``.
"""

from __future__ import annotations

import sys
import threading
import time

import pytest

import rl_otel
from rl_otel._internal.probes import live
from tests.fake_cuda import HazardCuda, device_tensor_class, fork_child_of
from tests.gpu_fakes import GIB, fake_torch, settle
from tests.promtools import scrape

WINDOW_S = 0.3  # how long a capture stays open: 3effae0's resolver polled every 1-50 ms while phases were pending


def init(**kwargs):
    return rl_otel.init(run="hazards", rank=0, prometheus={"host": "127.0.0.1", "port": 0}, handle_sigterm=False,
                        **kwargs)


@pytest.fixture
def tel():
    t = init()
    yield t
    t.close()


def use(monkeypatch, cuda: HazardCuda) -> HazardCuda:
    monkeypatch.setitem(sys.modules, "torch", fake_torch(cuda))
    return cuda


def errors(tel) -> float:
    return sum(tel.value("rl_telemetry_errors_total", sink="phase", reason=r) or 0.0
               for r in ("gpu_snapshot", "gpu_time", "internal"))


def gpu_total(tel, cluster: str = "rollout", phase: str = "generate") -> float | None:
    value = tel.value("rl_phase_gpu_duration_seconds", cluster=cluster, phase=phase, part="total")
    return None if value is None else value.count


def gpu_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("rl_otel-gpu")]


# -- no CUDA context where the process has none --------------------------------------------------------------


def test_a_process_that_never_used_cuda_gets_no_context_from_phases_or_scrapes(tel, monkeypatch):
    cuda = use(monkeypatch, HazardCuda(devices=2))
    for _ in range(3):
        with tel.phase("rollout", "generate", onload=lambda: None, offload=lambda: None):
            pass
    tel.log({"actor/pg_loss": 0.5}, step=1)
    assert "rl_phase_duration_seconds" in scrape(tel.metrics_url)  # the live gauges ran too
    assert tel.flush(10)
    assert cuda.contexts_created == [] and not cuda.initialized
    assert cuda.driver_inits == 0  # not even is_available(): its cuInit would spoil a later fork
    assert cuda.events_created == 0 and cuda.resets == 0 and errors(tel) == 0

    cuda.init()  # the process itself starts using CUDA: from now on its phases read memory and GPU times
    with tel.phase("rollout", "generate") as ph:
        cuda.launch(5)
    assert settle(tel) and gpu_total(tel) == 1
    assert "memory/rollout/generate/end/onload/allocated/0" in ph.metrics
    assert cuda.contexts == {0}


def test_a_bad_fork_makes_no_cuda_call(tel, monkeypatch):
    """A child forked from a process that used CUDA (a DataLoader worker): every CUDA call there raises; the
    phase makes none, and counts no failure."""
    cuda = use(monkeypatch, fork_child_of(HazardCuda(initialized=True)))
    with tel.phase("rollout", "generate", onload=lambda: None, offload=lambda: None) as ph:
        pass
    assert cuda.bad_fork_calls == [] and errors(tel) == 0
    assert "time/rollout/generate/total" in ph.metrics
    assert not [k for k in ph.metrics if k.startswith("memory/rollout/")]


# -- no CUDA call on a device or thread that is not the phase's own ----------------------------------------


def test_gpu_times_resolve_without_a_context_on_device_0(tel, monkeypatch):
    """A rank on ``cuda:3`` of four: its phases' events are queried with device 3 current, never on a thread whose
    current device is 0 (3effae0's resolver thread: a context on GPU 0 in every rank)."""
    cuda = use(monkeypatch, HazardCuda(devices=4, device=3, initialized=True))
    cuda.hold()
    for _ in range(3):
        with tel.phase("rollout", "generate"):
            cuda.launch(10)
    cuda.run_to()
    with tel.phase("rollout", "generate"):  # its edges resolve the earlier phases, on this thread
        cuda.launch(10)
    assert settle(tel) and gpu_total(tel) == 4
    assert cuda.contexts == {3}, cuda.contexts_created
    assert gpu_threads() == []


def test_flush_from_another_thread_queries_with_the_phases_device_current(tel, monkeypatch):
    cuda = use(monkeypatch, HazardCuda(devices=2))
    cuda.hold()

    def rank() -> None:
        cuda.set_device(1)
        cuda.init()
        with tel.phase("rollout", "generate"):
            cuda.launch(10)

    worker = threading.Thread(target=rank)
    worker.start()
    worker.join(30)
    assert not worker.is_alive()
    cuda.run_to()
    assert tel.flush(10) and gpu_total(tel) == 1  # this thread's current device is 0, never used
    assert cuda.contexts == {1}, cuda.contexts_created


# -- CUDA-graph captures ---------------------------------------------------------------------------------------


def test_captures_right_after_phases_with_pending_gpu_work_succeed(tel, monkeypatch):
    """torch.compile(mode="reduce-overhead") captures on the training thread, right after phases whose GPU work is
    still running: 10 of 10 captures stay valid (3effae0's resolver queried from its thread meanwhile)."""
    cuda = use(monkeypatch, HazardCuda(initialized=True))
    cuda.hold()
    broken = []
    for _ in range(10):
        with tel.phase("rollout", "generate"):
            cuda.launch(10)
        with cuda.capture() as capture:
            deadline = time.monotonic() + WINDOW_S / 10
            while capture.invalidated is None and time.monotonic() < deadline:
                time.sleep(0.005)
        broken.append(capture.invalidated)
    assert broken == [None] * 10
    cuda.run_to()
    assert settle(tel) and gpu_total(tel) == 10


def test_a_phase_inside_a_capture_records_no_event_and_queries_nothing(tel, monkeypatch):
    cuda = use(monkeypatch, HazardCuda(initialized=True))
    cuda.hold()
    with tel.phase("rollout", "generate"):  # pending while the capture runs
        cuda.launch(10)
    with cuda.capture() as capture, tel.phase("rollout", "generate") as ph:
        cuda.launch(1)
    assert capture.invalidated is None and cuda.captured_records == 0
    assert "time/rollout/generate/total" in ph.metrics  # host times and spans go on
    cuda.run_to()
    assert settle(tel) and gpu_total(tel) == 1  # the phase before the capture, not the one inside it


@pytest.mark.parametrize(("gpu_time", "broken"), [(True, True), (False, False)])
def test_global_capture_on_another_thread_is_the_limit_and_the_option_avoids_it(monkeypatch, gpu_time, broken):
    """Global capture mode forbids unsafe calls from every thread: a query on the training thread can break a
    capture another thread of the process runs (docs/gpu.md); ``phase_gpu_time=False`` makes no CUDA event call."""
    cuda = use(monkeypatch, HazardCuda(initialized=True))
    cuda.hold()
    tel = init(phase_gpu_time=gpu_time)
    try:
        with tel.phase("rollout", "generate"):
            cuda.launch(10)
        started, release = threading.Event(), threading.Event()
        result: list = []

        def engine() -> None:
            with cuda.capture() as capture:
                started.set()
                release.wait(30)
            result.append(capture.invalidated)

        thread = threading.Thread(target=engine)
        thread.start()
        assert started.wait(30)
        with tel.phase("rollout", "generate"):  # its start edge queries the pending phase (if GPU-timed)
            pass
        release.set()
        thread.join(30)
        assert (result[0] is not None) is broken, result
        cuda.run_to()
        assert settle(tel) and gpu_total(tel) == (2 if gpu_time else None)
    finally:
        cuda.run_to()
        tel.close()


# -- the process's peak statistics are the user's ------------------------------------------------------------


def test_nested_phases_keep_the_outer_phases_peak(tel, monkeypatch):
    cuda = use(monkeypatch, HazardCuda(initialized=True))
    with tel.phase("actor_train", "train_step") as outer:
        cuda.alloc(4 * GIB)
        cuda.free(4 * GIB)
        with tel.phase("actor_train", "micro_batch") as inner:
            cuda.alloc(6 * GIB)  # above everything before it: the inner peak is exact
            cuda.free(6 * GIB)
        with tel.phase("actor_train", "micro_batch") as bounded:
            cuda.alloc(1 * GIB)  # below the outer's 6 GiB: the inner peak reads that upper bound
            cuda.free(1 * GIB)
    assert cuda.resets == 1  # only the outermost phase reset torch's peaks
    assert outer.metrics["memory/actor_train/train_step/end/onload/max_allocated/0"] == 6.0
    assert inner.metrics["memory/actor_train/micro_batch/start/offload/max_allocated/0"] == 0.0
    assert inner.metrics["memory/actor_train/micro_batch/end/onload/max_allocated/0"] == 6.0
    assert bounded.metrics["memory/actor_train/micro_batch/end/onload/max_allocated/0"] == 6.0
    assert cuda.max_memory_allocated() == 6 * GIB  # a framework reading its own peak sees the outer phase's


def test_phase_peaks_false_never_resets_the_process_peak(monkeypatch):
    cuda = use(monkeypatch, HazardCuda(initialized=True))
    cuda.alloc(5 * GIB)
    cuda.free(5 * GIB)  # verl's perf/max_memory_allocated_gb reads this peak
    tel = init(phase_peaks=False)
    try:
        with tel.phase("actor_train", "train_step") as ph:
            cuda.alloc(GIB)
            with tel.phase("actor_train", "micro_batch"):
                pass
        assert cuda.resets == 0 and cuda.max_memory_allocated() == 5 * GIB
        assert ph.metrics["memory/actor_train/train_step/start/offload/max_allocated/0"] == 0.0
        assert ph.metrics["memory/actor_train/train_step/end/onload/max_allocated/0"] == 5.0  # since the last reset
    finally:
        tel.close()


# -- cheap phases ---------------------------------------------------------------------------------------------


def test_memory_false_is_events_only(monkeypatch):
    cuda = use(monkeypatch, HazardCuda(initialized=True))
    for tel_kwargs, phase_kwargs in (({}, {"memory": False}), ({"phase_memory": False}, {})):
        tel = init(**tel_kwargs)
        try:
            reads, resets, records = cuda.allocator_reads, cuda.resets, cuda.records
            with tel.phase("actor_train", "micro_batch", **phase_kwargs) as ph:
                cuda.launch(1)
            assert cuda.allocator_reads == reads and cuda.resets == resets
            assert cuda.records == records + 2  # START and EXECUTED
            assert not [k for k in ph.metrics if k.startswith("memory/")]
            assert settle(tel) and gpu_total(tel, "actor_train", "micro_batch") == 1
        finally:
            tel.close()


def test_live_gauges_read_the_allocator_once_per_device_and_scrape(monkeypatch):
    cuda = use(monkeypatch, HazardCuda(devices=2, initialized=True))
    cuda.alloc(GIB, device=1)
    reads = cuda.allocator_reads
    items = live.torch_process_memory()
    assert cuda.allocator_reads == reads + 2
    assert {(spec.name, labels, value) for spec, labels, value in items} >= {
        ("rl_gpu_process_memory_allocated_bytes", (("device_id", "1"),), float(GIB)),
        ("rl_gpu_process_memory_reserved_bytes", (("device_id", "1"),), float(GIB))}


# -- one host copy per log() and device -------------------------------------------------------------------------


def as_on_cuda(monkeypatch, device_tensor: type) -> None:
    """``log()`` takes ``device_tensor``'s tensors for CUDA ones (their reads copy to the host)."""
    from rl_otel._internal.pipeline import ingest, values

    for module in (values, ingest):
        monkeypatch.setattr(module, "on_device", lambda t: isinstance(t, device_tensor), raising=False)


def test_a_log_of_50_device_scalars_copies_to_the_host_once(tel, monkeypatch):
    torch = pytest.importorskip("torch")
    DeviceTensor = device_tensor_class()
    as_on_cuda(monkeypatch, DeviceTensor)
    metrics = {f"actor/custom_{i}": torch.tensor(float(i)).as_subclass(DeviceTensor) for i in range(48)}
    metrics["actor/custom_48"] = torch.tensor(48, dtype=torch.int64).as_subclass(DeviceTensor)  # another dtype
    metrics["actor/custom_49"] = torch.tensor(2**40 + 49, dtype=torch.int64).as_subclass(DeviceTensor)
    DeviceTensor.copies = 0
    tel.log(metrics, step=1)
    assert DeviceTensor.copies == 1
    expected = [float(i) for i in range(49)] + [float(2**40 + 49)]  # int64 read exactly (float64, not float32)
    assert [tel.value(f"actor/custom_{i}") for i in range(50)] == expected  # stored before log() returned


def test_distributions_on_a_device_cross_with_the_scalars_in_one_copy(tel, monkeypatch):
    torch = pytest.importorskip("torch")
    DeviceTensor = device_tensor_class()
    as_on_cuda(monkeypatch, DeviceTensor)
    ratios = torch.linspace(0.5, 1.5, 1000, dtype=torch.float32)
    metrics = {"actor/ratio_dist": ratios.as_subclass(DeviceTensor),
               **{f"actor/custom_{i}": torch.tensor(float(i)).as_subclass(DeviceTensor) for i in range(10)}}
    DeviceTensor.copies = 0
    tel.log(metrics, step=1)
    assert DeviceTensor.copies == 1
    dist = tel.value("actor/ratio_dist")
    assert dist is not None and dist.count == 1000 and dist.sum == pytest.approx(float(ratios.double().sum()))
    assert tel.value("actor/custom_9") == 9.0


def test_a_new_value_clip_costs_no_host_to_device_copy(monkeypatch):
    """ppo_stats on the GPU layout: its device constants are made by kernels, a clip value goes in as a Python
    number; a new value_clip must not cost a ``torch.tensor(..., device=...)`` (a host-to-device copy, 3effae0 made
    one per new value)."""
    torch = pytest.importorskip("torch")
    from rl_otel.stats import ppo_stats
    from tests.test_stats_ppo import make_batch

    batch = make_batch(0, 4, 16)
    made = []
    real = torch.tensor

    def counting(*args, **kwargs):
        if kwargs.get("device") is not None:
            made.append(kwargs["device"])
        return real(*args, **kwargs)

    def run(clip: float) -> dict:
        before = len(made)
        out = ppo_stats(**batch, value_clip=clip, _compact=False)
        return {"copies": len(made) - before, "clipfrac": out["critic/clipfrac"]}

    monkeypatch.setattr(torch, "tensor", counting)
    run(0.2)
    same = run(0.2)
    new = [run(clip) for clip in (0.3, 0.4, 0.5)]
    assert [r["copies"] for r in new] == [same["copies"]] * 3
    compact = ppo_stats(**batch, value_clip=0.4, _compact=True)  # the host layout computes the same fraction
    assert new[1]["clipfrac"] == pytest.approx(compact["critic/clipfrac"])
