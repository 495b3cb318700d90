"""rl_run_finished: a static target's last scrape tells a run that finished normally (1) from one killed (0), so
RLScrapeTargetDown stays quiet for the former (the alert's promtool cases are in the alert corpus)."""

from __future__ import annotations

import threading
import time
import urllib.request

import rl_otel


def _value(body: str, name: str) -> float | None:
    for line in body.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_close_serves_run_finished_1_to_one_more_scrape_of_a_watched_static_endpoint():
    """While the run trains the endpoint serves rl_run_finished 0; close() sets 1 and waits (bounded by the
    scrape interval it saw) for a scrape of it before the endpoint stops: a scraper polling the endpoint, as
    Prometheus does, reads 1 last (before: no such series, and the endpoint stopped at once)."""
    tel = rl_otel.init(run="finished", prometheus={"host": "127.0.0.1", "port": 0})
    seen: list[float | None] = []
    stop = threading.Event()

    def scrape() -> None:
        while not stop.is_set():
            try:
                with urllib.request.urlopen(tel.metrics_url, timeout=10) as answer:
                    seen.append(_value(answer.read().decode(), "rl_run_finished"))
            except OSError:
                return  # the endpoint stopped
            stop.wait(0.2)

    scraper = threading.Thread(target=scrape, daemon=True)
    scraper.start()
    try:
        tel.log({"actor/pg_loss": 0.5}, step=1)
        deadline = time.monotonic() + 60
        while len(seen) < 3 and scraper.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(seen) >= 3, f"three scrapes of the training run within 60 s: saw {seen}"
        assert seen[0] == 0
    finally:
        tel.close()
        stop.set()
        scraper.join(30)
    assert not scraper.is_alive()
    assert seen[-1] == 1, seen  # the last scrape Prometheus made saw the run finished
    assert set(seen) == {0, 1}


def test_an_endpoint_nothing_scrapes_closes_without_waiting_and_file_sd_targets_serve_no_finished_series(tmp_path):
    """No regular scrapes seen: close() does not wait for one (nothing watches; a person who looked twice is no
    Prometheus). A file_sd target needs no final signal
    (close() removes its file, its target leaves discovery), so it serves no rl_run_finished."""
    tel = rl_otel.init(run="unwatched", prometheus={"host": "127.0.0.1", "port": 0})
    registry = tel._components.registry
    for _ in range(2):
        with urllib.request.urlopen(tel.metrics_url, timeout=10):
            pass
    assert registry.scrape_interval() is None  # what close() decides on: two scrapes are no rhythm
    tel.close()
    listed = rl_otel.init(run="listed", prometheus={"host": "127.0.0.1", "port": 0, "file_sd": str(tmp_path)})
    try:
        with urllib.request.urlopen(listed.metrics_url, timeout=10) as answer:
            body = answer.read().decode()
        assert "rl_otel_build_info" in body and _value(body, "rl_run_finished") is None
    finally:
        listed.close()
