"""A real Prometheus scrapes an endpoint fed every seed key; its HTTP API must return every value and label."""

from __future__ import annotations

import math

import pytest

import rl_otel
from rl_otel.catalog import Kind, default_catalog
from tests.promtools import PrometheusServer, promtool_check, scrape

pytestmark = pytest.mark.slow  # the slow layer (tests/conftest.py)


@pytest.fixture
def fed(seed_keys):
    """A Telemetry that logged every seed key once, each with its own value; the expected series."""
    catalog = default_catalog()
    tel = rl_otel.init(run="e2e", rank=3, prometheus={"host": "127.0.0.1", "port": 0})
    metrics, expected = {}, []
    for i, key in enumerate(seed_keys):
        res = catalog.resolve(key)
        if res.spec.kind is Kind.HISTOGRAM:
            metrics[key] = [0.5, 1.0, float(i)]
            expected.append((res.spec.name + "_bucket", {**dict(res.labels), "le": "+Inf"}, 3.0))
        else:
            metrics[key] = i + 0.25
            expected.append((res.spec.prometheus_name, dict(res.labels), (i + 0.25) * res.spec.scale))
    metrics["actor/pg_loss"] = float("nan")
    expected = [e for e in expected if e[0] != "rl_actor_pg_loss"] + [("rl_actor_pg_loss", {}, math.nan)]
    tel.log(metrics, step=42)
    yield tel, expected
    tel.close()


def test_prometheus_sees_every_seed_key(fed, tmp_path):
    tel, expected = fed
    target = tel.metrics_url.split("//")[1].split("/")[0]
    server = PrometheusServer(tmp_path, [target])
    try:
        server.wait_for_scrapes(2)
        assert [r["value"][1] for r in server.query('up{job="rl_otel"}')] == ["1"]
        # one query for the whole endpoint, then compare series by series
        result = server.query('{job="rl_otel", run="e2e"}')
        got = {}
        for r in result:
            labels = dict(r["metric"])
            name = labels.pop("__name__")
            for drop in ("job", "instance", "run", "role", "rank"):
                assert drop in labels, (name, labels)
                if drop == "rank":
                    assert labels[drop] == "3"
                labels.pop(drop)
            got[(name, frozenset(labels.items()))] = float(r["value"][1])
        missing, wrong = [], []
        for name, labels, want in expected:
            value = got.get((name, frozenset(labels.items())))
            if value is None:
                missing.append((name, labels))
            elif not (math.isnan(want) and math.isnan(value)) and value != pytest.approx(want, rel=1e-12):
                wrong.append((name, labels, value, want))
        assert missing == [] and wrong == []
        assert len(expected) > 400
        step = server.query('rl_step{job="rl_otel"}')
        assert float(step[0]["value"][1]) == 42
    finally:
        server.close()


def test_promtool_check_metrics_is_clean_on_the_full_endpoint(fed):
    tel, _ = fed
    text = scrape(tel.metrics_url)
    assert text.count("\n") > 500
    assert promtool_check(text) == ""
