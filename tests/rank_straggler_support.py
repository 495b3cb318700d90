"""Four gloo ranks with one slowed, for the straggler tests (written by the goodput-runtime engineer).

STUB: the interface the ops tests are written against (``tests/test_ops_straggler_e2e.py``); the runtime's helper
replaces this file. It must start ``ranks`` processes of one run and role (``torch.distributed`` on gloo, an
all-reduce between steps inside each rank's ``tel.phase()``/``tel.collective()`` blocks, rank ``slow_rank``'s
compute slowed), each serving its metrics on its own endpoint, and keep them stepping until ``stop()``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path


def start_ranks(tmp_path: Path, slow_rank: int = 2, ranks: int = 4) -> tuple[list[str], Callable[[], None]]:
    """Start the ranks; return their metrics URLs (``urls[i]`` is rank ``i``'s ``http://host:port/metrics``) and a
    ``stop()`` that ends them (idempotent)."""
    raise NotImplementedError("tests/rank_straggler_support.py is the ops stub of the runtime's 4-rank helper")
