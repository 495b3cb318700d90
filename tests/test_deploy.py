"""docker-compose.yml, the Dockerfile, the Prometheus configs and the Kubernetes examples, checked without a
Docker engine or a cluster: structure, every mounted path, cross-references between files, promtool, and a real
Prometheus started on prometheus/prometheus.yml."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from rl_otel.cli import _parser
from rl_otel.ops.rules import recording_rules
from rl_otel.ops.thresholds import DEFAULT
from tests.promtools import free_port, require_binary

pytestmark = pytest.mark.slow  # the slow layer (tests/conftest.py)

ROOT = Path(__file__).resolve().parent.parent


def _yaml(rel: str) -> Any:
    return yaml.safe_load((ROOT / rel).read_text())


def _docs(rel: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((ROOT / rel).read_text()) if d]


@pytest.fixture(scope="module")
def compose() -> dict:
    return _yaml("docker-compose.yml")


def _mounts(service: dict) -> dict[str, Path]:
    """``{container path: host path}`` of a service's bind mounts (named volumes, shared between services, are
    left out; tests/test_deploy.py checks each is declared)."""
    out = {}
    for volume in service.get("volumes", []):
        host, container = volume.split(":")[:2]
        if host in _yaml("docker-compose.yml").get("volumes", {}):
            continue
        assert host.startswith("./"), f"{volume}: bind mounts, relative to the repository, or a declared volume"
        out[container] = ROOT / host
    return out


def _host_path(service: dict, container_path: str) -> Path:
    for container, host in sorted(_mounts(service).items(), key=lambda kv: -len(kv[0])):
        if container_path == container or container_path.startswith(container.rstrip("/") + "/"):
            return host / container_path[len(container):].lstrip("/")
    raise AssertionError(f"{container_path} is not mounted")


def _require_alertmanager(*names: str) -> str:
    """The first of ``names`` installed (Debian's prometheus-alertmanager ships amtool and prometheus-alertmanager);
    as tests.promtools.require_binary: in CI a missing one fails the test (scripts/test.sh installs the package),
    elsewhere it skips."""
    path = next((p for p in map(shutil.which, names) if p), None)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{' or '.join(names)} is not installed; scripts/test.sh installs the Debian "
                        "'prometheus-alertmanager' package")
        pytest.skip(f"{' or '.join(names)} not installed (apt-get install prometheus-alertmanager)")
    return path


def _flag(service: dict, flag: str) -> str:
    for arg in service["command"]:
        if arg.startswith(f"--{flag}="):
            return arg.split("=", 1)[1]
    raise AssertionError(f"--{flag} not set")


def test_compose_services_images_and_ports(compose):
    services = compose["services"]
    assert set(services) == {"trainer", "watcher", "prometheus", "grafana", "alertmanager", "otel-collector", "tempo"}
    for name, svc in services.items():
        assert "image" in svc or "build" in svc, name
        if "image" in svc and "build" not in svc:
            assert re.fullmatch(r"[\w./-]+:v?\d+\.\d+\.\d+", svc["image"]), f"{name}: pin the image version"
        for port in svc.get("ports", []):  # the watcher publishes nothing: Prometheus reaches it by name
            host, container = port.split(":")
            assert host == container and container.isdigit()
    assert services["trainer"]["command"][:2] == ["rl-otel", "demo"]
    assert "--port" in services["trainer"]["command"]
    for name, svc in services.items():
        assert set(svc.get("depends_on", [])) <= set(services) - {name}, name
    assert re.fullmatch(r"otel/opentelemetry-collector-contrib:\d+\.\d+\.\d+", services["otel-collector"]["image"])
    assert re.fullmatch(r"grafana/tempo:\d+\.\d+\.\d+", services["tempo"]["image"])
    # the trainer pushes its phase spans to the Collector's OTLP/HTTP port and leaves its metrics to the scrape
    env = services["trainer"]["environment"]
    assert env["OTEL_TRACES_EXPORTER"] == "otlp"
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector:4318"
    assert "4318:4318" in services["otel-collector"]["ports"]
    assert env.get("OTEL_METRICS_EXPORTER", "none") == "none"  # unset: rl_otel pushes no metrics


def test_compose_trainer_environment_configures_spans_only(compose):
    """rl_otel reads the trainer's variables as meant: spans over OTLP/HTTP to the Collector, no metric push."""
    from rl_otel._internal.exporters.otlp import otlp_config

    env = {k: str(v) for k, v in compose["services"]["trainer"]["environment"].items()}
    config = otlp_config(None, env=env)
    assert config is not None and config.metrics is None and config.traces is not None
    assert config.traces.protocol == "http/protobuf"
    assert config.traces.endpoint == "http://otel-collector:4318/v1/traces"


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
        # nothing listed by default (see test_no_shipped_target_answers_nowhere); the examples are valid files
        examples = [p for pattern in sd["files"] for p in config_path.parent.glob(pattern + ".example")]
        assert examples
        for f in examples:
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
    lines = [x.strip() for x in (ROOT / "Dockerfile").read_text().replace("\\\n", " ").splitlines()
             if x.strip() and not x.startswith("#")]
    assert lines[0] == "FROM python:3.11-slim"
    for line in lines:
        if line.startswith("COPY "):
            for src in shlex.split(line)[1:-1]:
                assert (ROOT / src).exists(), src
    install = next(x for x in lines if "pip install" in x)
    assert "-c requirements-test.txt" in install and "'.[torch,tensorboard,otlp]'" in install
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in install  # CPU torch, not the CUDA wheels
    extras = (ROOT / "pyproject.toml").read_text()
    for extra in ("torch", "tensorboard", "otlp"):  # otlp: the spans the trainer pushes (OTEL_TRACES_EXPORTER)
        assert re.search(rf"^{extra} = \[", extras, re.M), extra
    cmd = json.loads(next(x for x in lines if x.startswith("CMD "))[4:])
    assert cmd[:2] == compose["services"]["trainer"]["command"][:2] == ["rl-otel", "demo"]
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert "rl_otel" not in ignored and "pyproject.toml" not in ignored


@pytest.mark.parametrize("config", ["prometheus/prometheus.yml", "prometheus/prometheus-localhost.yml"])
def test_promtool_check_config_is_clean(config):
    """The compose config and the workstation one (docs/without-docker.md): clean, every rule file loaded."""
    proc = subprocess.run([require_binary("promtool"), "check", "config", config], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "WARNING" not in proc.stdout + proc.stderr
    assert f"SUCCESS: {len(recording_rules())} rules found" in proc.stdout
    assert f"SUCCESS: {_alert_count()} rules found" in proc.stdout


def test_the_workstation_config_scrapes_this_machine_only_under_rl_otel_jobs():
    """docs/without-docker.md's Prometheus: the training processes and watch sidecars of this machine, through
    the files they write (file_sd: a finished run leaves the scrape), and a process on the default port."""
    jobs = {j["job_name"]: j for j in _yaml("prometheus/prometheus-localhost.yml")["scrape_configs"]}
    assert all(name.startswith("rl_otel") and job.get("honor_labels") for name, job in jobs.items()), jobs
    assert jobs["rl_otel_file_sd"]["file_sd_configs"] == [{"files": ["targets/*.json"], "refresh_interval": "5s"}]
    assert jobs["rl_otel"]["static_configs"] == [{"targets": ["127.0.0.1:9464"]}]
    assert "prometheus-localhost.yml" in (ROOT / "docs/without-docker.md").read_text()


def test_prometheus_runs_on_the_shipped_config(tmp_path):
    """The compose config, loaded by a real Prometheus: rules load, every job has targets (down: no DNS here)."""
    port = free_port()
    log = open(tmp_path / "log", "w")  # noqa: SIM115 (closed in finally, after the process)
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
                if jobs == {"rl_otel"} and rules:
                    break  # the file_sd jobs (prometheus/targets, the compose watcher's) list nothing here
            except OSError:
                pass
            time.sleep(0.3)
        assert proc.poll() is None
        assert jobs == {"rl_otel"}  # the file_sd job lists nothing until a targets file is added
        engine_rules = sum(len(g["rules"]) for g in _yaml("prometheus/rules/rl_otel_engines.yml")["groups"])
        assert sum(len(g["rules"]) for g in rules) == _alert_count() + len(recording_rules()) + engine_rules
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


def test_kubernetes_pod_annotation_config(tmp_path):
    config = _yaml("prometheus/prometheus-kubernetes.yml")
    job = config["scrape_configs"][0]
    assert job["job_name"].startswith("rl_otel") and job["kubernetes_sd_configs"] == [{"role": "pod"}]
    # the rules' alerts go somewhere
    (am,) = config["alerting"]["alertmanagers"]
    assert am["static_configs"][0]["targets"] == ["alertmanager.monitoring.svc:9093"]
    pod = next(d for d in _docs("deploy/kubernetes/trainer.yaml") if d["kind"] == "Job")["spec"]["template"]
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
    (job,) = _docs("deploy/kubernetes/trainer.yaml")
    pod_labels = job["spec"]["template"]["metadata"]["labels"]
    port_names = {p["name"] for c in job["spec"]["template"]["spec"]["containers"] for p in c["ports"]}
    namespace = job["metadata"]["namespace"]

    pm = _docs("deploy/kubernetes/podmonitor.yaml")[0]
    assert (pm["apiVersion"], pm["kind"]) == ("monitoring.coreos.com/v1", "PodMonitor")
    assert pm["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert namespace in pm["spec"]["namespaceSelector"]["matchNames"]
    for ep in pm["spec"]["podMetricsEndpoints"]:
        assert ep["port"] in port_names and ep["path"] == "/metrics"
        jobs = [r["replacement"] for r in ep["relabelings"] if r["targetLabel"] == "job"]
        assert jobs and all(j.startswith("rl_otel") for j in jobs)
    # the operator picks monitors and rules up by the same release label
    rule = _docs("deploy/kubernetes/prometheusrule.yaml")[0]
    assert pm["metadata"]["labels"]["release"] == rule["metadata"]["labels"]["release"]


def test_kubernetes_scrapes_each_pod_once():
    """Applying every monitor shipped must not scrape a pod twice: one monitor kind selects the trainer."""
    monitors = [d for p in sorted((ROOT / "deploy/kubernetes").glob("*.yaml")) for d in _docs(str(p.relative_to(ROOT)))
                if d["kind"] in ("PodMonitor", "ServiceMonitor")]
    assert [m["kind"] for m in monitors] == ["PodMonitor"]
    assert not [d for d in _docs("deploy/kubernetes/trainer.yaml") if d["kind"] == "Service"
                and any(p.get("name") == "metrics" for p in d["spec"].get("ports", []))]


def test_kubernetes_trainer_is_an_indexed_job_ranked_by_its_completion_index():
    """Training runs to completion: a Job (no restart retraining from step 0 under the same run name), one pod per
    rank, RANK from the completion index (not one hard-coded rank for every pod)."""
    (job,) = _docs("deploy/kubernetes/trainer.yaml")
    assert (job["apiVersion"], job["kind"]) == ("batch/v1", "Job")
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"] >= 2
    assert spec["backoffLimit"] == 0 and spec["template"]["spec"]["restartPolicy"] == "Never"
    (container,) = spec["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["RANK"]["valueFrom"]["fieldRef"]["fieldPath"] == \
        "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    assert env["WORLD_SIZE"]["value"] == str(spec["completions"])
    assert env["RL_OTEL_RUN"]["value"]
    assert container["command"][:2] == ["rl-otel", "demo"]
    assert _linger(container["command"]) < DEFAULT.stall_seconds


def test_compose_watcher_follows_the_trainers_files_and_publishes_its_runs(compose):
    """The compose `watcher` reads the volume the trainer writes its TensorBoard files to and publishes each run
    for Prometheus' rl_otel_watch file_sd job through a volume both share, reachable by the service name."""
    services = compose["services"]
    trainer, watcher, prom = services["trainer"], services["watcher"], services["prometheus"]
    volumes = {name: dict(v.split(":")[:2] for v in svc["volumes"]) for name, svc in
               (("trainer", trainer), ("watcher", watcher), ("prometheus", prom))}
    args = _parser().parse_args(watcher["command"][1:])
    log_dir = trainer["command"][trainer["command"].index("--log-dir") + 1]
    assert volumes["trainer"]["logs"] == log_dir == args.paths[0] == volumes["watcher"]["logs"]
    assert volumes["watcher"]["watch-targets"] == args.file_sd and args.advertise_host == "watcher"
    job = next(j for j in _yaml("prometheus/prometheus.yml")["scrape_configs"] if j["job_name"] == "rl_otel_watch")
    (sd,) = job["file_sd_configs"]
    assert volumes["prometheus"]["watch-targets"] == "/etc/prometheus/watch-targets"  # beside prometheus.yml
    assert sd["files"] == ["watch-targets/*.json"] and job["honor_labels"] is True
    assert args.expire_after is not None and args.expire_after < DEFAULT.stall_seconds  # a finished run never pages


def test_kubernetes_watch_sidecar_serves_the_trainers_log_volume():
    """The sidecar example: `rl-otel watch` follows the directory the trainer writes (one shared volume), serves
    on the annotated port, and is a native sidecar (the Job completes when the trainer does)."""
    (job,) = _docs("deploy/kubernetes/watch-sidecar.yaml")
    assert (job["apiVersion"], job["kind"]) == ("batch/v1", "Job")
    pod = job["spec"]["template"]
    (sidecar,) = pod["spec"]["initContainers"]
    (trainer,) = pod["spec"]["containers"]
    assert sidecar["restartPolicy"] == "Always" and pod["spec"]["restartPolicy"] == "Never"
    command = sidecar["command"]
    assert command[:2] == ["rl-otel", "watch"]
    args = _parser().parse_args(command[1:])
    mounts = {m["name"]: m["mountPath"] for m in sidecar["volumeMounts"]}
    trainer_mounts = {m["name"]: m["mountPath"] for m in trainer["volumeMounts"]}
    assert mounts == trainer_mounts and {v["name"] for v in pod["spec"]["volumes"]} == set(mounts)
    (logs,) = mounts.values()
    assert args.paths == [logs] and str(args.state).startswith(logs)
    assert trainer["command"][trainer["command"].index("--log-dir") + 1] == logs
    assert str(args.port) == pod["metadata"]["annotations"]["prometheus.io/port"]
    assert [p["containerPort"] for p in sidecar["ports"]] == [args.port]
    # the trainer's own endpoint (the demo's) is not what the annotation publishes: each value scraped once
    assert trainer["command"][trainer["command"].index("--host") + 1] == "127.0.0.1"
    # no monitor selects it: the pod annotation is its only scrape
    monitors = [d for p in sorted((ROOT / "deploy/kubernetes").glob("*.yaml")) for d in _docs(str(p.relative_to(ROOT)))
                if d["kind"] in ("PodMonitor", "ServiceMonitor")]
    assert all(m["spec"]["selector"]["matchLabels"].items() - pod["metadata"]["labels"].items() for m in monitors)


def _alert_count() -> int:
    doc = _yaml("prometheus/rules/rl_otel_alerts.yml")
    return sum(len(g["rules"]) for g in doc["groups"])


def _linger(command: list[str]) -> float:
    return float(command[command.index("--linger") + 1]) if "--linger" in command else 0.0


# -- prometheus/targets: nothing that answers nowhere ------------------------------------------------------------

def test_no_shipped_target_answers_nowhere(compose):
    """A target listed by default that nothing serves pages (RLScrapeTargetDown) and hides RLScrapeTargetAbsent;
    host.docker.internal:9464 was also the compose trainer's own published port: scraped twice."""
    config = _yaml("prometheus/prometheus.yml")
    (sd_job,) = [j for j in config["scrape_configs"] if j["job_name"] == "rl_otel_file_sd"]
    listed = [p for sd in sd_job["file_sd_configs"] for pattern in sd["files"]
              for p in (ROOT / "prometheus").glob(pattern)]
    assert listed and all(json.loads(p.read_text()) == [] for p in listed), listed
    published = {p.split(":")[0] for p in compose["services"]["trainer"]["ports"]}
    for example in (ROOT / "prometheus/targets").glob("*.example"):
        for group in json.loads(example.read_text()):
            assert all(t.rsplit(":", 1)[1] not in published for t in group["targets"]), example


def test_file_sd_keeps_the_series_run_and_rank(tmp_path):
    """The shipped file_sd job, scraping a rank that published itself with prometheus={"file_sd": DIR}: the series
    keep their run and rank (honor_labels), no exported_run / exported_rank."""
    import rl_otel
    from tests.promtools import PrometheusServer

    (sd_job,) = [j for j in _yaml("prometheus/prometheus.yml")["scrape_configs"] if j["job_name"] == "rl_otel_file_sd"]
    assert sd_job["honor_labels"] is True
    targets = tmp_path / "targets"
    targets.mkdir()
    job = {**sd_job, "file_sd_configs": [{**sd_job["file_sd_configs"][0], "files": [str(targets / "*.json")]}]}
    server = PrometheusServer(tmp_path, scrape_configs=[job])
    try:
        with rl_otel.init(run="fsd-run", rank=3, handle_sigterm=False,
                          prometheus={"host": "127.0.0.1", "port": 0, "file_sd": str(targets)}) as tel:
            tel.log({"critic/score/mean": 0.5}, step=7)
            got: list[Any] = []
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not got:
                got = server.query('rl_critic_score{run="fsd-run"}')
                time.sleep(0.3)
        assert got, "the file_sd target was never scraped"
        labels = got[0]["metric"]
        assert labels["run"] == "fsd-run" and labels["rank"] == "3" and labels["job"] == sd_job["job_name"]
        assert not [k for k in labels if k.startswith("exported_")], labels
    finally:
        server.close()


# -- docker-compose: the demo stack shows a healthy run, it does not page -----------------------------------------

def _stall_alerts_of_a_finished_demo_run(tmp_path: Path, command: list[str]) -> str:
    """promtool, on the shipped rules: a demo run trains one minute, then serves its last step for --linger
    seconds, then its endpoint closes (the series go stale). RLTrainerStalled must never fire in the next hour."""
    linger_points = int(_linger(command) // 15)
    sel = 'job="rl_otel", instance="trainer:9464", run="compose-demo-1", rank="0"'
    series = [{"series": f"rl_last_step_timestamp_seconds{{{sel}}}",
               "values": f"0+15x4 60x{linger_points} stale"},
              {"series": f"rl_step{{{sel}}}", "values": f"0+50x4 200x{linger_points} stale"}]
    horizon = 4 * 60 + linger_points * 15 + 3600
    cases = [{"eval_time": f"{t}s", "alertname": "RLTrainerStalled", "exp_alerts": []}
             for t in range(0, horizon, 300)]
    doc = {"rule_files": [str(ROOT / "prometheus/rules/rl_otel_recording.yml"),
                          str(ROOT / "prometheus/rules/rl_otel_alerts.yml")],
           "evaluation_interval": "15s",
           "tests": [{"interval": "15s", "input_series": series, "alert_rule_test": cases}]}
    path = tmp_path / "demo_stall_test.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    proc = subprocess.run([require_binary("promtool"), "test", "rules", str(path)], capture_output=True, text=True,
                          timeout=120)
    return "" if proc.returncode == 0 else proc.stdout + proc.stderr


def test_the_compose_demo_never_pages_as_stalled(compose, tmp_path):
    command = compose["services"]["trainer"]["command"]
    assert command[command.index("--repeat") + 1] == "0"  # runs back to back: always a live run to look at
    assert 0 < _linger(command) < DEFAULT.stall_seconds
    assert _stall_alerts_of_a_finished_demo_run(tmp_path, command) == ""
    # the check itself: a run serving its last step for an hour (the old --linger 3600) does page
    assert "RLTrainerStalled" in _stall_alerts_of_a_finished_demo_run(tmp_path, ["--linger", "3600"])


# -- Alertmanager --------------------------------------------------------------------------------------------------

def _matches(matcher: str, labels: dict[str, str]) -> bool:
    m = re.fullmatch(r'(\w+)\s*(=~|!~|!=|=)\s*"(.*)"', matcher)
    assert m, matcher
    name, op, value = m.groups()
    have = labels.get(name, "")
    return {"=": have == value, "!=": have != value, "=~": re.fullmatch(value, have) is not None,
            "!~": re.fullmatch(value, have) is None}[op]


def _inhibited(config: dict, alerts: list[dict[str, str]]) -> list[dict[str, str]]:
    """Alertmanager's inhibition: a target alert is muted by a firing source alert whose ``equal`` labels have the
    same values (a missing label is the empty value)."""
    out = []
    for target in alerts:
        for rule in config.get("inhibit_rules", []):
            if not all(_matches(m, target) for m in rule["target_matchers"]):
                continue
            if any(source is not target and all(_matches(m, source) for m in rule["source_matchers"])
                   and all(source.get(k, "") == target.get(k, "") for k in rule["equal"]) for source in alerts):
                out.append(target)
                break
    return out


INHIBIT_CASE = [  # one job, several runs: only run-a stalled, and one file_sd rank of run-b down
    {"alertname": "RLTrainerStalled", "severity": "critical", "job": "rl_otel_pods", "run": "run-a"},
    {"alertname": "RLKLRunaway", "severity": "warning", "job": "rl_otel_pods", "run": "run-a"},
    {"alertname": "RLTelemetryErrors", "severity": "info", "job": "rl_otel_pods", "run": "run-a", "sink": "input",
     "reason": "bad_value"},
    {"alertname": "RLKLRunaway", "severity": "warning", "job": "rl_otel_pods", "run": "run-c"},
    {"alertname": "RLEntropyCollapse", "severity": "warning", "job": "rl_otel_pods", "run": "run-d"},
    {"alertname": "RLScrapeTargetDown", "severity": "critical", "job": "rl_otel_file_sd", "instance": "n1:9464",
     "run": "run-b", "rank": "3"},
    {"alertname": "RLClipFractionHigh", "severity": "warning", "job": "rl_otel_file_sd", "run": "run-b"},
    {"alertname": "RLClipFractionHigh", "severity": "warning", "job": "rl_otel_file_sd", "run": "run-e"},
    {"alertname": "RLScrapeTargetDown", "severity": "critical", "job": "rl_otel", "instance": "trainer:9464"},
    {"alertname": "RLRewardCollapse", "severity": "warning", "job": "rl_otel", "run": "compose-demo-1"},
    # run-f's rollout engine is alive but hung: the trainer's goodput drop is its consequence
    {"alertname": "RLProcessNoProgress", "severity": "critical", "job": "rl_otel_pods", "run": "run-f",
     "role": "rollout", "rank": "0", "instance": "n2:9464"},
    {"alertname": "RLGoodputDrop", "severity": "warning", "job": "rl_otel_pods", "run": "run-f", "role": "trainer"},
    {"alertname": "RLGoodputDrop", "severity": "warning", "job": "rl_otel_pods", "run": "run-g", "role": "trainer"},
]
MUTED = [("RLKLRunaway", "run-a"), ("RLTelemetryErrors", "run-a"), ("RLClipFractionHigh", "run-b"),
         ("RLGoodputDrop", "run-f")]


def test_an_alert_mutes_only_its_own_run():
    """A stalled run or a down rank explains its own run's warnings, never those of the job's other runs (the old
    `equal: [job]` muted every run sharing the job: every pod of a Kubernetes job)."""
    config = _yaml("alertmanager/alertmanager.yml")
    for rule in config["inhibit_rules"]:
        assert "run" in rule["equal"] and "job" in rule["equal"], rule
    muted = [(a["alertname"], a["run"]) for a in _inhibited(config, INHIBIT_CASE)]
    assert muted == MUTED


def test_amtool_checks_the_alertmanager_config():
    amtool = _require_alertmanager("amtool")
    proc = subprocess.run([amtool, "check-config", str(ROOT / "alertmanager/alertmanager.yml")], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0 and "SUCCESS" in proc.stdout, proc.stdout + proc.stderr


def test_a_real_alertmanager_mutes_only_the_stalled_run(tmp_path):
    """The same case posted to a real Alertmanager running the shipped config."""
    binary = _require_alertmanager("alertmanager", "prometheus-alertmanager")
    port = free_port()
    log = open(tmp_path / "log", "w")  # noqa: SIM115 (closed in finally, after the process)
    proc = subprocess.Popen([binary, f"--config.file={ROOT / 'alertmanager/alertmanager.yml'}",
                             f"--storage.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
                             "--cluster.listen-address="], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/api/v2/alerts"
    try:
        body = json.dumps([{"labels": a} for a in INHIBIT_CASE]).encode()
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(urllib.request.Request(url, data=body, method="POST",
                                                              headers={"Content-Type": "application/json"}),
                                       timeout=2).read()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "alertmanager did not start"
                time.sleep(0.2)
        deadline, muted = time.monotonic() + 30, []
        while time.monotonic() < deadline:
            alerts = json.loads(urllib.request.urlopen(url, timeout=2).read())
            muted = sorted((a["labels"]["alertname"], a["labels"]["run"]) for a in alerts
                           if a["status"]["inhibitedBy"])
            if len(alerts) == len(INHIBIT_CASE) and muted == sorted(MUTED):
                break
            time.sleep(0.3)
        assert muted == sorted(MUTED)
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()
