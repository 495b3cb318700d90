"""Which files to follow, and the run and rank each belongs to.

A run is TensorBoard's: the directory holding the event files, relative to the watched root (the root's own
name when the files lie in it). A rank is read where the frameworks put it: a directory ``rank_3``, ``rank-3`` or
``rank3`` (taken out of the run's name: ``exp1/rank_3/`` is run ``exp1``, rank 3), or such a part of the file's
name (``metrics_rank3.jsonl``, ``events.out.tfevents.1700000000.host.rank_3``); else rank 0. Event files are
those with ``tfevents`` in their name, metric lines those ending in ``.jsonl``. Hidden directories are passed
over. A watched path may also be one file.

Two event files of one rank in one directory are two writers (two processes, or a run restarted into its log
directory): TensorBoard draws them as one run, which interleaves their values in one series. Here the earliest
(by the time in its name, ``events.out.tfevents.<time>.<host>...``) is the directory's run and each later one a
run of its own, ``<run>@<time>`` (``exp1@1700000500``), so no series alternates between two writers; a resumed
run therefore shows as a new run from its restart on.
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
    if kind == "tfevents":
        run += _later_writer(name, directory, m.group(1) if m else None)
    return Found(os.path.abspath(path), kind, run, rank or 0)


def _stamp(name: str) -> str:
    """The writer's start time in an event file's name (``events.out.tfevents.<time>.<host>...``), else the rest of
    the name after ``tfevents.``."""
    rest = name.split("tfevents", 1)[1].lstrip(".")
    first = rest.split(".", 1)[0]
    return first if first.isdigit() else rest


def _rank_in_name(name: str) -> str | None:
    m = _RANK_IN_NAME.search(name)
    return m.group(1) if m else None


def _later_writer(name: str, directory: str, rank: str | None) -> str:
    """``""`` for the earliest event file of its rank in ``directory``, else ``"@<time>"`` (see the module)."""
    def order(file: str) -> tuple[int, str]:
        stamp = _stamp(file)
        return (int(stamp) if stamp.isdigit() else 0, file)

    try:
        siblings = [entry.name for entry in os.scandir(directory)
                    if kind_of(entry.name) == "tfevents" and entry.is_file()]
    except OSError:
        return ""
    same = [f for f in siblings if _rank_in_name(f) == rank]
    if not same or min([*same, name], key=order) == name:
        return ""
    return "@" + _stamp(name)


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
