from __future__ import annotations

from pathlib import Path

import pytest

import rl_otel
from tests.skip_policy import import_skip_problem

DATA = Path(__file__).parent / "data"

# The fast layer a developer runs after every edit: ``pytest -m "not slow"`` (under a minute on 2 cores). These
# modules start real servers, subprocesses, frameworks or promtool, or run long property tests: all their tests
# are marked slow here, as is every test marked ``prometheus``; a slow test in another module carries
# ``@pytest.mark.slow`` itself. The full suite runs them all (CI).
SLOW_MODULES = frozenset({
    "test_alert_corpus", "test_bridge", "test_budget", "test_collector", "test_demo", "test_endpoint_hardening",
    "test_failure_promises", "test_faults", "test_memory", "test_otlp", "test_readme", "test_stats_trinity",
    "test_tracing", "test_uniform_histogram", "test_deploy", "test_e2e_prometheus",
    "test_endpoint_attacks", "test_fleet", "test_fork", "test_frameworks_e2e", "test_integration_accelerate",
    "test_integration_nemo_rl", "test_integration_ports_and_options", "test_integration_roll",
    "test_integration_roll_phases", "test_integration_skyrl", "test_integration_slime", "test_integration_transformers",
    "test_integration_trinity", "test_integration_verl", "test_load", "test_multinode", "test_ops_demo_panels",
    "test_ops_e2e", "test_ops_rules", "test_ray", "test_setup_commands", "test_sinks_crash", "test_watch_e2e",
    "test_watch_scale", "test_webconfig",
})


def pytest_collection_modifyitems(config, items):
    for item in items:
        module = item.module.__name__.rsplit(".", 1)[-1] if item.module is not None else ""
        if module in SLOW_MODULES or item.get_closest_marker("prometheus") is not None:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def _no_otel_environment(monkeypatch):
    """The standard OTEL_* variables change what init() does (rl_otel honours them): a test sets the ones it
    means, none leak in from the machine running the suite."""
    import os

    for name in [n for n in os.environ if n.startswith("OTEL_")]:
        monkeypatch.delenv(name)


@pytest.fixture
def tel():
    """A Telemetry serving on a free loopback port, closed after the test."""
    t = rl_otel.init(run="test", rank=0, prometheus={"host": "127.0.0.1", "port": 0})
    yield t
    t.close()


@pytest.fixture(scope="session")
def seed_keys() -> list[str]:
    lines = (DATA / "seed_keys.txt").read_text().splitlines()
    return [line for line in lines if line and not line.startswith("#")]


def _fail_a_hiding_skip(report: pytest.CollectReport | pytest.TestReport) -> None:
    """An ``importorskip`` skip that hides a broken install fails (tests/skip_policy.py says when)."""
    if report.skipped and isinstance(report.longrepr, tuple):
        problem = import_skip_problem(str(report.longrepr[2]))
        if problem is not None:
            report.outcome = "failed"
            report.longrepr = problem


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    report = yield
    _fail_a_hiding_skip(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    _fail_a_hiding_skip(report)
    return report
