"""JSONL metric files: one JSON object per line, a step field and metric keys, possibly nested.

prime-rl's ``metrics.jsonl``, a ``--logger jsonl`` of many frameworks, or ``stdout`` sink's ``format="json"``
written to a file all look alike: ``{"step": 12, "loss": 0.3, "reward": {"mean": 0.4}}``. Nested objects are
joined with ``/`` (as :meth:`rl_otel.Telemetry.log` joins them), the step comes from the first of
:data:`STEP_KEYS` present, a timestamp from :data:`TIME_KEYS` (used by ``backfill``; neither is a metric).
Numbers, booleans, ``null`` (no value this step) and lists of numbers (a distribution) are kept; strings and other
values are not metrics and are left out quietly. A line of a file several processes append to, with keys they share
(prime-rl's trainer and orchestrator: ``time/step``), has those keys named by its writer
(:func:`rl_otel.watch.frameworks.attribute`: ``trainer/time/step``).

:class:`LineTail` returns the complete lines after its offset: a line without its newline yet waits; a line over
:data:`MAX_LINE` is skipped and counted, and the lines after it are read.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from typing import Any

from rl_otel.watch import frameworks
from rl_otel.watch.records import CHUNK, Batch

STEP_KEYS = ("step", "_step", "global_step", "train/global_step", "trainer/global_step", "iteration")
TIME_KEYS = ("timestamp", "_timestamp", "wall_time", "time")
MAX_LINE = 16 * 2**20  # a longer "line" is no metric record: skipped (never held whole) and counted


class LineTail:
    """The complete lines of one file, from ``offset`` (resumed from a state file) on.

    ``offset`` is where the next unread line starts; a line longer than a read looks for its end from where the
    last read stopped (it is not read again from its start at each poll), and is read whole once its newline is
    there. A line over :data:`MAX_LINE` is counted once, as soon as it is known to be that long, and skipped to
    its newline a chunk at a time without being kept; the offset stays at its start until then, so a watcher
    restarted meanwhile does not take the rest of it for a line (it counts the line again instead). Setting
    ``offset`` (a file replaced or truncated is read again from 0) forgets what the tail knew.
    """

    def __init__(self, path: str, offset: int = 0) -> None:
        self.path = path
        self._offset = offset
        self._seen = 0  # bytes from the offset known to hold no newline
        self._skipping = False  # the line at the offset is over MAX_LINE (counted): skip to its newline

    @property
    def offset(self) -> int:
        return self._offset

    @offset.setter
    def offset(self, value: int) -> None:
        self._offset, self._seen, self._skipping = value, 0, False

    def read(self, size: int, chunk: int = CHUNK) -> Batch:
        """Complete lines between the offset and ``size`` (the batch's ``records``, each without its newline), at
        most about ``chunk`` bytes of them read; a line over :data:`MAX_LINE` counts as ``corrupt``."""
        out = Batch()
        if size < self._offset + self._seen:  # shrank below what was looked at (rewritten): look again
            self.offset = self._offset
        start = self._offset + self._seen
        if size <= start:
            return out
        buf = _read(self.path, start, min(size - start, chunk))
        first = buf.find(b"\n")
        if first < 0:  # the line at the offset goes on past what was read
            self._seen += len(buf)
            if self._seen > MAX_LINE and not self._skipping:
                self._skipping = True
                out.corrupt += 1
            out.more = bool(buf) and start + len(buf) < size
            return out
        if self._seen:  # the line at the offset began before this read: it ends here
            stop = start + first  # its newline
            if stop - self._offset <= MAX_LINE:
                out.records.append(_read(self.path, self._offset, stop - self._offset))
            elif not self._skipping:
                out.corrupt += 1
            self.offset = start = stop + 1
            buf = buf[first + 1:]
        cut = buf.rfind(b"\n") + 1
        lines = buf[:cut].splitlines()
        if cut > MAX_LINE:  # only with a chunk larger than MAX_LINE can one of them be too long
            out.corrupt += sum(len(line) > MAX_LINE for line in lines)
            lines = [line for line in lines if len(line) <= MAX_LINE]
        out.records.extend(lines)
        self.offset = start + cut
        self._seen = len(buf) - cut  # the start of the next line, not read again until its newline comes
        out.more = start + len(buf) < size
        return out


def _read(path: str, offset: int, n: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(n)


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
