"""The standard OTEL_* variables: explicit argument > environment > default, per setting and per signal."""

from __future__ import annotations

import pytest

import rl_otel
from rl_otel import ConfigurationError
from rl_otel._internal.exporters.otel_env import export_interval_s, parse_headers, selected, signal_config, temporality
from tests.promtools import samples, scrape


def test_defaults_per_protocol():
    assert signal_config("metrics", {}) == signal_config("metrics", {}, protocol="http/protobuf")
    http, grpc = signal_config("traces", {}), signal_config("traces", {}, protocol="grpc")
    assert (http.endpoint, http.protocol, http.headers, http.timeout_s) == (
        "http://localhost:4318/v1/traces", "http/protobuf", (), 10.0)
    assert (grpc.endpoint, grpc.protocol) == ("http://localhost:4317", "grpc")


def test_signal_specific_variables_win_over_the_generic_ones():
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://traces-only:4318/", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
           "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://metrics:9090/otlp/v1/metrics",
           "OTEL_EXPORTER_OTLP_HEADERS": "a=1", "OTEL_EXPORTER_OTLP_METRICS_HEADERS": "b=2",
           "OTEL_EXPORTER_OTLP_TIMEOUT": "5", "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT": "2.5",
           "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"}
    metrics, traces = signal_config("metrics", env), signal_config("traces", env)
    assert metrics == signal_config("metrics", env, what="x")
    assert (metrics.endpoint, metrics.protocol, metrics.headers, metrics.timeout_s) == (
        "http://metrics:9090/otlp/v1/metrics", "http/protobuf", (("b", "2"),), 2.5)  # a signal URL: used as is
    assert (traces.endpoint, traces.protocol, traces.headers, traces.timeout_s) == (
        "http://traces-only:4318/", "grpc", (("a", "1"),), 5.0)  # grpc: the base URL as is


def test_explicit_arguments_win_over_the_environment():
    env = {"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://env:4318/v1/metrics", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
           "OTEL_EXPORTER_OTLP_HEADERS": "a=1", "OTEL_EXPORTER_OTLP_TIMEOUT": "5"}
    got = signal_config("metrics", env, base="http://arg:4318", protocol="http/protobuf", headers=(("c", "3"),),
                        timeout_s=1.0)
    assert (got.endpoint, got.protocol, got.headers, got.timeout_s) == (
        "http://arg:4318/v1/metrics", "http/protobuf", (("c", "3"),), 1.0)
    assert signal_config("metrics", env, headers=()).headers == ()  # an explicit "none" is explicit too


def test_exporter_selection_interval_temporality():
    assert selected({}, "metrics") is None
    assert selected({"OTEL_METRICS_EXPORTER": "console, OTLP"}, "metrics") is True
    assert selected({"OTEL_TRACES_EXPORTER": "none"}, "traces") is False
    assert export_interval_s({}, 10.0) == 10.0 and export_interval_s({"OTEL_METRIC_EXPORT_INTERVAL": "1500"}, 10) == 1.5
    assert temporality({}) == "cumulative"
    assert temporality({"OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE": "LowMemory"}) == "lowmemory"
    assert temporality({"OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE": "delta"}, "cumulative") == "cumulative"


def test_headers_are_url_decoded_and_errors_never_show_a_value():
    assert parse_headers("Authorization=Bearer%20abc%3D%3D, x-scope = a , ,", "V") == (
        ("Authorization", "Bearer abc=="), ("x-scope", "a"))
    with pytest.raises(ConfigurationError) as info:
        parse_headers("ok=1,secret-token-without-equals", "OTEL_EXPORTER_OTLP_HEADERS")
    assert "entry 2" in str(info.value) and "secret" not in str(info.value)


def test_grpc_takes_host_port_http_needs_a_url():
    assert signal_config("metrics", {"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4317"},
                         protocol="grpc").endpoint == "collector:4317"
    with pytest.raises(ConfigurationError, match="OTEL_EXPORTER_OTLP_ENDPOINT must be the collector's OTLP"):
        signal_config("metrics", {"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"})


def test_resource_from_the_environment_on_the_scrape(monkeypatch):
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=prod,service.name=attrs,host.name=pod-7")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "grpo-7b")
    tel = rl_otel.init(run="res", rank=1, prometheus={"host": "127.0.0.1", "port": 0})
    try:
        attrs = tel.resource.attributes
        assert (attrs["service.name"], attrs["deployment.environment"], attrs["host.name"]) == (
            "grpo-7b", "prod", "pod-7")  # OTEL_SERVICE_NAME > OTEL_RESOURCE_ATTRIBUTES > rl_otel's defaults
        assert (attrs["rl.run"], attrs["rl.rank"], attrs["telemetry.sdk.language"]) == ("res", 1, "python")
        (labels, _), = samples(scrape(tel.metrics_url), "target_info").items()
        assert {("service_name", "grpo-7b"), ("deployment_environment", "prod")} <= labels
    finally:
        tel.close()


def test_resource_argument_wins(monkeypatch):
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-env")
    tel = rl_otel.init(run="res", prometheus=False, resource={"service.name": "from-arg", "rl.run": "x", "gpus": 8})
    assert (tel.resource.attributes["service.name"], tel.resource.attributes["gpus"]) == ("from-arg", 8)
    tel.close()
    monkeypatch.delenv("OTEL_SERVICE_NAME")
    tel = rl_otel.init(run="res", prometheus=False)
    tel.close()
    assert tel.resource.attributes["service.name"] == "rl_otel"  # the default
    with pytest.raises(ConfigurationError, match="resource must be a dict of OTel resource attributes"):
        rl_otel.init(run="res", prometheus=False, resource={"service.name": None})


def test_headers_never_show_in_a_repr():
    config = signal_config("metrics", {"OTEL_EXPORTER_OTLP_HEADERS": "api-key=s3cr3t"})
    assert config.headers == (("api-key", "s3cr3t"),) and "s3cr3t" not in repr(config)
