"""The straggler named end to end: four real gloo ranks (one slowed, tests/straggler_ranks.py) serve their
compute seconds; the recording rules single out the slowed rank, and RLRankSkew names it and no other - under a real
Prometheus scraping the ranks, and under promtool replaying the rates they served for as long as the shipped
`for` needs."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from rl_otel.ops import contract, rules
from tests.promtools import PrometheusServer, require_binary, samples, scrape
from tests.straggler_ranks import start_ranks

pytestmark = pytest.mark.prometheus

SLOW = 2
RANKS = 4
COMPUTE = contract.RANK_COMPUTE.exposed


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    with start_ranks(RANKS, slow_rank=SLOW) as running:
        yield running.urls


def _compute(url: str) -> tuple[dict[str, str], float]:
    """The rank's labels (run, role, rank) and its compute seconds now (none before its first phase)."""
    served = samples(scrape(url), COMPUTE)
    if not served:
        return {}, 0.0
    (labels, value), = served.items()
    return dict(labels), value


def _rates(urls: list[str], seconds: float = 6.0) -> dict[str, float]:
    """Each rank's compute seconds per second of wall time, measured over ``seconds`` (from a first step on)."""
    deadline = time.monotonic() + 60
    while not all(_compute(u)[1] > 0 for u in urls):  # every rank has stepped
        assert time.monotonic() < deadline, "a rank served no compute time within 60 s"
        time.sleep(0.2)
    before = [(time.monotonic(), _compute(u)) for u in urls]
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.2)
    out = {}
    for url, (t0, (labels, v0)) in zip(urls, before, strict=True):
        labels, v1 = _compute(url)
        out[labels["rank"]] = (v1 - v0) / (time.monotonic() - t0)
    return out


def test_the_slowed_rank_computes_the_most_and_the_others_alike(ranks):
    rates = _rates(ranks)
    median = sorted(rates.values())[1:3]
    ratio = {rank: r / (sum(median) / 2) for rank, r in rates.items()}
    assert ratio[str(SLOW)] > rules.DEFAULT.rank_skew_max, ratio
    assert all(v < rules.DEFAULT.rank_skew_max for rank, v in ratio.items() if rank != str(SLOW)), ratio


def test_a_real_prometheus_names_the_slowed_rank_only(ranks, tmp_path):
    """The shipped rules, with RLRankSkew's `for` at 0 (the run lasts seconds, not 30 minutes)."""
    t = dataclasses.replace(rules.DEFAULT, rank_skew_for="0s")
    paths = []
    for name, doc in rules.rule_files(t).items():
        (tmp_path / name).write_text(json.dumps(doc))
        paths.append(tmp_path / name)
    targets = [u.split("//")[1].split("/")[0] for u in ranks]
    (tmp_path / "prom").mkdir()
    server = PrometheusServer(tmp_path / "prom", targets, rule_files=paths)
    try:
        server.wait_for_scrapes(3)
        deadline, named = time.monotonic() + 90, set()
        while time.monotonic() < deadline:
            named = {a["metric"]["rank"] for a in server.query('ALERTS{alertname="RLRankSkew", alertstate="firing"}')}
            if named:
                break
            time.sleep(0.5)
        ratio = {r["metric"]["rank"]: float(r["value"][1])
                 for r in server.query(rules.RANK_COMPUTE_RATIO)}
        assert named == {str(SLOW)}, (named, ratio)
        assert max(ratio, key=ratio.get) == str(SLOW) and len(ratio) == RANKS
        # the annotation names the rank
        alert = next(a for a in server.api("alerts")["alerts"] if a["labels"]["alertname"] == "RLRankSkew")
        assert f"rank {SLOW} " in alert["annotations"]["summary"], alert
    finally:
        server.close()


def test_promtool_names_the_slowed_rank_only_over_the_shipped_for(ranks, tmp_path):
    """The rates the ranks served, replayed for 50 minutes a sample a minute under the shipped rules and
    thresholds: RLRankSkew fires once its `for` has passed, for the slowed rank alone."""
    rates = _rates(ranks)
    labels = {rank: _compute(u)[0] for rank, u in zip((str(r) for r in range(RANKS)), ranks, strict=True)}
    minutes = 50
    series = []
    for rank, rate in rates.items():
        sel = ", ".join(f'{k}="{v}"' for k, v in {"job": "rl_otel", "instance": f"r{rank}:9464",
                                                  **labels[rank]}.items())
        series.append({"series": f"{COMPUTE}{{{sel}}}", "values": f"0+{rate * 60:.6g}x{minutes}"})
    root = Path(__file__).resolve().parent.parent / "prometheus" / "rules"
    doc = {"rule_files": [str(root / "rl_otel_recording.yml"), str(root / "rl_otel_alerts.yml")],
           "evaluation_interval": "1m",
           "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": [
               {"expr": 'group by (rank) (ALERTS{alertname="RLRankSkew", alertstate="firing"})',
                "eval_time": f"{minutes - 5}m", "exp_samples": [{"labels": f'{{rank="{SLOW}"}}', "value": 1}]},
               {"expr": 'ALERTS{alertname="RLRankSkew", alertstate="firing"}', "eval_time": "20m",
                "exp_samples": []}]}]}
    path = tmp_path / "straggler_test.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    proc = subprocess.run([require_binary("promtool"), "test", "rules", str(path)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
