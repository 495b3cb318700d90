"""The watcher's state file: per file the byte offset read up to, per run and rank the last value of each key.

Written atomically (:mod:`rl_otel._internal.atomic`: a temporary file in the same directory, flushed and fsynced,
then ``os.replace``), so a watcher killed at any moment (SIGKILL included) finds either the previous state or the
new one, never half of one. Offsets and values are written together, from the one thread that reads the files, so
they always agree: after a restart the watcher serves the saved values, then reads on from the saved offsets.
Records read after the last save are read again: they carry the same steps and values, so a gauge or counter takes
the same value (nothing is duplicated on the endpoint, a counter never goes back), and a histogram restarts from its
counts as saved, before those records were added.

Why last values and not a re-read from the start: a finished run's files can be GBs, and the endpoint must serve
every key's last value at once after a restart, not after minutes of reading history.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rl_otel._internal.atomic import atomic_write

_log = logging.getLogger("rl_otel.watch")
VERSION = 1


@dataclass
class FileState:
    """Where the watcher is in one file: ``offset`` (bytes consumed), and the file's identity (a file replaced
    under the same name, or truncated, is read again from the start)."""

    offset: int = 0
    dev: int = 0
    ino: int = 0


@dataclass
class RunState:
    """One run and rank: its framework, highest step, the last ``[step, value]`` of each key (as logged), the
    histograms' ``[step, counts, sum, count, min, max]`` as served, and the corrupt records counted."""

    run: str
    rank: int
    framework: str | None = None
    step: int | None = None
    values: dict[str, list] = field(default_factory=dict)
    hists: dict[str, list] = field(default_factory=dict)
    errors: dict[str, float] = field(default_factory=dict)


@dataclass
class State:
    """Everything the watcher persists (see the module)."""

    files: dict[str, FileState] = field(default_factory=dict)
    runs: dict[tuple[str, int], RunState] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"version": VERSION,
                "files": {p: [f.offset, f.dev, f.ino] for p, f in self.files.items()},
                "runs": [vars(r) for r in self.runs.values()]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> State:
        state = cls()
        if data.get("version") != VERSION:
            raise ValueError(f"state version {data.get('version')!r}, expected {VERSION}")
        for path, (offset, dev, ino) in data.get("files", {}).items():
            state.files[path] = FileState(int(offset), int(dev), int(ino))
        for r in data.get("runs", []):
            run = RunState(**r)
            state.runs[(run.run, run.rank)] = run
        return state


def default_path(roots: list[str]) -> Path:
    """``<user cache dir>/rl_otel/watch-<hash of the watched paths>.json``: one state per set of watched paths."""
    if sys.platform == "darwin":
        cache = Path.home() / "Library" / "Caches"
    elif os.name == "nt":
        cache = Path(os.environ.get("LOCALAPPDATA", Path.home() / "AppData" / "Local"))
    else:
        cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    digest = hashlib.sha256("\0".join(sorted(os.path.abspath(r) for r in roots)).encode()).hexdigest()[:16]
    return cache / "rl_otel" / f"watch-{digest}.json"


def load(path: Path) -> State:
    """The state saved at ``path``; an empty state when there is none, or when it cannot be read (said once:
    the watcher then reads every file from its start, which duplicates nothing on the endpoint)."""
    try:
        with open(path, encoding="utf-8") as f:
            return State.from_json(json.load(f))
    except FileNotFoundError:
        return State()
    except Exception as exc:  # boundary: the state file (OS errors, JSON of any shape)
        _log.warning("rl_otel watch: state file %s unreadable (%s); starting from the files' beginnings", path, exc)
        return State()


def save(state: State, path: Path) -> bool:
    """Write ``state`` to ``path`` atomically; False (logged) when it cannot be written."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_write(path) as f:
            json.dump(state.to_json(), f, separators=(",", ":"))
        return True
    except OSError as exc:  # the directory or the disk refuses (the JSON is the watcher's own: it encodes)
        _log.warning("rl_otel watch: state file %s not written: %s", path, exc)
        return False
