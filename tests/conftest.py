from __future__ import annotations

from pathlib import Path

import pytest

import rl_otel
from tests.skip_policy import import_skip_problem

DATA = Path(__file__).parent / "data"


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
