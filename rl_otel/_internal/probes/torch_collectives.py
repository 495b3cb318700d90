"""The one adapter for what torch.distributed knows of this process's collectives and offers no public API for.

torch's c10d keeps a flight recorder per process (on by default for NCCL and gloo in torch 2.13; its size is
``TORCH_FR_BUFFER_SIZE``, formerly ``TORCH_NCCL_TRACE_BUFFER_SIZE``): every collective a rank enqueues, in order,
with a sequence number per process group, and per group the last collective enqueued and the last completed.
``torch._C._distributed_c10d._dump_fr_trace_json`` is its only reader (private: ``torch.distributed.flight_recorder``
ships the offline analyser only). From it rl_otel serves, at each scrape, how many collectives this rank issued in
each group and the one it is in now - so in a hang the ranks waiting in collective N tell which rank issued only
N-1 - without the user wrapping a single ``dist.all_reduce``. With NCCL a collective is enqueued on a stream and the
host goes on; the flight recorder still holds it as not completed until the NCCL watchdog sees it end, which is
what "in it" means there.

Nothing here imports torch: a process that has not imported ``torch.distributed`` (or not initialized it) serves
nothing. ``tests/test_torch_collectives.py`` runs real gloo ranks and fails loudly when torch changes the reader or
its fields.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from typing import NamedTuple

from rl_otel._internal.probes.live import Item
from rl_otel.catalog import meta

_log = logging.getLogger("rl_otel")

MAX_GROUPS = 16  # process groups served (a job has a handful: world, TP, DP, PP); the others are left out


class GroupState(NamedTuple):
    """One process group's collectives in this rank: ``issued`` (the last enqueued sequence number), whether one
    is in flight (``busy``), and which and since when (``op``, ``since``: Unix time; ``None`` when none is in
    flight, or its details were not read)."""

    group: str
    issued: int
    op: str | None
    since: float | None
    busy: bool = False
    pg: str = ""


def _reader():
    dist = sys.modules.get("torch.distributed")
    if dist is None or not getattr(dist, "is_available", lambda: False)() or not dist.is_initialized():
        return None
    c10d = sys.modules.get("torch._C._distributed_c10d")
    return getattr(c10d, "_dump_fr_trace_json", None)


def groups_now(detail: Callable[[str, int], bool] = lambda pg, issued: True) -> list[GroupState] | None:
    """This rank's process groups now, or ``None`` where torch.distributed is not in use or has no flight
    recorder; the collective in flight of a group is read (its op and start) where ``detail(pg, issued)`` says so.
    Raises what the reader raises (the caller counts it)."""
    dump = _reader()
    if dump is None:
        return None
    status = json.loads(dump(False, True)).get("pg_status") or {}
    names = _group_names(status)
    in_flight = {pg for pg, s in status.items() if int(s.get("last_enqueued_collective", -1))
                 > int(s.get("last_completed_collective", -1))}
    busy = {pg for pg in in_flight if detail(pg, int(status[pg].get("last_enqueued_collective", 0)))}
    active: dict[str, tuple[str, float]] = {}
    if busy:  # the entries (the larger part of a dump, all of them with gloo) only where asked
        for entry in json.loads(dump(True, True)).get("entries") or ():
            pg = str(entry.get("pg_id"))
            if pg not in busy or entry.get("retired") or entry.get("is_p2p"):
                continue
            since = float(entry.get("time_created_ns", 0)) / 1e9
            if pg not in active or since < active[pg][1]:
                active[pg] = (str(entry.get("profiling_name", "")), since)
    out = []
    for pg, s in list(status.items())[:MAX_GROUPS]:
        now = active.get(pg)
        out.append(GroupState(names.get(pg, pg), max(0, int(s.get("last_enqueued_collective", 0))),
                              now[0] if now else None, now[1] if now else None, pg in in_flight, pg))
    return out


def _group_names(status: dict) -> dict[str, str]:
    """Process group id -> ``<id>:<description>`` (``0:default_pg``, ``1:tp``): the id is the same on every rank
    (groups are made in the same order everywhere), the description is torch's ``group_desc`` where it has one."""
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    world = getattr(c10d, "_world", None)
    names: dict[str, str] = {}
    try:
        for pg, name in dict(getattr(world, "pg_names", {})).items():
            desc = getattr(pg, "group_desc", "") or ""
            names[str(name)] = f"{name}:{desc}" if desc and desc != "undefined" else str(name)
    except Exception:  # a registry of another shape: the ids stand
        names = {}
    return {pg: names.get(pg, pg) for pg in status}


class CollectiveProbe:
    """The live series of this rank's collectives (a collector of the recorder: :meth:`collect` at each scrape)
    and a line for a stack dump's header (:meth:`describe`). A failing reader is counted (``count``) and said
    once; the series are then absent until it answers again."""

    def __init__(self, count: Callable[[str], None]) -> None:
        self._count = count
        self._warned = False
        # the collective each group had in flight at the last read: its details (the flight recorder's entries,
        # a parse of all of them with gloo, under the GIL) are read only for one still in flight at the next read -
        # a collective that outlasts a scrape interval - never for the short ones of a healthy run
        self._in_flight: dict[str, int] = {}

    def _groups(self, every: bool = False) -> list[GroupState] | None:
        seen = self._in_flight
        try:
            groups = groups_now(lambda pg, issued: every or seen.get(pg) == issued)
        except Exception as exc:  # boundary: torch.distributed's internals (private, of any version)
            groups = None
            self._failed(exc)
        self._in_flight = {g.pg: g.issued for g in groups or () if g.busy}
        return groups

    def _failed(self, exc: Exception) -> None:
        self._count("collectives")
        if not self._warned:
            self._warned = True
            _log.warning("rl_otel: torch's flight recorder could not be read (%s: %s); rl_collectives_total is "
                         "not served", type(exc).__name__, exc)

    def collect(self) -> list[Item]:
        groups = self._groups()
        if not groups:
            return []
        items: list[Item] = []
        for g in groups:
            items.append((meta.COLLECTIVES, (("group", g.group),), float(g.issued)))
            if g.op is not None and g.since is not None:
                items.append((meta.COLLECTIVE_STARTED, (("group", g.group), ("op", g.op)), g.since))
        return items

    def describe(self, now: float) -> list[str]:
        """Header lines of a stack dump: per group, the collectives issued and the one this rank is in."""
        lines = []
        for g in self._groups(every=True) or ():
            where = (f"in collective #{g.issued} ({g.op}) for {now - g.since:.1f} s"
                     if g.op is not None and g.since is not None else "in no collective of it")
            lines.append(f"process group {g.group}: {g.issued} collectives issued; {where}")
        return lines
