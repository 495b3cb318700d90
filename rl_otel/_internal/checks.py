"""Checks shared by every option dict and configuration file rl_otel reads: one wording for one kind of mistake."""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from rl_otel.errors import ConfigurationError


def check_known(what: str, options: Mapping[str, Any], known: Collection[str]) -> None:
    """Raise ConfigurationError naming the keys of ``options`` that are not ``known`` (a typo must not pass)."""
    unknown = set(options) - set(known)
    if unknown:
        raise ConfigurationError(f"unknown {what} option(s) {sorted(unknown)}; known: {sorted(known)}")


def boolean(name: str, value: object) -> bool:
    """``value`` if it is True or False (not 0/1, not "yes"): ConfigurationError naming ``name`` otherwise."""
    if not isinstance(value, bool):
        raise ConfigurationError(f"{name} must be True or False, got {value!r}")
    return value


def positive_seconds(name: str, value: object) -> float:
    """``value`` as a float number of seconds > 0; ConfigurationError naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigurationError(f"{name} must be a positive number of seconds, got {value!r}")
    return float(value)


def read_yaml(what: str, path: str | os.PathLike) -> Any:
    """The YAML document at ``path``; ConfigurationError saying which file ``what`` could not be read or parsed."""
    import yaml

    file = Path(os.fspath(path)).expanduser()
    try:
        return yaml.safe_load(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigurationError(f"{what} {str(file)!r} cannot be read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        # PyYAML's message quotes the offending line (``api_key: sk-...``): only what is wrong, and where
        raise ConfigurationError(f"{what} {str(file)!r} is not valid YAML: {_yaml_problem(exc)}") from None


def _yaml_problem(exc: Exception) -> str:
    """A YAML error's problem and position, without the snippet of the file PyYAML's ``str()`` quotes."""
    parts = []
    for text, mark in ((getattr(exc, "context", None), getattr(exc, "context_mark", None)),
                       (getattr(exc, "problem", None), getattr(exc, "problem_mark", None))):
        if text:
            where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
            parts.append(f"{text}{where}")
    return "; ".join(parts) or type(exc).__name__
