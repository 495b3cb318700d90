"""The rollout engines' rules and alerts (``rl_otel/ops/engines.py``): promtool-clean, each alert fires on its
broken engine runs and stays quiet on its healthy ones (``prometheus/tests/rl_otel_engines_test.yml``), and those
cases fail when an alert is broken."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from rl_otel.ops import engines, generate
from rl_otel.ops.thresholds import Thresholds
from tests.promtools import require_binary

ROOT = Path(__file__).resolve().parent.parent
RULE_FILE = "prometheus/rules/rl_otel_engines.yml"
TEST_FILE = "prometheus/tests/rl_otel_engines_test.yml"
ALERTS = [a.name for a in engines.alerts()]

pytestmark = pytest.mark.slow


def _promtool(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([require_binary("promtool"), *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def _tree(tmp: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / rel).write_text(text)
    return tmp


def test_the_engine_rules_are_promtool_clean_and_in_every_prometheus_config():
    proc = _promtool("check", "rules", RULE_FILE)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(engines.recording_rules()) + len(ALERTS)} rules found" in proc.stdout
    assert "WARNING" not in proc.stdout + proc.stderr
    for config in ("prometheus/prometheus.yml", "prometheus/central.yml", "prometheus/prometheus-kubernetes.yml"):
        assert "rules/rl_otel_engines.yml" in yaml.safe_load((ROOT / config).read_text())["rule_files"], config


def test_each_engine_alert_fires_on_its_broken_runs_and_not_on_its_healthy_ones():
    proc = _promtool("test", "rules", TEST_FILE)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = yaml.safe_load((ROOT / TEST_FILE).read_text())
    firing = {c["alertname"] for g in doc["tests"] for c in g["alert_rule_test"] if c["exp_alerts"]}
    quiet = {c["alertname"] for g in doc["tests"] for c in g["alert_rule_test"] if not c["exp_alerts"]}
    assert firing == quiet == set(ALERTS)
    # each alert's runs: one that fires, others that must not (their series are in the same group)
    for group in doc["tests"]:
        fired = {a["exp_labels"]["run"] for c in group["alert_rule_test"] for a in c["exp_alerts"]}
        runs = {m for s in group["input_series"] for m in re.findall(r'run="([^"]+)"', s["series"])}
        assert fired and runs - fired, (fired, runs)


def test_the_engine_rules_read_vllms_old_and_new_names_and_sglangs():
    text = (ROOT / RULE_FILE).read_text()
    for name in ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage",
                 "vllm:inter_token_latency_seconds_bucket", "vllm:time_per_output_token_seconds_bucket",
                 "sglang:num_retracted_requests_total", "sglang:num_running_reqs", "sglang:generation_tokens_total"):
        assert name in text, name
    doc = yaml.safe_load((ROOT / TEST_FILE).read_text())
    kv = next(g for g in doc["tests"] if g["alert_rule_test"][0]["alertname"] == "RLEngineKVCacheSaturated")
    fired = {a["exp_labels"]["run"] for c in kv["alert_rule_test"] for a in c["exp_alerts"]}
    assert fired == {"vllm-full", "vllm-old-names", "sglang-full"}


def _mutated(tmp_path: Path, alert: str, edit) -> subprocess.CompletedProcess:
    files = generate.render_all()
    doc = yaml.safe_load(files[RULE_FILE])
    for rule in (r for g in doc["groups"] for r in g["rules"]):
        edit(rule)
    files[RULE_FILE] = generate.dump_yaml(doc)
    tests = yaml.safe_load(files[TEST_FILE])
    tests["tests"] = [g for g in tests["tests"] if any(c["alertname"] == alert for c in g["alert_rule_test"])]
    files[TEST_FILE] = generate.dump_yaml(tests)
    root = _tree(tmp_path, files)
    return _promtool("test", "rules", Path(TEST_FILE).name, cwd=root / "prometheus" / "tests")


@pytest.mark.parametrize("alert", ALERTS)
def test_the_cases_fail_when_the_alert_never_fires(alert, tmp_path):
    def never(rule: dict) -> None:
        if rule.get("alert") == alert:
            rule["expr"] = "vector(1) == 0"

    proc = _mutated(tmp_path, alert, never)
    assert proc.returncode != 0 and f"alertname: {alert}," in proc.stdout + proc.stderr


@pytest.mark.parametrize("alert", ["RLEngineKVCacheSaturated", "RLEngineThroughputDrop", "RLEngineIdleDuringGeneration",
                                   "RLEngineTargetDown"])
def test_the_cases_fail_when_the_alert_ignores_what_keeps_healthy_runs_quiet(alert, tmp_path):
    """Without its second condition (preemptions; generating minutes only; the generation phase; a live run),
    each alert pages on a healthy run of its cases."""
    loose = {"RLEngineKVCacheSaturated": lambda e: e.split(" and ")[0],
             "RLEngineThroughputDrop": lambda e: e.replace(engines.ROLE_GENERATING, engines.ROLE_GENERATION),
             "RLEngineIdleDuringGeneration": lambda e: e.replace(" > 0.9 and", " >= 0 and"),
             "RLEngineTargetDown": lambda e: e.split(" and ")[0]}[alert]

    def loosen(rule: dict) -> None:
        if rule.get("alert") == alert:
            rule["expr"] = loose(rule["expr"])

    proc = _mutated(tmp_path, alert, loosen)
    assert proc.returncode != 0, proc.stdout


def test_engine_thresholds_flow_into_rules_and_tests(tmp_path):
    t = Thresholds(engine_kv_usage_max=0.9, engine_preemptions_min=0.2, engine_throughput_ratio_min=0.6,
                   engine_idle_for="5m")
    files = generate.render_all(t)
    assert "rl_engine_kv_cache_usage:max > 0.9 and" in files[RULE_FILE]
    root = _tree(tmp_path, files)
    proc = _promtool("test", "rules", Path(TEST_FILE).name, cwd=root / "prometheus" / "tests")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_generation_panels_of_the_phases_and_goodput_boards_link_to_the_engines_board():
    import json

    boards = {p.stem: json.loads(p.read_text()) for p in (ROOT / "grafana" / "dashboards").glob("rl-otel-*.json")}
    assert "rl-otel-engines" in boards
    for uid in ("rl-otel-phases", "rl-otel-goodput"):
        links = [link for panel in boards[uid]["panels"] for link in panel.get("links", [])]
        assert links and all(link["url"].startswith("/d/rl-otel-engines/") for link in links), uid
