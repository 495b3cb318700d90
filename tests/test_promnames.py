"""rl_otel's own OTel -> Prometheus name and unit mapping agrees with opentelemetry-exporter-prometheus' (which keeps
it in a private module: read here only, so that an upgrade that changes the mapping fails this test)."""

from __future__ import annotations

import pytest
from opentelemetry.exporter.prometheus import _mapping as stock

from rl_otel._internal.exporters import promnames
from rl_otel.catalog import default_catalog

UNITS = ["", "1", "s", "ms", "By", "GiBy", "KiBy", "%", "Cel", "Hz", "{token}", "{token}/s", "By/s", "m/s", "1/s",
         "/s", "s/", "{a}/{b}", "tokens/s", "foo-bar", "_x_", "1/{step}", "W", "mo", "km/h", "x/mo", "{s}", "s{x}"]
NAMES = ["rl_step", "9lives", "a.b-c", "rl:recorded", "héllo", "__x__", "", "0", "a b", "a__b", "_a", "a_", "Ab9",
         "a:b", "x" * 300, "ℌilbert", "rl_a_b_c"]


@pytest.mark.parametrize("unit", UNITS)
def test_units(unit):
    assert promnames.map_unit(unit) == stock.map_unit(unit)


@pytest.mark.parametrize("name", NAMES)
def test_names_and_attributes(name):
    assert promnames.sanitize_full_name(name) == stock.sanitize_full_name(name)
    assert promnames.sanitize_attribute(name) == stock.sanitize_attribute(name)


def test_every_catalog_entry():
    specs = list(default_catalog())
    assert len(specs) > 100
    for spec in specs:
        assert promnames.sanitize_full_name(spec.name) == stock.sanitize_full_name(spec.name)
        assert promnames.map_unit(spec.unit or "") == stock.map_unit(spec.unit or "")
    assert promnames.UNITS == stock._UNIT_MAPPINGS and promnames.PER_UNITS == stock._PER_UNIT_MAPPINGS
