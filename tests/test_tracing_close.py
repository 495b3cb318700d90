"""``close()`` sends the spans still queued within ``close_timeout_s``, and no longer: a collector slower than the
old fixed 2 s still gets them, one that never answers cannot hold the close for the exporter's own timeout."""

from __future__ import annotations

import socket
import threading
import time

import pytest

import rl_otel
from tests.otlp_receiver import OtlpReceiver
from tests.step_traces import received

pytestmark = pytest.mark.slow
PHASE_SPANS = ["actor_infer/generate", "onload", "execute", "offload"]


class SilentCollector:
    """A TCP server that accepts every connection and never answers (a hung collector)."""

    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._server.getsockname()[1]}"
        self._held: list[socket.socket] = []
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        self._server.settimeout(0.2)
        while not self._closed.is_set():
            try:
                conn, _ = self._server.accept()
            except OSError:
                continue
            self._held.append(conn)

    @property
    def connections(self) -> int:
        return len(self._held)

    def close(self) -> None:
        self._closed.set()
        self._thread.join(5)
        for conn in self._held:
            conn.close()
        self._server.close()


def _one_phase(url: str, close_timeout_s: float) -> rl_otel.Telemetry:
    tel = rl_otel.init(run="close", role="rollout", prometheus=False, handle_sigterm=False,
                       close_timeout_s=close_timeout_s, tracing={"exporter": "otlp", "endpoint": f"{url}/v1/traces"})
    with tel.phase("actor_infer", "generate", step=0):
        pass
    return tel


def test_close_waits_up_to_close_timeout_s_for_a_slow_collector():
    """A collector that answers after 3 s, close_timeout_s=8: close() returns once the spans are in (before, the
    spans' shutdown was cut at a fixed 2 s, whatever close_timeout_s said, and a process ending then lost them)."""
    receiver = OtlpReceiver(delay_s=3.0)
    try:
        tel = _one_phase(receiver.url, close_timeout_s=8.0)
        tel.close()
        assert sorted(s.name for s in received(receiver)) == sorted(PHASE_SPANS)
    finally:
        receiver.close()


def test_close_returns_within_close_timeout_s_when_the_collector_never_answers(monkeypatch):
    """A collector that accepts and never answers, the exporter's own timeout 60 s, close_timeout_s=1: close()
    gives the spans about close_timeout_s and returns (bound: close_timeout_s + 4 s, far below the exporter's
    60 s)."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "60")
    collector = SilentCollector()
    try:
        tel = _one_phase(collector.url, close_timeout_s=1.0)
        deadline = time.monotonic() + 30  # the phase's end sends its spans: the export is in flight, hung
        while collector.connections == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert collector.connections >= 1, "the phase's spans were never sent"
        started = time.monotonic()
        tel.close()
        took = time.monotonic() - started
        print(f"close() with a collector that never answers, close_timeout_s=1: {took:.2f} s")
        assert took < 1.0 + 4.0, took
    finally:
        collector.close()
