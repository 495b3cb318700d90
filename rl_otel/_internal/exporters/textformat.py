"""The exposition formats' text, as prometheus_client writes it: a family's HELP/TYPE(/UNIT) header for the
family the OTel exporter builds (its name sanitizing and unit mapping, prometheus_client's unit suffix,
``_total``/``_info`` munging and escaping), label strings, and values as Go formats them. Written natively, so
that a scrape imports no prometheus_client; ``tests/test_exposition_headers.py`` compares them with
prometheus_client's own encoding on hostile descriptions, units and names, and fails when it changes.

Text format 0.0.4 (:data:`TEXT`) and OpenMetrics 1.0.0 (:data:`OPENMETRICS`) differ in their headers only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rl_otel._internal.exporters.promnames import map_unit, sanitize_attribute, sanitize_full_name
from rl_otel.catalog import Kind, MetricSpec
from rl_otel.catalog.naming import encodable

TEXT = "text"  # text/plain; version=0.0.4
OPENMETRICS = "openmetrics"  # application/openmetrics-text; version=1.0.0
EOF = "# EOF\n"

_TYPES = {Kind.GAUGE: "gauge", Kind.COUNTER: "counter", Kind.HISTOGRAM: "histogram", Kind.INFO: "info"}
_LEGACY_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")  # prometheus_client's METRIC_NAME_RE, used as it uses it
_INF = float("inf")


# -- headers: prometheus_client's encoding of an empty family, written natively ------------------------------

def family_of(spec: MetricSpec) -> tuple[str, str, str]:
    """``(name, type, unit)`` of the prometheus_client family the OTel exporter builds for ``spec`` (an info
    family: the exporter's ``target_info``, an info family named without ``_info``)."""
    kind = spec.kind
    if kind is Kind.INFO:
        name, unit = spec.name[:-len("_info")], ""
    else:
        name, unit = sanitize_full_name(spec.name), map_unit(spec.unit or "")
        if kind is Kind.COUNTER and name.endswith("_total"):  # CounterMetricFamily's glue for old names
            name = name[:-len("_total")]
        if unit and not name.endswith("_" + unit):  # prometheus_client's Metric adds the unit suffix
            name += "_" + unit
    if not name:
        raise ValueError(f"{spec.name!r}: metric name cannot be empty")
    return name, _TYPES[kind], unit


def header(spec: MetricSpec, fmt: str) -> str:
    """The HELP/TYPE(/UNIT) lines prometheus_client writes for ``spec``'s family in ``fmt``, as its
    ``generate_latest`` (text 0.0.4) or OpenMetrics ``generate_latest`` (without ``# EOF``) encode it empty."""
    return family_header(*family_of(spec), spec.description or "", fmt)


def family_header(name: str, typ: str, unit: str, doc: str, fmt: str) -> str:
    """The header of family ``name`` (:func:`family_of`'s name, type and unit) with description ``doc`` in
    ``fmt``: the name and description escaped as prometheus_client escapes them, written by :func:`header_lines`."""
    if fmt == OPENMETRICS:
        doc = doc.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
        text = header_lines(_escape_name(name), typ, doc, unit)
    elif fmt == TEXT:
        if typ == "counter":
            name += "_total"
        elif typ == "info":
            name, typ = name + "_info", "gauge"
        doc = doc.replace("\\", r"\\").replace("\n", r"\n")
        text = header_lines(_escape_name(name), typ, doc)
    else:
        raise ValueError(f"unknown exposition format {fmt!r}")
    if not text.isascii():
        text.encode()  # raises on a lone surrogate, as prometheus_client's encoder does
    return text


def header_lines(shown: str, typ: str, doc: str, unit: str = "") -> str:
    """The one writer of a family's header lines: HELP and TYPE, and UNIT when ``unit`` is given (OpenMetrics
    writes it, the text format never does), for a name and a description already as the format shows them
    (escaped). :func:`family_header` escapes and calls it; the renderer's single pass calls it directly for the
    plain families, whose names and descriptions need no escaping (``exposition.Renderer.compile``)."""
    if unit:
        return f"# HELP {shown} {doc}\n# TYPE {shown} {typ}\n# UNIT {shown} {unit}\n"
    return f"# HELP {shown} {doc}\n# TYPE {shown} {typ}\n"


def _escape_name(name: str) -> str:
    """prometheus_client's ``escape_metric_name`` with its default escaping (underscores), what both encoders
    apply to a family name: unchanged when valid, else each character outside the legacy set becomes ``_``."""
    if not name or _LEGACY_NAME.match(name):
        return name
    return "".join(c if ("a" <= c <= "z" or "A" <= c <= "Z" or c in "_:" or ("0" <= c <= "9" and i > 0)) else "_"
                   for i, c in enumerate(name))


def escape_label(value: str) -> str:
    """A label value as the exposition quotes it; a lone surrogate is escaped first (:func:`encodable`)."""
    if not value.isascii():
        value = encodable(value)
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def label_text(pairs: Iterable[tuple[str, str]]) -> str:
    return ",".join(f'{k}="{escape_label(v)}"' for k, v in pairs)


# -- values ---------------------------------------------------------------------------------------------------

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


def go_floats(values: Sequence[Any]) -> list[str]:
    """:func:`go_float` of each value: ``repr`` in one pass in C, then the few values it writes otherwise than Go
    (from 1e6, non-finite) again; raises on a value that is not a number."""
    floats = list(map(float, values))
    strings = list(map(repr, floats))
    for i in [i for i, v in enumerate(floats) if not -_INF < v < 1e6]:  # NaN compares false
        strings[i] = go_float(floats[i])
    return strings


def target_info_labels(attributes: Mapping[str, object]) -> tuple[tuple[str, str], ...]:
    """The labels of ``target_info`` for an OTel resource's attributes, as the OTel exporter writes them (the
    Prometheus compatibility spec): names sanitized, non-string values JSON-encoded."""
    labels = {sanitize_attribute(key): value if isinstance(value, str) else json.dumps(value, default=str)
              for key, value in attributes.items()}
    return tuple(labels.items())
