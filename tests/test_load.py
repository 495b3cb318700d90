"""Load: 4 clients scrape /metrics at 20 Hz each over real HTTP while the loop logs 1,000 full-catalog steps.

Every scrape must parse, carry no torn step (all seed series of one scrape come from one step, and ``rl_step`` is
that step or the one before: the store writes a step under one lock, then the liveness series), never go
backwards for a client, and the final scrape must hold step 999's values. How much the scrapes slow the loop is
measured in ``benchmarks/bench_load.py``, never asserted here.
"""

from __future__ import annotations

import threading
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

import rl_otel
from tests._workload import FullStep
from tests.promtools import promtool_check

pytestmark = pytest.mark.slow  # the slow layer (tests/conftest.py)

STEPS, CLIENTS, HZ = 1000, 4, 20.0
BASE = {"run", "role", "rank"}


def parse(text: str) -> dict[tuple[str, tuple], float]:
    """``{(sample, labels without run/rank): value}`` through prometheus_client's own text parser."""
    return {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k not in BASE))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


MIN_SCRAPES = 10  # each client's scrapes, steps running or done


class Scraper(threading.Thread):
    """Scrapes ``url`` at ``hz`` until ``stop``; keeps every check failure instead of raising on its thread."""

    def __init__(self, url: str, workload: FullStep, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.url, self.workload, self.stop = url, workload, stop
        self.scrapes = 0
        self.failures: list[str] = []
        self.steps_seen: list[int] = []
        self.texts: list[str] = []

    def run(self) -> None:
        next_at = time.monotonic()
        while not self.stop.is_set():
            try:
                self.check(urllib.request.urlopen(self.url, timeout=30).read().decode())
            except Exception as exc:  # any error is a failure of the test, reported from the main thread
                self.failures.append(f"{type(exc).__name__}: {exc}")
            next_at += 1 / HZ
            self.stop.wait(max(0.0, next_at - time.monotonic()))

    def check(self, text: str) -> None:
        self.scrapes += 1
        if self.scrapes % 25 == 1:
            self.texts.append(text)
        series = parse(text)
        steps = set(self.workload.decode(series).values())
        rl_step = series.get(("rl_step", ()))
        if not steps:  # before the first log() finished: no seed series, no step yet
            return
        if len(steps) != 1:
            self.failures.append(f"a scrape mixes steps {sorted(steps)[:5]}")
            return
        (step,) = steps
        if rl_step not in (step, step - 1 if step else None):  # rl_step is written just after the values
            self.failures.append(f"rl_step {rl_step} with the values of step {step}")
        if self.steps_seen and step < self.steps_seen[-1]:
            self.failures.append(f"step went backwards: {self.steps_seen[-1]} -> {step}")
        self.steps_seen.append(step)


def test_concurrent_scrapes_during_1000_steps_lose_nothing():
    workload = FullStep()
    assert len(workload.keys) == 438 and len(workload.histograms) == 8
    tel = rl_otel.init("load", rank=0, prometheus={"host": "127.0.0.1", "port": 0}, handle_sigterm=False)
    stop = threading.Event()
    scrapers = [Scraper(tel.metrics_url, workload, stop) for _ in range(CLIENTS)]
    try:
        for s in scrapers:
            s.start()
        for step in range(STEPS):
            tel.log(workload.step(step), step=step)
        # every client scrapes the last step, and at least MIN_SCRAPES times in all: a fast loop on an idle machine
        # may end before a client's tenth scrape, so the clients go on against the last step (a bound, no timing)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(
                (s.steps_seen[-1:] == [STEPS - 1] and s.scrapes >= MIN_SCRAPES) or s.failures for s in scrapers):
            time.sleep(0.05)
        stop.set()
        for s in scrapers:
            s.join(60)
        final = parse(urllib.request.urlopen(tel.metrics_url, timeout=30).read().decode())
    finally:
        stop.set()
        tel.close()
    for s in scrapers:
        assert not s.is_alive()
        assert s.failures == [], s.failures[:5]
        assert s.scrapes >= MIN_SCRAPES and s.steps_seen[-1] == STEPS - 1, (s.scrapes, s.steps_seen[-1:])
    decoded = workload.decode(final)
    assert len(decoded) == len(workload.scalars) + len(workload.histograms)
    assert set(decoded.values()) == {STEPS - 1} and final[("rl_step", ())] == STEPS - 1
    assert final.get(("rl_telemetry_errors_total", ())) is None  # no family of errors at all
    assert not [k for k in final if k[0] == "rl_telemetry_errors_total"]
    texts = [t for s in scrapers for t in s.texts]
    for text in texts[:: max(1, len(texts) // 4)][:4]:
        assert promtool_check(text) == ""
