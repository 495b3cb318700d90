"""The OTel Collector path (deploy/collector/otelcol-agent.yaml, Tempo, docker-compose.yml, the Grafana Tempo
datasource), checked without a Docker engine or an ``otelcol`` binary (neither is on the test machine; an
``otelcol-contrib`` on PATH also validates the config): every pipeline references defined components of the
contrib distribution, every address points at a compose service's listening port; and rl_otel's OTLP push,
configured as the compose trainer is, reaches a real OTLP/HTTP receiver with the phase spans and the labels the
remote-write exporter turns into ``job``/``instance``."""

from __future__ import annotations

import re
import shutil
import subprocess
import urllib.parse
from pathlib import Path

import pytest
import yaml

import rl_otel
from rl_otel.ops.rules import JOB_REGEX, NODE_LABEL
from tests.otlp_receiver import OtlpReceiver

pytestmark = pytest.mark.slow  # the slow layer (tests/conftest.py)

ROOT = Path(__file__).resolve().parent.parent
CONFIG = "deploy/collector/otelcol-agent.yaml"
# Component types of otelcol-contrib 0.111 this config may use (type = the part of an id before "/").
KNOWN = {"receivers": {"otlp"}, "processors": {"batch", "memory_limiter", "resource", "attributes"},
         "exporters": {"prometheusremotewrite", "otlp", "otlphttp", "debug"}, "extensions": {"health_check"}}
# How the compose trainer sends its spans to the Collector (spans only: its metrics are scraped).
TRAINER_OTLP_ENV = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel-collector:4318"}


def _yaml(rel: str) -> dict:
    return yaml.safe_load((ROOT / rel).read_text())


@pytest.fixture(scope="module")
def collector() -> dict:
    return _yaml(CONFIG)


@pytest.fixture(scope="module")
def compose() -> dict:
    return _yaml("docker-compose.yml")


def _host_port(endpoint: str) -> tuple[str, int]:
    parts = urllib.parse.urlsplit(endpoint if "//" in endpoint else f"//{endpoint}")
    assert parts.hostname and parts.port, endpoint
    return parts.hostname, parts.port


def _published(service: dict) -> set[int]:
    return {int(p.split(":")[1]) for p in service.get("ports", [])}


def test_every_pipeline_references_defined_known_components(collector):
    service = collector["service"]
    for kind in ("receivers", "processors", "exporters", "extensions"):
        for name in collector.get(kind, {}):
            assert name.split("/")[0] in KNOWN[kind], f"{kind}: {name} is no otelcol-contrib component used here"
    for ext in service.get("extensions", []):
        assert ext in collector["extensions"]
    pipelines = service["pipelines"]
    assert set(pipelines) == {"metrics", "traces"}
    used = set()
    for name, pipeline in pipelines.items():
        assert pipeline["receivers"] and pipeline["exporters"], name
        for kind in ("receivers", "processors", "exporters"):
            for component in pipeline.get(kind, []):
                assert component in collector[kind], f"pipeline {name}: {kind[:-1]} {component} is not defined"
                used.add((kind, component))
        # the memory limiter must come first, the batch processor last (the Collector's documented order)
        assert pipeline["processors"][0] == "memory_limiter" and pipeline["processors"][-1] == "batch"
    defined = {(kind, c) for kind in ("receivers", "processors", "exporters") for c in collector[kind]}
    assert defined == used, f"defined but unused: {defined - used}"
    assert pipelines["metrics"]["exporters"] == ["prometheusremotewrite"]
    assert [e.split("/")[0] for e in pipelines["traces"]["exporters"]] == ["otlp"]


def test_collector_sends_where_the_compose_services_listen(collector, compose):
    services = compose["services"]
    col = services["otel-collector"]
    mounted = {v.split(":")[1]: v.split(":")[0] for v in col["volumes"]}
    config_arg = next(a for a in col["command"] if a.startswith("--config="))
    assert (ROOT / mounted[config_arg.split("=", 1)[1]]).resolve() == (ROOT / CONFIG).resolve()
    protocols = collector["receivers"]["otlp"]["protocols"]
    assert {_host_port(p["endpoint"])[1] for p in protocols.values()} == {4317, 4318} <= _published(col)
    # metrics: remote write into the compose Prometheus, which must accept it
    rw = collector["exporters"]["prometheusremotewrite"]
    host, port = _host_port(rw["endpoint"])
    assert urllib.parse.urlsplit(rw["endpoint"]).path == "/api/v1/write"
    assert host == "prometheus" and port in _published(services["prometheus"])
    assert "--web.enable-remote-write-receiver" in services["prometheus"]["command"]
    assert rw["external_labels"] == {NODE_LABEL: "${env:NODE_NAME}"} and "NODE_NAME" in col["environment"]
    # spans: OTLP/gRPC into Tempo's distributor
    tempo_svc = services["tempo"]
    tempo_mounts = {v.split(":")[1]: v.split(":")[0] for v in tempo_svc["volumes"]}
    tempo_arg = next(a for a in tempo_svc["command"] if a.startswith("-config.file="))
    tempo = yaml.safe_load((ROOT / tempo_mounts[tempo_arg.split("=", 1)[1]]).read_text())
    [traces_exporter] = collector["service"]["pipelines"]["traces"]["exporters"]
    host, port = _host_port(collector["exporters"][traces_exporter]["endpoint"])
    assert host == "tempo"
    assert _host_port(tempo["distributor"]["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"])[1] == port
    # Grafana reads Tempo where it serves its API
    datasource = yaml.safe_load((ROOT / "grafana/provisioning/datasources/tempo.yml").read_text())["datasources"][0]
    assert datasource["type"] == "tempo" and _host_port(datasource["url"]) == ("tempo",
                                                                             tempo["server"]["http_listen_port"])
    assert tempo["server"]["http_listen_port"] in _published(tempo_svc)
    assert any(v.startswith("./grafana/provisioning:") for v in services["grafana"]["volumes"])
    prom_ds = yaml.safe_load((ROOT / "grafana/provisioning/datasources/prometheus.yml").read_text())["datasources"][0]
    assert datasource["jsonData"]["tracesToMetrics"]["datasourceUid"] == prom_ds["uid"]
    # the trainer, once its environment sends spans, sends them to this Collector
    env = services["trainer"].get("environment", {})
    if "OTEL_EXPORTER_OTLP_ENDPOINT" in env:
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == TRAINER_OTLP_ENV["OTEL_EXPORTER_OTLP_ENDPOINT"]


def test_otelcol_validates_the_config_when_installed():
    """``otelcol-contrib validate`` when the binary is there; it is not a Debian package, so CI checks the config
    structurally above (the component set, the references, the addresses) and reports here that it could not run."""
    binary = shutil.which("otelcol-contrib") or shutil.which("otelcol")
    if binary is None:
        assert not (ROOT / CONFIG).read_text().count("\t"), "YAML with tabs"
        yaml.safe_load((ROOT / CONFIG).read_text())  # at least it parses
        return
    proc = subprocess.run([binary, "validate", f"--config={ROOT / CONFIG}"], capture_output=True, text=True,
                          env={"NODE_NAME": "test", "PATH": "/usr/bin:/bin"}, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_trainers_otlp_setting_delivers_phase_spans_and_no_metrics(monkeypatch):
    """The compose trainer's variables (spans to the Collector, metrics left to the scrape) against a real receiver."""
    receiver = OtlpReceiver()
    try:
        for name, value in TRAINER_OTLP_ENV.items():
            monkeypatch.setenv(name, value.replace("http://otel-collector:4318", receiver.url))
        tel = rl_otel.init(run="traced", rank=1, role="actor_train", prometheus={"host": "127.0.0.1", "port": 0})
        with tel.phase("actor_train", "train_step", onload=lambda: None, offload=lambda: None):
            pass
        tel.log({"critic/score/mean": 0.5}, step=1)
        tel.close()  # flushes the span processor
        spans = {name: (attrs, span_id, parent, resource) for name, attrs, span_id, parent, resource in
                 receiver.spans()}
        assert {"actor_train/train_step", "onload", "execute", "offload"} <= set(spans)
        root_attrs, root_id, _, resource = spans["actor_train/train_step"]
        assert all(spans[child][2] == root_id for child in ("onload", "execute", "offload"))
        assert (root_attrs["cluster"], root_attrs["phase"]) == ("actor_train", "train_step")
        assert (resource["service.name"], resource["rl.run"], resource["rl.role"]) == ("rl_otel", "traced",
                                                                                       "actor_train")
        assert receiver.metrics == []  # the scrape has them; a push too would double every series
    finally:
        receiver.close()


def test_pushed_metrics_carry_what_remote_write_makes_job_run_and_rank_from():
    receiver = OtlpReceiver()
    try:
        tel = rl_otel.init(run="pushed", rank=3, prometheus=False, otlp={"endpoint": receiver.url, "interval_s": 60})
        tel.log({"critic/score/mean": 0.25, "actor/approxkl": 0.01}, step=4)
        tel.close()
        points = {p.metric: p for p in receiver.points()}
        score = points["rl_critic_score"]
        assert score.resource is not None
        assert (score.value, score.attributes["run"], score.attributes["rank"]) == (0.25, "pushed", "3")
        # prometheusremotewrite: job <- service.name, instance <- service.instance.id; the rules select job=~rl_otel.*
        assert re.fullmatch(JOB_REGEX, score.resource["service.name"])
        assert score.resource["service.instance.id"].endswith("/pushed/trainer/3")
        assert points["rl_step"].value == 4.0
    finally:
        receiver.close()
