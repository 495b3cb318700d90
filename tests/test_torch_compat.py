"""The allocator adapter (``probes/torch_compat.py``) against the installed torch: it reads, with one call, the very
positions torch's public ``memory_allocated``/``memory_reserved``/``max_memory_*`` read. These tests fail loudly
when torch changes that: the nested dict they flatten, the function that gives it, or its layout.

On a CPU build the allocator's C call is replaced by a controlled nested dict (torch's own Python code runs on
it: its flattening, its ``.get`` of each key); on a GPU machine a real-allocator variant runs too."""

from __future__ import annotations

import gc
import inspect
import logging

import pytest

from rl_otel._internal.probes.torch_compat import NO_STATS, AllocatorReader, AllocatorStats
from tests.gpu_fakes import FakeCuda, real_cuda

torch = pytest.importorskip("torch")


def nested_stats(allocated: int, reserved: int, peak_allocated: int, peak_reserved: int) -> dict:
    """The layout of ``torch._C._cuda_memoryStats`` (CUDA's caching allocator): distinct numbers everywhere, so a
    read of a neighbouring position (another pool, another stat) shows."""
    pools = ("all", "large_pool", "small_pool")
    arrays = ("allocation", "segment", "active", "inactive_split", "allocated_bytes", "reserved_bytes",
              "active_bytes", "inactive_split_bytes", "requested_bytes")
    out: dict = {}
    for i, name in enumerate(arrays):
        out[name] = {pool: {"current": 1000 * i + 10 * j + 1, "peak": 1000 * i + 10 * j + 2,
                            "allocated": 1000 * i + 10 * j + 3, "freed": 1000 * i + 10 * j + 4}
                     for j, pool in enumerate(pools)}
    out["allocated_bytes"]["all"].update(current=allocated, peak=peak_allocated)
    out["reserved_bytes"]["all"].update(current=reserved, peak=peak_reserved)
    out.update(num_alloc_retries=7, num_ooms=8, max_split_size=-1,
               oversize_allocations={"current": 5, "peak": 6, "allocated": 7, "freed": 8})
    return out


@pytest.fixture
def controlled_allocator(monkeypatch):
    """torch.cuda's Python code over a controlled allocator: ``set(...)`` chooses what the C call returns."""
    state = {"stats": nested_stats(1, 2, 3, 4), "calls": 0}

    def memory_stats(device):
        state["calls"] += 1
        return state["stats"]

    monkeypatch.setattr(torch._C, "_cuda_memoryStats", memory_stats, raising=False)  # absent in a CPU build
    monkeypatch.setattr(torch.cuda.memory, "is_initialized", lambda: True)
    return state


def public(device: int = 0) -> AllocatorStats:
    return AllocatorStats(torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device),
                          torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device))


def test_torch_still_offers_the_nested_dict_publicly():
    assert "memory_stats_as_nested_dict" in torch.cuda.__all__
    # memory_stats() is built from it (if torch flattened another source, the nested read would be stale)
    assert "memory_stats_as_nested_dict(" in inspect.getsource(torch.cuda.memory.memory_stats)


@pytest.mark.parametrize("values", [(1 << 30, 3 << 30, 5 << 30, 7 << 30), (0, 0, 0, 0), (12345, 23456, 34567, 45678)])
def test_one_read_gives_what_the_four_public_functions_give(controlled_allocator, values):
    controlled_allocator["stats"] = nested_stats(*values)
    reader = AllocatorReader(torch.cuda)
    calls = controlled_allocator["calls"]
    got = reader.read(0)
    assert controlled_allocator["calls"] - calls == 1  # one allocator read for the four values
    calls = controlled_allocator["calls"]
    assert got == public(0) == values
    assert controlled_allocator["calls"] - calls == 4  # torch's way: one whole read per value


def test_before_cuda_is_initialized_it_reads_zeros_as_torch_does(controlled_allocator, monkeypatch):
    monkeypatch.setattr(torch.cuda.memory, "is_initialized", lambda: False)
    calls = controlled_allocator["calls"]
    assert AllocatorReader(torch.cuda).read(0) == public(0) == NO_STATS
    assert controlled_allocator["calls"] == calls  # neither asked the allocator


def test_the_read_makes_no_cyclic_garbage(controlled_allocator):
    """torch's ``memory_stats()`` flattens with a recursive closure: a reference cycle per call that keeps its ~120
    flattened pairs alive until the cyclic GC runs (what ``test_phases_nobody_reads_do_not_pile_up`` measured on
    the H100: +3.5 MB over 3,000 phases). The adapter's read leaves nothing for the GC."""
    reader = AllocatorReader(torch.cuda)
    gc.collect()
    gc.disable()
    try:
        for _ in range(100):
            reader.read(0)
        ours = gc.collect()
        for _ in range(100):
            torch.cuda.memory_allocated(0)
        theirs = gc.collect()
    finally:
        gc.enable()
    assert ours == 0
    assert theirs >= 100  # the cause, shown: if torch stops making cycles, this line says so


def test_another_layout_falls_back_to_the_public_flat_dict(controlled_allocator, caplog):
    caplog.set_level(logging.INFO, logger="rl_otel")
    controlled_allocator["stats"] = {"allocated_bytes.all.current": 11, "reserved_bytes.all.current": 22,
                                     "allocated_bytes.all.peak": 33, "reserved_bytes.all.peak": 44}  # flat, say
    reader = AllocatorReader(torch.cuda)
    assert reader.read(0) == AllocatorStats(11, 22, 33, 44)
    assert reader.read(0) == AllocatorStats(11, 22, 33, 44)
    assert len([r for r in caplog.records if "another layout" in r.getMessage()]) == 1


def test_a_torch_without_the_nested_dict_reads_memory_stats():
    class OldCuda(FakeCuda):
        memory_stats_as_nested_dict = None  # as if torch had dropped it

    cuda = OldCuda()
    cuda.alloc(5 << 20)
    assert AllocatorReader(cuda).read(0) == AllocatorStats(5 << 20, 5 << 20, 5 << 20, 5 << 20)
    assert cuda.allocator_reads == 1


def test_real_allocator_read_matches_the_public_functions():
    torch = real_cuda()
    device = torch.cuda.current_device()
    kept = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")  # 64 MiB held
    gone = torch.empty(32 << 20, dtype=torch.uint8, device="cuda")  # a peak above what is held
    del gone
    got = AllocatorReader(torch.cuda).read(device)
    assert got == public(device)
    assert got.allocated >= 64 << 20 and got.max_allocated >= got.allocated + (32 << 20) - (2 << 20)
    del kept


# -- the public calls the GPU probes' "do no harm" rests on (docs/gpu.md) --------------------------------------


def test_is_initialized_is_false_in_a_bad_fork_and_initializes_nothing(monkeypatch):
    """rl_otel gates every CUDA call on the public ``torch.cuda.is_initialized()``, relying on it being False in
    a child forked from a CUDA process (torch's private ``_is_in_bad_fork``, where every CUDA call raises) and on it
    initializing nothing. Should torch rename or drop what this test patches, or change the rule, it fails here."""
    calls = []
    monkeypatch.setattr(torch.cuda, "_lazy_init", lambda: calls.append("_lazy_init"))
    monkeypatch.setattr(torch.cuda, "_initialized", True)
    monkeypatch.setattr(torch.cuda, "_is_in_bad_fork", lambda: False)
    assert torch.cuda.is_initialized() is True
    monkeypatch.setattr(torch.cuda, "_is_in_bad_fork", lambda: True)
    assert torch.cuda.is_initialized() is False
    assert calls == []


def test_current_device_initializes_cuda(monkeypatch):
    """Why rl_otel never asks ``current_device()`` before ``is_initialized()``: it runs ``_lazy_init()`` (a CUDA
    context on a GPU of a process that had none); ``is_current_stream_capturing()`` is the public capture check."""
    calls = []

    def lazy_init() -> None:
        calls.append("_lazy_init")
        raise RuntimeError("stop here")

    monkeypatch.setattr(torch.cuda, "_lazy_init", lazy_init)
    with pytest.raises(RuntimeError, match="stop here"):
        torch.cuda.current_device()
    assert calls == ["_lazy_init"]
    assert callable(torch.cuda.is_current_stream_capturing) and callable(torch.cuda.device)
