"""Which files to follow, and the run and rank each belongs to.

A run is TensorBoard's: the directory holding the event files, relative to the watched root (the root's own
name when the files lie in it). A rank is read where the frameworks put it: a directory ``rank_3``, ``rank-3`` or
``rank3`` (taken out of the run's name: ``exp1/rank_3/`` is run ``exp1``, rank 3), or such a part of the file's
name (``metrics_rank3.jsonl``, ``events.out.tfevents.1700000000.host.rank_3``); else rank 0. Event files are
those with ``tfevents`` in their name, metric lines those ending in ``.jsonl``. Hidden directories are passed
over. A watched path may also be one file. Several event files of one rank in one directory are one run (a
training restarted into its directory goes on; two processes writing there at once are merged, so docs/watch.md
tells users to give each its own directory or rank).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

_RANK_DIR = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)
_RANK_IN_NAME = re.compile(r"(?:^|[._-])rank[_-]?(\d+)(?=$|[._-])", re.IGNORECASE)
MAX_FILES = 100_000  # files followed at most (a mistaken root such as / must not exhaust memory)


@dataclass(frozen=True)
class Found:
    """A file to follow: its path, ``"tfevents"`` or ``"jsonl"``, its run and its rank."""

    path: str
    kind: str
    run: str
    rank: int


def kind_of(name: str) -> str | None:
    """``"tfevents"``, ``"jsonl"`` or ``None`` for a file name."""
    if "tfevents" in name and not name.endswith((".tmp", ".lock")):
        return "tfevents"
    if name.endswith(".jsonl"):
        return "jsonl"
    return None


def classify(path: str, root: str) -> Found | None:
    """The run and rank of ``path`` under the watched ``root`` (a directory, or ``path`` itself)."""
    name = os.path.basename(path)
    kind = kind_of(name)
    if kind is None:
        return None
    root = os.path.abspath(root)
    directory = os.path.dirname(os.path.abspath(path))
    base = root if os.path.isdir(root) else os.path.dirname(root)
    rel = os.path.relpath(directory, base)
    parts = [] if rel == "." else rel.split(os.sep)
    rank = None
    kept = []
    for part in parts:
        m = _RANK_DIR.fullmatch(part)
        if m:
            rank = int(m.group(1))
        else:
            kept.append(part)
    m = _RANK_IN_NAME.search(name)
    if m:
        rank = int(m.group(1))
    run = "/".join(kept) or os.path.basename(base.rstrip(os.sep)) or "root"
    return Found(os.path.abspath(path), kind, run, rank or 0)


def scan(roots: Iterable[str], known: set[str] | None = None) -> Iterator[Found]:
    """The files under ``roots`` not in ``known`` (absolute paths), each once, in a stable order."""
    known = known if known is not None else set()
    count = len(known)
    for root in roots:
        if os.path.isfile(root):
            found = classify(root, root)
            if found is not None and found.path not in known:
                yield found
            continue
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for name in sorted(filenames):
                path = os.path.abspath(os.path.join(dirpath, name))
                if path in known or kind_of(name) is None:
                    continue
                if count >= MAX_FILES:
                    return
                found = classify(path, root)
                if found is not None:
                    count += 1
                    yield found
