"""Measured alert quality (tests/alert_corpus.py): healthy runs fire no warning or critical alert, broken runs fire
the right alert within its documented delay, under ``promtool test rules`` with the shipped rule files.

The corpus files are generated into a temporary folder (one per group, run two at a time) and judged by promtool;
the alert x framework table is written next to them and checked to cover every alert a framework logs.
"""

from __future__ import annotations

import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from rl_otel.ops import contract, rules
from tests import alert_corpus
from tests.frameworks import ALL_FRAMEWORKS
from tests.promtools import require_binary

pytestmark = pytest.mark.slow  # the slow layer (tests/conftest.py)

RULES = Path(__file__).resolve().parent.parent / "prometheus" / "rules"


def _run(promtool: str, path: Path) -> tuple[Path, subprocess.CompletedProcess]:
    return path, subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    promtool = require_binary("promtool")
    folder = tmp_path_factory.mktemp("alert_corpus")
    files = alert_corpus.write_files(folder)
    with ThreadPoolExecutor(2) as pool:
        results = dict(pool.map(lambda p: _run(promtool, p), sorted(files, key=lambda p: -p.stat().st_size)))
    return files, results


def _failed(output: str) -> set[tuple[str, str]]:
    """``(check, run)`` of every failing expression promtool printed; ``check`` is the alert of a broken run, ``*``
    for a healthy run's loud alerts, ``pending:<alert>`` for a demo run's CALM alerts."""
    out = set()
    for m in re.finditer(r'expr: "(.*?)", time:', output):
        expr = m.group(1).replace('\\"', '"')
        run = re.search(r'run="([^"]+)"', expr)
        alert = re.search(r'alertname=(~?)"([^"]+)"', expr)  # =~: the CALM alerts, pending or firing
        name = "*" if alert is None else f"pending:{alert.group(2)}" if alert.group(1) else alert.group(2)
        out.add((name, run.group(1) if run else "?"))
    return out


def test_healthy_runs_are_quiet_and_broken_runs_fire_in_time(corpus):
    files, results = corpus
    failed: set[tuple[str, str]] = set()
    for path, proc in results.items():
        if proc.returncode != 0:
            failed |= _failed(proc.stdout + proc.stderr) or {("?", path.name)}
    table = alert_corpus.table(list(files.values()), failed)
    Path("/tmp/alert_table.md").write_text(table)
    assert failed == set(), table


def test_the_corpus_is_what_the_brief_asks(corpus):
    files, _ = corpus
    groups = list(files.values())
    healthy = [c for g in groups for c in g.checks if c.kind == "healthy"]
    broken = [c for g in groups for c in g.checks if c.kind == "broken"]
    demo = next(g for g in groups if g.name == "demo")
    # the demo's real trajectory at three seeds, 1,000+ steps each (one a minute)
    assert len(demo.runs) == 3 and demo.minutes >= 1000
    # and as docker-compose runs it: six runs of the default 200 steps back to back, scraped every 15 s, each
    # lingering 4 minutes; the series of one run end where the next run's begin
    live = next(g for g in groups if g.name == "demo-live")
    assert [r.name for r in live.runs] == [f"compose-demo-{i}" for i in range(1, 7)] and live.interval == "15s"
    ratio = [next(v for k, v in r.series.items() if k.startswith("rl_actor_importance_ratio{")) for r in live.runs]
    assert all(len(v) == len(ratio[0]) for v in ratio)
    for i, v in enumerate(ratio):
        present = [j for j, x in enumerate(v) if x is not None]
        assert present == list(range(present[0], present[-1] + 1)) and len(present) >= alert_corpus.LINGER_S // 15
        assert v[present[-1]] == v[present[-1] - alert_corpus.LINGER_S // 15 + 1]  # held while it lingers
        if i:
            assert present[0] > max(j for j, x in enumerate(ratio[i - 1]) if x is not None)
    # every alert on a concept (or rl_otel's phases, goodput and progress) has a broken run on at least one
    # framework ...
    covered = {c.alert for c in broken}
    expected = {a.name for a in rules.alerts() if a.concept is not None} | {
        "RLPhaseStuck", "RLRankSkew", "RLMetricImpossible", "RLGoodputDrop", "RLProcessNoProgress"}
    assert expected <= covered, expected - covered
    # ... goodput and progress on each of the ten frameworks (buckets from their timing keys), the named straggler
    # where ranks run phases (ROLL's workers, rl_otel's tel.phase())
    frameworks_of = {a: {c.framework for c in broken if c.alert == a} for a in covered}
    assert frameworks_of["RLGoodputDrop"] == frameworks_of["RLProcessNoProgress"] == set(ALL_FRAMEWORKS)
    named = {(c.framework, c.ranks) for c in broken if c.alert == "RLRankSkew" and c.ranks}
    assert named == {("roll", (str(alert_corpus.SLOW_RANK),)), ("rl_otel phase()", ("1",))}
    for g in groups:  # every healthy framework run serves each of its processes' buckets, summing to its wall
        if g.name in ALL_FRAMEWORKS:
            run = next(r for r in g.runs if r.name == f"{g.name}-healthy")
            walls = {k: v for k, v in run.series.items() if k.startswith("rl_goodput_wall_seconds_total{")}
            assert walls, g.name
            for wall, values in walls.items():
                role = re.search(r'role="(\w+)"', wall).group(1)
                buckets = [v for k, v in run.series.items() if k.startswith("rl_goodput_bucket_seconds_total{")
                           and f'role="{role}"' in k]
                assert len(buckets) == len(contract.BUCKETS)
                assert [round(sum(b[m] for b in buckets), 1) for m in range(len(values))] == values
    # ... on every framework that logs a concept it reads, TRL's KL to the reference among them
    frameworks = {(c.alert, c.framework) for c in broken}
    assert {("RLRefKLRunaway", "trl"), ("RLEntropyCollapse", "roll"), ("RLTrainInferenceMismatch", "verl"),
            ("RLStalenessHigh", "verl"), ("RLStalenessHigh", "trl")} <= frameworks
    assert len(healthy) >= 8 and len(broken) >= 50


def test_roll_default_entropy_zero_is_replayed_and_quiet(corpus):
    files, results = corpus
    path = next(p for p, g in files.items() if g.name == "roll")
    doc = yaml.safe_load(path.read_text())
    entropy = [s for s in doc["tests"][0]["input_series"]
               if s["series"].startswith("rl_critic_entropy{") and 'run="roll-healthy"' in s["series"]
               and 'stat="mean"' in s["series"]]
    assert entropy and set(entropy[0]["values"].split()) == {"0"}
    assert results[path].returncode == 0, results[path].stdout + results[path].stderr


def test_the_demo_would_near_a_page_with_an_absolute_importance_ratio_threshold(tmp_path):
    """The CALM check is not vacuous: with the importance-ratio rule of before (the batch max itself against an
    absolute 10: a ceiling of 10 over a window of one sample), the demo's healthy runs go pending, at the recorded
    single-step spikes (1 step a minute) and in the compose runs' scrapes and lingering."""
    import dataclasses

    promtool = require_binary("promtool")
    old = dataclasses.replace(rules.DEFAULT, ratio_max=10.0, ratio_max_smooth="1m", ratio_max_for="10m")
    for fname, doc in rules.rule_files(old).items():
        (tmp_path / fname).write_text(yaml.safe_dump(doc, sort_keys=False, width=10_000))
    pending = set()
    for g in (g for g in alert_corpus.groups(old) if g.name.startswith("demo")):
        docs = alert_corpus.test_document([g], [str(tmp_path / f) for f in rules.rule_files(old)])
        (tmp_path / f"{g.name}.yml").write_text(yaml.safe_dump(docs, sort_keys=False, width=10_000))
        proc = subprocess.run([promtool, "test", "rules", str(tmp_path / f"{g.name}.yml")], capture_output=True,
                              text=True, timeout=300)
        failed = _failed(proc.stdout + proc.stderr)
        assert {alert for alert, _ in failed} <= {"pending:RLImportanceRatioExploding"}, failed
        pending |= {run for _, run in failed}
    assert {"demo-0", "demo-1", "demo-2"} <= pending, pending


def test_a_broken_alert_is_caught(tmp_path):
    """The corpus is not vacuous: with RLKLRunaway's ratio 100x higher its broken runs miss, and with an entropy
    threshold of half the run's best the healthy demo pages (its entropy falls from ~2.4 to ~0.3 as it learns)."""
    promtool = require_binary("promtool")
    t = rules.DEFAULT
    import dataclasses

    for name, changed, bad in (("high", dataclasses.replace(t, approx_kl_ratio=400), "broken"),
                               ("tight", dataclasses.replace(t, entropy_ratio_min=0.5), "healthy")):
        folder = tmp_path / name
        folder.mkdir()
        for fname, doc in rules.rule_files(changed).items():
            (folder / fname).write_text(yaml.safe_dump(doc, sort_keys=False, width=10_000))
        groups = [g for g in alert_corpus.groups(changed) if g.name in ("demo", "verl")]
        for g in groups:  # the demo's first seed, verl's KL runs: what the changed rule decides
            g.runs = [r for r in g.runs if r.name in ("demo-0", "verl-healthy", "verl-RLKLRunaway")]
            g.checks = [c for c in g.checks if c.alert in ("RLKLRunaway", "*") and c.run in {r.name for r in g.runs}
                        and (bad == "broken") == (c.kind == "broken")]
        docs = alert_corpus.test_document(groups, [str(folder / f) for f in rules.rule_files(changed)])
        (folder / "t.yml").write_text(yaml.safe_dump(docs, sort_keys=False, width=10_000))
        proc = subprocess.run([promtool, "test", "rules", str(folder / "t.yml")], capture_output=True, text=True,
                              timeout=300)
        failed = _failed(proc.stdout + proc.stderr)
        assert proc.returncode != 0
        if bad == "broken":
            assert ("RLKLRunaway", "verl-RLKLRunaway") in failed, failed
        else:
            assert any(run.startswith("demo-") for _, run in failed), failed


def _judge(tmp_path: Path, rule_docs: dict[str, dict], groups: list[alert_corpus.Group]) -> set[tuple[str, str]]:
    """promtool's failing checks of ``groups`` under the rule files ``rule_docs``."""
    for fname, doc in rule_docs.items():
        (tmp_path / fname).write_text(yaml.safe_dump(doc, sort_keys=False, width=10_000))
    docs = alert_corpus.test_document(groups, [str(tmp_path / f) for f in rule_docs])
    (tmp_path / "t.yml").write_text(yaml.safe_dump(docs, sort_keys=False, width=10_000))
    proc = subprocess.run([require_binary("promtool"), "test", "rules", str(tmp_path / "t.yml")],
                          capture_output=True, text=True, timeout=300)
    assert (proc.returncode == 0) == (not _failed(proc.stdout + proc.stderr)), proc.stdout + proc.stderr
    return _failed(proc.stdout + proc.stderr)


def _only(gs: list[alert_corpus.Group], names: set[str], alerts: set[str]) -> list[alert_corpus.Group]:
    """The groups holding runs ``names``, cut down to those runs and to the checks of ``alerts`` (and "*")."""
    out = []
    for g in gs:
        g.runs = [r for r in g.runs if r.name in names]
        g.checks = [c for c in g.checks if c.run in names and c.alert in alerts | {"*"}]
        if g.runs:
            out.append(g)
    return out


def test_the_phase_rule_alone_would_miss_the_straggler_or_name_no_rank(tmp_path):
    """The straggler runs are not vacuous: with RLRankSkew as it was (the slowest rank's phase time against the
    median rank's, no rank label), the slowed rank of ROLL's workers and of rl_otel's phases is never named: the
    all-reduce in the phase evens out the phase times, and the waiting ranks' are the longer ones."""
    docs = rules.rule_files()
    rank_skew = next(r for g in docs["rl_otel_alerts.yml"]["groups"] for r in g["rules"]
                     if r.get("alert") == "RLRankSkew")
    t = rules.DEFAULT
    rank_skew["expr"] = (f"{rules.RANK_SKEW} > {t.rank_skew_max:g} and {rules.RANK_SPREAD} > "
                         f"{t.rank_skew_min_seconds:g}")
    gs = [g for g in alert_corpus.groups() if g.name in ("roll", "phases")]
    failed = _judge(tmp_path, docs, _only(gs, {"roll-RLRankSkew", "phases-RLRankSkew-compute"}, {"RLRankSkew"}))
    assert {("RLRankSkew", "roll-RLRankSkew"), ("RLRankSkew", "phases-RLRankSkew-compute")} <= failed, failed


def test_the_goodput_alert_would_page_on_checkpoints_without_its_smoothing(tmp_path):
    """The healthy runs' checkpoint dips are not vacuous: judged on the 5-minute goodput itself for 5 minutes, a
    10-minute checkpoint pages on every framework's healthy run; the shipped smoothing and `for` keep it quiet."""
    import dataclasses

    jumpy = dataclasses.replace(rules.DEFAULT, goodput_smooth="5m", goodput_for="5m")
    gs = [g for g in alert_corpus.groups(jumpy) if g.name in ("verl", "nemo_rl")]
    failed = _judge(tmp_path, rules.rule_files(jumpy),
                    _only(gs, {"verl-healthy", "nemo_rl-healthy"}, {"RLGoodputDrop"}))
    assert {("*", "verl-healthy"), ("*", "nemo_rl-healthy")} <= failed, failed
