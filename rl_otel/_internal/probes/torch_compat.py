"""The one place that knows how torch's CUDA caching allocator lays out its statistics (a phase reads them).

``torch.cuda.memory_allocated()``, ``memory_reserved()``, ``max_memory_allocated()`` and ``max_memory_reserved()``
each call ``torch.cuda.memory_stats()``, which takes the allocator's statistics as a nested dict
(``torch.cuda.memory_stats_as_nested_dict()``: the C call ``torch._C._cuda_memoryStats``) and flattens it in
Python into ~120 sorted ``"a.b.c"`` keys - ~70 us on an H100, and a reference cycle (its recursive closure) that
leaves the whole flattened list for the cyclic GC. The four values a snapshot needs are all in the nested dict:
:func:`read_allocator` reads it once, through the public ``memory_stats_as_nested_dict`` (no private API), at the
positions ``memory_stats()`` flattens them from (``allocated_bytes.all.current`` is
``nested["allocated_bytes"]["all"]["current"]``). Should a torch no longer offer it, or lay it out otherwise, the
read falls back to the public ``memory_stats()`` (the old cost, the same values), and says so once.

``tests/test_torch_compat.py`` fails loudly if torch's public functions stop reading these positions, and if the
public ``torch.cuda.is_initialized()`` - the gate of every CUDA call rl_otel makes (``probes/memory.py``) - stops
being False in a child forked from a CUDA process (torch's "bad fork") or starts initializing CUDA: no private
torch name is needed for either.
"""

from __future__ import annotations

import logging
from typing import Any, NamedTuple

_log = logging.getLogger("rl_otel")


class AllocatorStats(NamedTuple):
    """Bytes of torch's caching allocator on one device, as the four public functions return them."""

    allocated: int  # torch.cuda.memory_allocated()
    reserved: int  # torch.cuda.memory_reserved()
    max_allocated: int  # torch.cuda.max_memory_allocated()
    max_reserved: int  # torch.cuda.max_memory_reserved()


NO_STATS = AllocatorStats(0, 0, 0, 0)  # what the four functions return before CUDA is initialized


class AllocatorReader:
    """Reads :class:`AllocatorStats` of one ``torch.cuda`` module with one allocator read per call."""

    __slots__ = ("_cuda", "_nested")

    def __init__(self, cuda: Any) -> None:
        self._cuda = cuda
        self._nested: Any = getattr(cuda, "memory_stats_as_nested_dict", None)
        if self._nested is None:
            _fallback("torch.cuda.memory_stats_as_nested_dict is missing")

    def read(self, device: int) -> AllocatorStats:
        """The four values for ``device`` (a CUDA ordinal)."""
        nested = self._nested
        if nested is not None:
            stats = nested(device)
            try:
                allocated, reserved = stats["allocated_bytes"]["all"], stats["reserved_bytes"]["all"]
                return AllocatorStats(allocated["current"], reserved["current"], allocated["peak"], reserved["peak"])
            except (KeyError, TypeError):
                if not stats:  # CUDA not initialized yet: torch's own functions return 0 then
                    return NO_STATS
                self._nested = None  # another layout: the public flat dict from now on
                _fallback(f"torch.cuda.memory_stats_as_nested_dict() has another layout (keys {sorted(stats)[:8]})")
        flat = self._cuda.memory_stats(device)
        return AllocatorStats(flat.get("allocated_bytes.all.current", 0), flat.get("reserved_bytes.all.current", 0),
                              flat.get("allocated_bytes.all.peak", 0), flat.get("reserved_bytes.all.peak", 0))


def _fallback(why: str) -> None:
    _log.info("rl_otel: %s; phase memory snapshots read torch.cuda.memory_stats() instead (slower, same values)",
              why)
