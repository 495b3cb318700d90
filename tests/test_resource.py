"""The OTel resource resolved without the SDK (what ``target_info`` serves at ``init()``) is the one the SDK's
``Resource.create`` builds: same attributes, same order, same precedence and parsing. A new opentelemetry-sdk that
changes its resolution fails here, loudly, instead of serving a ``target_info`` that disagrees with OTLP."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.version import __version__ as SDK_VERSION

from rl_otel._internal.exporters import otel_env
from rl_otel._internal.exporters.otel_env import build_resource, resolve_resource

REPO = Path(__file__).resolve().parents[1]
VARIABLES = ("OTEL_RESOURCE_ATTRIBUTES", "OTEL_SERVICE_NAME", "OTEL_EXPERIMENTAL_RESOURCE_DETECTORS")
DEFAULTS = {"service.name": "rl_otel", "service.version": "0.1.0", "service.instance.id": "host/run/0",
            "host.name": "host"}
OWN = {"rl.run": "run", "rl.rank": 0, "rl.role": "trainer", "rl.local_rank": 0, "rl.world_size": 1}

ENVIRONMENTS = [
    {},
    {"OTEL_SERVICE_NAME": "grpo-7b"},
    {"OTEL_SERVICE_NAME": ""},  # empty: ignored
    {"OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=prod,service.name=attrs,host.name=pod-7",
     "OTEL_SERVICE_NAME": "grpo-7b"},  # OTEL_SERVICE_NAME over OTEL_RESOURCE_ATTRIBUTES
    {"OTEL_RESOURCE_ATTRIBUTES": " team = rl%20infra ,url=http%3A%2F%2Fx%3Fa%3Db,eq=a=b,k=1,k=2"},  # decoding
    {"OTEL_RESOURCE_ATTRIBUTES": "no-equals-sign,ok=1,,=empty-key, =blank-key,trailing="},  # skipped items
    {"OTEL_RESOURCE_ATTRIBUTES": "telemetry.sdk.language=cobol,rl.run=env,new.key=v"},  # SDK's and own keys
    {"OTEL_RESOURCE_ATTRIBUTES": "service.name="},  # an empty service.name: the SDK's unknown_service
    {"OTEL_RESOURCE_ATTRIBUTES": "service.instance.id=from-env"},
    {"OTEL_RESOURCE_ATTRIBUTES": "a=%E2%9C%93,b=%ZZ,c=%"},  # UTF-8 and malformed escapes, as unquote reads them
    {"OTEL_EXPERIMENTAL_RESOURCE_DETECTORS": "otel"},  # only the built-in detectors, in their own order
    {"OTEL_EXPERIMENTAL_RESOURCE_DETECTORS": " service_instance , otel ,"},
]


@pytest.fixture
def env(monkeypatch):
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)

    def set_env(values: dict[str, str]) -> None:
        for name, value in values.items():
            monkeypatch.setenv(name, value)

    return set_env


@pytest.mark.parametrize("variables", ENVIRONMENTS, ids=lambda v: ";".join(f"{k}={w}" for k, w in v.items()) or "-")
@pytest.mark.parametrize("explicit", [{}, {"service.name": "from-arg", "gpus": 8, "rl.run": "x"}], ids=["", "arg"])
def test_resolved_attributes_are_the_sdk_s(env, variables, explicit):
    env(variables)
    ours = resolve_resource(DEFAULTS, OWN, explicit)
    sdk = build_resource(DEFAULTS, OWN, explicit)
    assert list(ours.attributes.items()) == list(sdk.attributes.items()), (
        f"rl_otel's resource resolution (otel_env.resolve_resource) no longer matches opentelemetry-sdk "
        f"{SDK_VERSION}'s Resource.create for {variables}: update it to the SDK's rules "
        f"(opentelemetry/sdk/resources/__init__.py)")
    built = ours.sdk()
    assert isinstance(built, Resource) and built == sdk and built.schema_url == sdk.schema_url
    assert ours.sdk() is built  # built once


def test_without_an_instance_id_the_sdk_s_random_one_takes_its_place(env):
    ours = resolve_resource({"service.name": "x"}, {}, {})
    sdk = build_resource({"service.name": "x"}, {}, {})
    assert list(ours.attributes) == list(sdk.attributes)
    assert len(str(ours.attributes["service.instance.id"])) == 36  # a UUID, as the SDK's detector makes one


@pytest.mark.parametrize("detectors", ["process", "otel,service_instance", "*"])
def test_detector_plugins_or_another_order_go_through_the_sdk(env, monkeypatch, detectors):
    env({"OTEL_EXPERIMENTAL_RESOURCE_DETECTORS": detectors, "OTEL_SERVICE_NAME": "svc"})
    calls = []

    def spy(*args):
        calls.append(args)
        return build_resource(*args)

    monkeypatch.setattr(otel_env, "build_resource", spy)
    ours = resolve_resource(DEFAULTS, OWN, {})
    assert len(calls) == 1 and ours.attributes == dict(ours.sdk().attributes)
    assert ours.attributes["service.name"] == "svc" and ours.attributes["rl.run"] == "run"
    if detectors == "process":  # the plugin's attributes are served too
        assert ours.attributes["process.pid"] == os.getpid()


def test_serving_metrics_loads_neither_the_sdk_resource_nor_psutil():
    """``init()`` with the scrape endpoint on builds no SDK Resource (nor imports psutil, which the SDK's resources
    module imports): the first read of ``tel.resource`` builds it, with the attributes target_info serves."""
    script = """
import json, sys
import rl_otel
from tests.promtools import samples, scrape
tel = rl_otel.init("lazy", prometheus={"host": "127.0.0.1", "port": 0}, handle_sigterm=False)
loaded = sorted(m for m in ("opentelemetry.sdk.resources", "opentelemetry.sdk.trace", "psutil") if m in sys.modules)
(served, _), = samples(scrape(tel.metrics_url), "target_info").items()
resource = tel.resource
from opentelemetry.sdk.resources import Resource
attributes = {k.replace(".", "_"): v if isinstance(v, str) else json.dumps(v) for k, v in resource.attributes.items()}
print(json.dumps({"loaded": loaded, "is_resource": isinstance(resource, Resource), "same": resource is tel.resource,
                  "run": resource.attributes["rl.run"], "target_info": dict(served) == attributes}))
tel.close()
"""
    env = {k: v for k, v in os.environ.items() if k not in VARIABLES}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=REPO,
                         env={**env, "PYTHONPATH": str(REPO)}, check=True).stdout
    got = json.loads(out.strip().splitlines()[-1])
    assert got == {"loaded": [], "is_resource": True, "same": True, "run": "lazy", "target_info": True}
