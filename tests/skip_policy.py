"""A skip means "not installed", never "installed but broken" (tests/conftest.py applies it to every report)."""

from __future__ import annotations

import importlib.util
import os
import re

_IMPORT_SKIP = re.compile(r"could not import '([\w.]+)'")


def import_skip_problem(reason: str) -> str | None:
    """Why an ``importorskip`` skip must fail instead, or None when it may stand.

    pytest's ``importorskip`` skips on ``ModuleNotFoundError``, and a package that is installed but misses one of
    *its* imports raises exactly that (``import verl`` without cloudpickle): the skip would hide a broken install.
    So a skip stands only when the package's top-level module is not installed at all, and not even then under the
    README's test command (``RL_OTEL_TEST_ALL=1``), which installs every optional package the suite imports."""
    match = _IMPORT_SKIP.search(reason)
    if match is None:
        return None
    top = match.group(1).split(".")[0]
    if importlib.util.find_spec(top) is not None:
        return f"{top} is installed but does not import: {reason}"
    if os.environ.get("RL_OTEL_TEST_ALL"):
        return f"{top} is not installed, yet scripts/test.sh installs it (an install step is missing): {reason}"
    return None
