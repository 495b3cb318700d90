"""OTLP push of the store's series and the phase spans to real OTLP receivers on loopback (HTTP and gRPC), the
standard OTEL_* variables, temporality, and the user's own exporter."""

from __future__ import annotations

import itertools
import math
import time

import pytest
from opentelemetry.sdk.metrics import Counter, Histogram
from opentelemetry.sdk.metrics.export import AggregationTemporality, MetricExporter, MetricExportResult

import rl_otel
from rl_otel import ConfigurationError
from tests.otlp_receiver import GrpcOtlpReceiver, OtlpReceiver
from tests.promtools import free_port, samples, scrape

pytestmark = pytest.mark.slow  # the slow layer (tests/conftest.py)


@pytest.fixture
def receiver():
    r = OtlpReceiver()
    yield r
    r.close()


def wait_until(predicate, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise TimeoutError("condition not met")


def test_metrics_and_spans_reach_the_collector(receiver):
    tel = rl_otel.init(run="push", rank=5, role="actor", prometheus=False,
                       otlp={"endpoint": receiver.url, "interval_s": 60, "headers": {"x-tenant": "rl"}})
    tel.log({"critic/score/mean": 0.5, "actor/approxkl": float("nan"), "system/samples": 1024,
             "env/reward_dist": [-1.0, 0.0, 0.5, 2.0], "custom/myLoss": float("inf")}, step=3)
    with tel.phase("actor_train", "train_step"):
        pass
    tel.close()  # the final push: interval_s=60 never fired

    assert len(receiver.metrics) == 1
    points = {(p.metric, tuple(sorted((k, v) for k, v in p.attributes.items() if k not in ("run", "role", "rank")))): p
              for p in receiver.points()}
    score = points[("rl_critic_score", (("stat", "mean"),))]
    assert (score.kind, score.value, score.attributes["run"], score.attributes["rank"]) == ("gauge", 0.5, "push", "5")
    assert math.isnan(points[("rl_actor_approx_kl", ())].value)  # the SDK's instruments would have dropped it
    assert points[("rl_custom_my_loss", ())].value == math.inf
    samples_total = points[("rl_system_samples", ())]
    assert (samples_total.kind, samples_total.value) == ("sum", 1024.0)
    dist = points[("rl_env_reward_dist", ())]
    assert (dist.kind, dist.count, sum(dist.bucket_counts)) == ("histogram", 4, 4)
    assert points[("rl_step", ())].value == 3.0
    assert points[("rl_otel_build_info", (("version", rl_otel.__version__),))].value == 1.0  # the SDK instrument
    assert score.resource["rl.run"] == "push" and score.resource["rl.role"] == "actor"
    assert [h.get("x-tenant") for h in receiver.headers] == ["rl"] * len(receiver.headers)

    spans = {name: (attrs, span_id, parent) for name, attrs, span_id, parent, _ in receiver.spans()}
    root_attrs, root_id, _ = spans["actor_train/train_step"]
    assert root_attrs["rank"] == 5 or root_attrs["rank"] == "5"
    assert {"onload", "execute", "offload"} <= set(spans)
    assert spans["execute"][2] == root_id


def test_pushes_periodically(receiver):
    with rl_otel.init(run="periodic", prometheus=False, otlp={"endpoint": receiver.url, "interval_s": 0.2}) as tel:
        for step in range(3):
            tel.log({"critic/score/mean": float(step)}, step=step)
            wait_until(lambda step=step: any(p.metric == "rl_step" and p.value == step for p in receiver.points())
                       if receiver.metrics else False)
        assert len(receiver.metrics) >= 3


@pytest.mark.parametrize("sick", ["down", "rejects", "slow"])
def test_a_sick_collector_never_reaches_the_training_loop(sick):
    receiver = None if sick == "down" else OtlpReceiver(status=503 if sick == "rejects" else 200,
                                                        delay_s=3.0 if sick == "slow" else 0.0)
    endpoint = f"http://127.0.0.1:{free_port()}" if receiver is None else receiver.url
    try:
        tel = rl_otel.init(run="sick", prometheus={"host": "127.0.0.1", "port": 0},
                           otlp={"endpoint": endpoint, "interval_s": 0.2, "timeout_s": 0.5})
        for step in range(20):
            tel.log({"critic/score/mean": 1.0}, step=step)
            with tel.phase("actor_train", "train_step"):
                pass

        def failures() -> float:
            errors = samples(scrape(tel.metrics_url), "rl_telemetry_errors_total")
            key = frozenset({"run": "sick", "role": "trainer", "rank": "0", "sink": "otlp",
                             "reason": "export_failed"}.items())
            return errors.get(key, 0.0)

        wait_until(lambda: failures() >= 1)
        tel.log({"critic/score/mean": 2.0}, step=20)
        assert samples(scrape(tel.metrics_url), "rl_critic_score")  # the scrape path is untouched
        tel.close()  # bounded by timeout_s, never raises
    finally:
        if receiver is not None:
            assert receiver.metrics == [] or sick == "slow"
            receiver.close()


@pytest.mark.parametrize(("otlp", "match"), [
    ({"endpoint": "collector:4318"}, "base URL"),
    ({"endpoint": "http://c:4318", "interval_s": 0}, "interval_s"),
    ({"endpoint": "http://c:4318", "headers": {"a": 1}}, "headers"),
    ({"endpoint": "http://c:4318", "protocol": "thrift"}, "'http/protobuf' or 'grpc'"),
    ({"endpoint": "http://c:4318", "colour": 1}, "unknown otlp option"),
    ({"endpoint": "http://c:4318", "temporality": "sometimes"}, "otlp temporality must be one of"),
    ({"exporter": "console"}, "MetricExporter"),
    (42, "otlp must be"),
])
def test_bad_otlp_options(otlp, match):
    with pytest.raises(ConfigurationError, match=match):
        rl_otel.init(prometheus=False, otlp=otlp)


def test_receiver_answers_like_a_collector(receiver):
    import requests

    assert requests.post(receiver.url + "/v1/metrics", data=b"x", headers={"Content-Type": "application/json"},
                         timeout=5).status_code == 415
    assert requests.post(receiver.url + "/v1/logs", data=b"", timeout=5).status_code == 404
    assert requests.post(receiver.url + "/v1/traces", data=b"\xff\xff",
                         headers={"Content-Type": "application/x-protobuf"}, timeout=5).status_code == 400


# -- gRPC, the standard OTEL_* variables, temporality, the user's own exporter ------------------------------------


@pytest.fixture
def grpc_receiver():
    r = GrpcOtlpReceiver()
    yield r
    r.close()


def _logged_and_traced(tel) -> None:
    tel.log({"critic/score/mean": 0.5, "actor/approxkl": float("nan"), "system/samples": 1024,
             "env/reward_dist": [-1.0, 0.0, 0.5, 2.0]}, step=3)
    with tel.phase("actor_train", "train_step"):
        pass
    tel.close()


def test_grpc_carries_metrics_and_spans(grpc_receiver):
    tel = rl_otel.init(run="grpc", rank=2, prometheus=False,
                       otlp={"endpoint": grpc_receiver.url, "protocol": "grpc", "interval_s": 60,
                             "headers": {"X-Tenant": "rl"}})
    _logged_and_traced(tel)

    assert len(grpc_receiver.metrics) == 1  # the final push at close()
    points = {p.metric: p for p in grpc_receiver.points()}
    assert (points["rl_critic_score"].value, points["rl_critic_score"].attributes["rank"]) == (0.5, "2")
    assert math.isnan(points["rl_actor_approx_kl"].value)
    assert (points["rl_system_samples"].kind, points["rl_system_samples"].value) == ("sum", 1024.0)
    assert points["rl_env_reward_dist"].count == 4 and points["rl_step"].value == 3.0
    assert points["rl_critic_score"].resource["rl.run"] == "grpc"
    assert all(h.get("x-tenant") == "rl" for h in grpc_receiver.headers)  # gRPC metadata keys are lower case
    spans = {name: (span_id, parent) for name, _, span_id, parent, _ in grpc_receiver.spans()}
    assert {"actor_train/train_step", "onload", "execute", "offload"} <= set(spans)
    assert spans["execute"][1] == spans["actor_train/train_step"][0]


def test_environment_turns_the_push_on_signal_specific_variables_win(monkeypatch, grpc_receiver, receiver):
    """ROLL points OTEL_EXPORTER_OTLP_ENDPOINT at its traces-only collector: the metrics go where
    OTEL_EXPORTER_OTLP_METRICS_ENDPOINT says, over the protocol OTEL_EXPORTER_OTLP_METRICS_PROTOCOL says."""
    for name, value in {"OTEL_METRICS_EXPORTER": "otlp", "OTEL_TRACES_EXPORTER": "otlp",
                        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,  # http/protobuf: /v1/traces is appended
                        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": grpc_receiver.url,
                        "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "grpc",
                        "OTEL_EXPORTER_OTLP_HEADERS": "x-tenant=rl%20team,x-other=1",
                        "OTEL_EXPORTER_OTLP_METRICS_HEADERS": "x-tenant=metrics",
                        "OTEL_METRIC_EXPORT_INTERVAL": "60000",
                        "OTEL_SERVICE_NAME": "grpo-7b",
                        "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=prod,service.name=ignored"}.items():
        monkeypatch.setenv(name, value)
    tel = rl_otel.init(run="env", prometheus=False)  # no otlp=: the environment decides
    assert tel.config.otlp.interval_s == 60.0
    _logged_and_traced(tel)

    assert len(grpc_receiver.metrics) == 1 and receiver.metrics == []
    point = next(p for p in grpc_receiver.points() if p.metric == "rl_critic_score")
    assert (point.resource["service.name"], point.resource["deployment.environment"]) == ("grpo-7b", "prod")
    assert point.resource["rl.run"] == "env"
    assert grpc_receiver.headers[0]["x-tenant"] == "metrics" and "x-other" not in grpc_receiver.headers[0]
    assert {name for name, *_ in receiver.spans()} >= {"actor_train/train_step", "execute"}
    assert grpc_receiver.traces == []
    assert {h.get("x-tenant") for h in receiver.headers} == {"rl team"}  # URL-decoded
    assert receiver.spans()[0][4]["service.name"] == "grpo-7b"


def test_explicit_arguments_win_over_the_environment(monkeypatch, receiver):
    dead = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", dead + "/v1/metrics")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-env")
    tel = rl_otel.init(run="explicit", prometheus=False, resource={"service.name": "from-arg", "team": "rl"},
                       otlp={"endpoint": receiver.url, "protocol": "http/protobuf", "interval_s": 60,
                             "traces": False})
    tel.log({"critic/score/mean": 1.0}, step=0)
    tel.close()
    assert len(receiver.metrics) == 1 and receiver.traces == []
    resource = receiver.points()[0].resource
    assert (resource["service.name"], resource["team"]) == ("from-arg", "rl")


def test_otlp_false_wins_over_the_environment_and_the_endpoint_alone_pushes_nothing(monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")  # what ROLL's tracing sets
    tel = rl_otel.init(run="quiet", prometheus=False)
    assert tel.config.otlp is None
    tel.close()
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    tel = rl_otel.init(run="quiet", prometheus=False, otlp=False)
    assert tel.config.otlp is None
    tel.close()


@pytest.mark.parametrize("bad, words", [
    ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "OTEL_EXPORTER_OTLP_PROTOCOL must be 'http/protobuf' or"),
    ({"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "collector:4318/v1/metrics"}, "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"),
    ({"OTEL_EXPORTER_OTLP_HEADERS": "api-key"}, "OTEL_EXPORTER_OTLP_HEADERS: entry 1"),
    ({"OTEL_EXPORTER_OTLP_TIMEOUT": "soon"}, "OTEL_EXPORTER_OTLP_TIMEOUT must be a positive number"),
    ({"OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE": "often"}, "TEMPORALITY_PREFERENCE must be one of"),
])
def test_a_bad_environment_variable_fails_at_init_naming_it(monkeypatch, bad, words):
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "otlp")
    for name, value in bad.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigurationError, match=words):
        rl_otel.init(run="bad", prometheus=False)


def _series(points, metric):
    return sorted((p for p in points if p.metric == metric), key=lambda p: p.time)


def _check_delta_chain(series) -> None:
    """Each delta point starts where the previous export of the series ended."""
    assert all(p.temporality == 1 for p in series)  # AGGREGATION_TEMPORALITY_DELTA
    assert all(b.start == a.time for a, b in itertools.pairwise(series))
    assert all(p.start < p.time for p in series)


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_delta_temporality_counters_and_histograms(monkeypatch, receiver, how):
    if how == "environment":
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "DELTA")
    options = {"endpoint": receiver.url, "interval_s": 0.3, "traces": False}
    tel = rl_otel.init(run="delta", prometheus=False,
                       otlp={**options, "temporality": "delta"} if how == "argument" else options)
    user_counter = tel.meter_provider.get_meter("mine").create_counter("my_restarts")
    tel.log({"system/samples": 100, "env/reward_dist": [1.0, 2.0], "critic/score/mean": 0.1}, step=0)
    user_counter.add(2)
    wait_until(lambda: any(p.metric == "rl_system_samples" for p in receiver.all_points()))
    tel.log({"system/samples": 250, "env/reward_dist": [3.0], "critic/score/mean": 0.2}, step=1)
    user_counter.add(3)
    wait_until(lambda: sum(p.value for p in _series(receiver.all_points(), "rl_system_samples")) == 250)
    tel.close()

    points = receiver.all_points()
    samples_series = _series(points, "rl_system_samples")
    _check_delta_chain(samples_series)
    assert sum(p.value for p in samples_series) == 250.0 and 150.0 in [p.value for p in samples_series]
    assert all(p.value in (0.0, 100.0, 150.0) for p in samples_series)
    dist = _series(points, "rl_env_reward_dist")
    _check_delta_chain(dist)
    assert sum(p.count for p in dist) == 3 and sum(p.sum for p in dist) == 6.0
    assert all(sum(p.bucket_counts) == p.count for p in dist)
    after = next(p for p in dist if p.count == 1)  # the interval that saw only 3.0: its max is exact, its min unknown
    assert (after.min, after.max) == (None, 3.0)
    assert all(p.temporality == 0 for p in _series(points, "rl_critic_score"))  # a gauge has no temporality
    mine = _series(points, "my_restarts")  # the user's SDK instrument follows the same preference
    assert mine and all(p.temporality == 1 for p in mine) and sum(p.value for p in mine) == 5.0


def test_cumulative_by_default(receiver):
    tel = rl_otel.init(run="cumulative", prometheus=False, otlp={"endpoint": receiver.url, "interval_s": 60})
    tel.log({"system/samples": 100, "env/reward_dist": [1.0]}, step=0)
    tel.close()
    points = {p.metric: p for p in receiver.points()}
    assert points["rl_system_samples"].temporality == points["rl_env_reward_dist"].temporality == 2


class CapturingExporter(MetricExporter):
    """A user's own exporter: keeps what it is given."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.exports: list = []

    def export(self, metrics_data, timeout_millis: float = 10_000, **kwargs) -> MetricExportResult:
        self.exports.append(metrics_data)
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs) -> None:
        self.shut = True


def _sdk_points(exporter, name):
    return [(metric.data, point) for data in exporter.exports for rm in data.resource_metrics
            for sm in rm.scope_metrics for metric in sm.metrics if metric.name == name
            for point in metric.data.data_points]


@pytest.mark.parametrize("temporality", [AggregationTemporality.CUMULATIVE, AggregationTemporality.DELTA])
def test_own_metric_exporter_gets_the_store_in_its_temporality(temporality):
    exporter = CapturingExporter(preferred_temporality={Counter: temporality, Histogram: temporality})
    tel = rl_otel.init(run="own", prometheus=False, otlp={"exporter": exporter, "interval_s": 60})
    assert tel.config.otlp.traces is None  # an own exporter pushes no spans unless asked
    tel.log({"system/samples": 7, "env/reward_dist": [0.5], "actor/approxkl": float("nan")}, step=0)
    tel.close()
    assert exporter.shut
    (data, point), = _sdk_points(exporter, "rl_system_samples")
    assert (data.aggregation_temporality, point.value) == (temporality, 7.0)
    (data, point), = _sdk_points(exporter, "rl_env_reward_dist")
    assert (data.aggregation_temporality, point.count) == (temporality, 1)
    (_, point), = _sdk_points(exporter, "rl_actor_approx_kl")
    assert math.isnan(point.value)


def test_own_metric_exporter_with_endpoint_options_is_refused():
    with pytest.raises(ConfigurationError, match="construct it with them"):
        rl_otel.init(prometheus=False, otlp={"exporter": CapturingExporter(), "endpoint": "http://c:4318"})


def test_the_providers_shut_down_together_and_span_export_failures_are_counted():
    """close() shuts the meter and tracer providers down at once (each may wait its export timeout for a collector
    that does not answer: in sequence, close() took 2-4.5x timeout_s), and a failed span export is counted."""
    import threading

    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    both_shutting = threading.Barrier(2, timeout=30)  # passes only if both shutdowns run at the same time

    class MeetingMetricExporter(CapturingExporter):
        def shutdown(self, timeout_millis: float = 30_000, **kwargs) -> None:
            both_shutting.wait()
            self.shut = True

    class FailingSpanExporter(SpanExporter):
        shut = False

        def export(self, spans):
            return SpanExportResult.FAILURE  # a collector that rejects the spans

        def shutdown(self):
            both_shutting.wait()
            FailingSpanExporter.shut = True

    metrics = MeetingMetricExporter()
    tel = rl_otel.init(run="close", prometheus=False, otlp={"exporter": metrics, "interval_s": 60},
                       tracing=FailingSpanExporter())
    with tel.phase("actor_train", "train_step"):
        pass
    tel.close()
    assert metrics.shut and FailingSpanExporter.shut and not both_shutting.broken
    assert tel.value("rl_telemetry_errors_total", sink="tracing", reason="span_export_failed") == 1
    assert tel.value("rl_telemetry_errors_total", sink="close", reason="meter_provider") is None


def test_a_collector_that_is_down_says_so_once_not_every_interval(caplog):
    """The SDK's exporters log a line per failed export (every interval while the collector is down); rl_otel
    counts each failure and lets one line per logger through per five minutes."""
    import logging

    with caplog.at_level(logging.WARNING):
        tel = rl_otel.init(run="down", prometheus=False,
                           otlp={"endpoint": f"http://127.0.0.1:{free_port()}", "interval_s": 0.1, "timeout_s": 0.2})
        wait_until(lambda: (tel.value("rl_telemetry_errors_total", sink="otlp", reason="export_failed") or 0) >= 5)
        tel.close()
    sdk_lines = [r for r in caplog.records if r.name.startswith("opentelemetry.exporter")]
    assert len(sdk_lines) <= 2  # before: one per failed export (>= 5 here); said once per 5 min per logger
