"""Why a dashboard panel may show no data, derived from what its queries read.

A panel that is empty says why, in Grafana's "no data" text (``fieldConfig.defaults.noValue``) and at the end of
its description. The reasons come from the catalog and the rules, never from a list kept by hand per panel:

- the frameworks whose keys feed the series it reads (a catalog entry's ``source``; a recorded series reads its
  concept's sources), so a veRL-only family says "logged by veRL" on a ROLL run;
- a GPU: families that exist only where torch sees a CUDA device, NVML a GPU, or a framework logs device memory;
- rl_otel's own ``tel.phase()`` blocks: the phase families (and ROLL's ``time/``, ``memory/`` keys it writes too);
- a baseline: the run's own median over ``baseline_window`` ending ``baseline_offset`` ago, which exists only that
  long into a run;
- a series that exists only when something is wrong (impossible values), or only after a run's first evaluation;
- the series of issue 33 (goodput, rank compute, collective waits, progress, stack dumps): what must run for a
  process to write them, as :mod:`rl_otel.ops.contract` says (a stack dump exists only once one was written).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from rl_otel.catalog import FRAMEWORKS, Catalog, every_entry
from rl_otel.catalog.concepts import CONCEPTS, Concept
from rl_otel.catalog.spec import MetricSpec
from rl_otel.ops import contract, rules
from rl_otel.ops.promql import metric_names
from rl_otel.ops.rules import OUT_OF_RANGE, PHASE_P90, PHASE_STARTED, RANK_SKEW, RANK_SPREAD, duration_minutes
from rl_otel.ops.thresholds import Thresholds

# How the catalog's ``source`` names read on a dashboard.
FRAMEWORK_NAMES = {"roll": "ROLL", "verl": "veRL", "trl": "TRL", "trinity": "Trinity-RFT", "openrlhf": "OpenRLHF",
                   "slime": "slime", "areal": "AReaL", "nemo_rl": "NeMo-RL", "skyrl": "SkyRL", "prime_rl": "prime-rl",
                   "transformers": "the transformers Trainer"}
# Device memory, NVML, torch.cuda: families that exist only on a GPU.
_GPU_ONLY = re.compile(r"^rl_gpu_|_gpu_memory_|_max_memory_(allocated|reserved)_|_peak_memory_")
# ROLL's state_offload_manger keys (time/<cluster>/<phase>/..., memory/...), which rl_otel's tel.phase() writes too
# (rl_otel/_internal/runtime/phase.py), and rl_otel's own phase families.
_PHASE_WRITTEN = frozenset({"rl_phase_last_duration_seconds", "rl_gpu_memory_bytes", "rl_gpu_memory_peak_ratio",
                            "rl_cpu_memory_bytes"})
# Evaluation families: logged at the run's evaluation steps only (the first comes eval_every steps in).
_EVAL = re.compile(r"^rl_(eval|val|bench)_")
_PHASE_OWN = frozenset({"rl_phase_duration_seconds", "rl_phase_started_timestamp_seconds"})
_RECORDED_PHASE = {PHASE_STARTED: "rl_phase_started_timestamp_seconds", PHASE_P90: "rl_phase_duration_seconds",
                   RANK_SKEW: "rl_phase_duration_seconds", RANK_SPREAD: "rl_phase_duration_seconds"}
# the recorded series of the issue-33 families, and the families each reads
_GOODPUT = (contract.GOODPUT_BUCKET, contract.GOODPUT_WALL)
_RECORDED_CONTRACT: dict[str, tuple[contract.Family, ...]] = {
    rules.GOODPUT_BUCKET: _GOODPUT, rules.GOODPUT_SHARE: _GOODPUT, rules.GOODPUT_WALL: _GOODPUT,
    rules.GOODPUT_RATIO: _GOODPUT, rules.GOODPUT_BASELINE: _GOODPUT, rules.LAST_PROGRESS: (contract.LAST_PROGRESS,),
    rules.RANK_COMPUTE: (contract.RANK_COMPUTE,), rules.RANK_COMPUTE_RATIO: (contract.RANK_COMPUTE,)}


@dataclass(frozen=True)
class NoData:
    """Why a panel may be empty: ``text`` for Grafana's "no data" text, ``detail`` for its description."""

    text: str
    detail: str


@dataclass(frozen=True)
class Reads:
    """What a panel's queries read: catalog entries (through recorded series), and recorded series that need a
    baseline or exist only when something is wrong."""

    specs: tuple[MetricSpec, ...]
    baseline: bool
    only_when_wrong: bool
    contracted: tuple[contract.Family, ...] = ()  # issue-33 families (whatever the catalog holds of them)
    goodput_baseline: bool = False  # the run's own goodput baseline (its own windows)


def spec_for(metric: str, catalog: Catalog | None = None) -> MetricSpec | None:
    """The catalog entry writing samples named ``metric`` (``_bucket``/``_sum``/``_count``/``_total`` stripped)."""
    catalog = catalog or every_entry()
    for suffix in ("", "_bucket", "_sum", "_count", "_total"):
        if suffix and not metric.endswith(suffix):
            continue
        base = metric[: len(metric) - len(suffix)] if suffix else metric
        try:
            spec = catalog.by_name(base)
        except KeyError:
            continue
        if metric in spec.exposed_names:
            return spec
    return None


def _concept_of(record: str) -> Concept | None:
    """The concept a recorded series (or its ``_baseline``, ``_avg1h``) is made of."""
    for c in CONCEPTS:
        if record == c.record or record.startswith(c.record + "_"):
            return c
    return None


def reads(exprs: Iterable[str]) -> Reads:
    """The catalog entries a panel's expressions read, directly or through the recording rules."""
    specs: dict[str, MetricSpec] = {}
    contracted: dict[str, contract.Family] = {}
    baseline = only_when_wrong = goodput_baseline = False
    for expr in exprs:
        for name in sorted(metric_names(expr)):
            found: list[MetricSpec | None] = []
            families = _RECORDED_CONTRACT.get(name) or ((f,) if (f := contract.find(name)) else ())
            if families:
                contracted.update((f.name, f) for f in families)
                goodput_baseline = goodput_baseline or name == rules.GOODPUT_BASELINE
            elif name == OUT_OF_RANGE:
                only_when_wrong = True
            elif name in _RECORDED_PHASE:
                found.append(spec_for(_RECORDED_PHASE[name]))
            elif name.count(":") == 2:
                baseline = baseline or name.endswith("_baseline")
                c = _concept_of(name)
                middle = spec_for(name.split(":")[1])
                found.extend([spec_for(src.metric) for src in c.sources] if c is not None else [middle])
            else:
                found.append(spec_for(name))
            for spec in found:
                if spec is not None:
                    specs.setdefault(spec.name, spec)
    return Reads(tuple(specs.values()), baseline, only_when_wrong, tuple(contracted.values()), goodput_baseline)


def gpu_only(spec: MetricSpec) -> bool:
    """Whether a family exists only on a GPU (device memory, NVML, torch.cuda)."""
    return bool(_GPU_ONLY.search(spec.name))


def frameworks(specs: Iterable[MetricSpec]) -> tuple[str, ...]:
    """The frameworks (catalog ``source`` names) whose keys feed ``specs``, in :data:`FRAMEWORKS` order; rl_otel's
    own families add none."""
    found = {f.strip() for spec in specs for f in spec.source.split(",")}
    return tuple(f for f in (*FRAMEWORKS, "transformers") if f in found)


def _listing(names: Iterable[str]) -> str:
    shown = [FRAMEWORK_NAMES.get(n, n) for n in names]
    return ", ".join(shown[:-1]) + " or " + shown[-1] if len(shown) > 1 else shown[0]


def explain(exprs: Iterable[str], t: Thresholds, needs_gpu: bool = False, when_empty: str = "") -> NoData:
    """Why a panel reading ``exprs`` may be empty; ``needs_gpu`` and ``when_empty`` add what the panel knows
    about itself (a window nothing ran in, a phase that must be running)."""
    got = reads(exprs)
    specs = got.specs
    short: list[str] = []
    long: list[str] = []
    if needs_gpu or (specs and all(gpu_only(s) for s in specs)):
        short.append("needs a GPU")
        long.append("Its series exist only on a GPU (torch's CUDA allocator, NVML, a framework's device-memory "
                    "keys): empty on a CPU-only run, such as the demo's.")
    if got.only_when_wrong:
        short.append("none is out of range (healthy)")
        long.append("Empty while every value is possible: a series appears here only when a metric reports a value "
                    "that cannot be true.")
    logged_by = frameworks(s for s in specs if s.name not in _PHASE_OWN)
    phase = any(s.name in _PHASE_OWN or s.name in _PHASE_WRITTEN for s in specs)
    if logged_by:
        who = _listing(logged_by) + (" (or rl_otel's tel.phase())" if phase else "")
        short.append(f"logged by {who}")
        long.append(f"Logged by {who}: empty for a run whose framework logs none of it.")
    elif phase:
        short.append("needs tel.phase() blocks")
        long.append("Written by rl_otel's tel.phase() blocks (ROLL's state_offload_manger, tel.phase() in "
                    "your own loop): empty for a run without phases.")
    if specs and all(_EVAL.search(s.name) for s in specs):
        short.append("until the run's first evaluation")
        long.append("Written at evaluation steps only: empty until the run's first evaluation.")
    for family in got.contracted:
        if family.empty not in short:
            short.append(family.empty)
            long.append(family.why)
    if when_empty:
        short.append(when_empty)
        long.append(when_empty[0].upper() + when_empty[1:] + ".")
    if got.goodput_baseline:
        age = duration_minutes(t.goodput_baseline_offset) + duration_minutes(t.goodput_baseline_min_history)
        short.append(f"the goodput baseline appears {duration_minutes(t.goodput_baseline_offset)} min into a run")
        long.append(f"The goodput baseline is the run's own median over {t.goodput_baseline_window} ending "
                    f"{t.goodput_baseline_offset} ago: it appears {duration_minutes(t.goodput_baseline_offset)} "
                    f"minutes into a run (the alert waits {age}).")
    if got.baseline:
        age = duration_minutes(t.baseline_window) + duration_minutes(t.baseline_offset)
        short.append(f"the baseline appears {age} min into a run")
        long.append(f"The baseline is the run's own median over {t.baseline_window} ending {t.baseline_offset} "
                    f"ago: it appears {age} minutes into a run.")
    if not short:
        short.append("no selected run is scraped")
        long.append("Every run serves it: no selected job and run is scraped now (check the variables, and "
                    "RL fleet → Scrape targets up).")
    return NoData("No data: " + "; ".join(short), "No data? " + " ".join(long))

