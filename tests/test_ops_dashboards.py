"""Generated Grafana dashboards: current, well-formed, chained variables, every expression parsed by promtool and
reading only catalog metrics or recorded series; provisioning files load them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from rl_otel.ops.dashboards import VARIABLES, dashboards, render, spec_for
from rl_otel.ops.promql import check_expressions, metric_names, substitute
from rl_otel.ops.rules import recording_rules
from tests.promtools import require_binary

ROOT = Path(__file__).resolve().parent.parent
BOARDS = ROOT / "grafana/dashboards"
SAMPLE = {"job": "rl_otel", "run": "r1|r2", "cluster": "actor_train", "phase": "train_step", "device_id": "0"}


def _files() -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in sorted(BOARDS.glob("*.json"))}


def _exprs() -> list[tuple[str, str, str]]:
    return [(uid, panel["title"], target["expr"]) for uid, board in ((b["uid"], b) for b in _files().values())
            for panel in board["panels"] for target in panel["targets"]]


def test_regenerating_gives_identical_bytes():
    boards = dashboards()
    assert sorted(f"{b.uid}.json" for b in boards) == sorted(_files())
    for board in boards:
        assert (BOARDS / f"{board.uid}.json").read_text() == render(board)
        assert render(board) == render(dashboards()[boards.index(board)])


def test_dashboards_are_well_formed():
    files = _files()
    assert set(files) == {"rl-otel-training.json", "rl-otel-phases.json", "rl-otel-memory.json",
                          "rl-otel-rollout-eval.json", "rl-otel-fleet.json"}
    for name, board in files.items():
        assert name == f"{board['uid']}.json" and board["title"] and board["schemaVersion"] >= 36
        ids = [p["id"] for p in board["panels"]]
        assert len(ids) == len(set(ids)) and len(ids) >= 8
        for panel in board["panels"]:
            pos = panel["gridPos"]
            assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24 and pos["h"] > 0
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert panel["targets"] and all(t["expr"] and t["refId"] for t in panel["targets"])
            assert panel["description"], (name, panel["title"])


def test_variables_are_chained():
    order = ["datasource", "job", "run", "cluster", "phase", "device_id"]
    for board in _files().values():
        variables = board["templating"]["list"]
        assert [v["name"] for v in variables] == order
        assert variables[0]["type"] == "datasource" and variables[0]["query"] == "prometheus"
        for i, var in enumerate(variables[1:], start=1):
            used = set(re.findall(r"\$(\w+)", var["query"]))
            assert used <= set(order[:i]), f"{var['name']} uses a later variable: {used}"
            assert var["datasource"]["uid"] == "${datasource}" and var["refresh"] == 2
        # each variable narrows on the one before it
        for prev, var in zip(order[1:], order[2:]):
            q = next(v for v in variables if v["name"] == var)["query"]
            assert f"${prev}" in q, (var, q)
        # panels only use defined variables (and Grafana's own)
        for panel in board["panels"]:
            for target in panel["targets"]:
                # ($1 in a label_replace is a regex group, not a variable)
                assert set(re.findall(r"\$([A-Za-z_]\w*)", target["expr"])) <= set(order) | {"__rate_interval"}


def test_every_expression_parses_with_promtool():
    require_binary("promtool")
    exprs = [substitute(e, SAMPLE) for _, _, e in _exprs()]
    exprs += [substitute(re.fullmatch(r"label_values\((.*), \w+\)", q).group(1), SAMPLE) for _, q in VARIABLES]
    assert len(exprs) > 70
    assert check_expressions(exprs) == ""


def test_every_metric_is_in_the_catalog_or_recorded():
    recorded = {r.record for r in recording_rules()}
    seen = set()
    for uid, title, expr in _exprs():
        names = metric_names(expr)
        assert names, (uid, title, expr)
        for name in names:
            assert name == "up" or name in recorded or spec_for(name) is not None, (uid, title, name)
        seen |= names
    # the dashboards use most of the recorded series
    assert len(recorded & seen) >= len(recorded) - 1


def test_the_training_overview_covers_the_basics():
    training = {n for uid, _, e in _exprs() if uid == "rl-otel-training" for n in metric_names(e)}
    assert {"rl_critic_score", "rl_actor_approx_kl", "rl_critic_entropy", "rl_actor_clip_ratio", "rl_actor_pg_loss",
            "rl_actor_learning_rate", "rl_step", "rl_system_tokens_per_second"} <= training
    phases = {n for uid, _, e in _exprs() if uid == "rl-otel-phases" for n in metric_names(e)}
    assert {"rl_phase_duration_seconds_bucket", "rl_phase_last_duration_seconds"} <= phases
    memory = {n for uid, _, e in _exprs() if uid == "rl-otel-memory" for n in metric_names(e)}
    assert {"rl_gpu_memory_bytes", "rl_gpu_memory_peak_ratio"} <= memory


def test_units_and_descriptions_come_from_the_catalog():
    memory = _files()["rl-otel-memory.json"]
    panel = next(p for p in memory["panels"] if p["title"].startswith("GPU memory at end of onload"))
    assert panel["fieldConfig"]["defaults"]["unit"] == "bytes"
    assert panel["description"] == spec_for("rl_gpu_memory_bytes").description
    training = _files()["rl-otel-training.json"]
    clip = next(p for p in training["panels"] if p["title"] == "Clip fraction")
    assert clip["fieldConfig"]["defaults"]["unit"] == "percentunit"
    # the alert threshold is drawn on the panel
    assert clip["fieldConfig"]["defaults"]["thresholds"]["steps"][1]["value"] == 0.3


def test_provisioning_points_at_the_dashboards():
    ds = yaml.safe_load((ROOT / "grafana/provisioning/datasources/prometheus.yml").read_text())
    assert ds["apiVersion"] == 1 and ds["datasources"][0]["type"] == "prometheus"
    providers = yaml.safe_load((ROOT / "grafana/provisioning/dashboards/rl_otel.yml").read_text())["providers"]
    assert providers[0]["type"] == "file" and providers[0]["options"]["path"] == "/var/lib/grafana/dashboards"
