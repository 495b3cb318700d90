"""Processes that append to one metrics file and log some keys under the same names with different meanings.

prime-rl's trainer and orchestrator both append to the run's ``metrics.jsonl`` and both log ``time/step`` and
``time/save_ckpt``; nothing in a line names its writer, but each writer's line holds keys the other's never does
(its *marks*). :meth:`SharedFile.attribute` renames the shared-prefix keys of a line whose writer its marks tell
(``time/step`` -> ``trainer/time/step``), so the catalog serves each writer's values on series of their own (a
``component`` label). A framework's catalog module names its file as ``LINE_WRITERS``; ``rl-otel watch`` applies it
to every JSONL line it reads (``rl_otel.watch.frameworks.attribute``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

V = TypeVar("V")


@dataclass(frozen=True)
class Writer:
    """One process writing lines into a file another process writes too."""

    component: str  # the ``component`` label value of its keys, and the prefix the keys get
    marks: frozenset[str]  # keys only this writer's lines hold: a line with one of them is this writer's


@dataclass(frozen=True)
class SharedFile:
    """The writers of one file and the keys they share (``prefix``: every key under it is renamed with the writer's
    component, so one writer's keys stay together; ``shared``: the keys both write, whose presence calls for it)."""

    prefix: str
    shared: frozenset[str]
    writers: tuple[Writer, ...]

    def writer(self, keys: Mapping[str, object]) -> Writer | None:
        """The one writer whose marks the line's ``keys`` hold; ``None`` for none, or for marks of several."""
        found = [w for w in self.writers if any(mark in keys for mark in w.marks)]
        return found[0] if len(found) == 1 else None

    def attribute(self, values: dict[str, V]) -> dict[str, V]:
        """``values`` with the keys under ``prefix`` renamed ``<component>/<key>`` when the line holds a shared key
        and tells its writer; otherwise ``values`` itself (a line of another file, or of no known writer)."""
        if not any(key in values for key in self.shared):
            return values
        writer = self.writer(values)
        if writer is None:
            return values
        head = writer.component + "/"
        return {(head + key if key.startswith(self.prefix) else key): value for key, value in values.items()}
