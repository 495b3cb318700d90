"""What every benchmark returns to ``run.py``: rows of a measurement, its baseline from the same run, and a target.

``ratio`` is always ``measured / baseline`` (below 1: rl_otel costs less than the baseline). A benchmark module
exposes ``rows(quick: bool = False) -> list[Row]`` and keeps a ``main()`` that prints its own details.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Row:
    name: str
    measured: float
    baseline: float
    unit: str  # of measured and baseline
    target: str  # in words, e.g. "ratio <= 0.5 and <= 10 ms"
    passed: bool | None  # None: no target, reported for information
    baseline_name: str = ""

    @property
    def ratio(self) -> float:
        return self.measured / self.baseline if self.baseline else float("inf")


def best_seconds(fns: Sequence[Callable[[], object]], repeat: int) -> list[float]:
    """The fastest of ``repeat`` interleaved runs of each function (robust to a busy, shared machine)."""
    for fn in fns:
        fn()  # warm-up
    best = [float("inf")] * len(fns)
    for _ in range(repeat):
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - start)
    return best


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def table(rows: Sequence[Row], markdown: bool = False) -> str:
    """The rows as a fixed-width table (or a Markdown table, for the README)."""
    head = ("benchmark", "measured", "baseline", "ratio", "target", "pass")
    body = [(r.name, f"{_fmt(r.measured)} {r.unit}", f"{_fmt(r.baseline)} {r.unit}" +
             (f" ({r.baseline_name})" if r.baseline_name else ""), f"{r.ratio:.3g}", r.target,
             {True: "yes", False: "NO", None: "-"}[r.passed]) for r in rows]
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
        lines += ["| " + " | ".join(cells) + " |" for cells in body]
        return "\n".join(lines)
    widths = [max(len(str(c)) for c in col) for col in zip(head, *body)]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip() for cells in (head, *body))
