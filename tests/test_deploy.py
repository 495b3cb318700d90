"""docker-compose.yml, the Dockerfile, the Prometheus configs and the Kubernetes examples, checked without a
Docker engine or a cluster: structure, every mounted path, cross-references between files, promtool, and a real
Prometheus started on prometheus/prometheus.yml."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from rl_otel.ops.rules import recording_rules
from tests.promtools import free_port, require_binary

ROOT = Path(__file__).resolve().parent.parent


def _yaml(rel: str) -> object:
    return yaml.safe_load((ROOT / rel).read_text())


def _docs(rel: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((ROOT / rel).read_text()) if d]


@pytest.fixture(scope="module")
def compose() -> dict:
    return _yaml("docker-compose.yml")


def _mounts(service: dict) -> dict[str, Path]:
    """``{container path: host path}`` of a service's bind mounts."""
    out = {}
    for volume in service.get("volumes", []):
        host, container = volume.split(":")[:2]
        assert host.startswith("./"), f"{volume}: bind mounts only, relative to the repository"
        out[container] = ROOT / host
    return out


def _host_path(service: dict, container_path: str) -> Path:
    for container, host in sorted(_mounts(service).items(), key=lambda kv: -len(kv[0])):
        if container_path == container or container_path.startswith(container.rstrip("/") + "/"):
            return host / container_path[len(container):].lstrip("/")
    raise AssertionError(f"{container_path} is not mounted")


def _flag(service: dict, flag: str) -> str:
    for arg in service["command"]:
        if arg.startswith(f"--{flag}="):
            return arg.split("=", 1)[1]
    raise AssertionError(f"--{flag} not set")


def test_compose_services_images_and_ports(compose):
    services = compose["services"]
    assert set(services) == {"trainer", "prometheus", "grafana", "alertmanager"}
    for name, svc in services.items():
        assert "image" in svc or "build" in svc, name
        if "image" in svc and "build" not in svc:
            assert re.fullmatch(r"[\w./-]+:v?\d+\.\d+\.\d+", svc["image"]), f"{name}: pin the image version"
        for port in svc["ports"]:
            host, container = port.split(":")
            assert host == container and container.isdigit()
    assert services["trainer"]["command"][:2] == ["rl-otel", "demo"]
    assert "--port" in services["trainer"]["command"]
    for dep in services["prometheus"]["depends_on"] + services["grafana"]["depends_on"]:
        assert dep in services


def test_every_mounted_path_exists(compose):
    for name, svc in compose["services"].items():
        for container, host in _mounts(svc).items():
            assert host.exists(), f"{name}: {host} (mounted at {container}) is missing"


def test_services_point_at_each_other(compose):
    services = compose["services"]
    trainer_port = services["trainer"]["command"][services["trainer"]["command"].index("--port") + 1]
    prom = services["prometheus"]
    config_path = _host_path(prom, _flag(prom, "config.file"))
    config = yaml.safe_load(config_path.read_text())
    static = [t for job in config["scrape_configs"] for sc in job.get("static_configs", []) for t in sc["targets"]]
    assert f"trainer:{trainer_port}" in static
    assert all(job["job_name"].startswith("rl_otel") for job in config["scrape_configs"])
    am = config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"][0]
    assert am == "alertmanager:" + services["alertmanager"]["ports"][0].split(":")[1]
    for rule_file in config["rule_files"]:
        assert (config_path.parent / rule_file).is_file()
    for sd in (s for job in config["scrape_configs"] for s in job.get("file_sd_configs", [])):
        files = [p for pattern in sd["files"] for p in config_path.parent.glob(pattern)]
        assert files
        for f in files:
            groups = json.loads(f.read_text())
            assert all(g["targets"] and all(re.fullmatch(r"[\w.-]+:\d+", t) for t in g["targets"]) for g in groups)
    am_svc = services["alertmanager"]
    am_config = yaml.safe_load(_host_path(am_svc, _flag(am_svc, "config.file")).read_text())
    receivers = {r["name"] for r in am_config["receivers"]}
    assert am_config["route"]["receiver"] in receivers
    assert all(r["receiver"] in receivers for r in am_config["route"].get("routes", []))
    grafana = services["grafana"]
    ds_file = _host_path(grafana, "/etc/grafana/provisioning/datasources/prometheus.yml")
    url = yaml.safe_load(ds_file.read_text())["datasources"][0]["url"]
    assert url == "http://prometheus:" + prom["ports"][0].split(":")[1]
    provider = yaml.safe_load(_host_path(grafana, "/etc/grafana/provisioning/dashboards/rl_otel.yml").read_text())
    dash_dir = _host_path(grafana, provider["providers"][0]["options"]["path"])
    assert sorted(dash_dir.glob("*.json")) and all(json.loads(p.read_text())["uid"] for p in dash_dir.glob("*.json"))
    home = _host_path(grafana, grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"])
    assert home.is_file()


def test_dockerfile_builds_the_trainer_from_the_repository(compose):
    assert compose["services"]["trainer"]["build"] == "."
    lines = [l.strip() for l in (ROOT / "Dockerfile").read_text().replace("\\\n", " ").splitlines()
             if l.strip() and not l.startswith("#")]
    assert lines[0] == "FROM python:3.11-slim"
    for line in lines:
        if line.startswith("COPY "):
            for src in shlex.split(line)[1:-1]:
                assert (ROOT / src).exists(), src
    install = next(l for l in lines if "pip install" in l)
    assert "-c requirements-test.txt" in install and "'.[torch,tensorboard]'" in install
    extras = (ROOT / "pyproject.toml").read_text()
    assert re.search(r"^torch = \[", extras, re.M) and re.search(r"^tensorboard = \[", extras, re.M)
    cmd = json.loads(next(l for l in lines if l.startswith("CMD "))[4:])
    assert cmd == compose["services"]["trainer"]["command"]
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert "rl_otel" not in ignored and "pyproject.toml" not in ignored


def test_promtool_check_config_is_clean():
    proc = subprocess.run([require_binary("promtool"), "check", "config", "prometheus/prometheus.yml"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "WARNING" not in proc.stdout + proc.stderr
    assert f"SUCCESS: {len(recording_rules())} rules found" in proc.stdout and "SUCCESS: 14 rules found" in proc.stdout


def test_prometheus_runs_on_the_shipped_config(tmp_path):
    """The compose config, loaded by a real Prometheus: rules load, every job has targets (down: no DNS here)."""
    port = free_port()
    log = open(tmp_path / "log", "w")
    proc = subprocess.Popen([require_binary("prometheus"), "--config.file=prometheus/prometheus.yml",
                             f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}/api/v1"
        deadline, jobs = time.monotonic() + 30, set()
        while time.monotonic() < deadline:
            try:
                rules = json.loads(urllib.request.urlopen(f"{url}/rules", timeout=2).read())["data"]["groups"]
                targets = json.loads(urllib.request.urlopen(f"{url}/targets", timeout=2).read())["data"]
                jobs = {t["labels"]["job"] for t in targets["activeTargets"]}
                if jobs == {"rl_otel", "rl_otel_file_sd"}:
                    break
            except OSError:
                pass
            time.sleep(0.3)
        assert proc.poll() is None
        assert jobs == {"rl_otel", "rl_otel_file_sd"}
        assert sorted(len(g["rules"]) for g in rules) == sorted([14, len(recording_rules())])
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


def test_kubernetes_pod_annotation_config(tmp_path):
    config = _yaml("prometheus/prometheus-kubernetes.yml")
    job = config["scrape_configs"][0]
    assert job["job_name"].startswith("rl_otel") and job["kubernetes_sd_configs"] == [{"role": "pod"}]
    pod = next(d for d in _docs("deploy/kubernetes/trainer.yaml") if d["kind"] == "Deployment")["spec"]["template"]
    annotations = pod["metadata"]["annotations"]
    # the relabelling, applied by hand to the example pod: kept, with the annotated port
    meta = {"__meta_kubernetes_pod_annotation_" + re.sub(r"[^\w]", "_", k): v for k, v in annotations.items()}
    meta["__address__"] = "10.1.2.3:8080"
    meta["__meta_kubernetes_pod_phase"] = "Running"
    for rule in job["relabel_configs"]:
        value = ";".join(meta.get(s, "") for s in rule.get("source_labels", []))
        m = re.fullmatch(rule.get("regex", "(.*)"), value)
        action = rule.get("action", "replace")
        if action == "keep":
            assert m, rule
        elif action == "drop":
            assert not m, rule
        elif m:
            meta[rule["target_label"]] = m.expand(rule.get("replacement", "$1").replace("$", "\\"))
    assert meta["__address__"] == "10.1.2.3:" + annotations["prometheus.io/port"]
    assert meta["__metrics_path__"] == "/metrics"
    # promtool on the same file with the pod discovery swapped for a static target (Debian's promtool is built
    # without Kubernetes discovery); relabel configs and rule files are still checked
    job = dict(job)
    job.pop("kubernetes_sd_configs")
    job["static_configs"] = [{"targets": ["10.1.2.3:9464"]}]
    config["scrape_configs"] = [job]
    config["rule_files"] = [str(ROOT / "prometheus" / f) for f in config["rule_files"]]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    proc = subprocess.run([require_binary("promtool"), "check", "config", str(path)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_kubernetes_monitors_select_the_trainer():
    trainer = {d["kind"]: d for d in _docs("deploy/kubernetes/trainer.yaml")}
    deployment, service = trainer["Deployment"], trainer["Service"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    port_names = {p["name"] for c in deployment["spec"]["template"]["spec"]["containers"] for p in c["ports"]}
    namespace = deployment["metadata"]["namespace"]

    pm = _docs("deploy/kubernetes/podmonitor.yaml")[0]
    assert (pm["apiVersion"], pm["kind"]) == ("monitoring.coreos.com/v1", "PodMonitor")
    assert pm["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert namespace in pm["spec"]["namespaceSelector"]["matchNames"]
    for ep in pm["spec"]["podMetricsEndpoints"]:
        assert ep["port"] in port_names and ep["path"] == "/metrics"
        jobs = [r["replacement"] for r in ep["relabelings"] if r["targetLabel"] == "job"]
        assert jobs and all(j.startswith("rl_otel") for j in jobs)

    sm = _docs("deploy/kubernetes/servicemonitor.yaml")[0]
    assert (sm["apiVersion"], sm["kind"]) == ("monitoring.coreos.com/v1", "ServiceMonitor")
    assert sm["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert namespace in sm["spec"]["namespaceSelector"]["matchNames"]
    service_ports = {p["name"] for p in service["spec"]["ports"]}
    assert all(p["targetPort"] in port_names for p in service["spec"]["ports"])
    for ep in sm["spec"]["endpoints"]:
        assert ep["port"] in service_ports
        assert all(r["replacement"].startswith("rl_otel") for r in ep["relabelings"] if r["targetLabel"] == "job")
    # the operator picks monitors and rules up by the same release label
    rule = _docs("deploy/kubernetes/prometheusrule.yaml")[0]
    assert pm["metadata"]["labels"]["release"] == sm["metadata"]["labels"]["release"] \
        == rule["metadata"]["labels"]["release"]
