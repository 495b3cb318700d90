"""fork() while other threads log and scrape (a DataLoader worker, a multiprocessing pool with the fork start
method): the child logs on the inherited Telemetry and never hangs on a lock another thread held at the fork."""

from __future__ import annotations

import faulthandler
import os
import signal
import threading
import time

import pytest

import rl_otel
from tests._sinks import Recorder
from tests.promtools import scrape

pytestmark = pytest.mark.slow  # the slow layer (tests/conftest.py)

FORKS = 200
IN_FLIGHT = 8  # children alive at once
DEADLINE_S = 60.0  # a child needs milliseconds to log a step and exit; a deadlock lasts forever: a generous
# bound keeps a child a loaded machine starved (2 CPU hogs, 8 children in flight) from counting as hung


def _child(tel) -> None:
    """In the forked child: run a phase and read its span context (the phase tracer's and the memory probe's
    locks), log a step (a known key, a new key, a bad value: the store, step, router and diagnostics locks, and
    the trackers' bridge), read it back, exit at once."""
    code = 4
    try:
        with tel.phase("actor_train", "train_step") as phase:
            phase.carrier()
        tel.log({"actor/pg_loss": 1.0, f"child/k{os.getpid()}": 2.0, "actor/entropy": "not a number"})
        code = 0 if tel.value("actor/pg_loss") == 1.0 else 3
    finally:
        os._exit(code)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX-only")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # Python 3.12+ warns about fork() with threads running
def test_forked_children_logging_under_a_scraper_and_a_logging_thread_never_hang(tmp_path):
    """200 forks while a thread scrapes the endpoint and another logs (every step a new key and a bad value):
    every child logs its step and exits (before: the store's, router's and step counter's locks, held by a
    parent's thread at the fork, stayed held in the child forever - 2 of 40 children hung with only rl_otel's
    threads running, 8 of 30 with a user thread logging too)."""
    Recorder.instances.clear()
    # every step of the logging thread a new key (the router's lock), all under max_unknown_keys: warned about
    # once at most, as a training loop's keys are (a warning written while another thread writes to the same log
    # file can hang a child in CPython's own buffered-file lock, which no library can reset)
    tel = rl_otel.init(run="fork", prometheus={"host": "127.0.0.1", "port": 0}, trackers=["recorder"],
                       max_unknown_keys=100_000, handle_sigterm=False)
    stop = threading.Event()
    counts = {"scrapes": 0, "steps": 0}

    def scraper() -> None:
        while not stop.is_set():
            scrape(tel.metrics_url)
            counts["scrapes"] += 1

    def logger() -> None:
        while not stop.is_set():
            with tel.phase("actor_infer", "generate") as phase:
                phase.carrier()  # makes the span context: the lock every phase's context is drawn under
            tel.log({"actor/pg_loss": 0.5, f"user/k{counts['steps']}": 1.0, "actor/entropy": "bad"})
            counts["steps"] += 1

    threads = [threading.Thread(target=scraper, daemon=True), threading.Thread(target=logger, daemon=True)]
    for thread in threads:
        thread.start()
    live: dict[int, float] = {}  # pid -> when it was forked
    exits: list[int] = []
    hung = 0
    # a hung child says where it waits: SIGUSR2 (its handler inherited through fork) dumps its stack to this file
    stacks = open(tmp_path / "hung-children.txt", "w+")  # noqa: SIM115 (open while children may write to it)
    faulthandler.register(signal.SIGUSR2, file=stacks, all_threads=True)

    def reap() -> None:
        nonlocal hung
        for pid, forked in list(live.items()):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                exits.append(os.waitstatus_to_exitcode(status))
            elif time.monotonic() - forked > DEADLINE_S:
                stacks.write(f"child {pid}, hung {time.monotonic() - forked:.0f} s after its fork:\n")
                stacks.flush()
                os.kill(pid, signal.SIGUSR2)
                time.sleep(1)  # its dump written (a C handler: it needs no lock the child may wait on)
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                hung += 1
            else:
                continue
            del live[pid]

    try:
        while counts["scrapes"] < 3 or counts["steps"] < 3:  # both threads are under way
            time.sleep(0.01)
        for _ in range(FORKS):
            while len(live) >= IN_FLIGHT:
                reap()
                time.sleep(0.002)
            pid = os.fork()
            if pid == 0:
                _child(tel)
            live[pid] = time.monotonic()
        while live:
            reap()
            time.sleep(0.01)
    finally:
        stop.set()
        for pid in live:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        for thread in threads:
            thread.join(30)
        tel.close()
        faulthandler.unregister(signal.SIGUSR2)
        stacks.seek(0)
        dumped = stacks.read()
        stacks.close()
    assert hung == 0, f"{hung} of {FORKS} forked children hung; where they waited:\n{dumped}"
    assert exits == [0] * FORKS
    assert counts["steps"] > 0 and counts["scrapes"] > 0
