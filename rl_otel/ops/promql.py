"""Small PromQL helpers: the metric names an expression reads, and Grafana variable substitution.

Parsing proper is promtool's job (``check_expressions`` writes expressions into a rule file and runs ``promtool
check rules``); this tokenizer only needs to find the metric names so they can be checked against the catalog.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import yaml

# Words that are not metric names where a name could stand.
_KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
                       "unless", "offset", "inf", "nan", "atan2",
                       # aggregations may be followed by ``by (...)`` before their parenthesis
                       "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk",
                       "topk", "quantile"})
# Modifiers followed by a parenthesized list of label names.
_LABEL_LIST = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_NUMBER = re.compile(r"(?:0x[0-9a-fA-F]+|[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)(?:[smhdwy]|ms)*")
_CLOSE = {"{": "}", "[": "]"}

# Grafana's built-in interval variables, and what a test substitutes for them.
GRAFANA_INTERVALS = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "5m"}


def _skip_string(expr: str, i: int) -> int:
    quote = expr[i]
    i += 1
    while i < len(expr) and expr[i] != quote:
        i += 2 if expr[i] == "\\" and quote != "`" else 1
    return i + 1


def _skip_group(expr: str, i: int, close: str) -> int:
    """Index after the bracket matching the one at ``i`` (strings inside skipped)."""
    i += 1
    while i < len(expr) and expr[i] != close:
        i = _skip_string(expr, i) if expr[i] in "\"'`" else i + 1
    return i + 1


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects (``foo{a="b"}[5m]`` -> ``foo``); function, aggregation and
    keyword names, label names in ``by (...)`` lists and everything inside ``{}``/``[]`` are left out."""
    names: set[str] = set()
    i, n = 0, len(expr)
    while i < n:
        c = expr[i]
        if c in "\"'`":
            i = _skip_string(expr, i)
        elif c in _CLOSE:
            i = _skip_group(expr, i, _CLOSE[c])
        elif c.isdigit() or (c == "." and i + 1 < n and expr[i + 1].isdigit()):
            m = _NUMBER.match(expr, i)
            i = m.end() if m and m.end() > i else i + 1
        elif c == "$":  # a Grafana variable left in the expression: not a name
            m = _IDENT.match(expr, i + 1)
            i = m.end() if m else i + 1
        elif ident := _IDENT.match(expr, i):
            word = ident.group()
            j = i + len(word)
            while j < n and expr[j].isspace():
                j += 1
            lower = word.lower()
            if lower in _LABEL_LIST and j < n and expr[j] == "(":
                i = expr.index(")", j) + 1
            elif (j < n and expr[j] == "(") or lower in _KEYWORDS:  # a function call or keyword
                i += len(word)
            else:
                names.add(word)
                i += len(word)
        else:
            i += 1
    return names


def substitute(expr: str, values: Mapping[str, str]) -> str:
    """Replace ``$name`` / ``${name}`` (template variables and Grafana's ``$__*`` intervals) by ``values``;
    longer names first, so ``$run`` never eats the start of ``$runner``."""
    merged = {**{k.lstrip("$"): v for k, v in GRAFANA_INTERVALS.items()}, **values}
    for name in sorted(merged, key=len, reverse=True):
        expr = expr.replace("${" + name + "}", merged[name])
        expr = re.sub(r"\$" + re.escape(name) + r"(?![A-Za-z0-9_])", _literal(merged[name]), expr)
    return expr


def _literal(text: str) -> Callable[[re.Match[str]], str]:
    """A ``re.sub`` replacement inserting ``text`` as it is (a str replacement would read its backslashes)."""
    return lambda _m: text


def check_expressions(exprs: Iterable[str], promtool: str | None = None) -> str:
    """``promtool check rules`` on the expressions wrapped as recording rules; '' when all parse."""
    binary = promtool or shutil.which("promtool")
    if binary is None:
        raise FileNotFoundError("promtool is not installed (apt-get install prometheus)")
    rules = [{"record": f"check:expr_{i}", "expr": e} for i, e in enumerate(exprs)]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "exprs.yml"
        path.write_text(yaml.safe_dump({"groups": [{"name": "exprs", "rules": rules}]}, sort_keys=False))
        proc = subprocess.run([binary, "check", "rules", str(path)], capture_output=True, text=True, timeout=120)
    return "" if proc.returncode == 0 else (proc.stdout + proc.stderr).strip()
