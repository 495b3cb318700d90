"""The user's own OTel instruments on rl_otel's endpoint (``Telemetry.meter_provider``), checked by real scrapes."""

from __future__ import annotations

import math

from opentelemetry.metrics import Observation

import rl_otel
from tests.otlp_receiver import OtlpReceiver
from tests.promtools import promtool_check, samples, scrape


def test_user_instruments_are_served_beside_rl_otels_series(tel):
    meter = tel.meter_provider.get_meter("my_trainer", "1.0")
    assert tel.meter_provider is tel.meter_provider  # built once
    restarts = meter.create_counter("my_restarts", unit="1", description="Trainer restarts.")
    restarts.add(2, {"reason": "oom"})
    meter.create_observable_gauge("my_queue_depth", callbacks=[lambda _options: [Observation(3.0)]],
                                  description="Batches waiting.")
    tel.log({"critic/score/mean": 0.5}, step=1)

    text = scrape(tel.metrics_url)
    assert samples(text, "my_restarts_total") == {frozenset({("reason", "oom")}): 2.0}
    assert samples(text, "my_queue_depth") == {frozenset(): 3.0}
    assert samples(text, "rl_critic_score")  # the store's series are all still there
    assert text.count("# TYPE target_info") <= 1 and "otel_scope_name" not in text
    assert promtool_check(text) == ""

    restarts.add(1, {"reason": "oom"})  # an instrument's change shows at the next scrape, no log() needed
    assert samples(scrape(tel.metrics_url), "my_restarts_total") == {frozenset({("reason", "oom")}): 3.0}


def test_a_name_rl_otel_serves_is_dropped_and_counted(tel):
    tel.log({"critic/score/mean": 0.5}, step=1)
    tel.meter_provider.get_meter("mine").create_gauge("rl_critic_score").set(9.0)
    text = scrape(tel.metrics_url)
    assert list(samples(text, "rl_critic_score").values()) == [0.5]  # the store's family wins
    errors = samples(scrape(tel.metrics_url), "rl_telemetry_errors_total")  # counted during the first scrape
    assert any(("reason", "duplicate_family") in k and v >= 1 for k, v in errors.items())


def test_user_instruments_are_pushed_with_the_store():
    receiver = OtlpReceiver()
    try:
        tel = rl_otel.init(run="mine", prometheus=False, otlp={"endpoint": receiver.url, "interval_s": 60})
        tel.meter_provider.get_meter("mine").create_histogram("my_batch_seconds", unit="s").record(0.25)
        tel.log({"critic/score/mean": float("nan")}, step=0)
        tel.close()
        names = {p.metric: p for p in receiver.all_points()}
        assert names["my_batch_seconds"].count == 1 and math.isnan(names["rl_critic_score"].value)
    finally:
        receiver.close()


def test_no_endpoint_and_no_push_no_meter_provider():
    tel = rl_otel.init(run="none", prometheus=False)
    assert tel.meter_provider is None
    tel.close()
