"""The series of issue 33 (goodput, stragglers, hangs) as the rules, dashboards and budget read them.

rl_otel's runtime writes them (their catalog entries: ``rl_otel/catalog/live.py`` and ``meta.py``); this module
spells, in one place, what ops relies on: each family's name, kind, unit and labels (the lead's series contract),
which buckets are goodput, and why a panel reading a family may be empty. ``tests/test_ops_contract.py`` checks
every family here against its catalog entry wherever the catalog defines it, so a rename on either side fails.

A family counts as *served* (:func:`served`) when the catalog defines it: the budget counts it, and the end-to-end
tests expect data from it, only then (an rl_otel whose catalog lacks it serves none of it).
"""

from __future__ import annotations

from dataclasses import dataclass

from rl_otel.catalog import every_entry
from rl_otel.catalog.goodput import BUCKETS
from rl_otel.catalog.spec import Kind, MetricSpec

__all__ = ["BUCKETS", "CONTRACT", "PRODUCTIVE", "Family", "catalog_entry", "find", "served"]

# The goodput buckets: the time a process spends on the work it exists for. Everything else is badput.
PRODUCTIVE: tuple[str, ...] = ("generation", "training", "inference")
BADPUT: tuple[str, ...] = tuple(b for b in BUCKETS if b not in PRODUCTIVE)


@dataclass(frozen=True)
class Family:
    """One family of the contract: ``name`` as the catalog names it (a counter without ``_total``), its kind, unit
    and labels besides run, role and rank; ``empty`` (short) and ``why`` (a sentence) say when it has no series."""

    name: str
    kind: Kind
    unit: str
    labels: tuple[str, ...]
    description: str
    empty: str
    why: str

    @property
    def exposed(self) -> str:
        """The sample name the exposition writes (counters get ``_total``)."""
        return self.name + "_total" if self.kind is Kind.COUNTER else self.name


_GOODPUT_EMPTY = "needs tel.phase() blocks or a framework's timing keys, and an rl_otel serving goodput"
_GOODPUT_WHY = ("Written by rl_otel's goodput accounting for a process that runs tel.phase() blocks (ROLL's "
                "state_offload_manger, your own loop) or logs a framework's timing keys (veRL timing_s/*, "
                "OpenRLHF timing/*, ...; rl-otel watch too): empty for a process with neither, and from an rl_otel "
                "that predates the goodput series.")

GOODPUT_BUCKET = Family(
    "rl_goodput_bucket_seconds", Kind.COUNTER, "s", ("bucket",),
    "Seconds of this process's wall time in each goodput bucket (startup, generation, training, inference, "
    "weight_sync, offload, validation, checkpointing, other, waiting).", _GOODPUT_EMPTY, _GOODPUT_WHY)
GOODPUT_WALL = Family(
    "rl_goodput_wall_seconds", Kind.COUNTER, "s", (),
    "The wall seconds the goodput buckets divide: process start to now for a process with phases, the sum of "
    "step durations for a run known only by its timing keys.", _GOODPUT_EMPTY, _GOODPUT_WHY)
COLLECTIVE_WAIT = Family(
    "rl_collective_wait_seconds", Kind.COUNTER, "s", ("point",),
    "Seconds this rank spent blocked where ranks meet (a tel.collective() block around a collective or barrier).",
    "needs tel.collective() blocks",
    "Written inside tel.collective() blocks around the collectives and barriers where ranks meet: empty for a "
    "process that wraps none.")
RANK_COMPUTE = Family(
    "rl_rank_compute_seconds", Kind.COUNTER, "s", (),
    "This rank's busy time (in phases) minus its waits at collectives.",
    "needs tel.phase() blocks, and an rl_otel serving rank compute",
    "Written for a process that runs tel.phase() blocks (its busy time less its tel.collective() waits): empty "
    "for a run without phases, and from an rl_otel that predates it.")
STACK_DUMPS = Family(
    "rl_stack_dumps", Kind.COUNTER, "{dump}", ("reason",),
    "Stack dumps this process wrote (reason: stuck, signal, http).",
    "no stack dump written (healthy)",
    "A series appears here only once a process wrote a stack dump: a phase stuck far beyond its usual duration, "
    "a signal, or the endpoint's dump path.")
STACK_DUMP_INFO = Family(
    "rl_stack_dump_info", Kind.GAUGE, "1", ("path", "cluster", "phase", "reason"),
    "Always 1: where this process's last stack dump is (path), for which phase and why.",
    STACK_DUMPS.empty, STACK_DUMPS.why)
LAST_PROGRESS = Family(
    "rl_last_progress_timestamp_seconds", Kind.GAUGE, "s", (),
    "Unix time of this process's last progress: a logged step or a finished phase.",
    "no progress yet, or an rl_otel without it",
    "Written from a process's first logged step or finished phase on: empty before it, and from an rl_otel that "
    "predates it.")

PROGRESS = Family(
    "rl_progress", Kind.COUNTER, "{event}", (),
    "Progress events of this process (logged steps and finished phases).",
    LAST_PROGRESS.empty, LAST_PROGRESS.why)
COLLECTIVES = Family(
    "rl_collectives", Kind.COUNTER, "{collective}", ("group",),
    "Collectives this rank issued in a torch.distributed process group (torch's flight recorder).",
    "needs torch.distributed",
    "Written by a process whose torch.distributed is initialized (NCCL or gloo, torch's flight recorder on: its "
    "default): empty for a single-process run, and from an rl_otel that predates it.")
COLLECTIVE_STARTED = Family(
    "rl_collective_started_timestamp_seconds", Kind.GAUGE, "s", ("group", "op"),
    "Unix time the collective this rank is in now was enqueued (absent when it is in none).",
    "no rank inside a collective now (healthy)", COLLECTIVES.why)

CONTRACT: tuple[Family, ...] = (GOODPUT_BUCKET, GOODPUT_WALL, COLLECTIVE_WAIT, RANK_COMPUTE, STACK_DUMPS,
                                STACK_DUMP_INFO, LAST_PROGRESS, PROGRESS, COLLECTIVES, COLLECTIVE_STARTED)
_BY_EXPOSED = {f.exposed: f for f in CONTRACT}


def find(metric: str) -> Family | None:
    """The contract family writing samples named ``metric``, or ``None``."""
    return _BY_EXPOSED.get(metric)


def catalog_entry(family: Family) -> MetricSpec | None:
    """The catalog's entry of ``family``, or ``None`` while the catalog does not define it."""
    try:
        return every_entry().by_name(family.name)
    except KeyError:
        return None


def served(family: Family) -> bool:
    """Whether this rl_otel serves ``family``: its catalog defines it."""
    return catalog_entry(family) is not None
