"""The exposition text of rl_otel's families, written straight from the series store.

The stock path (OTel ``Metric`` objects, the exporter's translation into prometheus_client families, then
``generate_latest``) costs ~120 ms for a node with 8 GPUs and 5 clusters (8,800 lines), which is why the scrape
endpoint renders here instead. The output is byte for byte what that path writes (a test compares them on every
catalog family, another the headers on hostile descriptions and units):

- the HELP/TYPE/UNIT header of a family is the one prometheus_client writes for the family the OTel exporter
  builds (the exporter's name sanitizing and unit mapping, prometheus_client's unit suffix, ``_total``/``_info``
  munging and escaping), written natively in :mod:`~rl_otel._internal.exporters.textformat`, in the format asked
  for only; prometheus_client is not imported;
- a series' label string (sorted names, escaped values) is built once per set of series;
- values are formatted as prometheus_client's ``floatToGoString`` does (:func:`go_float`); histogram buckets are
  cumulative, ``le`` is the exporter's ``f"{bound}"``, and ``_count``/``_sum`` are left out when the first bound
  is negative, as prometheus_client's ``HistogramMetricFamily`` does.

Sample lines are the same in the text format 0.0.4 and in OpenMetrics 1.0.0; only the headers differ.

Cost: a rendering is a :class:`Plan` - every family's header and every series' line up to its value, a slot per
series - filled with the values (:meth:`Renderer.fill`). The plan is compiled once per set of series
(:meth:`Renderer.compile`; the scrape registry keeps it while the snapshot's layout stays the same), so a scrape
after a ``log()`` formats the floats in one pass (``repr``, in C) and joins them with the plan's text: no Python
work per family or series. A histogram series fills its slot with its lines, written again only when its counts
changed. Compiling writes the common family (a gauge or counter of one unlabelled series) in one pass with
nothing kept per family. What it costs against prometheus_client: ``benchmarks/bench_scrape.py``.

One family never blanks the others: a label value with a lone surrogate is escaped (the text must encode as
UTF-8), and a family whose rendering raises is left out of that scrape and reported (``on_error``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import NamedTuple, cast

from rl_otel._internal.exporters.promnames import UNITS, map_unit
from rl_otel._internal.exporters.textformat import (
    OPENMETRICS,
    TEXT,
    family_header,
    family_of,
    go_float,
    go_floats,
    header_lines,
    label_text,
)
from rl_otel._internal.pipeline.records import Family, HistogramValue, Labels
from rl_otel.catalog import Kind, MetricSpec

_log = logging.getLogger("rl_otel")


# -- plans ----------------------------------------------------------------------------------------------------

class _State:
    """What a :class:`Renderer` keeps per family name (of the families :meth:`Renderer.compile` does not write in
    its single pass): its names, headers (per format) and series prefixes (a line up to its value, per labels;
    a histogram series' [label strings, last counts, lines])."""

    __slots__ = ("_samples", "base", "has_sum", "heads", "hists", "le", "name", "prefixes", "sample", "spec", "type",
                 "unit")

    def __init__(self, spec: MetricSpec) -> None:
        self.name, self.type, self.unit = family_of(spec)
        self.spec = spec
        self.le: tuple[str, ...] = ()
        self.has_sum = True
        if self.type == "histogram":
            self.sample = self.name
            self.le = (*(f"{float(b)}" for b in spec.buckets), "+Inf")
            self.has_sum = float(spec.buckets[0]) >= 0
        else:
            self.sample = (spec.name if self.type == "info" else
                           self.name + "_total" if self.type == "counter" else self.name)
        self._samples: frozenset[str] | None = None
        self.heads: dict[str, str] = {}
        self.base: Labels | None = None
        self.prefixes: dict[Labels, str] = {}
        self.hists: dict[Labels, _HistSeries] = {}

    @property
    def samples(self) -> frozenset[str]:
        """The sample names the family writes (what ``?name[]=`` selects)."""
        if self._samples is None:
            self._samples = frozenset((f"{self.sample}_bucket", f"{self.sample}_count", f"{self.sample}_sum")
                                      if self.le else (self.sample,))
        return self._samples

    def head(self, fmt: str) -> str:
        head = self.heads.get(fmt)
        if head is None:
            head = self.heads[fmt] = family_header(self.name, self.type, self.unit, self.spec.description or "", fmt)
        return head


class PlannedFamily(NamedTuple):
    """One family of a :class:`Plan`: its slots ``start:stop`` among the plan's (the first slot's static text
    begins with the family's header), ``first``: its first source among the plan's numbers (or histograms: then
    ``state`` writes their lines)."""

    name: str
    samples: frozenset[str]
    start: int
    stop: int
    first: int
    state: _State | None


# a family as compile() records it: a gauge of one series by its name (its sample's); any other family as (name,
# its sample name - or, when compiled through a _State, that state -, number of slots). Plan.families()
# turns them into PlannedFamily records.
_Record = str | tuple[str, "str | _State", int]


@dataclass
class Plan:
    """Families compiled for one format: their text is ``statics[i] + slots[i] + "\\n"`` for each slot, a slot
    per series: a number series' value (its source in ``numbers``) or a histogram series' lines (its source in
    ``hists``; the slot's index and cache entry in ``hist_at``). A static is a line up to its value, after the
    family's header for its first slot (a histogram's static is its header or nothing). ``failed``: the
    families that could not be compiled (reported at each fill)."""

    fmt: str
    statics: list[str]
    records: list[_Record]
    numbers: list
    hists: list
    hist_at: list[tuple[int, _State, _HistSeries]]
    failed: list[tuple[str, Exception]] = field(default_factory=list)  # reported when filled: a stale plan never is
    # families _prepare() left to _finish(): (their place in records, state, base labels, (labels, source) pairs)
    deferred: list[tuple[int, _State, Labels, list[tuple[Labels, object]]]] = field(default_factory=list)
    _names: frozenset[str] | None = None
    _families: list[PlannedFamily] | None = None

    @property
    def names(self) -> frozenset[str]:
        """The names of the families the plan writes."""
        if self._names is None:
            self._names = frozenset(r if isinstance(r, str) else r[0] for r in self.records)
        return self._names

    def families(self) -> list[PlannedFamily]:
        """The plan's families, each with its slots and sources (made at the first need: to cut families out of
        a rendering, or to fill the plan family by family)."""
        if self._families is None:
            parts = []
            slot = numbers = hists = 0
            for record in self.records:
                name, key, count = (record, record, 1) if isinstance(record, str) else record
                if isinstance(key, str):
                    parts.append(PlannedFamily(name, frozenset((key,)), slot, slot + count, numbers, None))
                    numbers += count
                elif key.le:
                    parts.append(PlannedFamily(name, key.samples, slot, slot + count, hists, key))
                    hists += count
                else:
                    parts.append(PlannedFamily(name, key.samples, slot, slot + count, numbers, None))
                    numbers += count
                slot += count
            self._families = parts
        return self._families

    def text(self, slots: list[str]) -> str:
        """The plan's text with every slot's string."""
        out: list[str] = ["\n"] * (3 * len(slots))
        out[::3] = self.statics
        out[1::3] = slots
        return "".join(out)

    def family_text(self, part: PlannedFamily, slots: Sequence[str | None]) -> str:
        """One family's text with its slots' strings; a ``None`` slot (a series without a value) writes no line."""
        statics = self.statics[part.start:part.stop]
        head = statics[0].rindex("\n") + 1  # a header's lines end the first static (label strings are escaped)
        text = [statics[0][:head]]
        statics[0] = statics[0][head:]
        text.extend(f"{static}{slot}\n" for static, slot in zip(statics, slots, strict=True) if slot is not None)
        return "".join(text)


@dataclass
class Rendering:
    """A filled :class:`Plan`: the text, the family names it writes, and what cuts one family out of it."""

    text: str
    names: frozenset[str]
    plan: Plan
    slots: list[str] | None  # every slot's string (one fill); None: ``texts`` holds each part's text
    texts: list[str] | None = None
    written: list[PlannedFamily] | None = None  # the families written when not all of the plan's

    def families(self) -> list[PlannedFamily]:
        """The families written."""
        return self.plan.families() if self.written is None else self.written

    def family_texts(self) -> list[str]:
        """The text of each family (:meth:`families`)."""
        if self.texts is None:
            slots = self.slots or []
            self.texts = [self.plan.family_text(p, slots[p.start:p.stop]) for p in self.families()]
        return self.texts

    def text_of(self, names: set[str]) -> str:
        """The families writing a sample named in ``names``, whole (headers and every sample)."""
        if self.texts is not None:
            return "".join(t for p, t in zip(self.families(), self.texts, strict=True)
                           if not p.samples.isdisjoint(names))
        slots = self.slots or []
        return "".join(self.plan.family_text(p, slots[p.start:p.stop]) for p in self.families()
                       if not p.samples.isdisjoint(names))


class Renderer:
    """Compiles families into :class:`Plan` s and fills them; keeps per family name (of those not written in
    :meth:`compile`'s single pass) its headers and its series' label strings, and a histogram series' last lines.

    Not thread-safe: the scrape registry calls it under its scrape lock.
    """

    def __init__(self) -> None:
        self._states: dict[str, _State] = {}
        self._base_text: dict[Labels, str] = {}  # base labels -> their label string
        self._logged: set[str] = set()  # families whose rendering failed, logged once each

    def samples(self, spec: MetricSpec) -> frozenset[str]:
        """The sample names ``spec``'s family writes."""
        return self._state(spec).samples

    def _state(self, spec: MetricSpec) -> _State:
        state = self._states.get(spec.name)
        if state is None or (state.spec is not spec and state.spec != spec):
            state = self._states[spec.name] = _State(spec)
        return state

    def render(self, views: Iterable[Family], fmt: str, seen: set[str],
               on_error: Callable[[str], None] | None = None) -> Rendering:
        """``views`` rendered in ``fmt`` (:meth:`compile` then :meth:`fill`, their values as the sources)."""
        plan = self.compile(views, fmt, seen)
        return self.fill(plan, plan.numbers, plan.hists, on_error)

    def compile(self, families: Iterable[Family], fmt: str, seen: set[str]) -> Plan:
        """The plan of ``families`` in ``fmt``. A family whose name is in ``seen`` is left out (the first family
        of a name wins) and every name taken is added to ``seen``; one that cannot be compiled is left out
        (reported - and logged once - at each :meth:`fill`), as is one without series.

        The common family - a gauge or counter of one series without labels of its own, whose unit is in the
        table and whose description needs no escaping - is written in one pass with nothing kept (what a fresh
        Telemetry's first scrape of hundreds of keys costs: ``benchmarks/bench_scrape.py``). The others are
        named in that pass and written afterwards through their :class:`_State` (headers and label strings,
        kept)."""
        return self._finish(self._prepare(families, fmt, seen))

    def _prepare(self, families: Iterable[Family], fmt: str, seen: set[str]) -> Plan:
        """The single pass of :meth:`compile`: the common families written, the others deferred."""
        if fmt != TEXT and fmt != OPENMETRICS:
            raise ValueError(f"unknown exposition format {fmt!r}")
        om = fmt == OPENMETRICS
        plan = Plan(fmt, [], [], [], [], [], [])
        statics, records, numbers, deferred = plan.statics, plan.records, plan.numbers, plan.deferred
        add_static, add_record, add_number, add_seen = statics.append, records.append, numbers.append, seen.add
        gauge, counter, words, lines = _GAUGE, _COUNTER, _UNIT_WORDS, header_lines
        fresh = not seen
        labels_text, last_base = "", None
        for spec, base, _start, points, _scrape_only in families:  # once per family of a new layout: it counts
            try:
                # a gauge's or counter's name is sanitized already: MetricSpec takes rl_[a-z0-9_]+ without "__"
                # (catalog.naming.check_name; tests/test_exposition_headers.py holds sanitize_full_name to it)
                name, kind, doc = spec.name, spec.kind, spec.description
                if ((kind is gauge or kind is counter) and len(points) == 1
                        and doc and doc.isascii() and "\\" not in doc and "\n" not in doc and '"' not in doc):
                    ((labels, source),) = points
                    unit = words.get(spec.unit)
                    if not labels and unit is not None and not (kind is counter and name.endswith("_total")):
                        if unit and not name.endswith("_" + unit):
                            name = f"{name}_{unit}"
                        if name in seen:
                            continue
                        add_seen(name)
                        if base is not last_base:
                            labels_text, last_base = self._braced(base), base
                        if kind is gauge:
                            sample, typ = name, "gauge"
                        else:
                            sample, typ = name + "_total", "counter"
                        # the text format names the header by the sample (a counter's _total), OpenMetrics by
                        # the family, with its unit
                        head = lines(name, typ, doc, unit) if om else lines(sample, typ, doc)
                        add_static(f"{head}{sample}{labels_text} ")
                        add_number(source)
                        add_record(name if kind is gauge else (name, sample, 1))
                        continue
                state = self._state(spec)
                if state.name in seen or not points:
                    continue
                add_seen(state.name)
                deferred.append((len(records), state, base, list(points)))
            except Exception as exc:  # boundary: a family as written (labels, values): one must not blank the scrape
                plan.failed.append((spec.name, exc))
        if fresh:
            plan._names = frozenset(seen)
        return plan

    def _finish(self, plan: Plan) -> Plan:
        """``plan`` (:meth:`_prepare`) with the families it deferred written in their places."""
        if not plan.deferred:
            return plan
        statics, numbers, records = plan.statics, plan.numbers, plan.records
        plan.statics, plan.numbers, plan.records = [], [], []
        done = 0
        for at, state, base, points in plan.deferred:
            plan.statics += statics[done:at]
            plan.numbers += numbers[done:at]
            plan.records += records[done:at]
            done = at
            try:
                self._compile_family(plan, state, base, points)
            except Exception as exc:  # boundary: a family as written (labels, values): one must not blank the scrape
                plan.failed.append((state.spec.name, exc))
        plan.statics += statics[done:]
        plan.numbers += numbers[done:]
        plan.records += records[done:]
        plan.deferred = []
        return plan

    def _compile_family(self, plan: Plan, state: _State, base: Labels, points: list[tuple[Labels, object]]) -> None:
        """One family into ``plan`` through its :class:`_State`; nothing of it when it raises."""
        numbers, hists, hist_at = plan.numbers, plan.hists, plan.hist_at
        n_numbers, n_hists = len(numbers), len(hists)
        try:
            if base is not state.base:
                if base != state.base:
                    state.prefixes.clear()
                    state.hists.clear()
                state.base = base
            head = state.head(plan.fmt)
            prefixes = (self._hist_slots(state, points, base, len(plan.statics), hists, hist_at) if state.le else
                        self._number_slots(state, points, base, numbers))
        except Exception:  # a rollback, re-raised: nothing of the failed family stays in the plan
            del numbers[n_numbers:], hists[n_hists:], hist_at[n_hists:]
            raise
        prefixes[0] = head + prefixes[0]
        plan.statics += prefixes
        plan.records.append((state.name, state, len(points)))

    def _labels(self, base: Labels) -> str:
        """The label string of ``base`` (run, rank): the same for most families."""
        text = self._base_text.get(base)
        if text is None:
            if len(self._base_text) >= 64:  # a handful in practice (the store's, target_info's none)
                self._base_text.clear()
            text = self._base_text[base] = label_text(sorted(base))
        return text

    def _braced(self, base: Labels) -> str:
        text = self._labels(base)
        return f"{{{text}}}" if text else ""

    def _number_slots(self, state: _State, points: Collection[tuple[Labels, object]], base: Labels,
                      numbers: list) -> list[str]:
        cached, sample = state.prefixes, state.sample
        if len(cached) > 2 * len(points) + 64:  # series expired or vanished: keep the cache bounded
            cached.clear()
        prefixes = []
        for labels, source in points:
            prefix = cached.get(labels)
            if prefix is None:
                text = label_text(sorted(base + labels)) if labels else self._labels(base)
                prefix = cached[labels] = f"{sample}{{{text}}} " if text else f"{sample} "
            prefixes.append(prefix)
            numbers.append(source)
        return prefixes

    @staticmethod
    def _hist_slots(state: _State, points: Collection[tuple[Labels, object]], base: Labels, slot: int, hists: list,
                    hist_at: list) -> list[str]:
        cached, name = state.hists, state.sample
        if len(cached) > 2 * len(points) + 64:
            cached.clear()
        for i, (labels, source) in enumerate(points):
            entry = cached.get(labels)
            if entry is None:  # the series' label strings around its bucket bound, and its plain ones
                pairs = sorted(base + labels)
                before = label_text(p for p in pairs if p[0] < "le")
                after = label_text(p for p in pairs if p[0] > "le")
                plain = label_text(pairs)
                entry = cached[labels] = _HistSeries(f"{name}_bucket{{{before}{',' if before else ''}le=\"",
                                                     f"\"{',' if after else ''}{after}}} ",
                                                     f"{{{plain}}}" if plain else "")
            hist_at.append((slot + i, state, entry))
            hists.append(source)
        return [""] * len(points)

    def fill(self, plan: Plan, numbers: Sequence[object], hists: Sequence[object],
             on_error: Callable[[str], None] | None = None) -> Rendering:
        """``plan`` filled with the values of its number slots (``numbers``, in order) and of its histogram slots
        (``hists``: :class:`HistogramValue` s). A family whose values cannot be written is left out (logged,
        ``on_error("render")``), as is every family the plan could not compile."""
        for name, exc in plan.failed:
            self._failed(name, on_error, exc)
        try:
            slots = go_floats(numbers)
            if plan.hist_at:
                slots = _merged(slots, [_hist_lines(state, entry, h)
                                        for (_i, state, entry), h in zip(plan.hist_at, hists, strict=True)],
                                [i for i, _state, _entry in plan.hist_at])
            return Rendering(plan.text(slots), plan.names, plan, slots)
        except Exception:  # boundary: a stored value that is not a number: find its family, serve the others
            return self._fill_by_family(plan, numbers, hists, on_error)

    def _fill_by_family(self, plan: Plan, numbers: Sequence[object], hists: Sequence[object],
                        on_error: Callable[[str], None] | None) -> Rendering:
        parts, texts = [], []
        for part in plan.families():
            a, b = part.first, part.first + part.stop - part.start
            try:
                if part.state is not None:  # a histogram
                    slots: list[str | None] = [
                        _hist_lines(part.state, entry, h)
                        for (_i, _state, entry), h in zip(plan.hist_at[a:b], hists[a:b], strict=True)]
                else:  # a series still without a value (None) writes no line, as before its first write
                    slots = [None if v is None else go_float(cast(float, v)) for v in numbers[a:b]]
                texts.append(plan.family_text(part, slots))
            except Exception:  # boundary: this family's stored values (the others are served)
                if part.state is not None:
                    part.state.hists.clear()
                self._failed(part.name, on_error)
                continue
            parts.append(part)
        return Rendering("".join(texts), frozenset(part.name for part in parts), plan, None, texts, parts)

    def _failed(self, name: str, on_error: Callable[[str], None] | None, exc: BaseException | None = None) -> None:
        if len(self._logged) < 100 and name not in self._logged:  # every scrape fails alike
            self._logged.add(name)
            _log.error("rl_otel: rendering %s failed; it is left out of the scrapes", name, exc_info=exc or True)
        if on_error is not None:
            on_error("render")


_GAUGE, _COUNTER = Kind.GAUGE, Kind.COUNTER
_UNIT_WORDS = {unit: map_unit(unit) for unit in ("", *UNITS)}  # the units map_unit needs no rule for


class _HistSeries:
    """A histogram series as a plan writes it: its label strings (``head`` + bound + ``tail`` for a bucket line,
    ``plain`` for ``_count``/``_sum``), and its last ``(counts, sum)`` with the ``lines`` written for them."""

    __slots__ = ("head", "key", "lines", "plain", "tail")

    def __init__(self, head: str, tail: str, plain: str) -> None:
        self.head, self.tail, self.plain = head, tail, plain
        self.key: tuple[tuple[int, ...] | list[int], float] | None = None
        self.lines = ""


def _hist_lines(state: _State, entry: _HistSeries, value: object) -> str:
    """A histogram series' lines, the last without its end (``entry``: its label strings, last counts and
    lines, rewritten on a change)."""
    h = cast(HistogramValue, value)  # a histogram family's points: anything else raises below
    key = (h.counts, h.sum)
    if key != entry.key:
        head, tail, plain, name = entry.head, entry.tail, entry.plain, state.sample
        cumulative = list(accumulate(h.counts))
        lines = [f"{head}{le}{tail}{go_float(n)}" for le, n in zip(state.le, cumulative, strict=True)]
        if state.has_sum:
            lines.append(f"{name}_count{plain} {go_float(cumulative[-1])}")
            lines.append(f"{name}_sum{plain} {go_float(h.sum)}")
        entry.key, entry.lines = key, "\n".join(lines)  # the plan writes the last line's end
    return entry.lines


def _merged(numbers: list[str], hists: list[str], at: list[int]) -> list[str]:
    """``numbers`` with ``hists`` inserted at the (ascending) slot indices ``at``."""
    out: list[str] = []
    taken = 0
    for i, text in zip(at, hists, strict=True):
        upto = taken + i - len(out)
        out.extend(numbers[taken:upto])
        taken = upto
        out.append(text)
    out.extend(numbers[taken:])
    return out
