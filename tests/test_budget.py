"""The series budget (rl_otel.ops.budget, ``rl-otel budget``) against the real thing: the per-rank figure equals the
sample lines a rank serves after logging the shape's keys (family by family, caps included), the per-target and
recorded figures equal what a real Prometheus holds, and the job figures scale as the shape says."""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections import Counter
from pathlib import Path

import pytest
import torch

import rl_otel
from rl_otel.cli import main as cli_main
from rl_otel.ops import budget as b
from rl_otel.ops import contract
from rl_otel.ops.rules import PHASE_P90, RANK_COMPUTE_RATIO, recording_rules, rule_files
from rl_otel.ops.thresholds import DEFAULT
from rl_otel.stats import ppo_stats
from tests.promtools import PrometheusServer, scrape

pytestmark = pytest.mark.slow  # the slow layer (tests/conftest.py)

ROOT = Path(__file__).resolve().parent.parent
# CPU: no CUDA, so no live GPU gauges; the GPU memory keys are logged as ROLL logs them
SHAPE = b.Shape(clusters=3, clusters_per_rank=2, phases=3, devices_per_rank=2, tasksets=2, eval_metrics=2, eval_ks=2,
                rollout_metrics=2, live_gpu=False, user_keys=4)


def ppo(n: int = 16, t: int = 12) -> dict:
    g = torch.Generator().manual_seed(0)
    lp = -torch.rand(n, t, generator=g) * 3
    mask = (torch.arange(t)[None, :] < torch.randint(1, t + 1, (n,), generator=g)[:, None]).long()
    r = lambda *shape: torch.randn(*shape, generator=g)
    return ppo_stats(log_probs=lp, old_log_probs=lp + 0.1 * r(n, t), ref_log_probs=lp + 0.1 * r(n, t),
                     response_mask=mask, advantages=r(n, t), values=r(n, t), returns=r(n, t), rewards=r(n),
                     scores=r(n), entropy=torch.rand(n, t, generator=g), distributions=True)


def test_the_ppo_key_list_is_what_ppo_stats_returns():
    assert tuple(sorted(ppo())) == b.PPO_KEYS


def log_shape(tel: rl_otel.Telemetry, shape: b.Shape, step_rank: bool) -> None:
    """What a rank of ``shape`` does in a step: its phases (timed by tel.phase), the GPU memory keys a CUDA process
    would add, the step's statistics on a step rank, the user's keys."""
    for cluster, phase in b.phase_pairs(shape):
        with tel.phase(cluster, phase):
            pass
    keys = [k for k in b.phase_keys(shape) if k.startswith("memory/") and not k.startswith("memory/cpu/")]
    metrics: dict[str, object] = dict.fromkeys(keys + b.user_keys(shape), 0.5)
    if step_rank:
        stats = ppo()
        metrics.update({k: v for k, v in stats.items() if shape.distributions or not k.endswith("_dist")})
        metrics.update({k: 0.25 for k in b.step_keys(shape) if k not in stats})
    tel.log(metrics, step=3)


def served(text: str) -> Counter:
    """Sample lines per family (a histogram's _bucket/_sum/_count lines under the family's name)."""
    out: Counter = Counter()
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name = line.split("{")[0].split(" ")[0]
            out[re.sub(r"_(bucket|sum|count|total)$", "", name) if not name.startswith("target_info") else name] += 1
    return out


def expected_families(endpoint: b.Endpoint) -> Counter:
    return Counter({re.sub(r"_total$", "", f): n for f, n in endpoint.by_family().items()})


@pytest.mark.parametrize("step_rank", [False, True], ids=["worker", "step-rank"])
def test_per_rank_series_equal_what_a_rank_serves(step_rank):
    with rl_otel.init(run="budget", rank=1, prometheus={"host": "127.0.0.1", "port": 0}) as tel:
        log_shape(tel, SHAPE, step_rank)
        got = served(scrape(str(tel.metrics_url)))
    endpoint = b.step_endpoint(SHAPE) if step_rank else b.worker_endpoint(SHAPE)
    assert got == expected_families(endpoint)
    assert sum(got.values()) == endpoint.lines


def test_caps_are_counted_as_the_store_applies_them():
    shape = dataclasses.replace(SHAPE, max_series_per_metric=5, max_unknown_keys=2)
    with rl_otel.init(run="capped", prometheus={"host": "127.0.0.1", "port": 0}, max_series_per_metric=5,
                      max_unknown_keys=2) as tel:
        log_shape(tel, shape, step_rank=False)
        got = served(scrape(str(tel.metrics_url)))
    # past a cap rl_otel counts the drops in its own counter family: not part of the healthy budget
    dropped = got.pop("rl_telemetry_dropped_series", 0)
    assert dropped > 0
    assert got == expected_families(b.worker_endpoint(shape))
    assert got["rl_phase_duration_seconds"] == 5 * (len(b.live.PHASE_DURATION.buckets) + 3)
    assert sum(1 for f in got if f.startswith("rl_custom_metric")) == 2


@pytest.mark.prometheus
def test_per_target_and_recorded_series_equal_what_prometheus_holds(tmp_path):
    paths = []
    for name, doc in rule_files(DEFAULT).items():
        path = tmp_path / name
        path.write_text(json.dumps(doc))  # JSON is YAML
        paths.append(path)
    with rl_otel.init(run="budget-prom", rank=0, prometheus={"host": "127.0.0.1", "port": 0}) as tel:
        log_shape(tel, SHAPE, step_rank=True)
        target = str(tel.metrics_url).split("//")[1].split("/")[0]
        (tmp_path / "prom").mkdir()
        server = PrometheusServer(tmp_path / "prom", [target], rule_files=paths)
        try:
            server.wait_for_scrapes(3)
            expected = b.budget(dataclasses.replace(SHAPE, gpus=1, gpus_per_node=1))
            [count] = server.query(f'count({{instance="{target}"}})')
            assert int(count["value"][1]) == expected.per_target + expected.step_series
            rec = b.recorded(b.step_endpoint(SHAPE).series())
            # a baseline is a median of the run's own past (an hour, 15 minutes ago), a phase's p90 needs phases
            # that took time over its window: none in a fresh run
            # and a rank's compute ratio needs compute within the rate window (the shape's phases end before the
            # first scrape)
            want = {name: n for name, n in rec.items() if n and not name.endswith("_baseline")
                    and name not in (PHASE_P90, RANK_COMPUTE_RATIO)}
            deadline = time.monotonic() + 60
            got: dict[str, int] = {}
            while time.monotonic() < deadline and got != want:
                got = dict(Counter(r["metric"]["__name__"] for r in server.query('{__name__=~"run.*:.+"}')))
                time.sleep(0.5)
            assert got == want
            assert expected.job_recorded == sum(rec.values())
        finally:
            server.close()


def test_job_figures_scale_with_the_shape():
    small, large = b.budget(b.Shape(gpus=64)), b.budget(b.Shape(gpus=1024))
    per_worker = small.worker_series + small.per_target
    assert large.job_scraped - small.job_scraped == (1024 - 64) * per_worker
    assert (small.shape.nodes, large.shape.nodes) == (8, 128)
    assert large.node_series == small.node_series  # a node is a node
    # recording rules keep no rank (one run, one set) but the straggler rules', one series per rank
    per_rank = sum(r.record.startswith("run_role_rank:") for r in recording_rules()) \
        if contract.served(contract.RANK_COMPUTE) else 0
    assert large.job_recorded - small.job_recorded == (1024 - 64) * per_rank
    every = b.budget(b.Shape(gpus=64, step_ranks=64))
    assert every.job_scraped - small.job_scraped == 63 * (every.step_series - every.worker_series)
    assert large.samples_per_second == pytest.approx(large.job_scraped / 15 + large.job_recorded / 15)
    with pytest.raises(ValueError, match=r"Shape\.gpus must be an int >= 1"):
        b.Shape(gpus=0)
    with pytest.raises(ValueError, match="clusters_per_rank"):
        b.Shape(clusters=2, clusters_per_rank=3)


def test_the_command_prints_the_three_sizes(capsys):
    assert cli_main(["budget", "--format", "json", "--ranks-per-gpu", "2"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["gpus"] for r in doc["budgets"]] == [8, 64, 1024] and doc["shape"]["ranks_per_gpu"] == 2
    assert [r["ranks"] for r in doc["budgets"]] == [16, 128, 2048]
    assert cli_main(["budget", "--gpus", "8"]) == 0
    table = capsys.readouterr().out
    assert table.splitlines()[0].split()[:3] == ["GPUs", "nodes", "ranks"] and "per worker rank" in table
    assert cli_main(["budget", "--gpus", "8", "--phases", "-1"]) == 2
    assert "Shape.phases must be an int >= 0" in capsys.readouterr().err


@pytest.mark.prometheus
def test_dropping_the_phase_buckets_as_agent_yml_suggests_leaves_what_the_budget_counts(tmp_path):
    """prometheus/agent.yml's commented write_relabel_configs (here as metric_relabel_configs, the same relabeling
    at scrape time): each rank keeps its phase means (_sum/_count) and loses the buckets, as the budget says."""
    import yaml

    text = (ROOT / "prometheus/agent.yml").read_text()
    # uncomment the suggested block (the lines right under "# write_relabel_configs:")
    block = re.search(r"^( *)# (write_relabel_configs:\n(?:\1#   .*\n)+)", text, re.M)
    assert block is not None
    agent = yaml.safe_load(text.replace(block.group(0), block.group(1) + block.group(2).replace(
        block.group(1) + "#   ", block.group(1) + "  ")))
    relabel = agent["remote_write"][0]["write_relabel_configs"]
    assert relabel == [{"source_labels": ["__name__"], "regex": "rl_phase_duration_seconds_bucket", "action": "drop"}]
    with rl_otel.init(run="dropped", rank=0, prometheus={"host": "127.0.0.1", "port": 0}) as tel:
        log_shape(tel, SHAPE, step_rank=False)
        target = str(tel.metrics_url).split("//")[1].split("/")[0]
        server = PrometheusServer(tmp_path, scrape_configs=[{
            "job_name": "rl_otel", "honor_labels": True, "static_configs": [{"targets": [target]}],
            "metric_relabel_configs": relabel}])
        try:
            server.wait_for_scrapes(2)
            [count] = server.query(f'count({{instance="{target}"}})')
            dropped = b.worker_endpoint(dataclasses.replace(SHAPE, drop_phase_buckets=True))
            assert int(count["value"][1]) == dropped.lines + len(b.PER_TARGET)
            assert dropped.lines < b.worker_endpoint(SHAPE).lines
            assert server.query("rl_phase_duration_seconds_count") and not server.query(
                "rl_phase_duration_seconds_bucket")
        finally:
            server.close()


def test_the_issue_33_series_are_counted_once_the_catalog_defines_them(monkeypatch):
    """A process with phases serves every goodput bucket, its wall clock, its last progress and its compute seconds
    (and a wait counter per tel.collective() point); the recording rules add a series per bucket, per role and, for
    the two straggler rules, per rank. Counted only where the catalog defines the families (an rl_otel that serves
    them): forced here, as the merged catalog will have them."""
    counted = [f for f in (contract.GOODPUT_BUCKET, contract.GOODPUT_WALL, contract.LAST_PROGRESS,
                           contract.RANK_COMPUTE) if not contract.served(f)]  # not yet in this catalog
    before = b.budget(b.Shape(gpus=64))
    monkeypatch.setattr(contract, "served", lambda family: True)
    after = b.budget(b.Shape(gpus=64))
    points = b.budget(b.Shape(gpus=64, collective_points=2))
    extra = sum(len(contract.BUCKETS) if f is contract.GOODPUT_BUCKET else 1 for f in counted)
    assert after.worker_series - before.worker_series == extra
    assert after.step_series - before.step_series == extra
    assert points.worker_series - after.worker_series == 2
    rec = b.recorded(b.worker_endpoint(b.Shape(gpus=64)).series(), ranks=64)
    assert rec["run_role_bucket:rl_goodput_bucket_seconds:rate5m"] == len(contract.BUCKETS)
    assert rec["run_role_bucket:rl_goodput_bucket_seconds:share_rate5m"] == len(contract.BUCKETS)
    assert rec["run_role:rl_goodput:ratio_rate5m"] == rec["run_role:rl_goodput_wall_seconds:rate5m"] == 1
    assert rec["run_role_rank:rl_rank_compute:rate5m"] == rec["run_role_rank:rl_rank_compute_ratio:rate5m"] == 64
