"""OTel names and units as Prometheus writes them: the OTel spec's Prometheus compatibility rules.

The same mapping opentelemetry-exporter-prometheus applies (it keeps its own in a private module, which rl_otel
does not import): metric names keep ``[a-zA-Z0-9:]`` and a leading digit becomes ``_``; attribute keys keep
``[a-zA-Z0-9]``; UCUM units become words (``s`` -> ``seconds``, ``By`` -> ``bytes``, ``1`` -> nothing,
``m/s`` -> ``meters_per_second``), ``{annotations}`` dropped. ``tests/test_scrape_render.py`` compares the
endpoint's text with the exporter's byte for byte, and ``tests/test_promnames.py`` this mapping with the
exporter's, so a change in the pinned exporter shows up as a failing test.
"""

from __future__ import annotations

import re

_NAME = re.compile(r"[^a-zA-Z0-9:]+")
_ATTRIBUTE = re.compile(r"[^a-zA-Z0-9]+")
_ANNOTATION = re.compile(r"{.*}")

# the OTel Collector's translator table (pkg/translator/prometheus), as the spec refers to it
UNITS = {
    "d": "days", "h": "hours", "min": "minutes", "s": "seconds", "ms": "milliseconds", "us": "microseconds",
    "ns": "nanoseconds",
    "By": "bytes", "KiBy": "kibibytes", "MiBy": "mebibytes", "GiBy": "gibibytes", "TiBy": "tibibytes",
    "KBy": "kilobytes", "MBy": "megabytes", "GBy": "gigabytes", "TBy": "terabytes",
    "m": "meters", "V": "volts", "A": "amperes", "J": "joules", "W": "watts", "g": "grams",
    "Cel": "celsius", "Hz": "hertz", "1": "", "%": "percent",
}
PER_UNITS = {"s": "second", "m": "minute", "h": "hour", "d": "day", "w": "week", "mo": "month", "y": "year"}


def _leading_digit(text: str) -> str:
    return "_" + text[1:] if text and text[0].isdigit() else text


def sanitize_full_name(name: str) -> str:
    """A metric name Prometheus accepts: other characters (runs of them) become ``_``, a leading digit ``_``."""
    if name.isidentifier() and name.isascii() and "__" not in name:  # rl_otel's names: nothing to replace
        return name
    return _NAME.sub("_", _leading_digit(name))


def sanitize_attribute(key: str) -> str:
    """A label name Prometheus accepts (no colon): other characters become ``_``, a leading digit ``_``."""
    return _ATTRIBUTE.sub("_", _leading_digit(key))


def map_unit(unit: str) -> str:
    """The unit word a Prometheus name ends with, for a UCUM unit (``""`` for none or ``1``)."""
    word = UNITS.get(unit)  # no annotation in a unit of the table
    if word is not None or not unit:
        return word or ""
    unit = _ANNOTATION.sub("", unit)
    if unit in UNITS:
        return UNITS[unit]
    top, slash, bottom = unit.partition("/")
    if slash:
        bottom = _NAME.sub("_", bottom)
        if bottom:
            top = _NAME.sub("_", top)
            top = UNITS.get(top, top)
            bottom = PER_UNITS.get(bottom, bottom)
            return f"{top}_per_{bottom}" if top else f"per_{bottom}"
    return _NAME.sub("_", unit).strip("_")
