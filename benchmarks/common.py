"""What every benchmark returns to ``run.py``: rows of a measurement, its baseline from the same run, and a target.

``ratio`` is always ``measured / baseline`` (below 1: rl_otel costs less than the baseline). A benchmark module
exposes ``rows(quick: bool = False) -> list[Row]`` and keeps a ``main()`` that prints its own details.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
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
    paired_ratio: float | None = None  # the median of per-round ratios, where the row was measured in A/B rounds

    @property
    def ratio(self) -> float:
        """The median of the per-round ratios if measured so (robust to drift), else measured / baseline."""
        if self.paired_ratio is not None:
            return self.paired_ratio
        return self.measured / self.baseline if self.baseline else float("inf")


@dataclass(frozen=True)
class Rounds:
    """Seconds per call of each function, one figure per round (see :func:`ab_rounds`)."""

    seconds: list[list[float]]

    def median(self, i: int) -> float:
        return statistics.median(self.seconds[i])

    def ratio(self, i: int, j: int) -> float:
        """The median over rounds of ``fn[i] / fn[j]`` measured in the same round: a drift of the machine's speed
        over the run (load, frequency) hits both sides of each round alike and cancels in the ratio."""
        return statistics.median(a / b for a, b in zip(self.seconds[i], self.seconds[j], strict=True))


def ab_rounds(fns: Sequence[Callable[[], object]], rounds: int, inner: int | None = None,
              round_seconds: float = 0.02, budget_s: float | None = None) -> Rounds:
    """Interleaved A/B rounds: each round times ``inner`` back-to-back calls of every function, in an order that
    alternates (A B, then B A: a linear drift within a round cancels over two). ``inner`` defaults to enough calls
    for the slowest function to take ``round_seconds`` (timer resolution and one-off hiccups are then small).
    With ``budget_s``, more rounds than ``rounds`` if they fit in that many seconds (short rounds are cheap, and
    on a loaded machine the median of many short rounds is steadier than of a few)."""
    for fn in fns:
        fn()  # warm-up: imports, caches, allocator
    per_call = []
    for fn in fns:
        t0 = time.perf_counter()
        fn()
        per_call.append(time.perf_counter() - t0)
    if inner is None:
        inner = max(1, min(10_000, int(round_seconds / max(max(per_call), 1e-9))))
    if budget_s is not None:
        rounds = max(rounds, min(201, int(budget_s / max(inner * sum(per_call), 1e-9))))
    seconds: list[list[float]] = [[] for _ in fns]
    order = list(range(len(fns)))
    for r in range(rounds):
        for i in (order if r % 2 == 0 else order[::-1]):
            fn = fns[i]
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            seconds[i].append((time.perf_counter() - t0) / inner)
    return Rounds(seconds)


def paired_rounds(fns: Sequence[Callable[[], float]], rounds: int) -> Rounds:
    """:func:`ab_rounds` for functions that time themselves (each returns the seconds of the part to compare, its
    set-up left out): one call of each a round, the order alternating."""
    for fn in fns:
        fn()  # warm-up
    seconds: list[list[float]] = [[] for _ in fns]
    order = list(range(len(fns)))
    for r in range(rounds):
        for i in (order if r % 2 == 0 else order[::-1]):
            seconds[i].append(fns[i]())
    return Rounds(seconds)


def metrics_url(tel) -> str:
    """The endpoint's URL of a Telemetry started with one (``metrics_url`` is None without)."""
    url = tel.metrics_url
    assert url is not None, "the Telemetry serves no endpoint"
    return url


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run torch's intra-op work on ``n`` threads (small ops: one thread, so thread hand-offs and a busy second core
    do not decide the figure), restoring the setting after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def peak_tensor_bytes(fn: Callable[[], object]) -> int:
    """The peak of the bytes held by tensors that ``fn`` allocates, above what was held before it ran (torch's
    profiler records every allocation and free of its CPU allocator in order; the malloc cache does not blur it)."""
    import os
    import sys

    from torch.profiler import ProfilerActivity, profile

    sys.stderr.flush()
    saved = os.dup(2)  # the profiler's C++ side prints a line to fd 2 at start and stop: silenced
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            fn()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    events.sort(key=lambda e: e.start_ns())
    held = peak = 0
    for e in events:
        held += e.nbytes()
        peak = max(peak, held)
    return peak


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def table(rows: Sequence[Row], markdown: bool = False) -> str:
    """The rows as a fixed-width table (or a Markdown table, for the README)."""
    head = ("benchmark", "measured", "baseline", "ratio", "target", "met")
    body = [(r.name, f"{_fmt(r.measured)} {r.unit}", f"{_fmt(r.baseline)} {r.unit}" +
             (f" ({r.baseline_name})" if r.baseline_name else ""), f"{r.ratio:.3g}", r.target,
             {True: "met", False: "MISSED", None: "-"}[r.passed]) for r in rows]
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
        lines += ["| " + " | ".join(cells) + " |" for cells in body]
        return "\n".join(lines)
    widths = [max(len(str(c)) for c in col) for col in zip(head, *body, strict=True)]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()
                     for cells in (head, *body))
