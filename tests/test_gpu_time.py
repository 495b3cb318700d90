"""GPU-true phase times (``probes/gpu_time.py``): CUDA events at a phase's edges, resolved on the GPU timer's thread,
served as ``rl_phase_gpu_duration_seconds`` beside the host times, on the root span, and to the trackers.

At the torch.cuda boundary with ``tests/gpu_fakes.FakeCuda``: its events are stamped with a GPU clock the test
moves (``launch`` queues work on the current stream, ``hold`` stops the GPU, ``run_to`` lets it run), and its
``synchronize`` fails the test. The real-GPU variants at the end skip without CUDA."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import rl_otel
from rl_otel._internal.probes.gpu_time import EXECUTED, START, GpuTimer
from rl_otel._internal.runtime.phase import GPU_ATTRIBUTES
from tests._sinks import Recorder
from tests.gpu_fakes import FakeCuda, fake_torch, gpu_timer, real_cuda, settle
from tests.promtools import promtool_check, samples, scrape

REPO = Path(__file__).resolve().parents[1]
GPU = "rl_phase_gpu_duration_seconds"


@pytest.fixture
def cuda(monkeypatch):
    fake = FakeCuda(devices=2)
    monkeypatch.setitem(sys.modules, "torch", fake_torch(fake))
    return fake


@pytest.fixture
def tel():
    t = rl_otel.init(run="gpu-time", rank=0, prometheus={"host": "127.0.0.1", "port": 0}, handle_sigterm=False)
    yield t
    t.close()


def gpu_seconds(tel, cluster: str = "rollout", phase: str = "generate") -> dict[str, float]:
    """The GPU seconds each part of ``cluster/phase`` summed over its runs (``{}`` where none was recorded)."""
    out = {}
    for part in ("total", "execute", "onload", "offload"):
        value = tel.value(GPU, cluster=cluster, phase=phase, part=part)
        if value is not None:
            out[part] = value.sum
    return out


def errors(tel, reason: str) -> float:
    return tel.value("rl_telemetry_errors_total", sink="phase", reason=reason) or 0.0


def _timer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("rl_otel-gpu")]


def approx(seconds: dict[str, float]) -> dict[str, object]:
    return {part: pytest.approx(value, abs=1e-9) for part, value in seconds.items()}


# -- what a phase measures ------------------------------------------------------------------------------------


def test_each_part_is_the_gpu_time_between_its_edges(tel, cuda):
    """onload's 10 ms, the body's 95 ms and offload's 5 ms of GPU work land in their parts, whatever the host took
    to launch them (here: no time at all)."""
    with tel.phase("rollout", "generate", onload=lambda: cuda.launch(10), offload=lambda: cuda.launch(5)) as ph:
        cuda.launch(95)
    assert settle(tel)
    assert gpu_seconds(tel) == approx({"total": 0.110, "execute": 0.095, "onload": 0.010, "offload": 0.005})
    assert ph.metrics["time/rollout/generate/execute"] < 0.095  # the host's view is unchanged: the launch time
    assert cuda.records == 4 and cuda.synchronizes == 0


def test_without_onload_or_offload_two_events_serve_the_phase(tel, cuda):
    cuda.launch(40)  # work queued before the phase is not the phase's
    with tel.phase("rollout", "generate"):
        cuda.launch(25)
    assert settle(tel)
    assert gpu_seconds(tel) == approx({"total": 0.025, "execute": 0.025, "onload": 0.0, "offload": 0.0})
    assert cuda.records == 2


def test_the_training_thread_never_waits_for_the_gpu(tel, cuda):
    cuda.hold()  # the GPU stalls: the body's kernels stay queued
    with tel.phase("rollout", "generate") as ph:
        cuda.launch(100)
    # the block is over, its host times written; its GPU times wait for the GPU (and a later edge or flush)
    assert tel.value("time/rollout/generate/total") == ph.metrics["time/rollout/generate/total"]
    assert gpu_seconds(tel) == {} and gpu_timer(tel).unresolved == 1
    assert not settle(tel, timeout_s=0.05)
    cuda.run_to()
    assert settle(tel)
    assert gpu_seconds(tel)["execute"] == pytest.approx(0.1)
    assert gpu_timer(tel).unresolved == 0 and cuda.synchronizes == 0


def test_events_come_from_a_pool_and_are_reused(tel, cuda):
    for _ in range(50):
        with tel.phase("rollout", "generate", onload=lambda: None, offload=lambda: None):
            cuda.launch(1)
        assert settle(tel)
    assert cuda.events_created == 4  # one phase's worth, reused 49 times
    assert tel.value(GPU, cluster="rollout", phase="generate", part="total").count == 50


def test_the_pool_keeps_a_bounded_number_of_events_after_a_burst(tel, cuda):
    """A burst of phases the GPU has not reached yet takes an event set each; once resolved, the pool keeps at most
    POOL events for reuse and lets the rest go (it once kept every event of the largest burst, for good)."""
    from rl_otel._internal.probes.gpu_time import POOL

    cuda.hold()
    for _ in range(200):
        with tel.phase("rollout", "generate", onload=lambda: None, offload=lambda: None):
            cuda.launch(1)
    assert gpu_timer(tel).unresolved == 200 and cuda.events_created == 800
    cuda.run_to()
    assert settle(tel)
    assert sum(len(free) for free in gpu_timer(tel)._free.values()) == POOL


def test_served_beside_the_host_times(tel, cuda):
    with tel.phase("rollout", "generate"):
        cuda.launch(30)
    assert settle(tel)
    text = scrape(tel.metrics_url)
    assert promtool_check(text) == ""
    base = {("run", "gpu-time"), ("role", "trainer"), ("rank", "0"), ("cluster", "rollout"), ("phase", "generate")}
    host = samples(text, "rl_phase_duration_seconds_count")
    gpu = samples(text, f"{GPU}_count")
    assert set(gpu) == set(host) == {frozenset(base | {("part", p)}) for p in ("total", "execute", "onload",
                                                                                "offload")}
    buckets = {dict(k)["le"]: v for k, v in samples(text, f"{GPU}_bucket").items() if ("part", "execute") in k}
    assert buckets["0.025"] == 0 and buckets["0.05"] == 1  # 30 ms, in the host histogram's buckets


# -- spans and trackers ---------------------------------------------------------------------------------------


def test_the_root_span_carries_the_gpu_times_and_ends_at_the_host_end(tel, cuda):
    exporter = InMemorySpanExporter()
    tel.tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    cuda.hold()
    # step given: a phase whose step is not known yet is held until its step's log() (tracing/pending.py)
    with tel.phase("rollout", "generate", onload=lambda: cuda.launch(2), step=0):
        cuda.launch(50)
    names = [s.name for s in exporter.get_finished_spans()]
    assert sorted(names) == ["execute", "offload", "onload"]  # the root waits for its GPU times
    cuda.run_to()
    assert settle(tel)
    spans = {s.name: s for s in exporter.get_finished_spans()}
    root = spans["rollout/generate"]
    assert {k: root.attributes[k] for k in GPU_ATTRIBUTES.values()} == approx(
        {GPU_ATTRIBUTES[p]: v for p, v in gpu_seconds(tel).items()})
    assert root.attributes["rl.gpu_time.execute_s"] == pytest.approx(0.05)
    assert root.end_time >= spans["offload"].end_time  # ended with the host's end time, not at resolution
    assert all(k.startswith(("cluster", "phase", "rank", "step")) for k in spans["execute"].attributes)


def test_trackers_get_the_gpu_times_with_a_later_step(cuda):
    Recorder.instances.clear()
    tel = rl_otel.init(run="gpu-time", prometheus=False, trackers=["recorder"], handle_sigterm=False)
    try:
        with tel.phase("actor_train", "train_step", onload=lambda: cuda.launch(3)):
            cuda.launch(20)
        assert settle(tel)
        tel.log({"actor/pg_loss": 1.0}, step=0)
        assert tel.flush(30)
    finally:
        tel.close()
    (step, logged), = Recorder.instances[0].steps
    assert step == 0
    assert {k: v for k, v in logged.items() if "/gpu/" in k} == approx({
        "time/actor_train/train_step/gpu/total": 0.023, "time/actor_train/train_step/gpu/execute": 0.020,
        "time/actor_train/train_step/gpu/onload": 0.003, "time/actor_train/train_step/gpu/offload": 0.0})
    assert "time/actor_train/train_step/execute" in logged  # ROLL's host keys, as before


# -- nesting, threads, streams, devices -----------------------------------------------------------------------


def test_a_phase_nested_in_another(tel, cuda):
    with tel.phase("actor_train", "train_step"):
        cuda.launch(10)
        with tel.phase("reference", "compute_log_probs"):
            cuda.launch(30)
        cuda.launch(5)
    assert settle(tel)
    assert gpu_seconds(tel, "reference", "compute_log_probs")["execute"] == pytest.approx(0.030)
    assert gpu_seconds(tel, "actor_train", "train_step")["execute"] == pytest.approx(0.045)


def test_phases_on_several_threads_and_streams(tel, cuda):
    """Each thread's phase is timed on its own current stream: the other thread's work is not in it."""
    barrier = threading.Barrier(2)

    def train(name: str, ms: float) -> None:
        with cuda.stream(cuda.Stream()), tel.phase("actor_train", name):
            barrier.wait()
            cuda.launch(ms)
            barrier.wait()  # both launched before either phase ends

    threads = [threading.Thread(target=train, args=(name, ms)) for name, ms in (("a", 20), ("b", 70))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert settle(tel)
    assert gpu_seconds(tel, "actor_train", "a")["execute"] == pytest.approx(0.020)
    assert gpu_seconds(tel, "actor_train", "b")["execute"] == pytest.approx(0.070)


def test_a_device_switched_inside_the_body_keeps_the_phase_on_its_device(tel, cuda):
    with tel.phase("rollout", "generate"):
        cuda.launch(12)
        cuda.set_device(1)  # every edge is recorded on the phase's first device (an event belongs to one)
    assert settle(tel)
    assert gpu_seconds(tel)["execute"] == pytest.approx(0.012) and errors(tel, "internal") == 0


# -- failures and bounds ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["body", "onload", "offload"])
def test_a_raising_phase_gives_its_events_back(tel, cuda, where):
    cuda.hold()

    def boom() -> None:
        raise RuntimeError(where)

    with pytest.raises(RuntimeError, match=where), tel.phase(
            "rollout", "generate", onload=boom if where == "onload" else None,
            offload=boom if where == "offload" else None):
        cuda.launch(10)
        if where == "body":
            boom()
    assert gpu_timer(tel).unresolved == 0  # nothing pending: no host times, no GPU times either
    cuda.run_to()
    assert settle(tel)
    assert gpu_seconds(tel) == {} and errors(tel, "gpu_time_unresolved") == 0 and errors(tel, "internal") == 0
    with tel.phase("rollout", "generate"):  # the events went back to the pool
        cuda.launch(1)
    assert settle(tel) and cuda.events_created == 4


def test_a_cuda_error_at_resolution_drops_the_phase_and_counts_it(tel, cuda):
    cuda.query_error = RuntimeError("CUDA error: an illegal memory access was encountered")
    with tel.phase("rollout", "generate"):
        cuda.launch(10)
    assert settle(tel)
    assert gpu_seconds(tel) == {} and errors(tel, "internal") == 1
    cuda.query_error = None
    with tel.phase("rollout", "generate"):
        cuda.launch(10)
    assert settle(tel) and gpu_seconds(tel)["execute"] == pytest.approx(0.01)


class Timed:
    """A bare GpuTimer on a fake, with what it resolved, counted and failed."""

    def __init__(self, cuda: FakeCuda, **kwargs) -> None:
        self.resolved: list[tuple[object, dict[str, float] | None]] = []
        self.counted: list[str] = []
        self.failed: list[str] = []
        self.timer = GpuTimer(lambda: cuda, lambda ph, secs: self.resolved.append((ph.payload, secs)),
                              count=self.counted.append, fail=self.failed.append, **kwargs)

    def phase(self, cuda: FakeCuda, payload: object, ms: float) -> bool:
        timed = self.timer.begin()
        if timed is None:
            return False
        cuda.launch(ms)
        timed.mark(EXECUTED)
        return timed.finish(payload)


def test_unresolved_phases_are_capped_and_the_excess_counted(cuda):
    t = Timed(cuda, max_unresolved=3)
    cuda.hold()
    try:
        assert [t.phase(cuda, i, 10) for i in range(5)] == [True, True, True, False, False]
        assert t.counted == ["gpu_time_backlog"] * 2 and t.timer.unresolved == 3
        assert cuda.events_created == 12  # 4 a phase, never more than the cap's
        cuda.run_to()
        assert t.timer.wait(30)
        assert [payload for payload, _ in t.resolved] == [0, 1, 2]
        assert t.timer.unresolved == 0
        assert t.phase(cuda, 5, 1) and t.timer.wait(30)
        assert cuda.events_created == 12 and t.failed == []
    finally:
        t.timer.close(0)


@pytest.mark.slow
def test_close_drops_and_counts_what_the_gpu_has_not_reached(tel, cuda):
    exporter = InMemorySpanExporter()
    tel.tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    cuda.hold()
    with tel.phase("rollout", "generate"):
        cuda.launch(10_000)  # the GPU never gets there
    closing = threading.Thread(target=tel.close)
    closing.start()
    closing.join(30)
    assert not closing.is_alive()  # bounded: close() polls, never waits on the GPU
    assert gpu_timer(tel).pending == 0  # nothing left behind
    assert errors(tel, "gpu_time_unresolved") == 1 and gpu_seconds(tel) == {}
    root = next(s for s in exporter.get_finished_spans() if s.name == "rollout/generate")
    assert not [k for k in root.attributes if k.startswith("rl.gpu_time.")]  # ended, without GPU times
    with tel.phase("rollout", "generate"):  # a phase after close: host side only, no event taken
        pass
    assert gpu_timer(tel).unresolved == 0


@pytest.mark.slow
def test_a_process_exiting_with_unresolved_events_exits_and_counts_them():
    script = """
import atexit, sys
from tests.gpu_fakes import FakeCuda, fake_torch
cuda = FakeCuda()
sys.modules["torch"] = fake_torch(cuda)
import rl_otel
# registered before the Telemetry's own close at exit: runs after it (atexit is last in, first out)
atexit.register(lambda: print("unresolved", tel.value("rl_telemetry_errors_total", sink="phase",
                                                      reason="gpu_time_unresolved")))
tel = rl_otel.init("exit", prometheus=False, handle_sigterm=False)
cuda.hold()
with tel.phase("rollout", "generate"):
    cuda.launch(10_000)
print("left the phase")
"""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=REPO,
                         env={**os.environ, "PYTHONPATH": path})
    assert run.returncode == 0, run.stderr[-4000:]
    assert run.stdout.split("\n")[:2] == ["left the phase", "unresolved 1.0"]


def test_without_cuda_no_event_and_no_thread(tel, monkeypatch):
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    with tel.phase("rollout", "generate"):
        pass
    timer = gpu_timer(tel)
    assert timer.begin() is None and not _timer_threads()
    assert tel.value(GPU, cluster="rollout", phase="generate", part="total") is None


def test_a_torch_without_timing_events_is_not_gpu_timed(tel, monkeypatch):
    class NoEvents(FakeCuda):
        Event = None

    monkeypatch.setitem(sys.modules, "torch", fake_torch(NoEvents()))
    with tel.phase("rollout", "generate") as ph:
        pass
    assert ph.metrics["memory/rollout/generate/end/onload/allocated/0"] == 0.0  # the memory keys stay
    assert not _timer_threads() and errors(tel, "internal") == 0


def test_the_event_pool_is_per_device(cuda):
    """An event belongs to the device it was first recorded on: device 1 never gets device 0's events back."""
    t = Timed(cuda)
    try:
        first = t.timer.begin()
        assert first is not None and first.marked == 1 << START
        device0 = {id(e) for e in first.events}
        t.timer.release(first)
        cuda.set_device(1)
        second = t.timer.begin()
        assert second is not None and not {id(e) for e in second.events} & device0
        t.timer.release(second)
        cuda.set_device(0)
        third = t.timer.begin()  # device 0 reuses its own
        assert third is not None and {id(e) for e in third.events} == device0
        assert cuda.events_created == 8 and t.failed == []
        t.timer.release(third)
    finally:
        t.timer.close(0)


def test_an_edge_that_cannot_be_recorded_is_counted_and_the_phase_goes_on(tel, cuda, monkeypatch):
    def broken(device=None):
        raise RuntimeError("CUDA error: invalid resource handle")

    with tel.phase("rollout", "generate") as ph:
        monkeypatch.setattr(cuda, "current_stream", broken)  # from the body on: the executed edge fails
    assert settle(tel)
    assert ph.metrics["time/rollout/generate/total"] > 0 and tel.value("time/rollout/generate/total") is not None
    assert gpu_seconds(tel) == {} and errors(tel, "internal") == 1 and gpu_timer(tel).unresolved == 0


# -- a real GPU -------------------------------------------------------------------------------------------------


def test_real_gpu_execute_is_the_kernels_time_not_the_launch_time(tel):
    """On a GPU: a body of bf16 matmuls, queued in a few milliseconds, is timed by the phase as the CUDA events
    around the same kernels time it (the phase's edges add microseconds), while its host ``execute`` is the
    launch time."""
    torch = real_cuda()
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ a  # warm-up: cuBLAS handles, the allocator
    torch.cuda.synchronize()
    first, last = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with tel.phase("rollout", "generate") as ph:
        first.record()
        for _ in range(40):
            a @ a
        last.record()
    assert settle(tel)
    theirs = first.elapsed_time(last) / 1e3
    ours = gpu_seconds(tel)["execute"]
    assert theirs <= ours <= theirs * 1.05 + 0.001, (ours, theirs)
    assert ph.metrics["time/rollout/generate/execute"] < ours  # the host only launched them


def test_real_gpu_offload_waits_but_execute_keeps_the_work(tel):
    torch = real_cuda()
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    out = []
    a @ a
    torch.cuda.synchronize()
    # the body: ~20 ms of GPU work queued in well under a millisecond; the offload: a small copy to the host, which
    # waits there for the body's kernels
    with tel.phase("actor_train", "train_step", offload=lambda: out.append(a[:256].to("cpu"))) as ph:
        for _ in range(100):
            a @ a
    assert settle(tel)
    gpu = gpu_seconds(tel, "actor_train", "train_step")
    assert gpu["execute"] > gpu["offload"]  # the work is where it ran, not where the host waited for it
    assert ph.metrics["time/actor_train/train_step/offload"] > ph.metrics["time/actor_train/train_step/execute"]


def test_a_later_phase_edge_resolves_the_earlier_phases_on_its_thread(tel, cuda):
    """No thread of its own: the GPU times of finished phases are written at the next phase edges of their
    thread, oldest first (or at flush())."""
    cuda.hold()
    for _ in range(3):
        with tel.phase("rollout", "generate"):
            cuda.launch(10)
    assert gpu_timer(tel).pending == 3 and gpu_seconds(tel) == {}
    cuda.run_to()
    cuda.hold()
    with tel.phase("rollout", "other"):  # its start edge resolves the three
        cuda.launch(10)
    assert gpu_timer(tel).pending == 1  # itself (the GPU has not reached its end), until a later edge or flush
    assert gpu_seconds(tel)["total"] == pytest.approx(0.030)
    cuda.run_to()
    assert settle(tel) and gpu_seconds(tel, "rollout", "other")["total"] == pytest.approx(0.010)
    assert not _timer_threads()
