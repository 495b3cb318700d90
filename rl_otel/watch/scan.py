"""Which files to follow, and the run and rank each belongs to.

A run is TensorBoard's: the directory holding the event files, relative to the watched root (the root's own
name when the files lie in it). A rank is read where the frameworks put it: a directory ``rank_3``, ``rank-3`` or
``rank3`` (taken out of the run's name: ``exp1/rank_3/`` is run ``exp1``, rank 3), or such a part of the file's
name (``metrics_rank3.jsonl``, ``events.out.tfevents.1700000000.host.rank_3``); else rank 0. Event files are
those with ``tfevents`` in their name, metric lines those ending in ``.jsonl``. Hidden directories are passed
over. A watched path may also be one file. Several event files of one rank in one directory are one run (a
training restarted into its directory goes on; two processes writing there at once are merged, so docs/watch.md
tells users to give each its own directory or rank).

A walk notes the stamps of the directories that hold directories or no file to follow yet (:func:`changed` stats
only those): a new run's directory changes its parent's, and its first file the new directory's, so the watcher
walks again at once when one appears, and only then; a new file beside followed ones (a restarted training's new
event file) waits for the next periodic walk.
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


def scan(roots: Iterable[str], known: set[str] | None = None,
         dirs: dict[str, tuple[int, int]] | None = None) -> Iterator[Found]:
    """The files under ``roots`` not in ``known`` (absolute paths), each once, in a stable order. ``dirs``, when
    given, is filled with the (mtime, link count) of each root directory and each walked directory holding
    directories or no file to follow, taken before it was listed: what :func:`changed` compares, so that a
    directory added under any of them (a new run) is seen without walking them all again."""
    known = known if known is not None else set()
    count = len(known)
    for root in roots:
        if os.path.isfile(root):
            found = classify(root, root)
            if found is not None and found.path not in known:
                yield found
            continue
        seen: dict[str, tuple[int, int]] = {}  # each directory's stamp, taken before os.walk lists it
        if dirs is not None:
            _stamp(root, seen)
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            if dirs is not None:
                stamp = seen.pop(dirpath, None)
                # a run's directory made before its first file (mkdir, then open) is watched until it holds one
                if stamp is not None and (dirnames or dirpath == root
                                          or not any(kind_of(name) for name in filenames)):
                    dirs[dirpath] = stamp
                for d in dirnames:
                    _stamp(os.path.join(dirpath, d), seen)
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


def _stamp(path: str, into: dict[str, tuple[int, int]]) -> None:
    try:
        st = os.stat(path)
    except OSError:
        return
    into[path] = (st.st_mtime_ns, st.st_nlink)


def changed(dirs: dict[str, tuple[int, int]]) -> bool:
    """Whether any of ``dirs`` (filled by :func:`scan`) changed since, or is gone: an entry was added or removed
    in it (a stat per directory: the roots, the directories of directories and those with no file followed, not
    the runs' own)."""
    for path, stamp in dirs.items():
        try:
            st = os.stat(path)
        except OSError:
            return True
        if (st.st_mtime_ns, st.st_nlink) != stamp:
            return True
    return False
