"""tracing= of init(): validation at init, exporters, random IDs, W3C carriers."""

from __future__ import annotations

import json
import random
import sys

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import rl_otel
from rl_otel._internal.tracing.carriers import extract, inject
from rl_otel._internal.tracing.config import tracing_config
from rl_otel._internal.tracing.tracing import UrandomIdGenerator

pytestmark = pytest.mark.slow  # the slow layer (tests/conftest.py)


@pytest.mark.parametrize("bad, words", [
    ("zipkin", "tracing exporter must be one of"),
    ({"exporter": "jsonl"}, "needs a 'path'"),
    ({"exporter": "console", "colour": 1}, "unknown tracing option(s) ['colour']"),
    ({"exporter": "otlp", "protocol": "thrift"}, "'http/protobuf' or 'grpc'"),
    ({"exporter": "otlp", "endpoint": 4317}, "tracing endpoint must be a str"),
    (42, "tracing must be None"),
])
def test_bad_tracing_config_fails_at_init(bad, words):
    with pytest.raises(rl_otel.ConfigurationError) as info:
        rl_otel.init(run="t", prometheus=False, tracing=bad)
    assert words in str(info.value)


def test_otlp_missing_is_a_clear_configuration_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    with pytest.raises(rl_otel.ConfigurationError, match=r"pip install -e '\.\[otlp\]' in the rl_otel checkout"):
        tracing_config({"exporter": "otlp"})


def test_otlp_when_installed():
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http.trace_exporter")
    tel = rl_otel.init(run="t", prometheus=False,
                       tracing={"exporter": "otlp", "endpoint": "http://127.0.0.1:9/v1/traces"})
    tel.close()


def test_jsonl_exporter_writes_one_span_per_line(tmp_path):
    path = tmp_path / "spans.jsonl"
    tel = rl_otel.init(run="t", prometheus=False, tracing={"exporter": "jsonl", "path": str(path)})
    with tel.phase("actor_train", "train_step", step=3):
        pass
    tel.close()  # flushes the batch processor
    spans = [json.loads(line) for line in path.read_text().splitlines()]
    assert sorted(s["name"] for s in spans) == ["actor_train/train_step", "execute", "offload", "onload"]
    assert all(s["attributes"]["step"] == 3 for s in spans)


def test_console_writes_json_lines_to_stderr(capsys):
    tel = rl_otel.init(run="t", prometheus=False, tracing="console")
    with tel.phase("actor_train", "train_step"):
        pass
    tel.close()
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 4 and json.loads(lines[-1])["name"] == "actor_train/train_step"


def test_span_exporter_instance(tmp_path):
    exporter = InMemorySpanExporter()
    tel = rl_otel.init(run="t", prometheus=False, tracing=exporter)
    with tel.phase("a", "b"):
        pass
    tel.close()
    assert len(exporter.get_finished_spans()) == 4


def test_telemetry_never_sets_the_global_provider():
    from opentelemetry import trace

    before = trace.get_tracer_provider()
    tel = rl_otel.init(run="t", prometheus=False, tracing="console")
    assert trace.get_tracer_provider() is before and tel.tracer_provider is not before
    tel.close()


def test_id_generator_ignores_random_seed():
    gen = UrandomIdGenerator()
    random.seed(0)
    a = (gen.generate_trace_id(), gen.generate_span_id())
    random.seed(0)
    b = (gen.generate_trace_id(), gen.generate_span_id())
    assert a != b and all(a) and all(b)


def test_carrier_round_trip():
    assert extract(None) is None and extract({}) is None
    assert inject() == {}  # no span running: nothing to carry


# -- the user's own TracerProvider ------------------------------------------------------------------------------


@pytest.fixture
def user_provider():
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def test_phases_become_spans_of_the_users_traces(user_provider):
    provider, exporter = user_provider
    tel = rl_otel.init(run="t", prometheus=False, tracer_provider=provider)
    assert tel.tracer_provider is provider
    tracer = provider.get_tracer("trainer")
    with tracer.start_as_current_span("epoch") as epoch, tel.phase("actor_train", "train_step", step=4), \
            tracer.start_as_current_span("forward"):
        pass
    tel.close()
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"epoch", "actor_train/train_step", "onload", "execute", "offload", "forward"}
    root = spans["actor_train/train_step"]
    assert root.parent.span_id == epoch.get_span_context().span_id  # a child of the user's span
    assert {s.context.trace_id for s in spans.values()} == {epoch.get_span_context().trace_id}
    assert spans["forward"].parent.span_id == spans["execute"].context.span_id
    assert root.attributes["step"] == 4 and root.instrumentation_scope.name == "rl_otel"

    with provider.get_tracer("trainer").start_as_current_span("after_close"):  # close() left the provider alone
        pass
    assert "after_close" in {s.name for s in exporter.get_finished_spans()}


def test_the_global_provider_can_be_given():
    from opentelemetry import trace

    tel = rl_otel.init(run="t", prometheus=False, tracer_provider=trace.get_tracer_provider())
    with tel.phase("a", "b"):  # a proxy or no-op provider: phases still run
        pass
    tel.close()


def test_own_tracer_provider_is_checked(user_provider):
    provider, _ = user_provider
    with pytest.raises(rl_otel.ConfigurationError, match="tracer_provider must be an opentelemetry TracerProvider"):
        rl_otel.init(run="t", prometheus=False, tracer_provider="sdk")
    with pytest.raises(rl_otel.ConfigurationError, match="leave tracing= out"):
        rl_otel.init(run="t", prometheus=False, tracer_provider=provider, tracing="console")
    with pytest.raises(rl_otel.ConfigurationError, match="add processors to it"):
        rl_otel.init(run="t", prometheus=False, tracer_provider=provider,
                     otlp={"endpoint": "http://127.0.0.1:9", "traces": True})


def test_otlp_push_adds_no_processor_to_the_users_provider(user_provider, monkeypatch):
    provider, _ = user_provider
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    tel = rl_otel.init(run="t", prometheus=False, tracer_provider=provider,
                       otlp={"endpoint": "http://127.0.0.1:9", "interval_s": 60})
    assert tel.config.otlp.traces is None
    tel.close()
    tel = rl_otel.init(run="t", prometheus=False, tracer_provider=provider)
    tel.close()
    assert tel.config.otlp is None  # OTEL_TRACES_EXPORTER=otlp is the user's provider's business


def test_tracing_otlp_reads_the_environment(monkeypatch):
    pytest.importorskip("opentelemetry.exporter.otlp.proto.grpc.trace_exporter")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "Authorization=Bearer%20x")
    config = tracing_config({"exporter": "otlp"})
    assert (config.otlp.protocol, config.otlp.endpoint) == ("grpc", "http://collector:4317")
    assert config.otlp.headers == (("authorization", "Bearer x"),)
    explicit = tracing_config({"exporter": "otlp", "endpoint": "http://c:4318/v1/traces", "protocol": "http/protobuf"})
    assert (explicit.otlp.protocol, explicit.otlp.endpoint) == ("http/protobuf", "http://c:4318/v1/traces")
