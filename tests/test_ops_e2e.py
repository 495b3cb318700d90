"""A real Prometheus scrapes two ranks of a PPO training and evaluates the generated rules: every dashboard variable
lists values, every dashboard query returns data, every recording rule records, every rule evaluates cleanly.

No GPU exists in CI: the live GPU gauges (torch's allocator, NVML) are fed at their boundaries by the fakes of
``tests/gpu_fakes.py`` (a fake ``pynvml`` module, and a ``torch`` seen by the scrape-time collector whose ``cuda``
is a fake allocator while every other attribute is the real torch), so the GPU panels are checked too."""

from __future__ import annotations

import contextlib
import re
import sys
import time
import types
from pathlib import Path

import pytest

import rl_otel
from rl_otel.ops import contract
from rl_otel.ops.dashboards import VARIABLES, dashboards
from rl_otel.ops.nodata import reads
from rl_otel.ops.promql import metric_names, substitute
from rl_otel.ops.rules import OUT_OF_RANGE, alerts, fleet_alerts, recording_rules
from tests.e2e_training import train
from tests.gpu_fakes import GIB, FakeCuda, FakeNvml, wait_for_nvml
from tests.promtools import PrometheusServer

pytestmark = pytest.mark.slow  # the slow layer (tests/conftest.py)

ROOT = Path(__file__).resolve().parent.parent
RULES = [ROOT / "prometheus/rules/rl_otel_recording.yml", ROOT / "prometheus/rules/rl_otel_alerts.yml"]
RUN = "e2e-ops"
RANKS = 2
STEPS = 12


class _TorchWithFakeCuda(types.ModuleType):
    """The real torch, but ``cuda`` is a fake allocator: what the live collector reads from ``sys.modules``."""

    def __init__(self, real: types.ModuleType, cuda: FakeCuda) -> None:
        super().__init__("torch")
        self._real, self.cuda = real, cuda

    def __getattr__(self, name: str):
        return getattr(self._real, name)


@pytest.fixture(scope="module")
def prom(tmp_path_factory):
    import torch

    cuda = FakeCuda(devices=2)
    cuda.alloc(5 * GIB, device=0)
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        mp.setitem(sys.modules, "pynvml", FakeNvml())
        mp.setitem(sys.modules, "torch", _TorchWithFakeCuda(torch, cuda))
        yield from _served(tmp_path_factory)


def _served(tmp_path_factory):
    tels = [rl_otel.init(run=RUN, rank=r, prometheus={"host": "127.0.0.1", "port": 0}, handle_sigterm=False)
            for r in range(RANKS)]
    server = None
    stack = contextlib.ExitStack()
    try:
        urls: list[str] = []
        for t in tels:
            assert t.metrics_url is not None and wait_for_nvml(t.metrics_url)
            urls.append(t.metrics_url)
        targets = [url.split("//")[1].split("/")[0] for url in urls]
        server = PrometheusServer(tmp_path_factory.mktemp("prom"), targets, rule_files=RULES)
        server.wait_for_scrapes(1)
        train(tels, steps=STEPS)
        if hasattr(tels[0], "collective"):  # a rank's wait where ranks meet (rl_collective_wait_seconds_total)
            for t in tels:
                with t.collective("allreduce"):
                    pass
        # a phase still running on rank 0 while the queries run: the "phases running now" panels have one to show
        stack.enter_context(tels[0].phase("actor_infer", "generate"))
        server.wait_for_scrapes(3)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # rules evaluated after the last step was scraped
            got = server.query(f'run:rl_step:max{{run="{RUN}"}}')
            if got and float(got[0]["value"][1]) == STEPS - 1:
                break
            time.sleep(0.5)
        time.sleep(2)
        yield server
    finally:
        stack.close()
        if server is not None:
            server.close()
        for t in tels:
            t.close()


def _unserved(expr: str) -> bool:
    """Whether ``expr`` reads an issue-33 family this rl_otel's catalog does not define (so nothing serves it:
    rl_otel/ops/contract.py), directly or through a recording rule."""
    return any(not contract.served(f) for f in reads([expr]).contracted)


def _variable_values(server: PrometheusServer) -> dict[str, str]:
    """Grafana's chain: each variable's label_values query, with the variables before it substituted."""
    values: dict[str, str] = {}
    for name, query in VARIABLES:
        m = re.fullmatch(r"label_values\((.*), (\w+)\)", query)
        assert m, query
        if _unserved(m.group(1)) or name == "replica":  # no engine here: tests/test_engines_e2e.py has them
            values[name] = ".*"
            continue
        listed = server.label_values(m.group(2), substitute(m.group(1), values))
        assert listed, f"variable {name}: {query} lists nothing"
        values[name] = RUN if name == "run" else sorted(listed)[0]
        assert values[name] in listed
    return values


# series a healthy run of minutes has none of: the medians of its own past hour, the count of impossible values, a
# stack dump
ABSENT_WHEN_HEALTHY = re.compile(r"_baseline$|^" + re.escape(OUT_OF_RANGE) + "$|^rl_stack_dump")


def test_every_dashboard_query_returns_data(prom):
    values = _variable_values(prom)
    assert values["job"] == "rl_otel" and values["device_id"] == "0"
    checked, gpu, empty = 0, 0, []
    for board in dashboards():
        if board.uid == "rl-otel-engines":  # a run with rollout engines: tests/test_engines_e2e.py
            continue
        for panel in board.panels:
            gpu += panel.needs_gpu
            for query in panel.queries:
                if all(ABSENT_WHEN_HEALTHY.search(name) for name in metric_names(query.expr)) \
                        or _unserved(query.expr):
                    continue
                expr = substitute(query.expr, values)
                checked += 1
                got = prom.query(expr)
                if not got:
                    empty.append((board.uid, panel.title, expr))
                elif board.uid == "rl-otel-goodput":  # the "where the time goes" table (pytest -s shows it)
                    print(f"{panel.title[:44]:44} {len(got):3} series, e.g. {got[0]['metric']} = "
                          f"{float(got[0]['value'][1]):.4g}   {expr[:90]}")
    assert empty == [], "\n".join(f"{uid}: {title}: {expr}" for uid, title, expr in empty)
    assert checked >= 70  # the dashboards are not empty
    assert gpu >= 2  # the live torch / NVML panels were among them
    print(f"\n{checked} dashboard queries returned data ({gpu} GPU panels, fed at the torch/NVML boundary)")


def test_every_recording_rule_records_the_run_without_rank(prom):
    for rule in recording_rules():
        if rule.record.endswith("_baseline") or rule.record == OUT_OF_RANGE or _unserved(rule.expr):
            continue  # a median of the run's own past hour (none yet), a count of impossible values (none)
        result = prom.query(f'{{__name__="{rule.record}", run="{RUN}"}}')
        assert result, rule.record
        for series in result:  # only the straggler rules keep the rank: one series per rank
            assert ("rank" in series["metric"]) == rule.record.startswith("run_role_rank:"), series
            assert "instance" not in series["metric"], series
    ranks = prom.query(f'run:rl_step:count{{run="{RUN}"}}')
    assert [float(r["value"][1]) for r in ranks] == [RANKS]
    peak = prom.query(f'run_phase:rl_gpu_memory_peak_ratio:max{{run="{RUN}", cluster="actor_train"}}')
    # rank 1 logs the larger peak: (20 + 2 + 0.1 * 11 + 8) / 80
    assert float(peak[0]["value"][1]) == pytest.approx((20 + 2 + 0.1 * (STEPS - 1) + 8) / 80)


def test_every_rule_evaluates_cleanly_and_only_the_expected_alert_is_active(prom):
    groups = prom.api("rules")["groups"]
    rules = [r for g in groups for r in g["rules"]]
    assert len(rules) == len(recording_rules()) + len(alerts()) + len(fleet_alerts())
    assert {r["name"] for r in rules if r["type"] == "alerting"} == {a.name for a in alerts() + fleet_alerts()}
    bad = [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    assert bad == []
    active = {r["name"] for r in rules if r["type"] == "alerting" and r["alerts"]}
    # the training logs one string value (counted as a telemetry error); everything else is healthy
    assert active == {"RLTelemetryErrors"}
