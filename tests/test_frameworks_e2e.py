"""Each framework's real key set, replayed into a real Prometheus that evaluates the shipped rules.

For ROLL, veRL, TRL and Trinity-RFT, two runs log every key the framework's code emits (tests/data/frameworks):
a healthy run, and a run whose core quantities turn bad half-way (KL runs away, the loss turns NaN, entropy
collapses, the reward falls, ...). The rules are the generated ones with every ``for`` at 0s and short windows (the
expressions are the shipped ones). Every alert whose concept the framework logs must fire on the bad run and stay
quiet on the healthy one, and every dashboard panel reading a family the framework's keys produce returns data.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time

import pytest
import yaml

import rl_otel
from rl_otel.catalog.concepts import concept
from rl_otel.ops import rules
from rl_otel.ops.dashboards import dashboards
from rl_otel.ops.promql import metric_names, substitute
from rl_otel.ops.thresholds import DEFAULT
from tests.frameworks import FRAMEWORKS, concept_keys, concepts_logged, load, resolve
from tests.promtools import PrometheusServer

pytestmark = pytest.mark.prometheus

# Every alert's `for` at 0s and its windows short, so a replay of a few seconds decides it; expressions unchanged.
FAST = dataclasses.replace(DEFAULT, **{f.name: "0s" for f in dataclasses.fields(DEFAULT) if f.name.endswith("_for")},
                           reward_window="10m", eval_window="10m", throughput_window="10m",
                           telemetry_errors_window="10m")

# (healthy value, bad value) of each concept, placed against the thresholds; `before` is the bad run's value
# while it is still healthy, where the alert compares with the run's own past (reward, eval, throughput).
VALUES: dict[str, tuple[float, float]] = {
    "reward": (0.5, 0.5 - 2 * FAST.reward_drop),
    "policy_kl": (FAST.approx_kl_max / 10, FAST.approx_kl_max * 10),
    "importance_ratio_max": (1.1, FAST.ratio_max * 5),
    "clip_ratio": (FAST.clip_ratio_max / 10, (1 + FAST.clip_ratio_max) / 2),
    "entropy": (1.0, FAST.entropy_min / 10),
    "explained_variance": (0.6, FAST.explained_variance_min - 0.5),
    "policy_loss": (0.5, math.nan),
    "gpu_memory_peak_ratio": (0.5, (1 + FAST.gpu_peak_ratio_max) / 2),
    "throughput": (1000.0, 1000.0 * FAST.throughput_ratio_min / 5),
    "eval_score": (0.7, 0.7 - 4 * FAST.eval_drop),
}
HEALTHY_STEPS, BAD_STEPS = 6, 8


def _values(keys, bad: bool, step: int) -> dict[str, float]:
    counters = {k.key for k in keys if k.kind == "counter"}
    by_concept = {k: name for name in VALUES for k in concept_keys(keys, concept(name))}
    out = {}
    for k in keys:
        if k.key in counters:
            out[k.key] = float(10 * (step + 1))
        elif k.key in by_concept:
            healthy, broken = VALUES[by_concept[k.key]]
            out[k.key] = broken if bad and step >= HEALTHY_STEPS else healthy
        else:
            out[k.key] = 1.0
    return out


@pytest.fixture(scope="module")
def replay(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("frameworks")
    rule_paths = []
    for name, doc in rules.rule_files(FAST).items():
        path = tmp / name
        path.write_text(yaml.safe_dump(doc, sort_keys=False, width=10_000))
        rule_paths.append(path)
    fixtures = {f: load(f) for f in FRAMEWORKS}
    tels = {}
    server = None
    try:
        for f in FRAMEWORKS:
            for health in ("good", "bad"):
                tels[f, health] = rl_otel.init(run=f"{f}-{health}", rank=0, handle_sigterm=False,
                                               prometheus={"host": "127.0.0.1", "port": 0})
        targets = [t.metrics_url.split("//")[1].split("/")[0] for t in tels.values()]
        (tmp / "prom").mkdir()
        server = PrometheusServer(tmp / "prom", targets, rule_files=rule_paths)
        server.wait_for_scrapes(1)
        for step in range(HEALTHY_STEPS + BAD_STEPS):
            for (f, health), tel in tels.items():
                tel.log(_values(fixtures[f], health == "bad", step), step=step)
            _wait_next_scrape(server)
        _wait_rules(server)
        yield server, fixtures
    finally:
        if server is not None:
            server.close()
        for tel in tels.values():
            tel.close()


def _wait_next_scrape(server: PrometheusServer) -> None:
    """Until every target was scraped once more (so each step's values are seen by Prometheus)."""
    start = {r["metric"]["instance"]: float(r["value"][1])
             for r in server.query("timestamp(up)")}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        now = {r["metric"]["instance"]: float(r["value"][1]) for r in server.query("timestamp(up)")}
        if now and all(now.get(i, 0) > t for i, t in start.items()):
            return
        time.sleep(0.2)
    raise TimeoutError("targets were not scraped again")


def _wait_rules(server: PrometheusServer) -> None:
    """Until the rule groups evaluated twice after the last scrape (alerts with for=0s are then firing)."""
    last_scrape = max(float(r["value"][1]) for r in server.query("timestamp(up)"))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        groups = server.api("rules")["groups"]
        evaluated = [g.get("lastEvaluation", "") for g in groups]
        stamps = [_rfc3339(e) for e in evaluated]
        if stamps and all(s > last_scrape + 1.5 for s in stamps):
            return
        time.sleep(0.3)
    raise TimeoutError("rules were not evaluated after the last scrape")


def _rfc3339(text: str) -> float:
    from datetime import datetime

    m = re.fullmatch(r"(.*?)(\.\d+)?(Z|[+-]\d\d:\d\d)", text)
    if not m:
        return 0.0
    base = datetime.fromisoformat(m.group(1) + ("+00:00" if m.group(3) == "Z" else m.group(3)))
    return base.timestamp() + float(m.group(2) or 0)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_every_alert_on_a_logged_concept_fires_on_the_bad_run_only(replay, framework):
    server, fixtures = replay
    logged = concepts_logged(fixtures[framework])
    firing = {(r["metric"]["alertname"], r["metric"].get("run")) for r in server.query('ALERTS{alertstate="firing"}')}
    checked = []
    for alert in rules.alerts(FAST):
        if alert.concept is None:
            continue
        if alert.concept in logged:
            checked.append(alert.name)
            assert (alert.name, f"{framework}-bad") in firing, (alert.name, logged[alert.concept])
        assert (alert.name, f"{framework}-good") not in firing, alert.name
    assert len(checked) >= 5, checked
    print(f"\n{framework}: {len(checked)} alerts fire on the bad run only: {checked}")


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_every_panel_on_a_logged_family_returns_data(replay, framework):
    server, fixtures = replay
    families = {res.spec.prometheus_name for res in resolve(fixtures[framework]).values() if res.known}
    logged = set(concepts_logged(fixtures[framework]))
    values = {"job": "rl_otel", "run": f"{framework}-good", "cluster": ".*", "phase": ".*", "device_id": ".*",
              "datasource": "prometheus"}
    checked, empty = 0, []
    for board in dashboards(FAST):
        for panel in board.panels:
            read = {n for q in panel.queries for n in metric_names(q.expr)}
            reads_family = {n for n in read if n in families or n.rsplit("_", 1)[0] in families}
            if panel.concept is not None:
                if panel.concept not in logged:
                    continue
            elif not reads_family:
                continue
            checked += 1
            if not any(server.query(substitute(q.expr, values)) for q in panel.queries):
                empty.append((board.uid, panel.title))
    assert empty == []
    assert checked >= 8
    print(f"\n{framework}: {checked} dashboard panels return data")
