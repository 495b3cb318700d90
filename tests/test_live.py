"""Live gauges read at scrape time: process memory, torch's allocator, NVML (fakes at the boundaries; on a GPU
machine the real torch and NVML too)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

import rl_otel
from rl_otel._internal.probes.live import NvmlPoller, torch_process_memory, visible_devices
from rl_otel.catalog import live as specs
from tests.gpu_fakes import GIB, FakeCuda, FakeNvml, fake_torch, real_cuda, wait_for_nvml
from tests.promtools import promtool_check, samples, scrape


def served(monkeypatch, nvml=None, cuda=None):
    if nvml is not None:
        monkeypatch.setitem(sys.modules, "pynvml", nvml)
    if cuda is not None:
        monkeypatch.setitem(sys.modules, "torch", fake_torch(cuda))
    tel = rl_otel.init(run="live", prometheus={"host": "127.0.0.1", "port": 0})
    if nvml is not None and not nvml.fail_init and nvml.uuids:
        assert wait_for_nvml(tel.metrics_url)
    return tel


def test_gpu_gauges_with_gpu_uuid(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    cuda = FakeCuda(devices=2)
    cuda.alloc(3 * GIB, device=1)
    tel = served(monkeypatch, FakeNvml(), cuda)
    try:
        text = scrape(tel.metrics_url)
    finally:
        tel.close()
    assert promtool_check(text) == ""
    base = {("run", "live"), ("role", "trainer"), ("rank", "0")}
    used = samples(text, "rl_gpu_device_memory_used_bytes")
    assert used == {frozenset(base | {("device_id", "0"), ("gpu_uuid", "GPU-aaaa")}): 1 * GIB,
                    frozenset(base | {("device_id", "1"), ("gpu_uuid", "GPU-bbbb")}): 2 * GIB}
    assert set(samples(text, "rl_gpu_device_memory_total_bytes").values()) == {80 * GIB}
    assert set(samples(text, "rl_gpu_device_memory_reserved_bytes").values()) == {300 * 2**20}
    allocated = samples(text, "rl_gpu_process_memory_allocated_bytes")
    assert allocated[frozenset(base | {("device_id", "1")})] == 3 * GIB
    assert len(samples(text, "rl_gpu_process_memory_reserved_bytes")) == 2
    assert samples(text, "rl_process_resident_memory_bytes")[frozenset(base)] > 1e6


def test_real_gpu_gauges_are_torchs_and_nvmls(monkeypatch):
    """On a GPU: the process gauges equal torch's own functions, and NVML's series carry the device's UUID."""
    import importlib.util

    torch = real_cuda()
    held = torch.ones(16 << 20, dtype=torch.uint8, device="cuda")
    device = torch.cuda.current_device()
    nvml = importlib.util.find_spec("pynvml") is not None
    tel = rl_otel.init(run="live", prometheus={"host": "127.0.0.1", "port": 0}, handle_sigterm=False)
    try:
        if nvml:
            assert wait_for_nvml(tel.metrics_url)
        text = scrape(tel.metrics_url)
    finally:
        tel.close()
    assert promtool_check(text) == ""
    labels = frozenset({("run", "live"), ("role", "trainer"), ("rank", "0"), ("device_id", str(device))})
    assert samples(text, "rl_gpu_process_memory_allocated_bytes")[labels] == torch.cuda.memory_allocated(device)
    assert samples(text, "rl_gpu_process_memory_reserved_bytes")[labels] == torch.cuda.memory_reserved(device)
    if nvml:
        used = {dict(k)["device_id"]: dict(k)["gpu_uuid"] for k in samples(text, "rl_gpu_device_memory_used_bytes")}
        assert used[str(device)].startswith(("GPU-", "MIG-"))  # NVML's UUID, the one DCGM's series carry
    del held


def test_no_gpu_means_no_gpu_series(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    tel = served(monkeypatch, FakeNvml(fail_init=True))
    try:
        text = scrape(tel.metrics_url)
    finally:
        tel.close()
    assert not [line for line in text.splitlines() if "rl_gpu_" in line]
    assert samples(text, "rl_process_resident_memory_bytes")
    assert samples(text, "rl_process_virtual_memory_bytes")
    assert promtool_check(text) == ""


def test_cuda_visible_devices_maps_ordinals(monkeypatch):
    nvml = FakeNvml(uuids=("GPU-a", "GPU-b", "GPU-c"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    assert visible_devices(nvml) == [(0, "GPU-c"), (1, "GPU-a")]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-b")
    assert visible_devices(nvml) == [(0, "GPU-b")]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert visible_devices(nvml) == []


def test_torch_view_never_initializes_cuda(monkeypatch):
    cuda = FakeCuda()
    cuda.initialized = False
    monkeypatch.setitem(sys.modules, "torch", fake_torch(cuda))
    assert torch_process_memory() == []
    cuda.initialized = True
    assert [spec for spec, _, _ in torch_process_memory()] == [specs.GPU_PROCESS_ALLOCATED, specs.GPU_PROCESS_RESERVED]


def test_stalled_nvml_never_blocks_collect():
    nvml = FakeNvml(uuids=("GPU-a",))
    errors = []
    poller = NvmlPoller(nvml, interval_s=0.01, stale_after_s=0.2, on_error=errors.append)
    try:
        assert poller.wait_ready(5)
        assert poller.collect()
        nvml.gate.clear()  # NVML hangs from now on
        done = threading.Event()
        results = []

        def scrape_loop():
            deadline = time.monotonic() + 0.5
            while time.monotonic() < deadline:
                results.append(poller.collect())
            done.set()

        threading.Thread(target=scrape_loop, daemon=True).start()
        assert done.wait(10), "collect() blocked on a stalled NVML"
        assert results[-1] == []  # a stale cache is served as absent series, never as an old number
        assert "nvml_stale" in errors
    finally:
        poller.close(timeout_s=0.1)
        nvml.gate.set()


def test_import_is_light_and_init_never_imports_torch():
    code = ("import sys, rl_otel; assert 'torch' not in sys.modules and 'pynvml' not in sys.modules; "
            "t = rl_otel.init(run='x', prometheus={'host': '127.0.0.1', 'port': 0}); "
            "t.phase('a', 'b').__enter__().__exit__(None, None, None); t.close(); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.parametrize("spec", specs.SPECS, ids=lambda s: s.name)
def test_live_entries_are_in_the_default_catalog(spec):
    assert rl_otel.default_catalog().by_name(spec.name) is spec


def _started(text: str) -> dict[tuple[str, str], float]:
    out = {}
    for line in text.splitlines():
        if line.startswith("rl_phase_started_timestamp_seconds{"):
            labels = dict(kv.split("=", 1) for kv in line[line.index("{") + 1:line.index("}")].split(","))
            out[(labels["cluster"].strip('"'), labels["phase"].strip('"'))] = float(line.rsplit(" ", 1)[1])
    return out


def test_running_phases_are_served_while_they_run():
    """rl_phase_started_timestamp_seconds{cluster, phase}: present while a phase runs (the earliest start of two
    concurrent ones), gone when it ends - also when its body or its onload raises."""
    import urllib.request

    tel = rl_otel.init(run="live-phases", prometheus={"host": "127.0.0.1", "port": 0}, handle_sigterm=False)

    def now() -> dict[tuple[str, str], float]:
        return _started(urllib.request.urlopen(tel.metrics_url, timeout=10).read().decode())

    try:
        assert now() == {}
        before = time.time()
        with tel.phase("actor_infer", "generate"):
            inside = now()
            assert list(inside) == [("actor_infer", "generate")]
            assert before <= inside[("actor_infer", "generate")] <= time.time()
            entered, left = threading.Event(), threading.Event()

            def second() -> None:
                with tel.phase("actor_infer", "generate"):
                    entered.set()
                    left.wait(10)

            worker = threading.Thread(target=second)
            worker.start()
            assert entered.wait(10)
            assert now() == inside  # the earliest start of the two running
            left.set()
            worker.join(10)
            with tel.phase("actor_train", "train_step"):
                assert set(now()) == {("actor_infer", "generate"), ("actor_train", "train_step")}
        assert now() == {}
        with pytest.raises(RuntimeError), tel.phase("actor_train", "train_step"):
            assert set(now()) == {("actor_train", "train_step")}
            raise RuntimeError("boom")
        assert now() == {}

        def bad_onload() -> None:
            raise ValueError("onload")

        with pytest.raises(ValueError), tel.phase("actor_train", "train_step", onload=bad_onload):
            pass
        assert now() == {}
    finally:
        tel.close()
