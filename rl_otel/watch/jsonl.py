"""JSONL metric files: one JSON object per line, a step field and metric keys, possibly nested.

prime-rl's ``metrics.jsonl``, a ``--logger jsonl`` of many frameworks, or ``stdout`` sink's ``format="json"``
written to a file all look alike: ``{"step": 12, "loss": 0.3, "reward": {"mean": 0.4}}``. Nested objects are
joined with ``/`` (as :meth:`rl_otel.Telemetry.log` joins them), the step comes from the first of
:data:`STEP_KEYS` present, a timestamp from :data:`TIME_KEYS` (used by ``backfill``; neither is a metric).
Numbers, booleans, ``null`` (no value this step) and lists of numbers (a distribution) are kept; strings and other
values are not metrics and are left out quietly. A line of a file several processes append to, with keys they share
(prime-rl's trainer and orchestrator: ``time/step``), has those keys named by its writer
(:func:`rl_otel.watch.frameworks.attribute`: ``trainer/time/step``).

:class:`LineTail` returns the complete lines after its offset: a line without its newline yet waits.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from rl_otel.watch import frameworks

STEP_KEYS = ("step", "_step", "global_step", "train/global_step", "trainer/global_step", "iteration")
TIME_KEYS = ("timestamp", "_timestamp", "wall_time", "time")
CHUNK = 8 * 2**20
MAX_LINE = 16 * 2**20  # a longer "line" is no metric record: skipped and counted


@dataclass
class Lines:
    """What one read found: complete lines, lines too long to be records, whether more bytes are waiting."""

    lines: list[bytes] = field(default_factory=list)
    corrupt: int = 0
    more: bool = False


class LineTail:
    """The complete lines of one file, from ``offset`` (resumed from a state file) on."""

    def __init__(self, path: str, offset: int = 0) -> None:
        self.path = path
        self.offset = offset

    def read(self, size: int, chunk: int = CHUNK) -> Lines:
        """Complete lines between the offset and ``size``, at most about ``chunk`` bytes of them."""
        out = Lines()
        if size <= self.offset:
            return out
        want = min(size - self.offset, chunk)
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            buf = f.read(want)
        cut = buf.rfind(b"\n") + 1
        if cut == 0:
            if len(buf) >= min(chunk, MAX_LINE) and size - self.offset > MAX_LINE:
                self.offset += len(buf)  # a "line" longer than any record: skip what was read (counted once)
                out.corrupt += 1
            return out
        out.lines = buf[:cut].splitlines()
        self.offset += cut
        out.more = want == chunk and self.offset < size
        return out


def parse(line: bytes, step_keys: Sequence[str] = STEP_KEYS,
          time_keys: Sequence[str] = TIME_KEYS) -> tuple[int | None, float | None, dict[str, Any]] | None:
    """``(step, timestamp, {key: value})`` of one line (``None`` for a blank line). Raises ``ValueError`` for a
    line that is not a JSON object (the caller counts it as a corrupt record)."""
    if not line.strip():
        return None
    obj = json.loads(line)
    if not isinstance(obj, dict):
        raise ValueError(f"a JSON {type(obj).__name__}, not an object")
    values = dict(_flatten(obj, ""))
    step = ts = None
    for key in step_keys:
        if key in values:
            raw = values.pop(key)
            if step is None and isinstance(raw, (int, float)) and not isinstance(raw, bool) and math.isfinite(raw) \
                    and raw >= 0 and raw == int(raw):
                step = int(raw)
    for key in time_keys:
        if key in values:
            raw = values.pop(key)
            if ts is None and isinstance(raw, (int, float)) and not isinstance(raw, bool) and math.isfinite(raw):
                ts = float(raw)
    return step, ts, frameworks.attribute(values)


def _flatten(obj: dict, prefix: str) -> Iterator[tuple[str, Any]]:
    for key, value in obj.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from _flatten(value, name + "/")
        elif value is None or isinstance(value, (int, float)) or (isinstance(value, list) and value and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)):
            yield name, value
