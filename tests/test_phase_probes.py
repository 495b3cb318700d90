"""The phase memory probes: one allocator read per GPU snapshot (none for a stage no user code ran before) with
every key and value as before, CUDA availability asked once (per torch module and process), CPU memory from
/proc/self/statm equal to psutil's memory_info(), fork and close handling."""

from __future__ import annotations

import os
import sys

import psutil
import pytest

import rl_otel
from rl_otel._internal.probes import memory
from rl_otel._internal.probes.memory import CpuProbe, GpuProbe
from tests.gpu_fakes import GIB, FakeCuda, fake_torch, legacy_snapshot

INFIX = "actor_train/train_step"
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/statm is Linux's")


@pytest.fixture
def tel():
    t = rl_otel.init(run="probes", prometheus=False)
    yield t
    t.close()


def gpu_keys(metrics):
    return [k for k in metrics if k.startswith(f"memory/{INFIX}/")]


class Oracle:
    """Today's snapshot (``legacy_snapshot``) taken beside the phase's, at the same points; its own allocator reads
    are kept out of the fake's counters, so those count the phase's alone."""

    def __init__(self, cuda: FakeCuda) -> None:
        self.cuda, self.expected = cuda, {}

    def take(self, stage: str, with_frac: bool = False) -> None:
        reads, props = self.cuda.allocator_reads, self.cuda.property_reads
        self.expected.update(legacy_snapshot(self.cuda, INFIX, stage, with_frac=with_frac))
        self.cuda.allocator_reads, self.cuda.property_reads = reads, props


@pytest.mark.parametrize("onload", [False, True], ids=["no_onload", "onload"])
@pytest.mark.parametrize("offload", [False, True], ids=["no_offload", "offload"])
def test_one_allocator_read_per_snapshot_and_the_same_keys_and_values(tel, monkeypatch, onload, offload):
    """A phase reads torch's allocator once per stage that user code preceded (2 reads without onload/offload,
    4 with both: before, 16 whole ``memory_stats()`` dicts), reads the device's total memory once per process,
    resets the peaks once per phase, and gives every key the value the four public functions give there."""
    cuda = FakeCuda()
    monkeypatch.setitem(sys.modules, "torch", fake_torch(cuda))
    cuda.alloc(10 * GIB)
    cuda.free(6 * GIB)  # a peak of 10 GiB before the phase: reset at its start, as ROLL does
    phases = 3
    for i in range(phases):
        oracle = Oracle(cuda)

        def load(oracle=oracle) -> None:
            oracle.take("start/offload")
            cuda.alloc(20 * GIB)

        def unload(oracle=oracle) -> None:
            cuda.free(20 * GIB, release=True)

        reads = cuda.allocator_reads
        with tel.phase("actor_train", "train_step", onload=load if onload else None,
                       offload=unload if offload else None) as ph:
            if not onload:
                oracle.take("start/offload")
            oracle.take("start/onload")
            cuda.alloc((i + 1) * GIB)
            cuda.alloc(8 * GIB)
            cuda.free(8 * GIB)  # a peak inside the body
            oracle.take("end/onload", with_frac=True)
        oracle.take("end/offload")
        assert cuda.allocator_reads - reads == 2 + onload + offload
        got = {k: v for k, v in ph.metrics.items() if k.startswith(f"memory/{INFIX}/")}
        assert len(got) == 18 and got == oracle.expected
    assert cuda.resets == phases
    assert cuda.property_reads == 1  # the device's total memory, once


def test_stages_without_user_code_between_share_their_read(tel, monkeypatch):
    """No onload: start/onload is start/offload's read; no offload: end/offload is end/onload's read."""
    cuda = FakeCuda()
    monkeypatch.setitem(sys.modules, "torch", fake_torch(cuda))
    cuda.alloc(3 * GIB)
    with tel.phase("actor_train", "train_step") as ph:
        cuda.alloc(2 * GIB)
    m = ph.metrics
    for kind in ("allocated", "reserved", "max_allocated", "max_reserved"):
        assert m[f"memory/{INFIX}/start/onload/{kind}/0"] == m[f"memory/{INFIX}/start/offload/{kind}/0"]
        assert m[f"memory/{INFIX}/end/offload/{kind}/0"] == m[f"memory/{INFIX}/end/onload/{kind}/0"]
    assert m[f"memory/{INFIX}/start/onload/allocated/0"] == 3.0 and m[f"memory/{INFIX}/end/onload/allocated/0"] == 5.0


def test_the_current_device_is_read_at_each_read(tel, monkeypatch):
    """An onload that moves the process to another device: the later stages read (and name) that device."""
    cuda = FakeCuda(devices=2)
    monkeypatch.setitem(sys.modules, "torch", fake_torch(cuda))
    cuda.alloc(1 * GIB, device=0)
    cuda.alloc(7 * GIB, device=1)
    with tel.phase("actor_train", "train_step", onload=lambda: cuda.set_device(1)) as ph:
        pass
    m = ph.metrics
    assert m[f"memory/{INFIX}/start/offload/allocated/0"] == 1.0
    assert m[f"memory/{INFIX}/start/onload/allocated/1"] == 7.0 and m[f"memory/{INFIX}/end/offload/allocated/1"] == 7.0


def test_cuda_availability_is_asked_once_across_phases(tel, monkeypatch):
    cuda = FakeCuda()
    monkeypatch.setitem(sys.modules, "torch", fake_torch(cuda))
    for _ in range(20):
        with tel.phase("actor_train", "train_step") as ph:
            pass
        assert len(gpu_keys(ph.metrics)) == 18
    assert cuda.availability_checks == 1  # 4 stages x 4 kinds + 2 fractions, every phase


def test_torch_imported_later_is_still_checked(tel, monkeypatch):
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    for _ in range(3):
        with tel.phase("actor_train", "train_step") as ph:
            pass
        assert gpu_keys(ph.metrics) == []
    cuda = FakeCuda()
    monkeypatch.setitem(sys.modules, "torch", fake_torch(cuda))  # the training code imports torch now
    for _ in range(3):
        with tel.phase("actor_train", "train_step") as ph:
            pass
        assert len(gpu_keys(ph.metrics)) == 18
    assert cuda.availability_checks == 1


def test_a_cached_no_gpu_answer_holds_until_torch_changes(monkeypatch):
    class NoDevice(FakeCuda):
        def is_available(self) -> bool:
            super().is_available()
            return False

    none = NoDevice()
    monkeypatch.setitem(sys.modules, "torch", fake_torch(none))
    probe, out = GpuProbe(), {}
    for _ in range(5):
        probe.snapshot(INFIX, "start/onload", out)
    assert out == {} and none.availability_checks == 1
    monkeypatch.setitem(sys.modules, "torch", fake_torch(FakeCuda()))  # another torch module: asked again
    probe.snapshot(INFIX, "start/onload", out)
    assert len(out) == 4


def test_a_forked_process_asks_again(monkeypatch):
    cuda = FakeCuda()
    monkeypatch.setitem(sys.modules, "torch", fake_torch(cuda))
    probe = GpuProbe()
    probe.read()
    probe.read()
    assert cuda.availability_checks == 1
    parent = os.getpid()
    monkeypatch.setattr(memory.os, "getpid", lambda: parent + 1)  # what a fork looks like to the probe
    probe.read()
    probe.read()
    assert cuda.availability_checks == 2


def test_a_child_forked_from_a_cuda_process_reads_no_gpu(monkeypatch):
    """torch cannot use CUDA in a child forked after the parent initialized it (a DataLoader worker, say): the
    probe reads nothing there rather than fail at every phase (``tests/test_gpu_hazards.py`` models the fork)."""
    cuda = FakeCuda()
    monkeypatch.setitem(sys.modules, "torch", fake_torch(cuda))
    used, unused = GpuProbe(), GpuProbe()
    assert used.read() is not None and unused.cuda() is not None
    parent = os.getpid()
    monkeypatch.setattr(memory.os, "getpid", lambda: parent + 1)
    cuda.initialized = False  # what torch.cuda.is_initialized() says in such a child
    reads = cuda.allocator_reads
    assert used.begin_peaks(reset=True) is None
    assert used.read() is None and used.snapshot(INFIX, "start/offload", {}) is None
    assert unused.read() is None
    assert cuda.resets == 0 and cuda.allocator_reads == reads


@linux_only
def test_cpu_memory_matches_psutil():
    probe = CpuProbe()
    try:
        ballast = bytearray(64 * 2**20)  # touched pages: rss moves by ~64 MiB
        ballast[:: 4096] = b"x" * len(ballast[:: 4096])
        rss, vms = probe.memory()
        info = psutil.Process().memory_info()
        assert rss == pytest.approx(info.rss, rel=0.02)
        assert vms == pytest.approx(info.vms, rel=0.02)
        del ballast
        assert probe.memory()[0] < rss - 32 * 2**20  # read afresh every time, not once
    finally:
        probe.close()


@linux_only
def test_close_releases_the_descriptor_and_psutil_takes_over():
    probe = CpuProbe()
    fd = probe._statm._fd
    assert os.readlink(f"/proc/self/fd/{fd}").endswith("/statm")
    probe.close()
    probe.close()  # idempotent
    assert not os.path.exists(f"/proc/self/fd/{fd}") or not os.readlink(f"/proc/self/fd/{fd}").endswith("/statm")
    rss, vms = probe.memory()
    assert rss == pytest.approx(psutil.Process().memory_info().rss, rel=0.02) and vms > rss


@linux_only
def test_telemetry_close_closes_the_cpu_probe():
    def statm_fds() -> set[str]:
        found = set()
        for fd in os.listdir("/proc/self/fd"):
            try:
                if os.readlink(f"/proc/self/fd/{fd}").endswith("/statm"):
                    found.add(fd)
            except OSError:  # the fd listdir itself used, closed by now
                pass
        return found

    before = statm_fds()
    t = rl_otel.init(run="probes", prometheus=False)
    assert statm_fds() - before  # the probe keeps /proc/self/statm open while it runs
    t.close()
    assert statm_fds() <= before
    with t.phase("actor_train", "train_step") as ph:  # a phase after close still measures (through psutil)
        pass
    assert ph.metrics[f"memory/cpu/{INFIX}/end/rss"] > 0


@linux_only
def test_forked_child_measures_itself():
    probe = CpuProbe()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: grow by 256 MiB, which the parent does not
        try:
            before, _ = probe.memory()
            ballast = bytearray(256 * 2**20)
            ballast[:: 4096] = b"x" * len(ballast[:: 4096])
            rss, _ = probe.memory()
            os.write(write_end, f"{before} {rss} {psutil.Process().memory_info().rss}".encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        child_before, child_probe, child_psutil = (float(x) for x in pipe.read().split())
    os.waitpid(pid, 0)
    try:
        # the child's probe reads the child (its own 256 MiB growth, what psutil says of it)...
        assert child_probe == pytest.approx(child_psutil, rel=0.02)
        assert child_probe - child_before > 200 * 2**20
        # ...and the parent's, the parent (a big parent's fork shares pages unevenly: compare each with itself)
        assert probe.memory()[0] == pytest.approx(psutil.Process().memory_info().rss, rel=0.02)
    finally:
        probe.close()


@linux_only
def test_psutil_is_imported_only_when_statm_cannot_be_read():
    """On Linux the probe reads /proc/self/statm: psutil (~7 ms to import) loads only for the fallback."""
    import subprocess
    from pathlib import Path

    script = ("import sys\nfrom rl_otel._internal.probes.memory import CpuProbe\np = CpuProbe()\nrss, _ = p.memory()\n"
              "before = 'psutil' in sys.modules\np.close()\nrss2, _ = p.memory()\n"
              "print(before, 'psutil' in sys.modules, rss > 0 and abs(rss2 - rss) < 0.5 * rss)")
    repo = Path(__file__).resolve().parents[1]
    path = os.pathsep.join(p for p in (str(repo), os.environ.get("PYTHONPATH", "")) if p)  # the suite's path kept
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=repo,
                         env={**os.environ, "PYTHONPATH": path}, check=True).stdout
    assert out.split() == ["False", "True", "True"]


def test_without_statm_psutil_measures(monkeypatch):
    monkeypatch.setattr(memory._Statm, "open", classmethod(lambda cls: None))
    probe = CpuProbe()
    rss, vms = probe.memory()
    assert rss == pytest.approx(psutil.Process().memory_info().rss, rel=0.02) and vms > rss
