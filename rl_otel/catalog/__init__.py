"""The metric catalog: the one place a metric is defined.

Every key of the ROLL, TRL and Trinity-RFT references has an entry here (instrument kind, name, unit, labels,
description). Docs (`rl-otel catalog`), the exporters and the bridge are derived from it. Keys without an entry
still work through a sanitized fallback gauge.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass

from rl_otel.catalog.naming import fallback_spec_name
from rl_otel.catalog.spec import ALLOWED_LABELS, Kind, MetricSpec, built_in

with built_in():  # rl_otel's own entries: checked by tests/test_catalog.py, not at every import
    from rl_otel.catalog import live, meta, roll, trinity, trl, verl

__all__ = ["ALLOWED_LABELS", "FRAMEWORKS", "Catalog", "Kind", "MetricSpec", "Resolution", "default_catalog",
           "every_entry", "framework_name", "left_out", "strip_reducer_tag"]

# ROLL tags a metric with the reducer its workers use (``actor/pg_loss@sum``; roll/utils/functionals.py:reduce_metrics
# knows mean, max, min, p50, p99, std, sum); Trinity's ``mean@4`` is no tag.
_REDUCER_TAG = re.compile(r"@(sum|mean|max|min|p50|p99|last|first|std|concat)$")


def strip_reducer_tag(key: str) -> str:
    """``actor/pg_loss@sum`` -> ``actor/pg_loss``; keys without a reducer tag are returned unchanged."""
    return _REDUCER_TAG.sub("", key)


@dataclass(frozen=True)
class Resolution:
    """What one logged key becomes: its entry (or the fallback) and the label values the key carries."""

    key: str
    known: bool
    spec: MetricSpec
    labels: tuple[tuple[str, str], ...]

    def to_dict(self) -> dict[str, object]:
        return {
            "key": self.key,
            "known": self.known,
            "prometheus_name": self.spec.prometheus_name,
            "otel_name": self.spec.name,
            "kind": self.spec.kind.value,
            "labels": dict(self.labels),
            "unit": self.spec.unit,
            "tracker_unit": self.spec.tracker_unit or self.spec.unit,
            "scale": self.spec.scale,
            "catalog_key": self.spec.key if self.known else None,
            "description": self.spec.description,
        }


class Catalog:
    """An immutable set of entries with key resolution. Thread-safe: resolution reads only."""

    def __init__(self, specs: Iterable[MetricSpec]) -> None:
        self.specs: tuple[MetricSpec, ...] = tuple(specs)
        self._concrete: dict[str, MetricSpec] = {}
        self._templates: list[MetricSpec] = []
        owners: dict[str, str] = {}
        by_name: dict[str, MetricSpec] = {}
        for spec in self.specs:
            if spec.name in by_name:
                raise ValueError(f"catalog entries {by_name[spec.name].key!r} and {spec.key!r} share the name "
                                 f"{spec.name!r}")
            by_name[spec.name] = spec
            for exposed in spec.exposed_names:
                if exposed in owners:
                    raise ValueError(f"{spec.key!r} would expose {exposed!r}, already exposed by {owners[exposed]!r}")
                owners[exposed] = spec.key
            if spec.templated:
                self._templates.append(spec)
            elif spec.key in self._concrete:
                raise ValueError(f"catalog key {spec.key!r} is defined twice")
            else:
                self._concrete[spec.key] = spec
        self._exposed = frozenset(owners)
        self._by_name = by_name
        # the templates a key can match, by the key's first segment: those with that literal first segment and
        # those with a placeholder there, in catalog order (the first match wins)
        self._segment: dict[str, list[MetricSpec]] = {}
        for spec in self._templates:
            seg = spec.first_segment
            if seg is not None:
                self._segment.setdefault(seg, []).append(spec)
        self._anywhere = tuple(s for s in self._templates if s.first_segment is None)
        order = {id(s): i for i, s in enumerate(self._templates)}
        # every other first segment (an unknown key's, a hostile stream's) has the templates of self._anywhere
        self._candidates: dict[str, tuple[MetricSpec, ...]] = {
            seg: tuple(sorted((*own, *self._anywhere), key=lambda s: order[id(s)]))
            for seg, own in self._segment.items()}
        self._screens: dict[int, re.Pattern[str]] = {}  # by id() of a candidates tuple: any of them matches

    def __len__(self) -> int:
        return len(self.specs)

    def __iter__(self):
        return iter(self.specs)

    def by_name(self, name: str) -> MetricSpec:
        return self._by_name[name]

    def exposes(self, prometheus_name: str) -> bool:
        """True if some entry writes samples under ``prometheus_name`` (fallback names must avoid these)."""
        return prometheus_name in self._exposed

    def lookup(self, key: str) -> Resolution | None:
        """The entry covering ``key`` (reducer tag stripped), or ``None``."""
        key = strip_reducer_tag(key)
        spec = self._concrete.get(key)
        if spec is not None:
            return Resolution(key, True, spec, ())
        candidates = self._candidates_for(key.split("/", 1)[0])
        if not candidates or self._screen(candidates).fullmatch(key) is None:
            return None  # no template covers it: one match in C instead of one per template
        for spec in candidates:
            labels = spec.match(key)
            if labels is not None:
                return Resolution(key, True, spec, tuple(labels.items()))
        return None

    def _candidates_for(self, segment: str) -> tuple[MetricSpec, ...]:
        """The templates a key of first segment ``segment`` can match, in catalog order (the first match wins)."""
        return self._candidates.get(segment, self._anywhere)

    def _screen(self, candidates: tuple[MetricSpec, ...]) -> re.Pattern[str]:
        """One regex matching what any of ``candidates`` matches (their patterns without named groups), so a key no
        template covers - an unknown key, the common case of a flood - is refused by one match."""
        screen = self._screens.get(id(candidates))  # the tuples live as long as the catalog
        if screen is None:
            screen = re.compile("|".join(f"(?:{_UNNAMED.sub('(?:', s.regex.pattern)})" for s in candidates))
            self._screens[id(candidates)] = screen  # one per literal first segment of a template, and one shared
        return screen

    def resolve(self, key: str) -> Resolution:
        """The entry covering ``key``, else a fallback gauge named from the sanitized key (``known`` false)."""
        found = self.lookup(key)
        if found is not None:
            return found
        key = strip_reducer_tag(key)
        name, unit, scale, tracker_unit = fallback_spec_name(key)
        spec = MetricSpec(key=key.replace("{", "(").replace("}", ")"), name=name, kind=Kind.GAUGE, unit=unit,
                          description=f"Value logged under the key {key!r} (no catalog entry).", source="fallback",
                          scale=scale, tracker_unit=tracker_unit)
        return Resolution(key, False, spec, ())

    def to_json(self) -> str:
        return json.dumps([spec.to_dict() for spec in self.specs], indent=2)

    def to_markdown(self) -> str:
        from rl_otel.catalog.markdown import render

        return render(self)


# The frameworks whose entries are in every catalog: their keys were made to agree with each other (one key, one
# meaning across ROLL, veRL, TRL and Trinity-RFT).
_UNNAMED = re.compile(r"\(\?P<\w+>")  # a named group's opening, made a plain one in a screen
SHARED_FRAMEWORKS = ("roll", "verl", "trl", "trinity")
# The frameworks whose keys resolve only in their own catalog (``default_catalog("slime")``): their key strings
# overlap others' with other meanings (``train/loss``, ``reward``, ``kl``), so a key resolves within the framework
# that logged it. Each module holds ``SPECS``, and ``CONCEPT_SOURCES`` (concept name -> its selectors), which
# rl_otel.catalog.concepts adds to the shared rules and panels.
SCOPED_FRAMEWORKS = ("openrlhf", "slime", "areal", "nemo_rl", "skyrl", "prime_rl")
FRAMEWORKS = (*SHARED_FRAMEWORKS, *SCOPED_FRAMEWORKS)
_ALIASES = {"transformers": "trl", "trinity-rft": "trinity", "trinity_rft": "trinity", "nemo-rl": "nemo_rl",
            "prime-rl": "prime_rl", "skyrl-train": "skyrl", "skyrl_train": "skyrl"}
_CATALOGS: dict[str | None, Catalog] = {}  # by framework (None: the shared one; "*": every_entry())
_LEFT_OUT: dict[str, tuple[MetricSpec, ...]] = {}  # by scoped framework: the shared entries its catalog leaves out


def framework_name(name: str) -> str:
    """A framework's canonical name (``prime-rl`` -> ``prime_rl``); ``ValueError`` naming the known ones."""
    canonical = _ALIASES.get(name.lower(), name.lower())
    if canonical not in FRAMEWORKS:
        raise ValueError(f"unknown framework {name!r}: one of {', '.join(FRAMEWORKS)}")
    return canonical


def framework_module(name: str):
    """The catalog module of a scoped framework (``rl_otel.catalog.slime``), imported on first use."""
    import importlib

    with built_in():
        return importlib.import_module(f"rl_otel.catalog.{name}")


def every_entry() -> Catalog:
    """Every framework's entries and rl_otel's own in one catalog, for documents and checks (docs/metrics.md,
    ``rl-otel catalog``): each Prometheus name is unique across all frameworks. Runs resolve keys in
    :func:`default_catalog` instead."""
    found = _CATALOGS.get("*")
    if found is None:
        found = _CATALOGS["*"] = Catalog((*default_catalog().specs,
                                          *(s for f in SCOPED_FRAMEWORKS for s in framework_module(f).SPECS)))
    return found


def default_catalog(framework: str | None = None) -> Catalog:
    """The catalog a run's keys resolve in.

    Without ``framework`` (or for ROLL, veRL, TRL, Trinity-RFT): the entries of those four frameworks and
    rl_otel's own series. For a scoped framework (:data:`SCOPED_FRAMEWORKS`): its own entries first, then those
    but the ones whose keys its own entries also match (:func:`left_out`), so its keys mean what they mean there
    and every entry of the catalog is served under its own name. Raises ``ValueError`` for an unknown framework
    name.
    """
    name = None if framework is None else framework_name(framework)
    if name in SHARED_FRAMEWORKS:
        name = None
    found = _CATALOGS.get(name)
    if found is None:
        base = (*roll.SPECS, *verl.SPECS, *trl.SPECS, *trinity.SPECS, *meta.SPECS, *live.SPECS)
        if name is None:
            found = Catalog(base)
        else:
            own = Catalog(framework_module(name).SPECS)
            # A shared entry with a key the framework's own entries also match would take that key from them (a
            # literal key before any template) or be shadowed by them on it and served under their name (prime-rl's
            # batch/{env} took TRL's batch/row_tokens_mean): the framework's meaning of its keys holds in its runs,
            # so such an entry is left out whole. Its keys are its examples (every alternative of an enumerated
            # placeholder; a literal key is its own example).
            left = tuple(s for s in base if _overlaps(own, s))
            gone = {id(s) for s in left}
            found = Catalog((*own.specs, *(s for s in base if id(s) not in gone)))
            _LEFT_OUT[name] = left
        _CATALOGS[name] = found
    return found


def left_out(framework: str) -> tuple[MetricSpec, ...]:
    """The shared entries (ROLL's, veRL's, TRL's, Trinity-RFT's, rl_otel's) that ``default_catalog(framework)``
    leaves out because the framework's own entries match some of their keys (none for a shared framework)."""
    name = framework_name(framework)
    if name in SHARED_FRAMEWORKS:
        return ()
    default_catalog(name)
    return _LEFT_OUT[name]


def _overlaps(own: Catalog, spec: MetricSpec) -> bool:
    return any(own.lookup(key) is not None for key in spec.examples)
