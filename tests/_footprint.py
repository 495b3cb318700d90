"""What a process holds - resident memory, threads, open file descriptors - for the leak test and its benchmark."""

from __future__ import annotations

import gc
import threading
from dataclasses import dataclass

import psutil


@dataclass(frozen=True)
class Footprint:
    rss: int  # bytes
    threads: int  # OS threads (Python's and native ones)
    python_threads: int
    fds: int

    @classmethod
    def now(cls) -> Footprint:
        gc.collect()
        proc = psutil.Process()
        return cls(proc.memory_info().rss, proc.num_threads(), threading.active_count(), proc.num_fds())

    def __str__(self) -> str:
        return (f"rss {self.rss / 2**20:8.1f} MiB, threads {self.threads} ({self.python_threads} Python), "
                f"fds {self.fds}")
