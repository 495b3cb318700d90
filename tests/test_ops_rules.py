"""Generated rules: up to date, promtool-clean, unit-tested per alert (tests that fail when an alert is broken),
names in the catalog, aggregated without rank, and one runbook section per alert."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest
import yaml

from rl_otel.catalog.concepts import CONCEPTS
from rl_otel.ops import contract, engines, generate, promtests, rules
from rl_otel.ops.dashboards import spec_for
from rl_otel.ops.promql import metric_names
from rl_otel.ops.rules import RunbookLinks
from rl_otel.ops.thresholds import Thresholds
from tests.promtools import require_binary

pytestmark = pytest.mark.slow  # the slow layer (tests/conftest.py)

ROOT = Path(__file__).resolve().parent.parent
CONCEPT_METRICS = {c.record.split(":")[1] for c in CONCEPTS}
RULE_FILES = ["prometheus/rules/rl_otel_recording.yml", "prometheus/rules/rl_otel_alerts.yml",
              "prometheus/rules/rl_otel_engines.yml"]  # the engines' own, tests/test_ops_engines.py
TEST_FILE = "prometheus/tests/rl_otel_alerts_test.yml"
ALERTS = rules.alerts() + rules.fleet_alerts()  # the two groups of the alerts file: every setup's, then the fleet's


def _promtool(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([require_binary("promtool"), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def _tree(tmp: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / rel).write_text(text)
    return tmp


def test_committed_files_are_what_the_generator_writes():
    files = generate.render_all()
    assert generate.render_all() == files  # deterministic
    assert generate.stale(ROOT, files) == []
    proc = subprocess.run([sys.executable, "-m", "rl_otel.ops", "--check", "--root", str(ROOT)], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def _check(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rl_otel.ops", "--check", "--root", str(root)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_check_mode_reports_a_stale_file(tmp_path):
    # a checkout: the generated files (prometheus/, grafana/, ...) and the generator itself
    _tree(tmp_path, generate.render_all())
    shutil.copytree(ROOT / "rl_otel" / "ops", tmp_path / "rl_otel" / "ops",
                    ignore=shutil.ignore_patterns("__pycache__"))
    assert _check(tmp_path).returncode == 0
    (tmp_path / RULE_FILES[1]).write_text("groups: []\n")
    proc = _check(tmp_path)
    assert proc.returncode == 1 and f"stale: {RULE_FILES[1]}" in proc.stderr
    assert proc.stderr.count("stale: ") == 1, proc.stderr


def test_check_mode_refuses_a_root_that_is_no_checkout(tmp_path):
    _tree(tmp_path, generate.render_all())  # the generated files, but no generator: not a checkout
    proc = _check(tmp_path)
    assert proc.returncode == 2 and "not a checkout" in proc.stderr


def test_promtool_check_rules_is_clean():
    proc = _promtool("check", "rules", *RULE_FILES)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(rules.recording_rules())} rules found" in proc.stdout
    assert f"SUCCESS: {len(ALERTS)} rules found" in proc.stdout
    assert "WARNING" not in proc.stdout + proc.stderr


def test_promtool_unit_tests_pass():
    proc = _promtool("test", "rules", TEST_FILE)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_every_alert_has_a_firing_and_a_quiet_check():
    doc = yaml.safe_load((ROOT / TEST_FILE).read_text())
    firing: set[str] = set()
    quiet: set[str] = set()
    for group in doc["tests"]:
        for check in group["alert_rule_test"]:
            (firing if check["exp_alerts"] else quiet).add(check["alertname"])
    names = {a.name for a in ALERTS}
    assert firing == names and quiet == names
    # every firing check also holds a healthy run (or target) that must stay quiet
    assert sum(len(g["alert_rule_test"]) for g in doc["tests"]) >= 2 * len(names)


@pytest.mark.parametrize("alert", [a.name for a in ALERTS])
def test_unit_tests_fail_when_the_alert_never_fires(alert, tmp_path):
    """The cases are not vacuous: an alert whose expression can never be true fails its test."""
    files = generate.render_all()
    doc = yaml.safe_load(files[RULE_FILES[1]])
    for rule in (r for g in doc["groups"] for r in g["rules"]):
        if rule["alert"] == alert:
            rule["expr"] = "vector(1) == 0"
    files[RULE_FILES[1]] = generate.dump_yaml(doc)
    tests = yaml.safe_load(files[TEST_FILE])  # the alert's own test groups (the others pass either way)
    tests["tests"] = [g for g in tests["tests"] if any(c["alertname"] == alert for c in g["alert_rule_test"])]
    files[TEST_FILE] = generate.dump_yaml(tests)
    root = _tree(tmp_path, files)
    proc = _promtool("test", "rules", TEST_FILE, cwd=root)
    assert proc.returncode != 0
    assert f"alertname: {alert}," in proc.stdout + proc.stderr


def test_other_thresholds_flow_into_rules_and_tests(tmp_path):
    """Thresholds live in one place: different ones give different rules whose unit tests still pass."""
    t = Thresholds(approx_kl_max=0.2, approx_kl_ratio=3.0, approx_kl_floor=0.01, ref_kl_ratio=3.0,
                   entropy_ratio_min=0.2, mismatch_ratio=3.0, mismatch_kl_max=0.1, staleness_max=4,
                   phase_stuck_ratio=4.0, rank_skew_max=2.0, eval_smooth="20m",
                   ratio_max=200.0, ratio_max_floor=5.0, ratio_max_ratio=3.0, ratio_max_smooth="6m",
                   clip_ratio_max=0.4, entropy_min=0.2, reward_drop=0.2,
                   explained_variance_min=0.1, gpu_peak_ratio_max=0.9, throughput_ratio_min=0.7, eval_drop=0.1,
                   stall_seconds=600)
    files = generate.render_all(t)
    assert "run:rl_policy_kl:max > 0.2" in files[RULE_FILES[1]]  # the ceiling
    assert files[RULE_FILES[1]] != generate.render_all()[RULE_FILES[1]]
    root = _tree(tmp_path, files)
    proc = _promtool("test", "rules", TEST_FILE, cwd=root)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_alerts_carry_for_severity_and_annotations():
    runbook = (ROOT / "docs/runbook.md").read_text()
    headings = {h.lower() for h in re.findall(r"^## (\S+)$", runbook, re.M)}
    doc = yaml.safe_load((ROOT / RULE_FILES[1]).read_text())
    assert [g["name"] for g in doc["groups"]] == ["rl_otel_alerts", "rl_otel_fleet"]
    alerts = [r for g in doc["groups"] for r in g["rules"]]
    assert [a["alert"] for a in alerts] == [a.name for a in ALERTS]
    for rule in alerts:
        assert re.fullmatch(r"\d+[smh]", rule["for"]) and rule["for"] != "0m", rule
        assert rule["labels"]["severity"] in ("critical", "warning", "info")
        ann = rule["annotations"]
        assert set(ann) == {"summary", "description", "runbook_url"} and all(ann.values())
        assert rule["alert"].lower() in headings, f"docs/runbook.md has no section ## {rule['alert']}"
    assert headings == {a["alert"].lower() for a in alerts} | {a.name.lower() for a in engines.alerts()}


def _runbook_urls(files: dict[str, str]) -> dict[str, list[str]]:
    """``{generated file: every runbook_url in it}``: the rule files, the promtool tests' expected annotations and
    the Kubernetes PrometheusRule."""
    found: dict[str, list[str]] = {}

    def walk(node: object, rel: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "runbook_url":
                    found.setdefault(rel, []).append(value)
                walk(value, rel)
        elif isinstance(node, list):
            for item in node:
                walk(item, rel)

    for rel, text in files.items():
        if rel.endswith((".yml", ".yaml")):
            walk(yaml.safe_load(text), rel)
    return found


def test_shipped_rule_files_link_to_the_runbook_dashboard_of_their_own_grafana_and_none_to_example_invalid():
    """Every runbook_url of every committed file (rules, promtool tests, the Kubernetes PrometheusRule) opens the
    alert's own panel of the runbook dashboard (its section of docs/runbook.md) in the Grafana that ships beside
    the file: docker-compose.yml's, published on port 3000 with grafana/dashboards/ provisioned; for Kubernetes,
    the Grafana the Prometheus' external label grafana_url names (a port-forward to 3000 without it). None opens
    a reserved name (they were https://example.invalid/..., dead for everyone)."""
    from rl_otel.ops import runbook

    committed = {rel: (ROOT / rel).read_text() for rel in generate.render_all()}
    urls = _runbook_urls(committed)
    k8s = "deploy/kubernetes/prometheusrule.yaml"
    assert set(urls) == {RULE_FILES[1], TEST_FILE, k8s, RULE_FILES[2], "prometheus/tests/rl_otel_engines_test.yml"}
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["grafana"]
    assert "3000:3000" in compose["ports"] and "./grafana/dashboards:/var/lib/grafana/dashboards:ro" in \
        compose["volumes"]
    assert (ROOT / f"grafana/dashboards/{runbook.UID}.json").is_file()
    board = json.loads((ROOT / f"grafana/dashboards/{runbook.UID}.json").read_text())
    panels = {p["id"]: p for p in board["panels"]}
    sections = runbook.sections()
    n = 0
    for rel, found in urls.items():
        for url in found:
            assert "example.invalid" not in url and ".invalid" not in url, (rel, url)
            base = rules.KUBERNETES_GRAFANA if rel == k8s else "http://localhost:3000"
            assert url.startswith(f"{base}/d/{runbook.UID}/{runbook.UID}?viewPanel="), (rel, url)
            n += 1
    for rel in (RULE_FILES[1], RULE_FILES[2], k8s):
        doc = yaml.safe_load(committed[rel])
        groups = doc["spec"]["groups"] if rel == k8s else doc["groups"]
        for rule in (r for g in groups for r in g["rules"] if "alert" in r):  # each opens its own panel
            query = urllib.parse.urlsplit(rule["annotations"]["runbook_url"].rsplit("}}", 1)[-1]).query
            panel = panels[int(urllib.parse.parse_qs(query)["viewPanel"][0])]
            assert panel["title"] == rule["alert"] and panel["options"]["content"] == sections[rule["alert"]]
    assert n >= 3 * len(ALERTS)


def test_the_default_links_open_the_shipped_grafana_and_a_kubernetes_prometheus_names_its_own():
    """No base given: the compose Grafana's runbook dashboard; the Kubernetes links read the external label
    grafana_url when the Prometheus has one (a Go template Prometheus expands), else localhost:3000."""
    assert RunbookLinks().url(rules.alerts()[0]) == \
        "http://localhost:3000/d/rl-otel-runbook/rl-otel-runbook?viewPanel=1"
    k8s = RunbookLinks(kubernetes=True).url(rules.alerts()[0])
    assert k8s == ("{{ with $externalLabels.grafana_url }}{{ . }}{{ else }}http://localhost:3000{{ end }}"
                   "/d/rl-otel-runbook/rl-otel-runbook?viewPanel=1")
    assert not RunbookLinks().chosen and RunbookLinks(grafana_url="https://g.example.com").chosen


@pytest.mark.slow
def test_the_kubernetes_runbook_url_renders_the_external_label_and_falls_back_to_localhost(tmp_path):
    """promtool expands the PrometheusRule's runbook_url as Prometheus does: with the external label grafana_url
    set, the link opens that Grafana; without it, localhost:3000."""
    promtool = require_binary("promtool")
    doc = yaml.safe_load(generate.render_all()["deploy/kubernetes/prometheusrule.yaml"])
    shipped = next(r for g in doc["spec"]["groups"] for r in g["rules"] if r.get("alert") == "RLScrapeTargetDown")
    rule = {"alert": "Linked", "expr": "vector(1)",
            "annotations": {"runbook_url": shipped["annotations"]["runbook_url"]}}
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": [{"name": "k8s", "rules": [rule]}]}))
    panel = f"/d/rl-otel-runbook/rl-otel-runbook?viewPanel={rules.alert_names().index('RLScrapeTargetDown') + 1}"
    for labels, grafana in (({"grafana_url": "https://grafana.corp.example.com"}, "https://grafana.corp.example.com"),
                            ({}, "http://localhost:3000")):
        test = {"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": [{
            "interval": "1m", "external_labels": labels, "input_series": [],
            "alert_rule_test": [{"eval_time": "1m", "alertname": "Linked", "exp_alerts": [{
                "exp_labels": {}, "exp_annotations": {"runbook_url": grafana + panel}}]}]}]}
        (tmp_path / "test.yml").write_text(yaml.safe_dump(test))
        run = subprocess.run([promtool, "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, text=True,
                             timeout=120)
        assert run.returncode == 0, (labels, run.stdout + run.stderr)


def test_a_placeholder_or_loopback_base_is_named_unreachable():
    from rl_otel.ops import runbook

    for url in ("http://localhost:3000", "http://127.0.0.1:3000/x", "http://[::1]:3000", "http://0.0.0.0:3000",
                "https://example.invalid/rl_otel", "http://grafana.localhost", "https://docs.example/x"):
        assert runbook.unreachable(url), url
    for url in ("https://github.com/org/rl_otel/blob/main/docs/runbook.md", "https://grafana.corp.example.com",
                "http://10.0.0.7:3000"):
        assert runbook.unreachable(url) is None, url


def test_grafana_url_opens_the_alerts_panel_of_the_runbook_dashboard():
    """--grafana-url: each runbook_url opens the alert's panel of the runbook dashboard in the team's Grafana,
    holding that alert's section of docs/runbook.md."""
    from rl_otel.ops import runbook

    board = json.loads((ROOT / "grafana/dashboards/rl-otel-runbook.json").read_text())
    panels = {p["id"]: p for p in board["panels"]}
    sections = runbook.sections()
    files = generate.render_all(links=RunbookLinks(grafana_url="https://grafana.corp.example.com/"))
    doc = yaml.safe_load(files[RULE_FILES[1]])
    for rule in (r for g in doc["groups"] for r in g["rules"]):
        url = urllib.parse.urlsplit(rule["annotations"]["runbook_url"])
        assert (url.scheme, url.netloc, url.path) == ("https", "grafana.corp.example.com",
                                                      f"/d/{board['uid']}/{board['uid']}")
        panel = panels[int(urllib.parse.parse_qs(url.query)["viewPanel"][0])]
        assert panel["title"] == rule["alert"] and panel["options"]["content"] == sections[rule["alert"]]
    urls = _runbook_urls(files)
    assert all(u.startswith("https://grafana.corp.example.com/d/") for found in urls.values() for u in found)


def test_runbook_base_points_the_links_at_a_page_of_the_runbook():
    files = generate.render_all(links=RunbookLinks(runbook_base="https://git.example.org/ml/rl_otel/docs/runbook.md"))
    urls = [u for found in _runbook_urls(files).values() for u in found]
    assert "https://git.example.org/ml/rl_otel/docs/runbook.md#rltrainerstalled" in urls
    assert all(u.startswith("https://git.example.org/ml/rl_otel/docs/runbook.md#rl") for u in urls)
    k8s = yaml.safe_load(files["deploy/kubernetes/prometheusrule.yaml"])  # the same base in the PrometheusRule
    assert {r["annotations"]["runbook_url"] for g in k8s["spec"]["groups"] for r in g["rules"] if "alert" in r} \
        <= set(urls)


@pytest.mark.parametrize("links", [{"runbook_base": "docs/runbook.md"}, {"grafana_url": "grafana:3000"},
                                   {"runbook_base": "https://x.example.com/runbook.md#top"},
                                   {"runbook_base": "https://a.example.com", "grafana_url": "https://b.example.com"}])
def test_a_bad_base_is_refused_naming_it(links):
    with pytest.raises(ValueError) as err:
        RunbookLinks(**links)
    assert any(str(v) in str(err.value) for v in links.values()) or "not both" in str(err.value)


def test_the_required_alerts_exist():
    names = {a.name for a in ALERTS}
    assert {"RLTrainerStalled", "RLScrapeTargetAbsent", "RLLossNotFinite", "RLKLRunaway",
            "RLImportanceRatioExploding", "RLClipFractionHigh", "RLEntropyCollapse", "RLRewardCollapse",
            "RLValueExplainedVarianceCollapse", "RLGPUMemoryHeadroomLow", "RLThroughputDrop",
            "RLEvalRegression"} <= names


# derived names: the count of non-finite loss series across the frameworks' loss metrics, a role's goodput (its
# productive share of the wall time), a rank's compute rate and its ratio to the median rank
DERIVED = {"run:rl_loss_non_finite:count", rules.OUT_OF_RANGE, rules.GOODPUT_RATIO, rules.GOODPUT_BASELINE,
           rules.RANK_COMPUTE, rules.RANK_COMPUTE_RATIO}


def _known(metric: str) -> bool:
    """A catalog family, or one of the issue-33 series the runtime writes (rl_otel/ops/contract.py)."""
    return spec_for(metric) is not None or contract.find(metric) is not None \
        or any(metric == f.name for f in contract.CONTRACT)


def test_recording_rules_are_named_level_metric_operations_and_keep_only_their_level():
    """``level:metric:operations``; the level names the labels a rule keeps besides job (run, role, phase, bucket,
    rank): only the per-rank straggler rules keep rank, and no rule keeps instance."""
    recorded = {r.record for r in rules.recording_rules()}
    levels = {"run": [], "run_phase": ["cluster", "phase"], "run_taskset": ["taskset", "metric", "k"],
              "run_role": ["role"], "run_role_bucket": ["role", "bucket"], "run_role_rank": ["role", "rank"]}
    for rule in rules.recording_rules():
        level, metric, operations = rule.record.split(":")
        assert level in levels and re.fullmatch(r"[a-z0-9_]+", operations), rule.record
        # a catalog family, a concept every framework's keys feed (rl_otel.catalog.concepts), or a derived name
        assert _known(metric) or metric in CONCEPT_METRICS or rule.record in DERIVED, rule.record
        by_lists = re.findall(r"\bby \(([^)]*)\)", rule.expr)
        assert by_lists or "_over_time(" in rule.expr or "group_left" in rule.expr, rule
        for labels in by_lists:
            names = [x.strip() for x in labels.split(",")]
            assert names[:2] == ["job", "run"] and "instance" not in names, rule
            # le: a histogram quantile's buckets; metric: which metric's values are impossible
            extra = {"le"} | ({"metric"} if rule.record == rules.OUT_OF_RANGE else set())
            assert set(names[2:]) <= set(levels[level]) | extra, rule
            assert "rank" not in names or level == "run_role_rank", rule
        for name in metric_names(rule.expr):
            assert name in recorded or _known(name), (rule.record, name)
    assert {r.record for r in rules.recording_rules() if r.record.startswith("run_role_rank:")} == {
        rules.RANK_COMPUTE, rules.RANK_COMPUTE_RATIO}


def test_alert_expressions_read_catalog_metrics_or_recorded_series():
    recorded = {r.record for r in rules.recording_rules()}
    for alert in ALERTS:
        for name in metric_names(alert.expr):
            assert name == "up" or name in recorded or _known(name), (alert.name, name)


def test_annotation_renderer_matches_prometheus_templates():
    assert promtests.render('{{ $value | printf "%.3g" }} in {{ $labels.run }}', {"run": "r"}, 0.123456) \
        == "0.123 in r"
    # a label's presence picks a branch; each query block (else included) renders as the next hand-written text
    template = ("{{ if $labels.rank }}rank {{ $labels.rank }}{{ with x | query }}{{ . | first | value }}{{ else }}"
                "-{{ end }}{{ else }}no rank{{ end }}: {{ range y | query }}{{ .Labels.path }}{{ end }} "
                "{{ $value | humanizePercentage }}")
    assert promtests.render(template, {"rank": "2"}, 0.175, ("A", "B")) == "rank 2A: B 17.5%"
    assert promtests.render(template, {}, 0.5, ("B",)) == "no rank: B 50%"
    assert promtests.humanize_percentage(0.5249999999999999) == "52.5%"


def test_prometheus_rule_for_kubernetes_holds_the_same_groups(tmp_path):
    doc = yaml.safe_load((ROOT / "deploy/kubernetes/prometheusrule.yaml").read_text())
    assert doc["apiVersion"] == "monitoring.coreos.com/v1" and doc["kind"] == "PrometheusRule"
    groups = doc["spec"]["groups"]
    expected = [g for f in RULE_FILES for g in yaml.safe_load((ROOT / f).read_text())["groups"]]
    for group in expected:  # the same rules; only the runbook links open the Kubernetes Prometheus' Grafana
        for rule in group["rules"]:
            if "alert" in rule:
                url = rule["annotations"]["runbook_url"]
                assert url.startswith(rules.COMPOSE_GRAFANA + "/")
                rule["annotations"]["runbook_url"] = rules.KUBERNETES_GRAFANA + url[len(rules.COMPOSE_GRAFANA):]
    assert groups == expected
    path = tmp_path / "extracted.yml"
    path.write_text(yaml.safe_dump({"groups": groups}))
    proc = _promtool("check", "rules", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
