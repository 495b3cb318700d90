"""The catalog against what the frameworks' current code logs (tests/data/frameworks/*.tsv, read off their source).

For each framework: at least 95% of the keys its code emits have a catalog entry; every catalogued key has the
kind the framework's code gives it (a running total is a counter) and the unit it is logged in (the entry converts
it to the base unit); the free parts of a templated key (data source, domain, reward function, ...) become label
values, never parts of a metric name; and the core concepts it logs reach the shipped rules.
"""

from __future__ import annotations

import pytest

from rl_otel.catalog import Kind, default_catalog
from rl_otel.catalog.concepts import CONCEPTS
from tests.frameworks import FRAMEWORKS, UNITS, concepts_logged, header, load, resolve

CATALOG = default_catalog()
COVERAGE = 0.95
# units a framework logs in that the catalog converts, beyond tests.frameworks.UNITS: verl's total_tokens(B)
UNIT_SCALES = {**UNITS, "G{token}": ("{token}", 1e9)}

# Core concepts each framework's code logs (the list: reward, KL, loss, clip fraction, entropy, response
# length, throughput, step time, eval score, GPU memory), checked to reach the rules through the catalog.
EXPECTED_CONCEPTS = {
    "trl": {"reward", "ref_kl", "policy_loss", "clip_ratio", "entropy", "response_length", "step_duration",
            "eval_score", "learning_rate", "grad_norm"},
    "verl": {"reward", "policy_kl", "ref_kl", "policy_loss", "clip_ratio", "entropy", "response_length",
             "throughput", "step_duration", "eval_score", "gpu_memory_peak", "learning_rate", "grad_norm",
             "explained_variance"},
    "roll": {"reward", "policy_kl", "ref_kl", "policy_loss", "clip_ratio", "importance_ratio_max", "entropy",
             "response_length", "throughput", "step_duration", "eval_score", "gpu_memory_peak",
             "gpu_memory_peak_ratio", "learning_rate", "grad_norm"},
    "trinity": {"reward", "policy_kl", "policy_loss", "clip_ratio", "entropy", "response_length", "throughput",
                "step_duration", "eval_score", "gpu_memory_peak", "learning_rate", "grad_norm"},
}


@pytest.fixture(scope="module", params=FRAMEWORKS)
def framework(request):
    return request.param, load(request.param)


def test_fixture_names_its_source_version(framework):
    name, keys = framework
    assert len(keys) >= 20, name
    assert "version" in header(name).lower() or "commit" in header(name).lower()
    for k in keys:
        assert k.kind in ("gauge", "counter", "info"), (k.line, k.kind)
        assert k.source and k.meaning, k.line


def test_at_least_95_percent_of_the_emitted_keys_are_catalogued(framework):
    name, keys = framework
    resolved = resolve(keys)
    unknown = sorted({k.key for k in keys if not resolved[k.key].known})
    share = 1 - len(unknown) / len(keys)
    print(f"\n{name}: {len(keys) - len(unknown)}/{len(keys)} keys catalogued ({share:.1%}); unknown: {unknown}")
    assert share >= COVERAGE, unknown


def test_catalogued_keys_have_the_framework_kind_and_unit(framework):
    _name, keys = framework
    resolved = resolve(keys)
    wrong = []
    for k in keys:
        res = resolved[k.key]
        if not res.known:
            continue
        spec = res.spec
        if (k.kind == "counter") != (spec.kind is Kind.COUNTER):
            wrong.append((k.key, "kind", k.kind, spec.kind.value))
        unit = UNIT_SCALES.get(k.unit, (k.unit, 1.0))
        if (spec.unit, spec.scale) != unit:
            wrong.append((k.key, "unit", k.unit, f"{spec.unit} x{spec.scale:g}"))
    assert wrong == []


def test_free_parts_of_a_key_become_labels(framework):
    _name, keys = framework
    resolved = resolve(keys)
    baked = []
    for k in keys:
        res = resolved[k.key]
        if not res.known:
            continue
        values = set(dict(res.labels).values())
        for placeholder, value in k.free_values().items():
            if value.replace("/", "_") not in values and not any(value in v for v in values):
                baked.append((k.key, placeholder, value, res.spec.prometheus_name, dict(res.labels)))
    assert baked == []


def test_core_concepts_reach_the_rules(framework):
    name, keys = framework
    logged = concepts_logged(keys)
    missing = EXPECTED_CONCEPTS[name] - set(logged)
    assert not missing, f"{name} logs these concepts but no catalogued key of it feeds them: {missing}"


def test_every_concept_source_is_a_catalog_family():
    from rl_otel.catalog import every_entry

    for c in CONCEPTS:
        for source in c.sources:
            spec = next((s for s in every_entry() if s.prometheus_name == source.metric), None)
            assert spec is not None, (c.name, source.selector)
            for label, _op, _value in source.matchers:
                assert label in spec.labels, (c.name, source.selector, spec.labels)


@pytest.mark.parametrize("cluster", ["sft_train", "actor_train", "student"])
def test_roll_s_strategy_loss_is_served_as_the_cluster_s_loss(cluster):
    """ROLL's training strategies log the language-model loss as ``{worker name}/loss@sum`` for whichever training
    cluster runs them (before: only sft_train's had an entry; actor_train's was served under a generic name)."""
    resolved = default_catalog("roll").resolve(f"{cluster}/loss@sum")
    assert resolved.known and resolved.spec.prometheus_name == "rl_cluster_loss", resolved
    assert dict(resolved.labels) == {"cluster": cluster}
