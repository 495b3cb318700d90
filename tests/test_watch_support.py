"""Helpers of the ``rl-otel watch`` tests (no tests of its own): waiting on a condition, reading what an endpoint
serves, a watcher on a thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from tests.promtools import samples, scrape

T = TypeVar("T")


def wait_for(condition: Callable[[], T], timeout: float = 20.0, what: str = "condition") -> T:
    """Poll ``condition`` every 20 ms until it returns something truthy (returned); fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = condition()
        except OSError:  # an endpoint not up yet
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def served(url: str, name: str, **labels: str) -> float | None:
    """The value ``url`` serves for the sample ``name`` whose labels include ``labels``, else None."""
    for key, value in samples(scrape(url), name).items():
        if set(labels.items()) <= set(key):
            return value
    return None


class ThreadedWatcher:
    """A :class:`Watcher` polling on a thread until ``close()``."""

    def __init__(self, roots: list[str], state_path: Path | None = None, expire_s: float | None = None,
                 **serve: object) -> None:
        from rl_otel.watch.served import ServeOptions
        from rl_otel.watch.watcher import Watcher, WatchOptions

        self.watcher = Watcher(roots, WatchOptions(serve=ServeOptions(host="127.0.0.1", port=0, **serve),
                                                   state_path=state_path, expire_s=expire_s))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self.watcher.run, args=(self._stop,), daemon=True)
        self._thread.start()

    def url(self, run: str, rank: int = 0, timeout: float = 20.0) -> str:
        return wait_for(lambda: self.watcher.targets().get((run, rank)), timeout, f"run {run!r} rank {rank}")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self.watcher.close()
