"""A real Prometheus scrapes a run with rollout engines: two ranks of one tensor-parallel vLLM replica running in
the ranks' processes (its families in prometheus_client's registry, served by each rank's rl_otel endpoint), and an
SGLang server (prometheus_client's own HTTP server on a loopback port, standing in for ``sglang.launch_server
--enable-metrics``; like the real one it writes ``sglang_*`` sample names to a Prometheus 2) that rank 0 published
with ``tel.engine()``; every target found through rl_otel's file_sd files. The engines' families reach Prometheus
with the run's labels, the engine rules record (a TP group's tokens counted once), and every query of the "Rollout
engines" dashboard returns data."""

from __future__ import annotations

import contextlib
import re
import time
from pathlib import Path

import pytest
from prometheus_client import REGISTRY, CollectorRegistry, start_http_server

import rl_otel
from rl_otel.ops import engines
from rl_otel.ops.dashboards import VARIABLES, dashboards
from rl_otel.ops.promql import substitute
from tests.engine_families import sglang_engine, vllm_engine
from tests.promtools import PrometheusServer

pytestmark = [pytest.mark.slow, pytest.mark.prometheus]

ROOT = Path(__file__).resolve().parent.parent
RULES = [ROOT / "prometheus/rules/rl_otel_recording.yml", ROOT / "prometheus/rules/rl_otel_engines.yml"]
RUN = "e2e-engines"
ROLE = "actor"
VLLM_TOKENS_PER_STEP = 40.0


def _wait(prom: PrometheusServer, query: str, count: int, timeout: float = 60.0) -> list[dict]:
    """The query's result once it holds ``count`` series; fails naming the query and what it held."""
    deadline = time.monotonic() + timeout
    got: list[dict] = []
    while time.monotonic() < deadline:
        got = prom.query(query)
        if len(got) >= count:
            return got
        time.sleep(0.5)
    raise AssertionError(f"{query}: {len(got)} series after {timeout:g}s, wanted {count}: {got}")


@pytest.fixture(scope="module")
def prom(tmp_path_factory):
    targets = tmp_path_factory.mktemp("file_sd")
    in_process, server_registry = CollectorRegistry(), CollectorRegistry()
    vllm, sglang = vllm_engine(in_process), sglang_engine(server_registry)
    REGISTRY.register(in_process)  # where an in-process vLLM keeps its families
    httpd, thread = start_http_server(0, addr="127.0.0.1", registry=server_registry)
    stack = contextlib.ExitStack()
    server = None
    tels = []
    try:
        for rank in (0, 1):  # one tensor-parallel group: both ranks run the same engine, one replica
            tels.append(rl_otel.init(run=RUN, role=ROLE, rank=rank, handle_sigterm=False, engines={"replica": "dp0"},
                                     prometheus={"host": "127.0.0.1", "port": 0, "file_sd": str(targets)}))
        assert tels[0].engine(f"http://127.0.0.1:{httpd.server_port}", name="sglang-0") is not None
        server = PrometheusServer(tmp_path_factory.mktemp("prom"), rule_files=RULES, scrape_configs=[{
            "job_name": "rl_otel_file_sd", "honor_labels": True,
            "file_sd_configs": [{"files": [f"{targets}/*.json"], "refresh_interval": "1s"}]}])
        _wait(server, 'up{job="rl_otel_file_sd"} == 1', 3)
        for tel in tels:  # generation phases stay open while the engines work and the queries run
            stack.enter_context(tel.phase("actor_rollout", "generate", bucket="generation"))
        for step in range(40):
            vllm.step(running=6, waiting=2, kv=0.7, prompt=100, generated=int(VLLM_TOKENS_PER_STEP), preempted=1,
                      ttft=0.05, itl=0.02, finished=[(0.3, 2.5, 40)])
            sglang.step(running=3, queued=1, usage=0.5, prompt=50, generated=20, retracted=0, ttft=0.08)
            for tel in tels:
                tel.log({"actor/pg_loss": 0.1}, step=step)
            time.sleep(0.2)
        _wait(server, f'{engines.GENERATION}{{run="{RUN}"}}', 2)
        _wait(server, f'{engines.PER_GENERATION_SECOND}{{run="{RUN}"}}', 1)
        _wait(server, f'{engines.TTFT.format(q="95")}{{run="{RUN}"}}', 2)
        yield server
    finally:
        stack.close()
        if server is not None:
            server.close()
        for tel in tels:
            tel.close()
        httpd.shutdown()
        thread.join(10)
        REGISTRY.unregister(in_process)


def test_an_in_process_engine_and_an_engine_server_reach_one_prometheus_with_the_runs_labels(prom):
    in_process = prom.query(f'vllm:num_requests_running{{run="{RUN}"}}')
    assert {(s["metric"]["role"], s["metric"]["rank"], s["metric"]["replica"]) for s in in_process} == {
        (ROLE, "0", "dp0"), (ROLE, "1", "dp0")}
    assert all(s["metric"]["model_name"] and s["metric"]["engine"] == "0" for s in in_process)  # its own labels
    # an engine server's own prometheus_client writes its colons as underscores to Prometheus 2 (the rules read
    # both spellings: rl_otel/ops/engines.py)
    [served] = prom.query(f'{{__name__=~"sglang[:_]num_running_reqs", run="{RUN}"}}')
    assert {k: served["metric"][k] for k in ("role", "rank", "replica", "rl_target", "tp_rank")} == {
        "role": ROLE, "rank": "0", "replica": "sglang-0", "rl_target": "engine", "tp_rank": "0"}
    assert float(served["value"][1]) == 3


def test_a_tensor_parallel_groups_tokens_are_counted_once_and_its_gpus_twice(prom):
    per_rank = prom.query(f'rate(vllm:generation_tokens_total{{run="{RUN}", rank="0"}}[1m])')
    [replica] = prom.query(f'{engines.GENERATION}{{run="{RUN}", replica="dp0"}}')
    # (the recorded series is of the last rule evaluation, the rate of now: alike, and far from twice)
    assert float(replica["value"][1]) == pytest.approx(float(per_rank[0]["value"][1]), rel=0.3)
    gpus = {s["metric"]["replica"]: float(s["value"][1]) for s in prom.query(f'{engines.GPUS}{{run="{RUN}"}}')}
    assert gpus == {"dp0": 2, "sglang-0": 1}
    [role] = prom.query(f'{engines.ROLE_GENERATION}{{run="{RUN}"}}')
    both = sum(float(s["value"][1]) for s in prom.query(f'{engines.GENERATION}{{run="{RUN}"}}'))
    assert float(role["value"][1]) == pytest.approx(both)


def test_every_rollout_engines_dashboard_query_returns_data(prom):
    [board] = [b for b in dashboards() if b.uid == "rl-otel-engines"]
    values: dict[str, str] = {}
    for name, query in VARIABLES:  # Grafana's chain, as far as the engines' board shows it
        if name not in ("job", "run", "role", "replica"):
            continue
        m = re.fullmatch(r"label_values\((.*), (\w+)\)", query)
        assert m, query
        listed = prom.label_values(m.group(2), substitute(m.group(1), values))
        assert listed, f"variable {name}: {query} lists nothing"
        values[name] = {"run": RUN, "role": ROLE}.get(name, ".*")
        if name in ("run", "role"):
            assert values[name] in listed
        if name == "replica":
            assert set(listed) == {"dp0", "sglang-0"}
    empty, checked = [], 0
    for panel in board.panels:
        for query in panel.queries:
            checked += 1
            if not prom.query(substitute(query.expr, values)):
                empty.append((panel.title, query.expr))
    assert empty == [], empty
    assert checked >= 15


def test_the_engine_rules_evaluate_cleanly_and_no_engine_alert_fires_on_a_healthy_run(prom):
    groups = [g for g in prom.api("rules")["groups"] if g["name"].startswith("rl_otel_engines")]
    rules = [r for g in groups for r in g["rules"]]
    assert len(rules) == len(engines.recording_rules()) + len(engines.alerts())
    assert [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"] == []
    assert [r["name"] for r in rules if r["type"] == "alerting" and r["alerts"]] == []
