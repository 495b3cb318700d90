"""The issue-33 series as ops reads them (rl_otel/ops/contract.py) against the catalog and the rules: the same names,
kinds, units and labels wherever the catalog defines a family, the catalog's buckets, and every family read by a
rule or a panel spelled by the contract."""

from __future__ import annotations

import pytest

from rl_otel.catalog import every_entry, goodput
from rl_otel.catalog.spec import BASE_LABELS, Kind
from rl_otel.ops import contract, rules
from rl_otel.ops.dashboards import dashboards
from rl_otel.ops.promql import metric_names


@pytest.mark.parametrize("family", contract.CONTRACT, ids=lambda f: f.name)
def test_a_family_the_catalog_defines_is_the_one_ops_reads(family):
    """Checked for every family the catalog holds (all of them once the runtime's entries are merged): a rename, a
    unit or a label changed on either side fails here rather than leaving a rule reading nothing."""
    spec = contract.catalog_entry(family)
    assert contract.served(family) is (spec is not None)
    if spec is None:  # not in this catalog (yet): the budget counts none of it, the e2e tests expect none
        assert family.name not in {s.name for s in every_entry().specs}
        return
    assert (spec.kind, spec.unit, spec.prometheus_name) == (family.kind, family.unit, family.exposed)
    assert set(spec.labels) == set(family.labels), (spec.labels, family.labels)


def test_the_contract_is_the_series_contract():
    assert contract.BUCKETS == goodput.BUCKETS
    assert set(contract.PRODUCTIVE) == {"generation", "training", "inference"} <= set(goodput.BUCKETS)
    assert set(contract.BADPUT) == set(goodput.BUCKETS) - set(contract.PRODUCTIVE)
    names = {f.exposed: f for f in contract.CONTRACT}
    assert set(names) == {"rl_goodput_bucket_seconds_total", "rl_goodput_wall_seconds_total",
                          "rl_collective_wait_seconds_total", "rl_rank_compute_seconds_total",
                          "rl_stack_dumps_total", "rl_stack_dump_info", "rl_last_progress_timestamp_seconds",
                          "rl_progress_total", "rl_collectives_total", "rl_collective_started_timestamp_seconds"}
    assert names["rl_goodput_bucket_seconds_total"].labels == ("bucket",)
    assert names["rl_collective_wait_seconds_total"].labels == ("point",)
    assert set(names["rl_stack_dump_info"].labels) == {"path", "cluster", "phase", "reason"}
    for family in contract.CONTRACT:
        assert not set(family.labels) & set(BASE_LABELS)
        assert (family.kind is Kind.COUNTER) == family.exposed.endswith("_total")
        assert contract.find(family.exposed) is family and contract.find(family.name + "_x") is None


def test_the_rules_and_panels_read_the_contract_names():
    read = {n for r in rules.recording_rules() for n in metric_names(r.expr)}
    read |= {n for a in rules.alerts() for n in metric_names(a.expr)}
    read |= {n for b in dashboards() for p in b.panels for q in p.queries for n in metric_names(q.expr)}
    assert {f.exposed for f in contract.CONTRACT} <= read
    # the goodput ratio divides the productive buckets by the wall clock, per run and role
    ratio = next(r for r in rules.recording_rules() if r.record == rules.GOODPUT_RATIO)
    assert 'bucket=~"generation|training|inference"' in ratio.expr and "by (job, run, role)" in ratio.expr
