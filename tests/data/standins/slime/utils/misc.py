"""Stand-in for ``slime.utils.misc.load_function``: a dotted name -> the function (import the module, getattr)."""

from __future__ import annotations

import importlib
from typing import Any


def load_function(path: str) -> Any:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)
