"""Generated Grafana dashboards: current, well-formed, chained variables, every expression parsed by promtool and
reading only catalog metrics or recorded series; provisioning files load them."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import yaml

from rl_otel.ops import contract, engines
from rl_otel.ops.dashboards import ON_DEMAND, PARENTS, VARIABLES, chain, dashboards, render, spec_for
from rl_otel.ops.promql import check_expressions, metric_names, substitute
from rl_otel.ops.rules import recording_rules
from tests.promtools import require_binary

ROOT = Path(__file__).resolve().parent.parent
BOARDS = ROOT / "grafana/dashboards"
SAMPLE = {"job": "rl_otel", "run": "r1|r2", "cluster": "actor_train", "phase": "train_step", "device_id": "0",
          "role": "trainer", "rank": "0|3"}


def _files() -> dict[str, dict]:
    """The metric dashboards (the runbook dashboard holds text panels only: tests/test_ops_rules.py)."""
    return {p.name: json.loads(p.read_text()) for p in sorted(BOARDS.glob("*.json"))
            if p.name != "rl-otel-runbook.json"}


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
                          "rl-otel-rollout-eval.json", "rl-otel-fleet.json", "rl-otel-goodput.json",
                          "rl-otel-engines.json"}
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


ORDER = ["datasource", "job", "run", "cluster", "phase", "device_id"]
ROLES = ["datasource", "job", "run", "role", "rank"]
ENGINES = ["datasource", "job", "run", "role", "replica"]  # the rollout engines' replicas, per role


def test_variables_are_chained():
    """Each variable narrows on its parent (job -> run, then cluster -> phase -> device_id, or role -> rank), which
    the dashboard shows before it."""
    assert [n for n, _ in VARIABLES] == ORDER[1:] + ROLES[3:] + ENGINES[4:]
    assert chain("device_id") == tuple(ORDER[1:]) and chain("rank") == tuple(ROLES[1:])
    for board in _files().values():
        variables = board["templating"]["list"]
        order = [v["name"] for v in variables]
        assert order in (ORDER[:len(order)], ROLES[:len(order)], ENGINES[:len(order)]) and len(order) >= 3, order
        assert variables[0]["type"] == "datasource" and variables[0]["query"] == "prometheus"
        for i, var in enumerate(variables[1:], start=1):
            used = set(re.findall(r"\$(\w+)", var["query"]))
            assert used <= set(order[:i]), f"{var['name']} uses a later variable: {used}"
            assert var["datasource"]["uid"] == "${datasource}" and var["refresh"] == 2
            # each variable narrows on its parent
            if var["name"] in PARENTS:
                assert f"${PARENTS[var['name']]}" in var["query"], (var["name"], var["query"])
        # panels only use defined variables (and Grafana's own)
        for panel in board["panels"]:
            for target in panel["targets"]:
                # ($1 in a label_replace is a regex group, not a variable)
                assert set(re.findall(r"\$([A-Za-z_]\w*)", target["expr"])) <= set(order) | {"__rate_interval",
                                                                                             "__range"}
            assert panel.get("repeat", "datasource") in order


def test_a_dashboard_shows_only_the_dropdowns_its_panels_use():
    """cluster / phase / device_id change nothing on the training, rollout and fleet dashboards: not shown there;
    role and rank only where the goodput panels use them."""
    shown = {uid[:-5]: [v["name"] for v in b["templating"]["list"]] for uid, b in _files().items()}
    assert shown == {"rl-otel-training": ORDER[:3], "rl-otel-rollout-eval": ORDER[:3], "rl-otel-fleet": ORDER[:3],
                     "rl-otel-phases": ORDER[:5], "rl-otel-memory": ORDER, "rl-otel-goodput": ROLES,
                     "rl-otel-engines": ENGINES}
    for board in _files().values():
        exprs = " ".join(t["expr"] for p in board["panels"] for t in p["targets"])
        last = board["templating"]["list"][-1]["name"]
        assert f"${last}" in exprs, (board["uid"], last)


def test_ranks_are_shown_on_demand():
    """A role may have a thousand ranks: the rank dropdown starts at one (no "All"), the per-rank panels follow it;
    the role-level panels repeat per selected role."""
    goodput = _files()["rl-otel-goodput.json"]
    variables = {v["name"]: v for v in goodput["templating"]["list"]}
    assert {"rank"} == ON_DEMAND and variables["rank"]["includeAll"] is False and "allValue" not in variables["rank"]
    assert variables["role"]["includeAll"] is True
    per_rank = [p for p in goodput["panels"] if any('rank=~"$rank"' in t["expr"] for t in p["targets"])]
    assert len(per_rank) >= 3 and all("chosen ranks" in p["title"] for p in per_rank)
    repeated = [p for p in goodput["panels"] if p.get("repeat")]
    assert repeated and all(p["repeat"] == "role" and "$role" in p["title"] for p in repeated)


def test_the_goodput_stack_is_every_bucket_in_the_catalogs_order():
    goodput = _files()["rl-otel-goodput.json"]
    for title in ("Where the time goes: $role (share of wall time per bucket)", "Where the time goes: chosen ranks"):
        panel = next(p for p in goodput["panels"] if p["title"] == title)
        buckets = [re.search(r'bucket="(\w+)"', t["expr"]).group(1) for t in panel["targets"]]
        assert buckets == list(contract.BUCKETS), title
        assert panel["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "normal"
        assert panel["fieldConfig"]["defaults"]["unit"] == "percentunit"
    processes = next(p for p in goodput["panels"] if p["title"].startswith("Processes per bucket"))
    assert processes["targets"][-1]["legendFormat"] == "wall (processes)"  # a line over the stack, not on it
    assert processes["fieldConfig"]["overrides"][0]["matcher"] == {"id": "byName", "options": "wall (processes)"}
    heat = next(p for p in goodput["panels"] if p["type"] == "heatmap")
    (target,) = heat["targets"]
    assert target["expr"].startswith("run_role_rank:rl_rank_compute_ratio:rate5m{") and "format" not in target
    assert target["legendFormat"] == "{{role}} {{rank}}" and heat["options"]["calculate"] is False


def test_all_jobs_means_the_jobs_serving_rl_step():
    """Grafana's "All" of a variable without allValue is the regex of the listed values; with allValue ".*" the
    fleet's `up{job=~"$job"}` listed every target of a shared Prometheus."""
    for board in _files().values():
        variables = {v["name"]: v for v in board["templating"]["list"]}
        assert variables["job"]["query"] == "label_values(rl_step, job)" and "allValue" not in variables["job"]
        assert variables["run"]["allValue"] == ".*"
    up = next(p for p in _files()["rl-otel-fleet.json"]["panels"] if p["title"] == "Scrape targets up")
    assert [t["expr"] for t in up["targets"]] == ['up{job=~"$job"}']


def _colour(panel: dict, value: float) -> str:
    """The colour Grafana gives ``value``: the last absolute threshold step at or below it."""
    steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
    return [s["color"] for s in steps if s["value"] is None or s["value"] <= value][-1]


def test_thresholds_are_red_on_the_alerts_side():
    panels = {(b["uid"], p["title"]): p for b in _files().values() for p in b["panels"]}
    cases = {  # (dashboard, panel): [(value, colour)]
        ("rl-otel-fleet", "Non-finite losses"): [(0, "green"), (1, "red"), (3, "red")],
        ("rl-otel-fleet", "Scrape targets up"): [(0, "red"), (1, "green")],
        ("rl-otel-fleet", "Telemetry errors absorbed"): [(0, "green"), (2, "red")],
        ("rl-otel-training", "Entropy (per token)"): [(0.005, "red"), (1.2, "green")],
        ("rl-otel-fleet", "Entropy per run"): [(0.005, "red"), (1.2, "green")],
        ("rl-otel-training", "Value function explained variance"): [(-0.5, "red"), (0.6, "green")],
        ("rl-otel-rollout-eval", "Eval regression vs best"): [(-0.2, "red"), (0, "green")],
        ("rl-otel-training", "Clip fraction"): [(0.1, "green"), (0.5, "red")],
        # the line is the ceiling; below it RLKLRunaway compares the run with its own baseline (fleet dashboard)
        ("rl-otel-training", "KL old -> new policy"): [(0.2, "green"), (1.5, "red")],
        ("rl-otel-training", "Off-policy staleness (policy versions, worst sample)"): [(2, "green"), (12, "red")],
        ("rl-otel-training", "MFU"): [(0.4, "green"), (1.2, "red")],
        # red above the alert's ceiling (a single batch's 12 is the healthy demo's noise, not a page)
        ("rl-otel-training", "Importance ratio max"): [(1.6, "green"), (12, "green"), (150, "red")],
        ("rl-otel-fleet", "Seconds since the last step"): [(10, "green"), (3600, "red")],
    }
    for key, expected in cases.items():
        assert [(v, _colour(panels[key], v)) for v, _ in expected] == expected, key
    # a timeseries with an alert threshold draws it
    assert panels[("rl-otel-training", "Entropy (per token)")]["fieldConfig"]["defaults"]["custom"][
        "thresholdsStyle"] == {"mode": "line"}


def test_importance_ratios_are_numbers_and_percent_is_for_fractions():
    """An importance ratio of 1.62 must read 1.62, not "162%" (nor its threshold 10 "1000%")."""
    seen = 0
    for board in _files().values():
        for panel in board["panels"]:
            unit = panel["fieldConfig"]["defaults"]["unit"]
            if any("importance_ratio" in t["expr"] for t in panel["targets"]):
                seen += 1
                assert unit != "percentunit", (board["uid"], panel["title"])
                if panel["type"] == "heatmap":
                    assert panel["options"]["yAxis"]["unit"] != "percentunit"
            if unit == "percentunit":  # fractions: thresholds within 0-1
                assert all(s["value"] is None or 0 <= s["value"] <= 1
                           for s in panel["fieldConfig"]["defaults"]["thresholds"]["steps"]), panel["title"]
    assert seen == 4  # ratio max, its distribution, the fleet's max per run, the |ratio - 1| mismatch


def test_the_pie_covers_the_dashboards_time_range():
    pie = next(p for p in _files()["rl-otel-phases.json"]["panels"] if p["type"] == "piechart")
    (target,) = pie["targets"]
    assert "[$__range]" in target["expr"] and "$__rate_interval" not in target["expr"]
    assert target["instant"] is True and target["range"] is False


def _promql_unit_test(tmp_path: Path, series: list[dict], cases: list[dict]) -> str:
    """``promtool test rules`` on expressions (no rules): series at a 15 s interval; '' when every case holds."""
    doc = {"rule_files": [], "evaluation_interval": "15s",
           "tests": [{"interval": "15s", "input_series": series, "promql_expr_test": cases}]}
    path = tmp_path / "exprs_test.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    proc = subprocess.run([require_binary("promtool"), "test", "rules", str(path)], capture_output=True, text=True,
                          timeout=60)
    return "" if proc.returncode == 0 else proc.stdout + proc.stderr


ALL = {"job": "rl_otel", "run": ".*", "cluster": ".*", "phase": ".*", "device_id": ".*", "role": ".*",
       "rank": ".*"}


def _panel_expr(uid: str, title: str, i: int = 0) -> str:
    board = next(b for b in dashboards() if b.uid == uid)
    return substitute(next(p for p in board.panels if p.title == title).queries[i].expr, ALL)


def test_phase_durations_show_no_nan_once_training_ends(tmp_path):
    """40 phase runs of 0.1-0.4 s during 10 minutes, then training ends and the counters stay flat: p95 and mean
    have values while phases run and no series (not NaN) a few minutes later."""
    sel = 'job="rl_otel", run="r1", rank="0", cluster="actor_train", phase="train_step", part="total"'
    buckets = {"0.1": 10, "0.25": 25, "0.5": 40, "+Inf": 40}
    series = [{"series": f'rl_phase_duration_seconds_bucket{{{sel}, le="{le}"}}',
               "values": f"0+{n / 40:g}x40 {n}x40"} for le, n in buckets.items()]
    series += [{"series": f"rl_phase_duration_seconds_count{{{sel}}}", "values": "0+1x40 40x40"},
               {"series": f"rl_phase_duration_seconds_sum{{{sel}}}", "values": "0+0.25x40 10x40"}]
    p95 = _panel_expr("rl-otel-phases", "Phase duration p95 (total)")
    mean = _panel_expr("rl-otel-phases", "Phase duration mean (total)")
    labels = '{cluster="actor_train", phase="train_step"}'
    cases = [{"expr": mean, "eval_time": "5m", "exp_samples": [{"labels": labels, "value": 0.25}]},
             {"expr": f"count({p95})", "eval_time": "5m", "exp_samples": [{"labels": "{}", "value": 1}]},
             {"expr": mean, "eval_time": "15m", "exp_samples": []},
             {"expr": p95, "eval_time": "15m", "exp_samples": []}]
    assert _promql_unit_test(tmp_path, series, cases) == ""


def test_the_chosen_ranks_shares_add_up_and_goodput_is_per_rank(tmp_path):
    """Two trainer ranks scraped every 15 s: rank 0 generates 75% of its wall time and waits 25%, rank 1 25% and
    75%. The chosen ranks' stack reads 50% generation and 50% waiting (their seconds added), the per-rank goodput 75%
    and 25%; a rollout engine of the same run is another role."""
    sel = 'job="rl_otel", run="r1", role="{role}", rank="{rank}"'
    series = []
    for role, rank, shares in (("trainer", 0, {"generation": 0.75, "waiting": 0.25}),
                               ("trainer", 1, {"generation": 0.25, "waiting": 0.75}),
                               ("rollout", 0, {"generation": 1.0})):
        labels = sel.format(role=role, rank=rank)
        for bucket in contract.BUCKETS:
            step = 15 * shares.get(bucket, 0.0)
            series.append({"series": f'rl_goodput_bucket_seconds_total{{{labels}, bucket="{bucket}"}}',
                           "values": f"0+{step:g}x40"})
        series.append({"series": f"rl_goodput_wall_seconds_total{{{labels}}}", "values": "0+15x40"})
    values = {**ALL, "role": "trainer", "rank": "0|1"}
    board = next(b for b in dashboards() if b.uid == "rl-otel-goodput")
    chosen = next(p for p in board.panels if p.title == "Where the time goes: chosen ranks")
    per_rank = next(p for p in board.panels if p.title == "Goodput per rank (chosen ranks)")
    cases = [{"expr": f"sum({substitute(q.expr, values)})", "eval_time": "5m",
              "exp_samples": [{"labels": "{}", "value": {"generation": 0.5, "waiting": 0.5}.get(b, 0)}]}
             for q, b in zip(chosen.queries, contract.BUCKETS, strict=True)]
    cases.append({"expr": substitute(per_rank.queries[0].expr, values), "eval_time": "5m", "exp_samples": [
        {"labels": '{run="r1", role="trainer", rank="0"}', "value": 0.75},
        {"labels": '{run="r1", role="trainer", rank="1"}', "value": 0.25}]})
    assert _promql_unit_test(tmp_path, series, cases) == ""


def test_telemetry_errors_read_zero_before_the_first_error(tmp_path):
    series = [{"series": 'rl_step{job="rl_otel", run="r1", rank="0"}', "values": "0+1x20"},
              {"series": 'rl_step{job="rl_otel", run="r1", rank="1"}', "values": "0+1x20"},
              {"series": 'rl_step{job="rl_otel", run="r2", rank="0"}', "values": "0+1x20"},
              {"series": 'rl_telemetry_errors_total{job="rl_otel", run="r2", rank="0", sink="input", '
                         'reason="bad_value"}', "values": "0+1x20"}]
    total = _panel_expr("rl-otel-fleet", "Telemetry errors absorbed", 1)
    cases = [{"expr": total, "eval_time": "4m", "exp_samples": [{"labels": '{run="r1"}', "value": 0},
                                                                {"labels": '{run="r2"}', "value": 16}]}]
    assert _promql_unit_test(tmp_path, series, cases) == ""


def test_every_expression_parses_with_promtool():
    require_binary("promtool")
    exprs = [substitute(e, SAMPLE) for _, _, e in _exprs()]
    exprs += [substitute(re.fullmatch(r"label_values\((.*), \w+\)", q).group(1), SAMPLE) for _, q in VARIABLES]
    assert len(exprs) > 70
    assert check_expressions(exprs) == ""


def test_every_metric_is_in_the_catalog_or_recorded():
    core = {r.record for r in recording_rules()}
    recorded = core | {r.record for r in engines.recording_rules()}  # the engines' file (tests/test_ops_engines.py)
    seen = set()
    for uid, title, expr in _exprs():
        names = metric_names(expr)
        assert names, (uid, title, expr)
        for name in names:
            assert name == "up" or name in recorded or spec_for(name) is not None or contract.find(name), \
                (uid, title, name)
        seen |= names
    # the dashboards use most of the recorded series
    assert len(core & seen) >= len(core) - 1


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
    assert panel["description"].startswith(spec_for("rl_gpu_memory_bytes").description + " No data? ")
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
