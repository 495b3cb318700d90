"""Exemplars: a phase duration histogram's bucket carries the trace ID of a recent phase, in OpenMetrics only,
and that trace is one the spans were exported in (a real HTTP scrape, a real OTLP receiver, a real Prometheus
with exemplar storage)."""

from __future__ import annotations

import re
import time
import urllib.request

import pytest

import rl_otel
from rl_otel._internal.exporters.exemplars import Exemplar, with_exemplars
from rl_otel._internal.tracing.steps import step_ids
from tests.otlp_receiver import OtlpReceiver
from tests.promtools import PrometheusServer
from tests.step_traces import received

OPENMETRICS = "application/openmetrics-text; version=1.0.0"
EXEMPLAR = re.compile(r'^rl_phase_duration_seconds_bucket\{(?P<labels>[^}]*)\} \S+ '
                      r'# \{trace_id="(?P<trace>[0-9a-f]{32})",span_id="(?P<span>[0-9a-f]{16})"\} (?P<value>\S+) '
                      r'(?P<ts>\S+)$', re.M)


def test_an_exemplar_goes_on_the_first_bucket_holding_its_value():
    text = "\n".join(f'rl_phase_duration_seconds_bucket{{cluster="a",le="{le}",part="{part}",phase="p"}} 1'
                     for part in ("execute", "total") for le in ("0.1", "1.0", "+Inf")) + "\n"
    out = with_exemplars(text, {("a", "p"): Exemplar("ab" * 16, "cd" * 8, 0.5, 1700000000.0)})
    marked = [line for line in out.splitlines() if " # {" in line]
    assert marked == ['rl_phase_duration_seconds_bucket{cluster="a",le="1.0",part="total",phase="p"} 1 '
                      f'# {{trace_id="{"ab" * 16}",span_id="{"cd" * 8}"}} 0.5 1700000000.000']
    assert with_exemplars(text, {("b", "p"): Exemplar("ab" * 16, "cd" * 8, 0.5, 1.0)}) == text


def _scrape(url: str, accept: str | None) -> str:
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    return urllib.request.urlopen(request, timeout=10).read().decode()


@pytest.mark.slow
def test_the_exemplars_trace_is_an_exported_trace_and_prometheus_stores_it(tmp_path):
    receiver = OtlpReceiver()
    tel = rl_otel.init(run="exemplars", prometheus={"host": "127.0.0.1", "port": 0},
                       tracing={"exporter": "otlp", "endpoint": f"{receiver.url}/v1/traces"})
    server = None
    try:
        for step in range(3):
            with tel.phase("actor_train", "train_step"):
                time.sleep(0.01)
            tel.log({"actor/pg_loss": 0.1}, step=step)
        om = _scrape(tel.metrics_url, OPENMETRICS)
        found = [m.groupdict() for m in EXEMPLAR.finditer(om)]
        assert len(found) == 1 and 'part="total"' in found[0]["labels"], om[-3000:]
        assert int(found[0]["trace"], 16) == step_ids("exemplars", 2)[0]  # the last step's trace
        assert " # {" not in _scrape(tel.metrics_url, None)  # the text format has no exemplars
        assert tel.flush(10)
        spans = received(receiver)
        assert any(f"{s.trace_id:032x}" == found[0]["trace"] and f"{s.span_id:016x}" == found[0]["span"]
                   and s.name == "actor_train/train_step" for s in spans)

        # a real Prometheus with exemplar storage keeps it (it asks for OpenMetrics by itself)
        server = PrometheusServer(tmp_path, [tel.metrics_url.split("//")[1].split("/")[0]],
                                  flags=("--enable-feature=exemplar-storage",))
        deadline, stored = time.monotonic() + 30, []
        while time.monotonic() < deadline and not stored:
            now = time.time()
            stored = server.api("query_exemplars", {"query": "rl_phase_duration_seconds_bucket",
                                                    "start": str(now - 600), "end": str(now + 60)})
            time.sleep(0.5)
        traces = {e["labels"]["trace_id"] for series in stored for e in series["exemplars"]}
        assert traces == {found[0]["trace"]}
    finally:
        if server is not None:
            server.close()
        tel.close()
        receiver.close()
