"""The CPU time the scrape endpoint's threads spend on their own work, for its budget (``admission.Governor``).

``time.thread_time()`` also counts the garbage collections that happen to start on the thread: CPython collects on
whichever thread allocates past a threshold. A collection of the older generations walks every object that lived
through a collection before: in a training process (torch, transformers, a model and an optimizer loaded) that is
hundreds of thousands to millions of objects: 0.11 to 0.12 s for 210,000 of them (torch, transformers and trl
imported) on the 2-core machine this project is tested on, more under load. Charged to the endpoint, one such
collection puts a 4%-of-a-core budget 0.1 to 0.4 s in debt, and the endpoint pauses for 2.5 to 10 s: the likely
cause of a CI scrape of ``/debug/stacks`` that timed out after 10 s in a test process with those libraries loaded.
Those objects are the process's, not the endpoint's: a request's garbage dies young and is collected in
generation 0, which stays charged (a client cannot make the endpoint collect for free).

A thread between :func:`begin` and :func:`end` has the time of its collections of generation 1 and older left out
of :func:`own_cpu_s`. The bookkeeping is a callback in ``gc.callbacks`` (public API since Python 3.3), installed
only while some thread is between the two: CPython calls every callback twice per collection, on every thread
(~1.7 us a collection measured here), and a training loop collects generation 0 every 700 allocations, so an
endpoint waiting for its next scrape leaves no callback behind.
"""

from __future__ import annotations

import gc
import os
import threading
import time

_local = threading.local()
_lock = threading.Lock()
_counting = 0  # threads between begin() and end()


def _on_collection(phase: str, info: dict) -> None:
    state = _local.__dict__
    if not state.get("counted"):
        return
    try:
        if phase == "start":
            state["started"] = time.thread_time() if info.get("generation", 0) >= 1 else None
        elif state.get("started") is not None:
            state["gc_s"] += time.thread_time() - state["started"]
            state["started"] = None
    except Exception:  # a callback must never raise into the collector (CPython prints it and goes on)
        pass


def begin() -> None:
    """Until :func:`end`, this thread's collections of generation 1 and older are not its own time."""
    global _counting
    state = _local.__dict__
    if state.get("counted"):
        return
    state.update(counted=True, started=None)
    state.setdefault("gc_s", 0.0)
    with _lock:
        _counting += 1
        if _counting == 1:
            gc.callbacks.append(_on_collection)


def end() -> None:
    """This thread's collections are its own time again (the callback leaves when no thread is counting)."""
    global _counting
    state = _local.__dict__
    if not state.get("counted"):
        return
    state["counted"] = False
    with _lock:
        _counting -= 1
        if _counting == 0 and _on_collection in gc.callbacks:
            gc.callbacks.remove(_on_collection)


def own_cpu_s() -> float:
    """This thread's CPU seconds less the older-generation collections it ran between :func:`begin` and
    :func:`end` (a monotonic clock: compare two readings)."""
    return time.thread_time() - _local.__dict__.get("gc_s", 0.0)


def _forked_child() -> None:  # the threads that were counting do not run in a child
    global _counting, _lock
    _lock = threading.Lock()
    _counting = 0
    if _on_collection in gc.callbacks:
        gc.callbacks.remove(_on_collection)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked_child)
