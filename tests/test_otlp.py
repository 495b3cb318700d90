"""OTLP push of the store's series and the phase spans to a real OTLP/HTTP receiver on loopback."""

from __future__ import annotations

import math
import time

import pytest

import rl_otel
from rl_otel import ConfigurationError
from tests.otlp_receiver import OtlpReceiver
from tests.promtools import free_port, samples, scrape


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
    points = {(p.metric, tuple(sorted((k, v) for k, v in p.attributes.items() if k not in ("run", "rank")))): p
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
            wait_until(lambda: any(p.metric == "rl_step" and p.value == step for p in receiver.points())
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
            key = frozenset({"run": "sick", "rank": "0", "sink": "otlp", "reason": "export_failed"}.items())
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
    ({"endpoint": "http://c:4318", "protocol": "grpc"}, "unknown otlp option"),
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
