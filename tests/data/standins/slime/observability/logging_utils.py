"""Stand-in for ``slime.observability.logging_utils.log(args, metrics, step_key)``: records what slime's default
logging would hand wandb / TensorBoard (``LOGGED``), so a test sees it is unchanged."""

from __future__ import annotations

from typing import Any

LOGGED: list[tuple[dict[str, Any], str]] = []


def log(args: Any, metrics: dict[str, Any], step_key: str) -> None:
    LOGGED.append((dict(metrics), step_key))
