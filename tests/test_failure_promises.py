"""The promises of ``docs/failure-behaviour.md`` that no other test checked (issue 25, "Trust under failure").

Each test names the promise it checks. Failures are provoked through public surfaces where one exists (a
submitted job, a registered sink, a real TLS client, a real scrape, a subprocess with few descriptors); where the
failure can only come from inside rl_otel (a bug, a close step raising), one internal callable is wrapped so that
it still does its work and then raises, and the promise is checked through ``tel.value`` and the scrape.
"""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import requests
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult

import rl_otel
from rl_otel.sinks import register_sink
from tests._sinks import Recorder
from tests._waits import CHILD_ENV, read_line
from tests.promtools import samples, scrape

pytestmark = pytest.mark.slow  # the slow layer (tests/conftest.py)

REPO = Path(__file__).resolve().parents[1]


def errors(tel, sink: str, reason: str) -> float:
    return tel.value("rl_telemetry_errors_total", sink=sink, reason=reason) or 0.0


def wait_until(condition, timeout: float = 30.0, what: str = "condition", every: float = 0.02):
    """Poll ``condition`` until it is true (returned) or ``timeout`` passes (the test fails)."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        pause.wait(every)


def status_of(url: str, **kwargs) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, **kwargs), timeout=10) as response:
            response.read()
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


class Capturing(MetricExporter):
    """A user's own OTLP metric exporter: keeps what it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.exports: list = []

    def export(self, metrics_data, timeout_millis: float = 10_000, **kwargs) -> MetricExportResult:
        self.exports.append(metrics_data)
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs) -> None:
        pass


@pytest.fixture
def tel():
    t = rl_otel.init(run="promise", rank=0, prometheus={"host": "127.0.0.1", "port": 0}, handle_sigterm=False)
    yield t
    t.close()


# ---- sink="submit"


def test_submit_timeout_a_job_running_past_close_timeout_s_is_counted_once():
    """``submit``/``timeout``: a job running longer than ``close_timeout_s`` is counted once, and submit() does not
    wait on it."""
    tel = rl_otel.init(run="promise", prometheus=False, close_timeout_s=0.3, handle_sigterm=False)
    gate, running = threading.Event(), threading.Event()
    try:
        stuck = tel.submit(lambda: running.set() or (gate.wait(60) and {}), step=0)
        assert running.wait(30)

        def submitted_behind_a_hung_job() -> bool:
            t0 = time.monotonic()
            tel.submit(lambda: {"critic/score/mean": 1.0})
            assert time.monotonic() - t0 < 5  # never waits on the hung job
            return errors(tel, "submit", "timeout") >= 1

        wait_until(submitted_behind_a_hung_job, what="the hung job counted as a timeout", every=0.05)
        for _ in range(5):
            tel.submit(lambda: {"critic/score/mean": 2.0})
        assert errors(tel, "submit", "timeout") == 1  # once per stuck job, not once per submit
    finally:
        gate.set()
        tel.close()
    assert stuck.done()


def test_submit_close_timeout_close_gives_up_on_a_stuck_job_and_drops_what_is_queued():
    """``submit``/``close_timeout``: jobs still queued when close() gave up (after ``close_timeout_s``) are
    dropped and counted; close() returns."""
    tel = rl_otel.init(run="promise", prometheus=False, close_timeout_s=0.5, handle_sigterm=False)
    gate, running = threading.Event(), threading.Event()
    try:
        tel.submit(lambda: running.set() or (gate.wait(60) and {}), step=0)
        assert running.wait(30)
        queued = tel.submit(lambda: {"critic/score/mean": 1.0}, step=1)
        t0 = time.monotonic()
        tel.close()
        took = time.monotonic() - t0
        assert took < 10, took  # bounded by close_timeout_s, not by the stuck job (60 s)
        assert isinstance(queued.exception(timeout=5), RuntimeError)  # dropped, never run
        assert errors(tel, "submit", "close_timeout") == 1
    finally:
        gate.set()
        tel.close()


class _Bail(BaseException):
    """Not an ``Exception``: gets past submit()'s own handler to the metrics worker's last guard."""


def test_submit_internal_a_failure_past_the_job_handler_or_inside_submit_is_counted(tel, monkeypatch, caplog):
    """``submit``/``internal``: a failure in the submit machinery itself (the worker's last guard, or submit()'s
    own code) is counted, never raised, and the worker and log() go on."""
    tel.submit(lambda: (_ for _ in ()).throw(_Bail()), step=0)  # escapes the job handler: the worker catches it
    wait_until(lambda: errors(tel, "submit", "internal") == 1, what="the worker's guard counted")
    ok = tel.submit(lambda: {"critic/score/mean": 0.5}, step=1)
    assert ok.result(timeout=10) == {"critic/score/mean": 0.5}  # the worker thread lived on

    import rl_otel._internal.pipeline.steplog as steplog_module

    def broken(values):
        raise RuntimeError("a bug in submit()")

    monkeypatch.setattr(steplog_module, "caller_streams", broken)
    with caplog.at_level(logging.WARNING, logger="rl_otel"):
        future = tel.submit(lambda: {"critic/score/mean": 0.7}, step=2)  # never raises
    assert isinstance(future.exception(timeout=5), RuntimeError)
    assert errors(tel, "submit", "internal") == 2
    assert "submit() failed internally" in caplog.text
    tel.log({"critic/score/mean": 0.9}, step=3)
    assert tel.value("critic/score/mean") == 0.9


# ---- sink="phase"


def test_phase_a_failing_carrier_is_counted_and_the_phase_goes_on(tel, monkeypatch):
    """``phase``: a failure in a phase's own bookkeeping (here: building its carrier) is counted - under
    ``reason="internal"``, the failing part named in the warning - and the phase and its body go on."""
    import rl_otel._internal.runtime.phase as phase_module

    def broken(ctx=None):
        raise RuntimeError("propagator exploded")

    monkeypatch.setattr(phase_module, "inject", broken)
    ran = []
    with tel.phase("actor_train", "train_step") as phase:
        assert phase.carrier() == {}  # never raises
        ran.append("body")
    assert ran == ["body"]
    assert tel.value("time/actor_train/train_step/total") is not None  # the phase was recorded
    assert errors(tel, "phase", "internal") == 1


# ---- a tracker's name


class _Unreachable:
    def __init__(self, **kwargs) -> None:
        raise ConnectionError("tracker service unreachable")


register_sink("fp_unreachable", lambda **kw: _Unreachable(**kw))


def test_tracker_start_failed_a_constructor_raising_leaves_the_tracker_out(caplog):
    """tracker/``start_failed``: a tracker failing to start (not a configuration error) is left out, counted,
    and init() returns with the other trackers mirroring."""
    Recorder.instances.clear()
    with caplog.at_level(logging.WARNING, logger="rl_otel"):
        tel = rl_otel.init(run="promise", prometheus=False, trackers=["fp_unreachable", "recorder"],
                           handle_sigterm=False)
    try:
        assert tel.trackers == ("recorder",)
        assert errors(tel, "fp_unreachable", "start_failed") == 1
        assert "tracker service unreachable" in caplog.text
        tel.log({"actor/pg_loss": 1.0}, step=0)
        assert tel.flush(30)
        (rec,) = Recorder.instances
        assert rec.steps == [(0, {"actor/pg_loss": 1.0})]
    finally:
        tel.close()


# ---- sink="prometheus"


def test_prometheus_collect_a_store_failing_during_a_scrape_leaves_the_rest_served(tel, monkeypatch):
    """``prometheus``/``collect``: collecting failing during a scrape is counted and the scrape still answers
    (the live gauges served); the next scrape serves the store again."""
    from rl_otel._internal.pipeline.store import SeriesStore

    tel.log({"critic/score/mean": 0.5}, step=0)
    real = SeriesStore.freeze

    def broken(self, *args, **kwargs):
        raise RuntimeError("store exploded")

    monkeypatch.setattr(SeriesStore, "freeze", broken)
    text = scrape(tel.metrics_url)  # 200
    assert samples(text, "rl_process_resident_memory_bytes")  # the live gauges still served
    assert "rl_critic_score" not in text
    monkeypatch.setattr(SeriesStore, "freeze", real)
    assert samples(scrape(tel.metrics_url), "rl_critic_score")
    assert errors(tel, "prometheus", "collect") == 1


def test_prometheus_internal_a_bug_in_rendering_the_store_answers_500_not_a_partial_scrape(tel, monkeypatch):
    """``prometheus``/``internal``: rendering the stored series is rl_otel's own code, with no guard of its own (a
    family that cannot render is left out by the renderer): a bug there answers 500, counted, never a scrape
    that silently lacks the store; the next scrape serves it again."""
    from rl_otel._internal.exporters.prometheus import ScrapeRegistry

    tel.log({"critic/score/mean": 0.5}, step=0)
    real = ScrapeRegistry._rendered

    def broken(self, *args, **kwargs):
        raise RuntimeError("plan exploded")

    monkeypatch.setattr(ScrapeRegistry, "_rendered", broken)
    assert status_of(tel.metrics_url) == 500
    monkeypatch.setattr(ScrapeRegistry, "_rendered", real)
    assert samples(scrape(tel.metrics_url), "rl_critic_score")
    assert (errors(tel, "prometheus", "internal"), errors(tel, "prometheus", "collect")) == (1, 0)


def test_prometheus_internal_a_failing_request_answers_500_counted_with_one_traceback(tel, monkeypatch, caplog):
    """``prometheus``/``internal``: a request that fails inside the endpoint answers 500, is counted each time,
    and logs its traceback once a minute at most; the endpoint goes on serving."""
    from rl_otel._internal.exporters.prometheus import ScrapeRegistry

    real = ScrapeRegistry.render_chunks

    def broken(self, *args, **kwargs):
        raise RuntimeError("renderer exploded")

    monkeypatch.setattr(ScrapeRegistry, "render_chunks", broken)
    with caplog.at_level(logging.WARNING, logger="rl_otel"):
        assert [status_of(tel.metrics_url) for _ in range(3)] == [500] * 3
    assert errors(tel, "prometheus", "internal") == 3
    assert sum("failed to answer a request" in r.getMessage() for r in caplog.records) == 1
    monkeypatch.setattr(ScrapeRegistry, "render_chunks", real)
    assert status_of(tel.metrics_url) == 200


def test_prometheus_internal_a_bug_in_the_endpoints_loop_stops_it_and_training_goes_on(monkeypatch):
    """``prometheus``/``internal``: a bug in the endpoint's own loop is counted and the endpoint stops serving;
    log() and close() go on."""
    from rl_otel._internal.exporters.server import Server

    def broken(self):
        raise RuntimeError("event loop exploded")

    monkeypatch.setattr(Server, "_loop", broken)
    tel = rl_otel.init(run="promise", prometheus={"host": "127.0.0.1", "port": 0}, handle_sigterm=False)
    try:
        wait_until(lambda: errors(tel, "prometheus", "internal") == 1, what="the loop's failure counted")
        with pytest.raises(OSError):
            scrape(tel.metrics_url)
        tel.log({"critic/score/mean": 0.5}, step=0)
        assert tel.value("critic/score/mean") == 0.5
    finally:
        tel.close()


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    from tests.certs import make_pki

    return make_pki(tmp_path_factory.mktemp("pki"))


def _mtls(tmp_path: Path, pki, **tls) -> rl_otel.Telemetry:
    import yaml

    doc = {"tls_server_config": {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key),
                                 "client_auth_type": "RequireAndVerifyClientCert", "client_ca_file": str(pki.ca),
                                 **tls}}
    (tmp_path / "web.yml").write_text(yaml.safe_dump(doc))
    tel = rl_otel.init(run="promise", rank=0, handle_sigterm=False,
                       prometheus={"host": "127.0.0.1", "port": 0, "web_config_file": str(tmp_path / "web.yml")})
    tel.log({"critic/score/mean": 0.25}, step=1)
    return tel


def test_prometheus_tls_handshake_failed_handshakes_are_counted(tmp_path, pki):
    """``prometheus``/``tls_handshake``: no client certificate, an untrusted one, plain HTTP on the TLS port."""
    refused = (requests.exceptions.SSLError, requests.exceptions.ConnectionError)
    with _mtls(tmp_path, pki) as tel:
        url = tel.metrics_url
        with pytest.raises(refused):
            requests.get(url, verify=str(pki.ca), timeout=10)
        wait_until(lambda: errors(tel, "prometheus", "tls_handshake") >= 1, what="no certificate counted")
        with pytest.raises(refused):
            requests.get(url, verify=str(pki.ca), cert=(str(pki.stranger_cert), str(pki.stranger_key)), timeout=10)
        wait_until(lambda: errors(tel, "prometheus", "tls_handshake") >= 2, what="untrusted certificate counted")
        with pytest.raises(refused):
            requests.get(url.replace("https://", "http://"), timeout=10)
        wait_until(lambda: errors(tel, "prometheus", "tls_handshake") >= 3, what="plain HTTP counted")
        ok = requests.get(url, verify=str(pki.ca), cert=(str(pki.client_cert), str(pki.client_key)), timeout=10)
        assert ok.status_code == 200 and "rl_critic_score" in ok.text
        assert errors(tel, "prometheus", "tls_san") == 0


def test_prometheus_tls_san_a_verified_certificate_without_an_allowed_san_is_counted(tmp_path, pki):
    """``prometheus``/``tls_san``: a verified client certificate whose SANs are not allowed is refused and
    counted (not as a failed handshake)."""
    refused = (requests.exceptions.SSLError, requests.exceptions.ConnectionError)
    with _mtls(tmp_path, pki, client_allowed_sans=["someone.else"]) as tel:
        with pytest.raises(refused):
            requests.get(tel.metrics_url, verify=str(pki.ca), cert=(str(pki.client_cert), str(pki.client_key)),
                         timeout=10)
        wait_until(lambda: errors(tel, "prometheus", "tls_san") == 1, what="the SAN refusal counted")


def test_prometheus_auth_throttled_answers_429_with_retry_after(tmp_path):
    """``prometheus``/``auth_throttled``: new credentials past the bcrypt budget get ``429`` with
    ``Retry-After: 1``, counted; a wrong password checked gets 401 with ``WWW-Authenticate``."""
    import bcrypt
    import yaml

    hashed = bcrypt.hashpw(b"right", bcrypt.gensalt(rounds=4)).decode()
    (tmp_path / "web.yml").write_text(yaml.safe_dump({"basic_auth_users": {"prometheus": hashed}}))
    with rl_otel.init(run="promise", rank=0, handle_sigterm=False, prometheus={
            "host": "127.0.0.1", "port": 0, "web_config_file": str(tmp_path / "web.yml")}) as tel:
        answers = [requests.get(tel.metrics_url, auth=("prometheus", f"guess-{i}"), timeout=10) for i in range(12)]
        statuses = [a.status_code for a in answers]
        assert 429 in statuses and set(statuses) <= {401, 429}
        assert all(a.headers.get("Retry-After") == "1" for a in answers if a.status_code == 429)
        assert all(a.headers.get("WWW-Authenticate", "").startswith("Basic") for a in answers
                   if a.status_code == 401)
        assert errors(tel, "prometheus", "auth_throttled") == statuses.count(429)


@pytest.mark.parametrize(("tls", "match"), [
    ({"client_auth_type": "RequireAnyClientCert", "client_ca_file": "{ca}"}, "not supported"),
    ({"curve_preferences": ["X25519"]}, "curve_preferences"),
    ({"cert": "-----BEGIN CERTIFICATE-----"}, "inline"),
    ({"key": "-----BEGIN PRIVATE KEY-----"}, "inline"),
], ids=["require_any_client_cert", "curve_preferences", "inline_cert", "inline_key"])
def test_web_config_settings_python_cannot_honour_are_refused_at_init(tmp_path, pki, tls, match):
    """Refused as ConfigurationError at init() rather than silently weakened (``RequestClientCert`` and
    plain-text passwords: ``test_webconfig.py``)."""
    import yaml

    files = {"{ca}": str(pki.ca)}
    section = {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key),
               **{k: files.get(v, v) if isinstance(v, str) else v for k, v in tls.items()}}
    (tmp_path / "web.yml").write_text(yaml.safe_dump({"tls_server_config": section}))
    with pytest.raises(rl_otel.ConfigurationError, match=match):
        rl_otel.init(run="promise", handle_sigterm=False,
                     prometheus={"host": "127.0.0.1", "port": 0, "web_config_file": str(tmp_path / "web.yml")})


def test_web_config_http2_is_accepted_and_the_endpoint_speaks_http_1_1(tmp_path):
    import http.client

    import yaml

    (tmp_path / "web.yml").write_text(yaml.safe_dump({"http_server_config": {"http2": True}}))
    with rl_otel.init(run="promise", handle_sigterm=False, prometheus={
            "host": "127.0.0.1", "port": 0, "web_config_file": str(tmp_path / "web.yml")}) as tel:
        host, port = tel.metrics_url.split("//")[1].split("/")[0].split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        for _ in range(2):  # keep-alive: two requests on one connection
            conn.request("GET", "/metrics")
            response = conn.getresponse()
            assert response.status == 200 and response.version == 11
            response.read()
        conn.close()


def test_web_config_a_renewed_certificate_is_served_to_new_connections(tmp_path):
    """The certificate and key files are checked for changes and read again: a renewed certificate reaches new
    connections without a restart."""
    import shutil

    import yaml

    from tests.certs import make_pki

    old, new = make_pki(tmp_path / "old"), make_pki(tmp_path / "new")  # two CAs: which one verifies tells them apart
    cert, key = tmp_path / "server.crt", tmp_path / "server.key"
    shutil.copy(old.server_cert, cert)
    shutil.copy(old.server_key, key)
    (tmp_path / "web.yml").write_text(yaml.safe_dump({"tls_server_config": {"cert_file": str(cert),
                                                                            "key_file": str(key)}}))
    with rl_otel.init(run="promise", handle_sigterm=False, prometheus={
            "host": "127.0.0.1", "port": 0, "web_config_file": str(tmp_path / "web.yml")}) as tel:
        url = tel.metrics_url
        assert requests.get(url, verify=str(old.ca), timeout=10).status_code == 200
        for source, target in ((new.server_key, key), (new.server_cert, cert)):
            staged = target.with_suffix(".new")
            shutil.copy(source, staged)
            staged.replace(target)

        def served_by_the_new_certificate() -> bool:
            try:
                return requests.get(url, verify=str(new.ca), timeout=10).status_code == 200
            except requests.exceptions.SSLError:
                return False

        wait_until(served_by_the_new_certificate, what="the renewed certificate served", every=0.2)


_FEW_DESCRIPTORS = """
    import os, resource, sys, time
    import rl_otel

    tel = rl_otel.init(run="fds", prometheus={"host": "127.0.0.1", "port": 0}, handle_sigterm=False)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    used = max(int(fd) for fd in os.listdir("/proc/self/fd"))  # the highest open descriptor
    while True:  # fill the free numbers below it: the limit caps a descriptor's number, not their count
        fd = os.open(os.devnull, os.O_RDONLY)
        if fd > used:
            os.close(fd)
            break
    resource.setrlimit(resource.RLIMIT_NOFILE, (used + 1, hard))  # no new descriptor: accept() gets EMFILE
    print(tel.metrics_url, flush=True)
    sys.stdin.readline()  # the test connected
    deadline = time.monotonic() + 30
    def refused():
        return tel.value("rl_telemetry_errors_total", sink="prometheus", reason="connection_limit") or 0
    while refused() < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    print("counted", refused(), flush=True)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))  # descriptors again: the waiting client is served
    sys.stdin.readline()
    tel.close()
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/fd")
def test_prometheus_connection_limit_accept_out_of_descriptors_is_counted_and_served_later(tmp_path):
    """``prometheus``/``connection_limit``: ``accept()`` out of descriptors is counted, the endpoint lives on and
    answers the waiting client once descriptors are free again."""
    script = tmp_path / "fds.py"
    script.write_text(textwrap.dedent(_FEW_DESCRIPTORS))
    proc = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", **CHILD_ENV})
    try:
        url = read_line(proc, "its endpoint's URL").strip()
        assert url.startswith("http://127.0.0.1:"), url
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        client = socket.create_connection(("127.0.0.1", port), timeout=30)
        client.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        proc.stdin.write("connected\n")
        proc.stdin.flush()
        counted = read_line(proc, "the refused accept counted").split()
        assert counted[:1] == ["counted"] and float(counted[1]) >= 1, counted
        answer = b""
        while b"\r\n" not in answer:
            chunk = client.recv(4096)
            assert chunk, answer
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
        client.close()
        proc.stdin.write("done\n")
        proc.stdin.flush()
        assert proc.wait(60) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# ---- sink="otlp"


def test_otlp_collect_collecting_for_a_push_failing_is_counted_and_the_push_goes_on(monkeypatch):
    """``otlp``/``collect``: collecting the store for a push failing is counted; the SDK's part is still pushed."""
    import rl_otel._internal.exporters.otlp_push as otlp_push

    def broken(store):
        raise RuntimeError("store exploded")

    monkeypatch.setattr(otlp_push, "store_metrics", broken)
    exporter = Capturing()
    tel = rl_otel.init(run="promise", prometheus=False, otlp={"exporter": exporter, "interval_s": 0.1},
                       handle_sigterm=False)
    try:
        tel.log({"critic/score/mean": 0.5}, step=0)
        wait_until(lambda: errors(tel, "otlp", "collect") >= 1 and exporter.exports, what="a push without the store")
        assert errors(tel, "otlp", "export_failed") == 0
    finally:
        tel.close()


def test_otlp_a_collector_that_hangs_costs_close_at_most_timeout_s_plus_1_s():
    """The OTLP collector down or hanging: each failed push counted, the endpoint serving, and ``close()`` waits
    for the final push ``timeout_s`` + 1 s at most (2 s at least)."""
    from tests.otlp_receiver import OtlpReceiver

    receiver = OtlpReceiver(delay_s=20.0)
    try:
        tel = rl_otel.init(run="promise", prometheus={"host": "127.0.0.1", "port": 0}, handle_sigterm=False,
                           otlp={"endpoint": receiver.url, "interval_s": 0.2, "timeout_s": 1.0})
        tel.log({"critic/score/mean": 0.5}, step=0)
        wait_until(lambda: errors(tel, "otlp", "export_failed") >= 1, what="a failed push counted")
        assert samples(scrape(tel.metrics_url), "rl_critic_score")
        t0 = time.monotonic()
        tel.close()
        took = time.monotonic() - t0
        # the deadline (timeout_s + 1 s, at least 2 s), not the collector's 20 s: the slack is a loaded machine's
        assert took < 1.0 + 1.0 + 8.0, took
    finally:
        receiver.close()


# ---- sink="live"


def test_live_torch_memory_failing_leaves_its_series_out_until_it_recovers(tel, monkeypatch):
    """``live``/``torch_memory``: a failing torch.cuda memory query is counted, its series are left out of the
    scrape (the rest served), and they come back when it recovers."""
    from tests.gpu_fakes import FakeCuda

    class Flaky(FakeCuda):
        broken = True

        def memory_stats_as_nested_dict(self, d=None):  # the one allocator read a scrape makes per device
            if self.broken:
                raise RuntimeError("CUDA error: device lost")
            return super().memory_stats_as_nested_dict(d)

    cuda = Flaky()
    cuda.alloc(1024)
    fake = type(sys)("torch")
    fake.cuda = cuda
    monkeypatch.setitem(sys.modules, "torch", fake)
    tel.log({"critic/score/mean": 0.5}, step=0)
    text = scrape(tel.metrics_url)
    assert "rl_gpu_process_memory_allocated_bytes{" not in text and samples(text, "rl_critic_score")
    assert errors(tel, "live", "torch_memory") >= 1
    cuda.broken = False
    text = scrape(tel.metrics_url)
    assert list(samples(text, "rl_gpu_process_memory_allocated_bytes").values()) == [1024.0]


def test_live_process_memory_failing_leaves_its_series_out_until_it_recovers(tel, monkeypatch):
    """``live``/``process_memory``: the process-memory source failing is counted, its series left out, back when
    it recovers."""
    from rl_otel._internal.probes.memory import CpuProbe

    real = CpuProbe.memory

    def broken(self):
        raise OSError("statm unreadable")

    monkeypatch.setattr(CpuProbe, "memory", broken)
    text = scrape(tel.metrics_url)
    assert not samples(text, "rl_process_resident_memory_bytes") and samples(text, "rl_step") is not None
    assert errors(tel, "live", "process_memory") >= 1
    monkeypatch.setattr(CpuProbe, "memory", real)
    assert samples(scrape(tel.metrics_url), "rl_process_resident_memory_bytes")


# ---- sink="close"


def _raising_after(cls, method: str, monkeypatch) -> None:
    """``cls.method`` does its work, then raises: the part is closed, the step still reports a failure."""
    real = getattr(cls, method)

    def wrapped(self, *args, **kwargs):
        real(self, *args, **kwargs)
        raise RuntimeError(f"{cls.__name__}.{method} exploded")

    monkeypatch.setattr(cls, method, wrapped)


def _close_target(reason: str):
    if reason == "signals":
        from rl_otel._internal.runtime.signals import SignalFlush
        return SignalFlush, "uninstall"
    if reason == "metrics_worker":
        from rl_otel._internal.pipeline.worker import Worker
        return Worker, "close"
    if reason == "trackers":
        from rl_otel._internal.trackers.bridge import Bridge
        return Bridge, "close"
    if reason == "targets_file":
        from rl_otel._internal.exporters.file_sd import TargetsFile
        return TargetsFile, "close"
    if reason == "endpoint":
        from rl_otel._internal.exporters.prometheus import ScrapeEndpoint
        return ScrapeEndpoint, "close"
    if reason == "tracer_provider":
        from opentelemetry.sdk.trace import TracerProvider
        return TracerProvider, "shutdown"
    from opentelemetry.sdk.metrics import MeterProvider  # meter_provider, user_meter_provider
    return MeterProvider, "shutdown"


@pytest.mark.parametrize("reason", ["signals", "metrics_worker", "trackers", "targets_file", "endpoint",
                                    "meter_provider", "tracer_provider", "user_meter_provider"])
def test_close_a_failing_step_is_counted_by_name_and_the_later_steps_still_run(tmp_path, monkeypatch, caplog, reason):
    """``close``/<step>: a step of close() failing is counted under its name, logged, close() never raises, and the
    other steps still run (trackers closed, endpoint stopped, targets file removed)."""
    Recorder.instances.clear()
    options: dict = {}
    if reason == "meter_provider":
        options["otlp"] = {"exporter": Capturing(), "interval_s": 60}
    if reason == "tracer_provider":
        options["tracing"] = {"exporter": "jsonl", "path": str(tmp_path / "spans.jsonl")}
    tel = rl_otel.init(run="promise", rank=0, trackers=["recorder"], handle_sigterm=True, close_timeout_s=5,
                       prometheus={"host": "127.0.0.1", "port": 0, "file_sd": str(tmp_path / "sd")}, **options)
    if reason == "user_meter_provider":
        tel.meter_provider.get_meter("mine").create_counter("my_requests").add(1)
    tel.log({"actor/pg_loss": 1.0}, step=0)
    url = tel.metrics_url
    assert list((tmp_path / "sd").iterdir())
    cls, method = _close_target(reason)
    _raising_after(cls, method, monkeypatch)
    with caplog.at_level(logging.WARNING, logger="rl_otel"):
        tel.close()  # never raises
    assert errors(tel, "close", reason) == 1
    assert f"closing {reason} failed" in caplog.text
    (rec,) = Recorder.instances
    assert rec.closed and rec.steps == [(0, {"actor/pg_loss": 1.0})]
    with pytest.raises(OSError):
        scrape(url)
    assert list((tmp_path / "sd").iterdir()) == []
