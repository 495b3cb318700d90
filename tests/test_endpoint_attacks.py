"""Clients that hold the scrape endpoint's connections without playing by HTTP's rules (issue 25, item 6): a
legitimate scraper, Prometheus' way (a new connection, one request, read), is still answered within seconds.

Each attack opens ``max_connections`` (64) connections and re-opens those the server closes, in a bounded loop:
``pipeline`` sends 400 GETs at once and never reads; ``never_read`` sends one GET and never reads; ``slow_read``
pipelines 400 GETs through a small receive buffer and reads a byte a second; ``handshake`` (TLS) sends one byte of
a ClientHello and nothing more. ``measure`` is also what the attack table in the closing note was measured with."""

from __future__ import annotations

import select
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

import bcrypt
import pytest
import yaml

from rl_otel._internal.exporters.admission import Limits
from rl_otel._internal.exporters.prometheus import ScrapeEndpoint, ScrapeRegistry
from rl_otel._internal.exporters.webconfig import load_web_config
from rl_otel._internal.pipeline.records import Batch
from rl_otel._internal.runtime.assembly import pipeline
from rl_otel.catalog import default_catalog, meta
from tests.certs import make_pki
from tests.test_endpoint_hardening import auth, host_port

pytestmark = pytest.mark.slow  # the slow layer (tests/conftest.py)

PASSWORD = "s3cret-scrape"
ATTACKS = ("pipeline", "never_read", "slow_read", "handshake")
GET = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"


def _open(kind: str, address: tuple[str, int]) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if kind == "slow_read":
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(5)
    s.connect(address)
    s.setblocking(False)
    try:
        s.send({"pipeline": GET * 400, "slow_read": GET * 400, "never_read": GET,
                "handshake": b"\x16"}[kind])  # as much as the kernel takes now; never more
    except OSError:
        pass
    return s


def _closed_by_server(s: socket.socket) -> bool:
    """Whether the server closed ``s`` (or reset it), without reading what it sent."""
    poll = select.poll()
    poll.register(s, select.POLLRDHUP | select.POLLHUP | select.POLLERR)
    return bool(poll.poll(0))


def attack(kind: str, address: tuple[str, int], stop: threading.Event, n: int = 64, seconds: float = 120.0) -> None:
    """Hold ``n`` connections of ``kind`` until ``stop`` (or ``seconds``), re-opening each one the server closes."""
    socks: list[socket.socket | None] = [None] * n
    end = time.monotonic() + seconds
    try:
        while not stop.is_set() and time.monotonic() < end:
            for i, s in enumerate(socks):
                if s is not None:
                    if not _closed_by_server(s):
                        if kind == "slow_read":
                            try:
                                s.recv(1)
                            except OSError:
                                pass
                        continue
                    s.close()
                    socks[i] = None
                try:
                    socks[i] = _open(kind, address)
                except OSError:
                    pass
            stop.wait(0.5)
    finally:
        for s in socks:
            if s is not None:
                s.close()


@dataclass
class Scrapes:
    seconds: list[float] = field(default_factory=list)
    failed: int = 0

    @property
    def worst_s(self) -> float:
        return max(self.seconds, default=float("nan"))


def scrape_once(url: str, headers: dict[str, str], context: ssl.SSLContext | None, timeout: float) -> float | None:
    """Seconds a scrape on a new connection took to answer 200; None if it failed or timed out."""
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout,
                                    context=context) as response:
            response.read()
            ok = response.status == 200
    except (OSError, urllib.error.HTTPError):
        ok = False
    return time.monotonic() - t0 if ok else None


def measure(kind: str, url: str, headers: dict[str, str], context: ssl.SSLContext | None, scrapes: int,
            timeout: float = 10.0, every_s: float = 1.0, ramp_s: float = 2.0) -> Scrapes:
    """``scrapes`` legitimate scrapes, one every ``every_s``, while ``kind`` attacks."""
    stop = threading.Event()
    thread = threading.Thread(target=attack, args=(kind, host_port(url), stop), daemon=True)
    thread.start()
    out = Scrapes()
    try:
        stop.wait(ramp_s)
        for _ in range(scrapes):
            t0 = time.monotonic()
            took = scrape_once(url, headers, context, timeout)
            if took is None:
                out.failed += 1
                out.seconds.append(time.monotonic() - t0)
            else:
                out.seconds.append(took)
            stop.wait(max(0.0, every_s - (time.monotonic() - t0)))
    finally:
        stop.set()
        thread.join(10)
    return out


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def endpoint(tmp_path, pki, kind: str, basic_auth: bool) -> tuple[ScrapeEndpoint, dict, ssl.SSLContext | None]:
    doc: dict = {}
    if kind == "handshake":
        doc["tls_server_config"] = {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key)}
    if basic_auth:
        doc["basic_auth_users"] = {"prometheus": bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()}
    web = None
    if doc:
        (tmp_path / "web.yml").write_text(yaml.safe_dump(doc))
        web = load_web_config(tmp_path / "web.yml")
    recorder = pipeline(default_catalog(), {"run": "attack", "role": "trainer", "rank": "0"},
                        max_series_per_metric=100)
    recorder.record(Batch([(meta.STEP, (), 1.0)]))
    registry = ScrapeRegistry(on_duplicate=lambda name: None, collect=recorder.collect, on_error=lambda reason: None)
    served = ScrapeEndpoint(registry, "127.0.0.1", 0, web=web, limits=Limits())
    context = ssl.create_default_context(cafile=str(pki.ca)) if kind == "handshake" else None
    return served, auth(PASSWORD) if basic_auth else {}, context


@pytest.mark.parametrize("basic_auth", [False, True], ids=["plain", "basic_auth"])
@pytest.mark.parametrize("kind", ATTACKS)
def test_a_legitimate_scrape_is_answered_whatever_64_connections_do(tmp_path, pki, kind, basic_auth):
    """Before: 64 connections pipelining 400 GETs and never reading could not be evicted (each had a request in
    flight) and every scrape timed out, with basic auth on too (the attacker holds no credentials). Now a
    connection that does not read its answers gets no more work and is the first closed for a newcomer."""
    served, headers, context = endpoint(tmp_path, pki, kind, basic_auth)
    try:
        result = measure(kind, served.url, headers, context, scrapes=3)
    finally:
        served.close()
    assert result.failed == 0, f"{result.failed}/3 scrapes failed under {kind}; took {result.seconds}"
    assert result.worst_s < 10.0
