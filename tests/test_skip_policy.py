"""The suite's skip policy: an ``importorskip`` skip stands only for a package that is not installed."""

from __future__ import annotations

from tests.skip_policy import import_skip_problem


def test_an_installed_package_that_fails_to_import_fails_instead_of_skipping(monkeypatch):
    monkeypatch.delenv("RL_OTEL_TEST_ALL", raising=False)
    # yaml is installed: a skip naming it means one of *its* imports failed (verl without cloudpickle)
    problem = import_skip_problem("Skipped: could not import 'yaml.cyaml': No module named 'cloudpickle'")
    assert problem is not None and "installed but does not import" in problem


def test_a_package_that_is_not_installed_may_skip_except_under_the_test_command(monkeypatch):
    reason = "Skipped: could not import 'no_such_package_xyz': No module named 'no_such_package_xyz'"
    monkeypatch.delenv("RL_OTEL_TEST_ALL", raising=False)
    assert import_skip_problem(reason) is None
    monkeypatch.setenv("RL_OTEL_TEST_ALL", "1")
    assert "scripts/test.sh installs it" in (import_skip_problem(reason) or "")


def test_other_skips_are_left_alone(monkeypatch):
    monkeypatch.setenv("RL_OTEL_TEST_ALL", "1")
    assert import_skip_problem("Skipped: needs a CUDA device") is None
