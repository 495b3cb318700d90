"""The OTel resource is the SDK's: ``Resource.create`` with its detectors resolves it at ``init()``, and
``target_info`` serves exactly the attributes the OTLP push and the tracer provider carry. rl_otel's own
attributes take the documented precedence over the ``OTEL_*`` variables."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.resources import Resource

import rl_otel
from rl_otel._internal.exporters.otel_env import resolve_resource
from tests.promtools import samples, scrape

VARIABLES = ("OTEL_RESOURCE_ATTRIBUTES", "OTEL_SERVICE_NAME", "OTEL_EXPERIMENTAL_RESOURCE_DETECTORS")
DEFAULTS = {"service.name": "rl_otel", "service.version": "0.1.0", "host.name": "host"}
OWN = {"rl.run": "run", "rl.rank": 0, "rl.role": "trainer"}


@pytest.fixture
def env(monkeypatch):
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return lambda values: [monkeypatch.setenv(k, v) for k, v in values.items()]


def test_precedence_defaults_then_environment_then_own_then_explicit(env):
    env({"OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=prod,service.name=attrs,host.name=pod-7,rl.run=env",
         "OTEL_SERVICE_NAME": "grpo-7b"})
    resolved = resolve_resource(DEFAULTS, OWN, {"gpus": 8})
    attrs = resolved.attributes
    assert attrs["service.name"] == "grpo-7b"         # OTEL_SERVICE_NAME over OTEL_RESOURCE_ATTRIBUTES and defaults
    assert attrs["host.name"] == "pod-7" and attrs["deployment.environment"] == "prod"  # the environment's
    assert attrs["rl.run"] == "run"                    # init()'s own over the environment
    assert attrs["gpus"] == 8                          # init(resource=...) last
    assert attrs["telemetry.sdk.name"] == "opentelemetry" and len(str(attrs["service.instance.id"])) == 36
    assert isinstance(resolved.sdk(), Resource) and dict(resolved.sdk().attributes) == dict(attrs)
    explicit = resolve_resource(DEFAULTS, OWN, {"service.name": "from-arg"})
    assert explicit.attributes["service.name"] == "from-arg"


def test_a_detector_plugin_named_in_the_environment_is_run(env):
    env({"OTEL_EXPERIMENTAL_RESOURCE_DETECTORS": "process"})
    import os

    assert resolve_resource(DEFAULTS, OWN, {}).attributes["process.pid"] == os.getpid()


def test_target_info_serves_the_resource_the_providers_carry(env):
    env({"OTEL_RESOURCE_ATTRIBUTES": "team=rl%20infra"})
    with rl_otel.init("res", prometheus={"host": "127.0.0.1", "port": 0}, handle_sigterm=False) as tel:
        (served, _), = samples(scrape(str(tel.metrics_url)), "target_info").items()
        expected = {k.replace(".", "_"): str(v) for k, v in tel.resource.attributes.items()}
        assert dict(served) == expected and expected["team"] == "rl infra"
