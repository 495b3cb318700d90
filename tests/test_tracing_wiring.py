"""Tempo wired to the dashboards, checked as configuration (Tempo cannot run here): compose and the Kubernetes
manifests send the spans to a Tempo that Grafana knows under the uid the exemplars and the phases dashboard use."""

from __future__ import annotations

import json
import urllib.parse
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _docs(rel: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((ROOT / rel).read_text()) if d]


def _datasources(docs: list[dict]) -> dict[str, dict]:
    return {ds["uid"]: ds for d in docs for ds in d.get("datasources", [])}


def test_compose_prometheus_stores_exemplars_that_open_in_tempo():
    compose = _docs("docker-compose.yml")[0]["services"]
    assert "--enable-feature=exemplar-storage" in compose["prometheus"]["command"]
    assert "tempo" in compose and "tempo" in compose["grafana"]["depends_on"]
    sources = _datasources([d for p in sorted((ROOT / "grafana/provisioning/datasources").glob("*.yml"))
                            for d in _docs(str(p.relative_to(ROOT)))])
    assert sources["tempo"]["type"] == "tempo" and sources["tempo"]["url"] == "http://tempo:3200"
    (destination,) = sources["prometheus"]["jsonData"]["exemplarTraceIdDestinations"]
    assert destination == {"name": "trace_id", "datasourceUid": "tempo"}  # the exemplar's label (exemplars.py)


def test_phases_dashboard_shows_exemplars_and_links_to_the_step_traces():
    dashboard = json.loads((ROOT / "grafana/dashboards/rl-otel-phases.json").read_text())
    targets = [t for p in dashboard["panels"] for t in p.get("targets", [])]
    assert any(t.get("exemplar") and "rl_phase_duration_seconds_bucket" in t["expr"] for t in targets)
    (link,) = [link for link in dashboard["links"] if link["type"] == "link"]
    panes = json.loads(urllib.parse.unquote(link["url"].split("panes=", 1)[1]))
    (query,) = panes["traces"]["queries"]
    assert query["datasource"]["uid"] == "tempo" and 'name = "step"' in query["query"]
    assert "resource.rl.run" in query["query"]


def test_kubernetes_trainer_sends_spans_to_the_tempo_grafana_knows():
    docs = _docs("deploy/kubernetes/tempo.yaml")
    service = next(d for d in docs if d["kind"] == "Service")
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    assert ports == {"http": 3200, "otlp-grpc": 4317, "otlp-http": 4318}
    job = next(d for d in _docs("deploy/kubernetes/trainer.yaml") if d["kind"] == "Job")
    env = {e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    host = f"{service['metadata']['name']}.{service['metadata']['namespace']}"
    assert env["OTEL_TRACES_EXPORTER"] == "otlp"
    assert env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] == f"http://{host}:{ports['otlp-http']}/v1/traces"
    config = yaml.safe_load(next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "tempo")
                            ["data"]["tempo.yaml"])
    assert config["distributor"]["receivers"]["otlp"]["protocols"]["http"]["endpoint"].endswith(":4318")
    source = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"].get("labels", {}).get(
        "grafana_datasource") == "1")
    (ds,) = yaml.safe_load(source["data"]["tempo.yaml"])["datasources"]
    assert (ds["uid"], ds["url"]) == ("tempo", f"http://{host}:{ports['http']}")
