"""The suite itself: no variable of the machine running it that changes what rl_otel, its trackers or Ray do
reaches a test (tests/conftest.py), and a child a test starts inherits none either."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import HERMETIC_NAMES, HERMETIC_PREFIXES


def _leaks(environ) -> list[str]:
    return sorted(n for n in environ if (n in HERMETIC_NAMES or n.startswith(HERMETIC_PREFIXES))
                  and not n.startswith("RL_OTEL_TEST_") and n != "WANDB_SERVICE")


def test_no_otel_wandb_rl_otel_multiproc_or_ray_variable_reaches_a_test_or_its_children():
    assert _leaks(os.environ) == []
    child = subprocess.run([sys.executable, "-c", "import os; print('\\n'.join(os.environ))"], capture_output=True,
                           text=True, timeout=120, check=True)
    assert _leaks(child.stdout.split()) == []


def test_a_variable_one_test_sets_is_gone_in_the_next():
    os.environ["RL_OTEL_RUN"] = "leaked"  # set directly, as a library or a careless test would
    os.environ["OTEL_SERVICE_NAME"] = "leaked"


def test_the_previous_test_s_variables_are_gone():
    assert "RL_OTEL_RUN" not in os.environ and "OTEL_SERVICE_NAME" not in os.environ
