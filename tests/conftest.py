from __future__ import annotations

import os
from pathlib import Path

import pytest

import rl_otel
from tests.skip_policy import import_skip_problem

DATA = Path(__file__).parent / "data"

# The fast layer a developer runs after every edit: ``pytest -m "not slow"`` (under 90 s of wall on 2 idle cores).
# A slow test says so itself: a module whose every test starts real servers, subprocesses, frameworks or
# promtool carries ``pytestmark = pytest.mark.slow``, a single slow test ``@pytest.mark.slow``; every test marked
# ``prometheus`` (it needs the binaries) is slow too. A module that moves a test to the slow layer keeps a fast
# test of the same promise. The full suite runs them all (CI).


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("prometheus") is not None:
            item.add_marker(pytest.mark.slow)


# Variables that change what the library, its trackers or Ray do. The machine running the suite may have any of
# them set (a user's OTEL_EXPORTER_OTLP_ENDPOINT, WANDB_API_KEY, RAY_ADDRESS of a cluster they run): none leaks
# into a test, which sets the ones it means. RL_OTEL_TEST_* configure the suite itself and stay.
HERMETIC_PREFIXES = ("OTEL_", "WANDB_", "RL_OTEL_")
HERMETIC_NAMES = frozenset({"PROMETHEUS_MULTIPROC_DIR", "RAY_ADDRESS"})
# set by a wandb run of this process (an earlier test): the in-process service it names stays usable
KEEP_IN_SESSION = frozenset({"WANDB_SERVICE"})


def _hermetic(name: str) -> bool:
    return (name in HERMETIC_NAMES or name.startswith(HERMETIC_PREFIXES)) and not name.startswith("RL_OTEL_TEST_")


def pytest_configure(config):
    # the machine's own values, WANDB_SERVICE included, are gone before any session fixture starts a child
    for name in [n for n in os.environ if _hermetic(n)]:
        del os.environ[name]


@pytest.fixture(autouse=True)
def _hermetic_environment():
    """None of the variables above leaks from one test into the next: each test starts without them, and what a
    test set (with os.environ directly, or a library that exports one) is gone after it - not restored, as
    monkeypatch would restore what it removed: the machine's own values went at configure time."""
    _clear_hermetic()
    yield
    _clear_hermetic()


def _clear_hermetic() -> None:
    for name in [n for n in os.environ if _hermetic(n) and n not in KEEP_IN_SESSION]:
        del os.environ[name]


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
