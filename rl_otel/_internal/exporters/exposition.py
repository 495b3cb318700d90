"""The exposition text of rl_otel's families, written straight from the series store.

The stock path (OTel ``Metric`` objects, the exporter's translation into prometheus_client families, then
``generate_latest``) costs ~120 ms for a node with 8 GPUs and 5 clusters (8,800 lines), which is why the scrape
endpoint renders here instead. The output is byte for byte what that path writes (a test compares them on every
catalog family):

- the HELP/TYPE/UNIT header of a family is written by prometheus_client itself, once per entry, from the family
  the OTel exporter would have built (its name sanitizing and unit mapping, prometheus_client's unit suffix);
- a series' label string (sorted names, escaped values) is built once and kept while the series lives, and its
  line is written again only when its value changed;
- values are formatted as prometheus_client's ``floatToGoString`` does (:func:`go_float`); histogram buckets are
  cumulative, ``le`` is the exporter's ``f"{bound}"``, and ``_count``/``_sum`` are left out when the first bound
  is negative, as prometheus_client's ``HistogramMetricFamily`` does.

Sample lines are the same in the text format 0.0.4 and in OpenMetrics 1.0.0; only the headers differ.

One family never blanks the others: a label value with a lone surrogate is escaped (the text must encode as
UTF-8), and a family whose rendering raises is left out of that scrape and reported (``on_error``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from itertools import accumulate
from types import SimpleNamespace

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, InfoMetricFamily
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from rl_otel._internal.exporters.promnames import map_unit, sanitize_attribute, sanitize_full_name
from rl_otel._internal.pipeline.store import FamilyView, HistogramValue, Labels
from rl_otel.catalog import Kind, MetricSpec
from rl_otel.catalog.naming import encodable

_log = logging.getLogger("rl_otel")

TEXT = "text"  # text/plain; version=0.0.4
OPENMETRICS = "openmetrics"  # application/openmetrics-text; version=1.0.0
EOF = "# EOF\n"


@dataclass(frozen=True)
class _Header:
    name: str  # the prometheus_client family name: what "one family per name" is about
    text: dict[str, str]  # format -> HELP/TYPE(/UNIT) lines
    sample: str  # sample name of a gauge or counter, the family name of a histogram
    le: tuple[str, ...] = ()  # a histogram's le label values, "+Inf" last
    has_sum: bool = True  # a histogram's _count and _sum lines

    @property
    def samples(self) -> frozenset[str]:
        """The sample names the family writes (what ``?name[]=`` selects)."""
        if self.le:
            return frozenset((f"{self.sample}_bucket", f"{self.sample}_count", f"{self.sample}_sum"))
        return frozenset((self.sample,))


# (sample names of a family, index of its first chunk, index past its last): where each family is in a rendering
Span = tuple[frozenset[str], int, int]


def families(*items) -> SimpleNamespace:
    """A collector of prometheus_client families, for the stock encoders."""
    return SimpleNamespace(collect=lambda: list(items))


def encode(collector, fmt: str) -> str:
    """prometheus_client's own encoding of ``collector`` (OpenMetrics without its ``# EOF``)."""
    if fmt == OPENMETRICS:
        return generate_openmetrics(collector).decode()[:-len(EOF)]
    return generate_latest(collector).decode()


def escape_label(value: str) -> str:
    """A label value as the exposition quotes it; a lone surrogate is escaped first (:func:`encodable`)."""
    if not value.isascii():
        value = encodable(value)
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _label_text(pairs: Iterable[tuple[str, str]]) -> str:
    return ",".join(f'{k}="{escape_label(v)}"' for k, v in pairs)


class Renderer:
    """Renders :class:`FamilyView` lists; keeps headers per catalog entry, label strings and last lines per series.

    Not thread-safe: the scrape registry calls it under its scrape lock.
    """

    def __init__(self) -> None:
        self._headers: dict[MetricSpec, _Header] = {}
        # family -> label values -> [line parts..., last value, its lines]: a series' label string is built once,
        # and its lines again only when its value changed
        self._series_cache: dict[str, dict[Labels, list]] = {}
        self._logged: set[str] = set()  # families whose rendering failed, logged once each

    def header(self, spec: MetricSpec) -> _Header:
        header = self._headers.get(spec)
        if header is None:
            header = self._headers[spec] = _make_header(spec)
        return header

    def render(self, views: Iterable[FamilyView], fmt: str, seen: set[str], spans: list[Span] | None = None,
               on_error: Callable[[str], None] | None = None) -> list[str]:
        """The exposition chunks of ``views`` in ``fmt``; a family whose name is in ``seen`` is skipped (the
        first family of a name wins) and every rendered name is added to ``seen``. ``spans`` gets where each
        family's chunks are. A family that fails to render is left out (logged, ``on_error("render")``)."""
        out: list[str] = []
        for view in views:
            start = len(out)
            try:
                header = self.header(view.spec)
                if header.name in seen:
                    continue
                seen.add(header.name)
                out.append(header.text[fmt])
                if view.spec.kind is Kind.HISTOGRAM:
                    self._histogram_lines(view, header, out)
                else:
                    self._number_lines(view, header, out)
            except Exception:  # one family must not blank the scrape
                del out[start:]
                self._series_cache.pop(view.spec.name, None)
                if len(self._logged) < 100 and view.spec.name not in self._logged:  # every scrape fails alike
                    self._logged.add(view.spec.name)
                    _log.exception("rl_otel: rendering %s failed; it is left out of the scrapes", view.spec.name)
                if on_error is not None:
                    on_error("render")
                continue
            if spans is not None:
                spans.append((header.samples, start, len(out)))
        return out

    def _series(self, view: FamilyView) -> dict[Labels, list]:
        cached = self._series_cache.setdefault(view.spec.name, {})
        if len(cached) > 2 * len(view.points) + 64:  # series expired or vanished: keep the cache bounded
            cached.clear()
        return cached

    def _number_lines(self, view: FamilyView, header: _Header, out: list[str]) -> None:
        cached, base, sample = self._series(view), view.base, header.sample
        get, append, fmt = cached.get, out.append, go_float  # locals: this loop runs once per series
        for labels, value in view.points:
            entry = get(labels)
            if entry is None:
                text = _label_text(sorted(base + labels))
                entry = cached[labels] = [f"{sample}{{{text}}} " if text else f"{sample} ", None, ""]
            if value != entry[1]:  # a series whose value did not change keeps its line (NaN never equals)
                entry[1] = value
                entry[2] = f"{entry[0]}{fmt(value)}\n"  # type: ignore[arg-type]  # a gauge's or counter's float
            append(entry[2])

    def _histogram_lines(self, view: FamilyView, header: _Header, out: list[str]) -> None:
        cached, base, name, les = self._series(view), view.base, header.sample, header.le
        for labels, h in view.points:
            assert isinstance(h, HistogramValue)
            entry = cached.get(labels)
            if entry is None:
                pairs = sorted(base + labels)
                before = _label_text(p for p in pairs if p[0] < "le")
                after = _label_text(p for p in pairs if p[0] > "le")
                plain = _label_text(pairs)
                entry = cached[labels] = [f"{name}_bucket{{{before}{',' if before else ''}le=\"",
                                          f"\"{',' if after else ''}{after}}} ", f"{{{plain}}}" if plain else "",
                                          None, ""]
            key = (h.counts, h.sum)
            if key != entry[3]:
                head, tail, plain = entry[0], entry[1], entry[2]
                cumulative = list(accumulate(h.counts))
                lines = [f"{head}{le}{tail}{go_float(n)}\n" for le, n in zip(les, cumulative, strict=True)]
                if header.has_sum:
                    lines.append(f"{name}_count{plain} {go_float(cumulative[-1])}\n")
                    lines.append(f"{name}_sum{plain} {go_float(h.sum)}\n")
                entry[3], entry[4] = key, "".join(lines)
            out.append(entry[4])


_GO_EXPONENT = {dot: f"e+{dot - 1:02d}" for dot in range(7, 17)}  # repr's integer digits -> Go's exponent


def go_float(value: float) -> str:
    """prometheus_client's ``floatToGoString``, 40% faster on the values that dominate a node's scrape (GPU bytes):
    Go writes positive values from 1e6 (repr's integer part of 7 digits and more) up to 1e16 (where repr switches
    to exponents itself) as ``d.ddde+XX``."""
    value = float(value)
    if 1e6 <= value < 1e16:
        s = repr(value)
        dot = s.find(".")
        digits = s.replace(".", "").rstrip("0")
        if len(digits) > 1:
            return f"{digits[0]}.{digits[1:]}{_GO_EXPONENT[dot]}"
        return digits + _GO_EXPONENT[dot]
    if value - value == 0.0:  # finite
        return repr(value)
    return "NaN" if value != value else ("+Inf" if value > 0 else "-Inf")


def target_info_labels(attributes: Mapping[str, object]) -> tuple[tuple[str, str], ...]:
    """The labels of ``target_info`` for an OTel resource's attributes, as the OTel exporter writes them (the
    Prometheus compatibility spec): names sanitized, non-string values JSON-encoded."""
    labels = {sanitize_attribute(key): value if isinstance(value, str) else json.dumps(value, default=str)
              for key, value in attributes.items()}
    return tuple(labels.items())


def _make_header(spec: MetricSpec) -> _Header:
    """The family the OTel exporter builds for ``spec``, empty, encoded by prometheus_client."""
    if spec.kind is Kind.INFO:  # the exporter's target_info: an info family "target" of samples "target_info"
        info = InfoMetricFamily(spec.name[:-len("_info")], spec.description or "", labels=[])
        return _Header(info.name, {fmt: encode(families(info), fmt) for fmt in (TEXT, OPENMETRICS)}, spec.name)
    cls = {Kind.GAUGE: GaugeMetricFamily, Kind.COUNTER: CounterMetricFamily,
           Kind.HISTOGRAM: HistogramMetricFamily}[spec.kind]
    family = cls(sanitize_full_name(spec.name), spec.description or "", labels=[], unit=map_unit(spec.unit or ""))
    text = {fmt: encode(families(family), fmt) for fmt in (TEXT, OPENMETRICS)}
    if spec.kind is Kind.HISTOGRAM:
        les = (*(f"{float(b)}" for b in spec.buckets), "+Inf")
        return _Header(family.name, text, family.name, les, has_sum=float(spec.buckets[0]) >= 0)
    sample = family.name + "_total" if spec.kind is Kind.COUNTER else family.name
    return _Header(family.name, text, sample)
