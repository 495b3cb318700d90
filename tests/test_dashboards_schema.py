"""Every shipped dashboard against Grafana's own schema, as grafana-foundation-sdk ships it: Python models generated
from the CUE kinds of one Grafana version (pinned to the version docker-compose.yml runs).

The SDK's ``from_json`` validates nothing: it copies what it knows and drops the rest. So the check is two-fold:
the dashboard goes through ``Dashboard.from_json(...).to_json()`` and every key it had must come back with the same
value (a key dropped or a value changed is one the schema does not have), and the JSON is walked against the
models' type annotations, each panel's ``options``/``fieldConfig.defaults.custom`` with its panel plugin's models,
each target with the dataquery model of its datasource type, so that a key the SDK passes through untyped is still
checked, a string where the schema has a number is caught, and an unknown panel type, datasource type or unit fails.
"""

from __future__ import annotations

import copy
import enum
import functools
import json
import re
import types
import typing
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
from grafana_foundation_sdk.cog import plugins, runtime
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.variants import Dataquery
from grafana_foundation_sdk.models import dashboard, units

ROOT = Path(__file__).resolve().parent.parent
BOARDS = ROOT / "grafana/dashboards"

plugins.register_default_plugins()

# Custom units Grafana accepts beside its list (FieldConfig.unit's documentation in the SDK).
CUSTOM_UNIT = re.compile(r"(suffix|prefix|time|si|count|currency):.+")
UNITS = frozenset(v for k, v in vars(units).items() if not k.startswith("_") and isinstance(v, str))


def schema_problems(board: dict[str, Any]) -> list[str]:
    """What Grafana's schema does not know or types differently in ``board``; empty when it all conforms."""
    return _round_trip(board) + _walk(board, dashboard.Dashboard, "dashboard")


# -- round trip through the SDK's model ---------------------------------------------------------------------------

def _round_trip(board: dict[str, Any]) -> list[str]:
    try:
        kept = json.loads(json.dumps(dashboard.Dashboard.from_json(board), cls=JSONEncoder))
    except Exception as exc:  # the model's decoder indexes into what it expects: a wrong shape raises
        return [f"dashboard: the SDK's model cannot read it: {exc!r}"]
    return _lost(board, kept, "dashboard")


def _lost(before: Any, after: Any, path: str) -> list[str]:
    """Where ``after`` (the round trip) lacks a key of ``before`` or holds another value; keys it adds (the
    schema's defaults) are fine."""
    if isinstance(before, dict):
        if not isinstance(after, dict):
            return [f"{path}: the model turned an object into {after!r}"]
        return [problem for key, value in before.items()
                for problem in ([f"{path}.{key}: dropped by the model (not in the schema)"] if key not in after
                                else _lost(value, after[key], f"{path}.{key}"))]
    if isinstance(before, list):
        if not isinstance(after, list) or len(after) != len(before):
            return [f"{path}: the model turned the list into {after!r}"]
        return [problem for i, (b, a) in enumerate(zip(before, after, strict=True))
                for problem in _lost(b, a, f"{path}[{i}]")]
    if type(before) is not type(after) or before != after:
        return [f"{path}: {before!r} became {after!r} in the model"]
    return []


# -- walk against the models' annotations -------------------------------------------------------------------------

@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


@functools.cache
def _fields(cls: type) -> dict[str, str]:
    """JSON key -> attribute of a model, read off its own ``to_json`` (a marker set on the attribute shows under
    the key the model writes it to)."""
    out = {}
    for attr in _hints(cls):
        obj, marker = cls(), object()
        setattr(obj, attr, marker)
        keys = [key for key, value in obj.to_json().items() if value is marker]
        assert len(keys) == 1, (cls, attr, keys)
        out[keys[0]] = attr
    return out


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and not issubclass(tp, enum.Enum) and hasattr(tp, "from_json") \
        and hasattr(tp, "to_json")


def _scalar(value: Any, tp: type) -> bool:
    if tp is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, tp)


def _walk(value: Any, tp: Any, path: str) -> list[str]:
    """Problems of the JSON ``value`` against the type annotation ``tp``."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any or tp is object:  # the schema leaves it open (a transformation's options, a matcher's)
        return []
    if tp is type(None):
        return [] if value is None else [f"{path}: {value!r} where the schema has null"]
    if origin is typing.Union or origin is types.UnionType:
        if value is None:
            return [] if type(None) in args else [f"{path}: null where the schema has {tp}"]
        if dashboard.RowPanel in args and isinstance(value, dict):  # decided by type, as the SDK's decoder does
            return _walk(value, dashboard.RowPanel if value.get("type") == "row" else dashboard.Panel, path)
        tries = [_walk(value, alt, path) for alt in args if alt is not type(None)]
        return [] if any(not t for t in tries) else min(tries, key=len)
    if origin is typing.Literal:
        if any(value == a and type(value) is type(a) for a in args):
            return []
        return [f"{path}: {value!r} is not one of {list(args)}"]
    if origin is list:
        if not isinstance(value, list):
            return [f"{path}: {value!r} where the schema has a list"]
        return [p for i, item in enumerate(value) for p in _walk(item, args[0], f"{path}[{i}]")]
    if origin is dict:
        if not isinstance(value, dict):
            return [f"{path}: {value!r} where the schema has an object"]
        return [p for key, item in value.items() for p in _walk(item, args[1], f"{path}.{key}")]
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        base = int if issubclass(tp, int) else str
        if _scalar(value, base) and value in {m.value for m in tp}:
            return []
        return [f"{path}: {value!r} is not one of {tp.__name__}'s {[m.value for m in tp]}"]
    if tp in (bool, int, float, str):
        return [] if _scalar(value, tp) else [f"{path}: {value!r} where the schema has {tp.__name__}"]
    if tp is Dataquery:
        return [f"{path}: a query outside a panel (no datasource type to read it with)"]
    if tp is dashboard.Panel:
        return _panel(value, path)
    if _is_model(tp):
        return _model(value, tp, path)
    return [f"{path}: the check has no rule for {tp!r}"]


def _model(value: Any, cls: type, path: str, skip: tuple[str, ...] = ()) -> list[str]:
    """``value`` as the model ``cls``: every key one of its fields, every value of the field's type; keys in
    ``skip`` are checked by the caller (with a plugin's model)."""
    if not isinstance(value, dict):
        return [f"{path}: {value!r} where the schema has an object ({cls.__qualname__})"]
    fields, hints, out = _fields(cls), _hints(cls), []
    for key, item in value.items():
        here = f"{path}.{key}"
        if key not in fields:
            out.append(f"{here}: unknown key ({cls.__module__.rsplit('.', 1)[-1]}.{cls.__qualname__} has no such "
                       "field)")
        elif key not in skip:
            out += _walk(item, hints[fields[key]], here)
            if fields[key] == "unit" and isinstance(item, str) and item not in UNITS \
                    and not CUSTOM_UNIT.fullmatch(item):
                out.append(f"{here}: {item!r} is not a Grafana unit")
    return out


def _plugin_class(hook: Any) -> type | None:
    return getattr(hook, "__self__", None) if hook is not None else None


def _panel(value: Any, path: str) -> list[str]:
    """A panel: its type a panel plugin the schema has, options and custom field config by that plugin's models,
    targets by the dataquery model of their datasource type."""
    if not isinstance(value, dict):
        return [f"{path}: {value!r} where the schema has a panel object"]
    kind = value.get("type")
    config = runtime.panelcfg_config(kind) if isinstance(kind, str) else None
    if config is None:
        return [f"{path}.type: unknown panel type {kind!r} (no panel plugin in the schema)"]
    path = f"{path}<{kind}>"
    out = _model(value, dashboard.Panel, path, skip=("options", "fieldConfig", "targets"))
    options_cls = _plugin_class(config.options_from_json_hook)
    if "options" in value:
        out += (_walk(value["options"], options_cls, f"{path}.options") if options_cls
                else [f"{path}.options: the {kind} panel has no options in the schema"])
    if "fieldConfig" in value:
        field_config = value["fieldConfig"]
        defaults = field_config.get("defaults") if isinstance(field_config, dict) else None
        if isinstance(defaults, dict) and "custom" in defaults:
            custom_cls = _plugin_class(config.field_config_from_json_hook)
            out += (_walk(defaults["custom"], custom_cls, f"{path}.fieldConfig.defaults.custom") if custom_cls
                    else [f"{path}.fieldConfig.defaults.custom: the {kind} panel has no custom field config in "
                          "the schema"])
            field_config = {**field_config, "defaults": {k: v for k, v in defaults.items() if k != "custom"}}
        out += _walk(field_config, dashboard.FieldConfigSource, f"{path}.fieldConfig")
    targets = value.get("targets", [])
    if not isinstance(targets, list):
        return [*out, f"{path}.targets: {targets!r} where the schema has a list"]
    for i, target in enumerate(targets):
        out += _target(target, value.get("datasource"), f"{path}.targets[{i}]")
    return out


def _target(target: Any, panel_datasource: Any, path: str) -> list[str]:
    if not isinstance(target, dict):
        return [f"{path}: {target!r} where the schema has a query object"]
    source = target.get("datasource") or panel_datasource
    kind = source.get("type") if isinstance(source, dict) else None
    variant = runtime.Runtime().dataquery_variants.get(kind) if isinstance(kind, str) else None
    query_cls = _plugin_class(variant.from_json_hook) if variant else None
    if query_cls is None:
        return [f"{path}: datasource type {kind!r} has no dataquery model in the schema"]
    return _walk(target, query_cls, f"{path}<{kind}>")


# -- tests ----------------------------------------------------------------------------------------------------------

def _board(name: str) -> dict[str, Any]:
    board: dict[str, Any] = json.loads((BOARDS / name).read_text())
    return board


FILES = sorted(p.name for p in BOARDS.glob("*.json"))


def test_there_are_dashboards_to_check():
    assert len(FILES) >= 5, FILES


@pytest.mark.parametrize("name", FILES)
def test_dashboard_conforms_to_grafanas_schema(name):
    assert schema_problems(_board(name)) == []


def test_the_schema_is_the_grafana_version_that_runs():
    """The SDK's models are generated per Grafana version (the part after the epoch): they must be the ones of the
    Grafana image docker-compose.yml starts, or the check validates against another schema."""
    image = re.search(r"image:\s*grafana/grafana:(\d+\.\d+)", (ROOT / "docker-compose.yml").read_text())
    assert image, "docker-compose.yml runs no grafana/grafana image"
    sdk = version("grafana-foundation-sdk").split("!")[-1]
    assert sdk.split(".")[:2] == image.group(1).split("."), (sdk, image.group(1))


def _first(board: dict[str, Any], kind: str) -> dict[str, Any]:
    panel: dict[str, Any] = next(p for p in board["panels"] if p["type"] == kind)
    return panel


# (what the defect is, how to put it into a dashboard, a fragment the report must contain)
DEFECTS: list[tuple[str, typing.Callable[[dict[str, Any]], None], str]] = [
    ("unknown top-level key", lambda b: b.update(refreshInterval="10s"), "dashboard.refreshInterval: unknown key"),
    ("top-level string for a number", lambda b: b.update(schemaVersion="39"),
     "dashboard.schemaVersion: '39' where the schema has int"),
    ("enum value out of range", lambda b: b.update(graphTooltip=3), "dashboard.graphTooltip: 3 is not one of"),
    ("unknown panel key", lambda b: _first(b, "timeseries").update(legendMode="table"), ".legendMode: unknown key"),
    ("string for a number in gridPos", lambda b: _first(b, "timeseries")["gridPos"].update(w="12"),
     ".gridPos.w: '12' where the schema has int"),
    ("string for a number in a threshold", lambda b: _first(b, "timeseries")["fieldConfig"]["defaults"][
        "thresholds"]["steps"][0].update(value="0.5"), ".steps[0].value: '0.5' where the schema has float"),
    ("unknown field config key", lambda b: _first(b, "timeseries")["fieldConfig"]["defaults"].update(colour="red"),
     ".fieldConfig.defaults.colour: unknown key"),
    ("unknown custom field config key (timeseries plugin)",
     lambda b: _first(b, "timeseries")["fieldConfig"]["defaults"]["custom"].update(lineWidht=2),
     ".fieldConfig.defaults.custom.lineWidht: unknown key"),
    ("custom field config on a plugin without one",
     lambda b: _first(b, "stat")["fieldConfig"]["defaults"].update(custom={"lineWidth": 1}),
     "the stat panel has no custom field config"),
    ("unknown option (stat plugin)", lambda b: _first(b, "stat")["options"].update(sparkline=True),
     ".options.sparkline: unknown key"),
    ("option of the wrong type", lambda b: _first(b, "stat")["options"]["reduceOptions"].update(values="false"),
     ".options.reduceOptions.values: 'false' where the schema has bool"),
    ("unknown panel type", lambda b: _first(b, "stat").update(type="singlestat"), "unknown panel type 'singlestat'"),
    ("unknown unit", lambda b: _first(b, "timeseries")["fieldConfig"]["defaults"].update(unit="seconds"),
     "'seconds' is not a Grafana unit"),
    ("unknown Prometheus query key", lambda b: _first(b, "timeseries")["targets"][0].update(step=15),
     ".targets[0]<prometheus>.step: unknown key"),
    ("query format out of range", lambda b: _first(b, "timeseries")["targets"][0].update(format="graph"),
     ".targets[0]<prometheus>.format: 'graph' is not one of"),
    ("unknown datasource type", lambda b: _first(b, "timeseries")["targets"][0].update(
        datasource={"type": "influx", "uid": "x"}), ".targets[0]: datasource type 'influx' has no dataquery model"),
    ("unknown datasource ref key", lambda b: _first(b, "timeseries")["datasource"].update(name="Prometheus"),
     ".datasource.name: unknown key"),
    ("unknown variable key", lambda b: b["templating"]["list"][1].update(refreshOnLoad=True),
     "dashboard.templating.list[1].refreshOnLoad: unknown key"),
]


@pytest.mark.parametrize(("what", "inject", "expected"), DEFECTS, ids=[d[0] for d in DEFECTS])
def test_the_check_reports_an_injected_defect(what, inject, expected):
    """A copy of a shipped dashboard with one defect fails the check, and the report says where."""
    board = _board("rl-otel-fleet.json")  # the one dashboard with timeseries and stat panels and many variables
    assert schema_problems(board) == []
    broken = copy.deepcopy(board)
    inject(broken)
    problems = schema_problems(broken)
    assert any(expected in p for p in problems), (what, problems)


def test_the_round_trip_alone_catches_a_dropped_key():
    """The round trip half on its own: a key the model does not keep is reported as dropped."""
    board = _board("rl-otel-training.json")
    board["panels"][0]["gridPos"]["depth"] = 1
    assert "dashboard.panels[0].gridPos.depth: dropped by the model (not in the schema)" in _round_trip(board)
