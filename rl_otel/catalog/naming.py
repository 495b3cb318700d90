"""Prometheus-safe names for keys the catalog does not know.

The rules are those ``promtool check metrics`` enforces (client_golang's promlint), so a sanitized name never
draws a lint warning: snake_case, no colon, no unit abbreviation or non-base unit as a ``_``-separated token,
no metric type in the name, and no suffix reserved for counters, histograms, summaries or OpenMetrics.
"""

from __future__ import annotations

import re
from functools import cache

PREFIX = "rl_"

# promlint's abbreviations, non-base unit words, SI prefixes and base units.
_ABBREVIATIONS = frozenset({"s", "ms", "us", "ns", "sec", "b", "kb", "mb", "gb", "tb", "pb", "m", "h", "d"})
_NON_BASE = frozenset({
    "minutes", "hours", "days", "weeks", "kelvin", "kelvins", "fahrenheit", "rankine", "inches", "yards",
    "miles", "bits", "calories", "pounds", "ounces",
})
_BASE = frozenset({"seconds", "bytes", "meters", "grams", "joules", "celsius", "volts", "amperes", "bits"})
_UNIT_PREFIXES = ("pico", "nano", "micro", "milli", "centi", "deci", "deca", "hecto", "kilo", "kibi", "mega",
                  "mibi", "giga", "gibi", "tera", "tebi", "peta", "pebi")
_TYPE_WORDS = frozenset({"counter", "gauge", "histogram", "summary"})
RESERVED_SUFFIXES = ("_total", "_count", "_sum", "_bucket", "_created", "_info", "_gcount", "_gsum")

# the patterns below are compiled at their first use (a key without a catalog entry), not at import
_CAMEL = r"(?<=[a-z0-9])(?=[A-Z])"
_INVALID = r"[^a-z0-9]+"


def _lint_flagged(token: str) -> bool:
    if token in _ABBREVIATIONS or token in _NON_BASE or token in _TYPE_WORDS:
        return True
    for prefix in _UNIT_PREFIXES:
        if token.startswith(prefix) and (token[len(prefix):] in _BASE or token[len(prefix):] in _NON_BASE):
            return True
    return False


def sanitize_tokens(text: str) -> list[str]:
    """Split ``text`` into lowercase snake_case tokens, gluing any token promlint would flag to its neighbour."""
    tokens = [t for t in re.split(_INVALID, re.sub(_CAMEL, "_", text).lower()) if t]
    out: list[str] = []
    for token in tokens:
        if _lint_flagged(token):
            if out:
                out[-1] += token
            else:
                out.append(token)  # glued to the next token below
            continue
        if out and _lint_flagged(out[-1]):
            out[-1] += token
        else:
            out.append(token)
    if out and _lint_flagged(out[-1]):
        out[-1] += "x"
    return out


def fallback_name(key: str) -> str:
    """The Prometheus gauge name for a key with no catalog entry: ``rl_`` + sanitized key.

    >>> fallback_name("custom/myLoss-v2")
    'rl_custom_my_loss_v2'
    >>> fallback_name("perf/time_ms")
    'rl_perf_timems'
    """
    tokens = sanitize_tokens(key)
    name = PREFIX + "_".join(tokens) if tokens else PREFIX + "unnamed"
    if name.startswith(PREFIX + "rl_"):
        name = name[len(PREFIX):]
    if name.endswith(RESERVED_SUFFIXES):
        name += "_value"
    return name


# Unit spellings of keys without a catalog entry: (key pattern, UCUM unit, scale to the base unit, tracker unit).
# The group ``u`` is the unit's spelling, dropped from the name, where the base unit's word is appended instead
# (`step_time_ms` -> `..._step_time_seconds`, x 1e-3); words such as `_time` stay. First match wins; the prefixes
# are the frameworks' timing namespaces.
_UNIT_SPELLINGS: tuple[tuple[str, str, float, str], ...] = (
    (r"(?i)(?P<u>_ms|_millis(?:econds)?|\(ms\))$", "s", 1e-3, "ms"),
    (r"(?i)^(?:timing|timing_per_token|time)(?P<u>_ms)/", "s", 1e-3, "ms"),
    (r"(?i)(?P<u>_s|_sec|_secs|_seconds|\(s\))$", "s", 1.0, ""),
    (r"(?i)^(?:time|timing|timer|timers)(?P<u>_s)?/", "s", 1.0, ""),
    (r"(?i)[_/](?:time|runtime|duration|latency|elapsed)$", "s", 1.0, ""),
    (r"(?i)(?P<u>_gib|_gb|\(gb\)|\(gib\))$", "By", float(2**30), "GiBy"),
    (r"(?i)(?P<u>_mib|_mb|\(mb\)|\(mib\))$", "By", float(2**20), "MiBy"),
    (r"(?i)(?P<u>_bytes)$", "By", 1.0, ""),
)


@cache
def _unit_spellings() -> tuple[tuple[re.Pattern[str], str, float, str], ...]:
    return tuple((re.compile(pattern), unit, scale, tracker) for pattern, unit, scale, tracker in _UNIT_SPELLINGS)


_BASE_WORD = {"s": "seconds", "By": "bytes"}


def infer_unit(key: str) -> tuple[str, float, str, str]:
    """``(unit, scale, tracker_unit, stem)`` of a key without a catalog entry, from its usual unit spellings.

    ``stem`` is the key without its unit spelling (``timing_s/gen`` -> ``timing/gen``).

    >>> infer_unit("custom/rollout_ms")
    ('s', 0.001, 'ms', 'custom/rollout')
    >>> infer_unit("timing_s/gen")
    ('s', 1.0, '', 'timing/gen')
    >>> infer_unit("custom/loss")
    ('1', 1.0, '', 'custom/loss')
    """
    for pattern, unit, scale, tracker_unit in _unit_spellings():
        m = pattern.search(key)
        if m is not None:
            spelled = "u" in pattern.groupindex and m.group("u") is not None
            stem = key[: m.start("u")] + key[m.end("u"):] if spelled else key
            return unit, scale, tracker_unit, stem
    return "1", 1.0, "", key


def fallback_spec_name(key: str) -> tuple[str, str, float, str]:
    """``(name, unit, scale, tracker_unit)`` of the fallback gauge for ``key``: the sanitized name, with the base
    unit's word (``_seconds``, ``_bytes``) when the key's spelling says it is a duration or a size."""
    unit, scale, tracker_unit, stem = infer_unit(key)
    name = fallback_name(stem)
    word = _BASE_WORD.get(unit)
    if word:
        if name.endswith("_value"):
            name = name[: -len("_value")]
        if not name.endswith("_" + word):
            name = f"{name}_{word}"
    return name, unit, scale, tracker_unit


def encodable(text: str) -> str:
    """``text`` unchanged when it is valid Unicode; else each lone surrogate (``os.fsdecode`` of a non-UTF-8 file
    name gives them) spelled as its escape, ``\\udce9``: the exposition is UTF-8 and one unencodable character
    would fail the whole scrape. Two names that differ in their undecodable bytes stay apart.

    >>> encodable("gsm8k-\\udce9")
    'gsm8k-\\\\udce9'
    """
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def label_value(text: str) -> str:
    """A label value taken from a key segment: ``/`` becomes ``_``; lone surrogates are escaped
    (:func:`encodable`); other characters are kept."""
    return encodable(text).replace("/", "_")


def check_name(name: str) -> None:
    """Raise ``ValueError`` unless ``name`` is a lint-clean rl_otel metric name (used to validate the catalog)."""
    if not re.fullmatch(r"rl_[a-z0-9_]+", name) or "__" in name or name.endswith("_"):
        raise ValueError(f"metric name {name!r} is not snake_case with the 'rl_' prefix")
    flagged = [t for t in name.split("_") if _lint_flagged(t)]
    if flagged:
        raise ValueError(f"metric name {name!r} contains unit abbreviations, non-base units or type words: {flagged}")
