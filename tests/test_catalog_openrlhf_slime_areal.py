"""The catalogs of OpenRLHF, slime and AReaL against what their current code logs (tests/data/frameworks/*.tsv).

Each of these frameworks' keys resolves in its own catalog (``default_catalog("slime")``: its entries first, then the
shared ones). For each: at least 95% of the keys its code emits resolve to an entry of its own module, with the kind
the code gives it (a running total is a counter) and its unit converted to the base unit; the free parts of a
templated key (data source, eval dataset, reward category, ...) become label values; every family is named with the
framework's prefix, so the union of every framework's catalog builds; the module's ``CONCEPT_SOURCES`` name its own
families and cover the concepts its keys carry; and a real Telemetry serving the keys passes ``promtool check
metrics``.
"""

from __future__ import annotations

import importlib
import re

import pytest

from rl_otel.catalog import SCOPED_FRAMEWORKS, Catalog, Kind, default_catalog
from rl_otel.catalog.concepts import CONCEPTS, Source
from rl_otel.catalog.spec import MetricSpec
from tests.frameworks import UNITS, FixtureKey, header, load
from tests.promtools import promtool_check, samples, scrape

NAMES = ("openrlhf", "slime", "areal")
COVERAGE = 0.95
# units a framework logs in -> (catalog unit, scale to it), beyond tests.frameworks.UNITS
UNIT_SCALES = {**UNITS, "%": ("1", 0.01), "GiB/s": ("By/s", float(2**30)), "TFLOP/s": ("{flop}/s", 1e12)}

# Keys a literal entry of the shared catalog (veRL's SFT train/loss, train/grad_norm and its rollout/spec_accept_*)
# takes in default_catalog(framework) before the framework's own template: the catalog finds a literal key before
# any template. The own entry exists (checked below); these stay within the 5%.

# The concepts each framework's code logs (tests/data/frameworks notes), with the family that must carry each.
EXPECTED_CONCEPTS = {
    "openrlhf": {"reward", "ref_kl", "policy_kl", "policy_loss", "clip_ratio", "entropy", "response_length",
                 "step_duration", "eval_score", "learning_rate", "grad_norm", "train_infer_kl"},
    "slime": {"reward", "ref_kl", "policy_kl", "policy_loss", "clip_ratio", "entropy", "response_length",
              "throughput", "step_duration", "eval_score", "learning_rate", "grad_norm", "train_infer_logprob_diff",
              "train_infer_ratio_deviation"},
    "areal": {"reward", "policy_kl", "policy_loss", "clip_ratio", "importance_ratio_max", "entropy", "eval_score",
              "learning_rate", "grad_norm", "train_infer_kl", "train_infer_ratio_deviation", "staleness"},
}


def _module(name: str):
    return importlib.import_module(f"rl_otel.catalog.{name}")


def _own(name: str, key: str) -> tuple[MetricSpec, dict[str, str]] | None:
    """The entry of the framework's own module covering ``key`` (first match, literal keys first) and its labels."""
    specs = _module(name).SPECS
    for spec in (*(s for s in specs if not s.templated), *(s for s in specs if s.templated)):
        labels = spec.match(key)
        if labels is not None:
            return spec, labels
    return None


@pytest.fixture(scope="module", params=NAMES)
def framework(request) -> tuple[str, list[FixtureKey]]:
    return request.param, load(request.param)


def test_fixture_names_its_source_version(framework):
    name, keys = framework
    assert len(keys) >= 20, name
    assert "commit" in header(name).lower()
    for k in keys:
        assert k.kind in ("gauge", "counter"), (k.line, k.kind)
        assert k.source and k.meaning, k.line


def test_at_least_95_percent_resolve_to_the_framework_own_entries(framework):
    name, keys = framework
    catalog, own = default_catalog(name), {id(s) for s in _module(name).SPECS}
    missed = sorted({k.key for k in keys if (r := catalog.lookup(k.key)) is None or id(r.spec) not in own})
    share = 1 - len(missed) / len(keys)
    print(f"\n{name}: {len(keys) - len(missed)}/{len(keys)} keys resolve to its own entries ({share:.1%}); "
          f"others: {missed}")
    assert share >= COVERAGE, missed
    # a key a shared framework also logs (slime's train/loss, veRL SFT's) resolves to the framework's own entry
    assert missed == [], missed


def test_every_fixture_key_has_an_own_entry(framework):
    """The module covers every key its framework's code emits."""
    name, keys = framework
    assert [k.key for k in keys if _own(name, k.key) is None] == []


def test_own_entries_have_the_framework_kind_and_unit(framework):
    name, keys = framework
    wrong = []
    for k in keys:
        spec, _labels = _own(name, k.key) or (None, None)
        assert spec is not None, k.key
        if (k.kind == "counter") != (spec.kind is Kind.COUNTER):
            wrong.append((k.key, "kind", k.kind, spec.kind.value))
        unit = UNIT_SCALES.get(k.unit, (k.unit, 1.0))
        if (spec.unit, spec.scale) != unit:
            wrong.append((k.key, "unit", k.unit, f"{spec.unit} x{spec.scale:g}"))
        if spec.scale != 1.0 and not spec.tracker_unit:
            wrong.append((k.key, "tracker_unit", k.unit, "(none)"))
    assert wrong == []


def test_free_parts_of_a_key_become_labels(framework):
    name, keys = framework
    baked = []
    for k in keys:
        spec, labels = _own(name, k.key) or (None, {})
        values = set(labels.values())
        for placeholder, value in k.free_values().items():
            if value.replace("/", "_") not in values and not any(value in v for v in values):
                baked.append((k.key, placeholder, value, spec and spec.prometheus_name, labels))
    assert baked == []


def test_the_free_parts_become_these_labels():
    cases = {
        ("openrlhf", "eval/eval_openai/gsm8k_pass4"): ("rl_openrlhf_eval_pass_at_k",
                                                       {"taskset": "openai_gsm8k", "k": "4"}),
        ("openrlhf", "train/math_accuracy"): ("rl_openrlhf_reward_extra", {"metric": "math_accuracy"}),
        ("slime", "eval/aime-2024-pass@8"): ("rl_slime_eval_pass_at_k", {"taskset": "aime-2024", "k": "8"}),
        ("slime", "eval/aime/error_cat/format_error"): ("rl_slime_eval_reward_category_ratio",
                                                        {"taskset": "aime", "reason": "format_error"}),
        ("slime", "perf/train_wait_time"): ("rl_slime_perf_timer_seconds", {"operation": "train_wait"}),
        ("areal", "ppo_actor/num_turns/max"): ("rl_areal_actor_agent_stat", {"metric": "num_turns", "stat": "max"}),
        ("areal", "timeperf/ref_offload"): ("rl_areal_engine_offload_duration_seconds",
                                            {"role": "ref", "operation": "offload"}),
        ("areal", "ppo_actor/update/compute_logp/linear/abs_error/avg"): (
            "rl_areal_actor_approx_logprob_abs_error", {"kind": "linear", "stat": "avg"}),
    }
    for (name, key), (family, labels) in cases.items():
        res = default_catalog(name).lookup(key)
        assert res is not None and (res.spec.prometheus_name, dict(res.labels)) == (family, labels), key


def test_other_frameworks_train_keys_are_no_openrlhf_extra_log():
    """OpenRLHF's extra_logs catch-all leaves loss, norm, KL, learning-rate and step spellings alone."""
    catalog = default_catalog("openrlhf")
    for key in ("train/pg_loss", "train/kl_loss", "train/lr-pg_0", "train/grad_norm", "train/critic-value_loss",
                "train/global_batch_size", "train/opd_reverse_kl"):
        res = catalog.lookup(key)
        assert res is None or res.spec.source != "openrlhf", (key, res.spec.name)


def test_entries_are_well_formed_prefixed_and_name_their_framework():
    for name in NAMES:
        specs = _module(name).SPECS
        assert specs
        for spec in specs:
            spec.check()
            assert spec.name.startswith(f"rl_{name}_"), spec.name
            assert spec.source == name, spec.key
            assert spec.description.endswith("."), spec.key
            assert spec.kind is not Kind.COUNTER or spec.name.endswith("_steps"), spec.name


def test_every_entry_example_resolves_to_itself_in_its_framework_catalog():
    for name in NAMES:
        catalog = default_catalog(name)
        for spec in _module(name).SPECS:
            assert spec.examples, spec.key
            for example in spec.examples:
                assert catalog.resolve(example).spec is spec, (name, example, spec.key)


def test_the_union_of_every_framework_catalog_builds():
    """Names unique across all frameworks, and a key defined literally once (a shared one is a template)."""
    mine = [s for name in NAMES for s in _module(name).SPECS]
    union = Catalog((*default_catalog().specs, *mine))
    assert len(union) == len(default_catalog()) + len(mine)
    for name in SCOPED_FRAMEWORKS:  # the other scoped frameworks' modules present in this checkout
        if name not in NAMES:
            try:
                others = _module(name).SPECS
            except ModuleNotFoundError:
                continue
            Catalog((*union.specs, *others))


def test_every_name_is_promtool_clean():
    lines = []
    for name in NAMES:
        for spec in _module(name).SPECS:
            lines += [f"# HELP {spec.prometheus_name} {spec.description}",
                      f"# TYPE {spec.prometheus_name} {spec.kind.value}"]
            labels = ",".join(f'{label}="x"' for label in ("run", "rank", *spec.labels))
            lines.append(f"{spec.prometheus_name}{{{labels}}} 1")
    assert promtool_check("\n".join(lines) + "\n") == ""


_CONCEPTS = {c.name: c for c in CONCEPTS}


def _label_regex(spec: MetricSpec, label: str) -> str:
    return next(regex or "[^/]+" for name, regex in spec.placeholders if name == label)


def test_concept_sources_name_own_families_with_their_labels():
    for name in NAMES:
        module = _module(name)
        by_name = {s.prometheus_name: s for s in module.SPECS}
        selectors = {sel for sels in module.CONCEPT_SOURCES.values() for sel in sels}
        for concept, sels in module.CONCEPT_SOURCES.items():
            assert concept in _CONCEPTS, (name, concept)
            assert sels, (name, concept)
            for sel in sels:
                source = Source(sel)
                spec = by_name.get(source.metric)
                assert spec is not None, (name, concept, sel)
                assert spec.kind is Kind.GAUGE and spec.unit == _CONCEPTS[concept].unit, (concept, sel, spec.unit)
                for label, op, value in source.matchers:
                    assert label in spec.labels, (sel, label)
                    assert op == "=" and re.fullmatch(_label_regex(spec, label), value), (sel, label, value)
        for extra in ("CONCEPT_TRANSFORMS", "CONCEPT_SET_LABELS"):
            assert set(getattr(module, extra, {})) <= selectors, (name, extra)
        for transform in getattr(module, "CONCEPT_TRANSFORMS", {}).values():
            assert "{}" in transform


def test_the_concepts_each_framework_logs_have_sources_its_keys_feed(framework):
    name, keys = framework
    module = _module(name)
    assert set(module.CONCEPT_SOURCES) >= EXPECTED_CONCEPTS[name], EXPECTED_CONCEPTS[name] - set(
        module.CONCEPT_SOURCES)
    resolved = [r for k in keys if (r := _own(name, k.key)) is not None]
    unfed = []
    for concept, sels in module.CONCEPT_SOURCES.items():
        for sel in sels:
            source = Source(sel)
            if not any(spec.prometheus_name == source.metric
                       and all(labels.get(label) == value for label, _op, value in source.matchers)
                       for spec, labels in resolved):
                unfed.append((concept, sel))
    assert unfed == []


def test_watch_infers_each_framework_from_its_keys(monkeypatch):
    from rl_otel.watch import frameworks

    present = []
    for name in SCOPED_FRAMEWORKS:
        try:
            _module(name)
        except ModuleNotFoundError:
            continue
        present.append(name)
    monkeypatch.setattr(frameworks, "SCOPED_FRAMEWORKS", tuple(present))
    for name in (*NAMES, "verl", "trl", "roll", "trinity"):
        keys = [k.key for k in load(name)]
        assert frameworks.infer(keys) == name
        train = [k for k in keys if k.startswith("train/")]
        if len(train) >= 5:
            assert frameworks.infer(train) == name, name


@pytest.mark.prometheus
@pytest.mark.parametrize("name", NAMES)
def test_a_run_logging_the_keys_is_served_promtool_clean(name):
    import rl_otel

    keys = load(name)
    catalog = default_catalog(name)
    specs = _module(name).SPECS
    examples = {e: 1.0 for s in specs for e in s.examples[:1]}
    tel = rl_otel.init(run=f"{name}-names", rank=0, prometheus={"host": "127.0.0.1", "port": 0},
                       catalog=catalog, handle_sigterm=False)
    try:
        for step in range(2):
            values = {**examples, **{k.key: float(10 * (step + 1)) if k.kind == "counter" else 0.5 for k in keys}}
            tel.log(values, step=step)
        text = scrape(tel.metrics_url)  # type: ignore[arg-type]
    finally:
        tel.close()
    assert promtool_check(text) == ""
    served = set(re.findall(r"^# TYPE (\S+) ", text, re.M))
    assert {s.prometheus_name for s in specs} - served == set()
    for k in keys:
        spec, labels = _own(name, k.key) or (None, {})
        assert spec is not None
        found = samples(text, spec.prometheus_name)
        want = {("run", f"{name}-names"), *labels.items()}
        hit = [v for lbls, v in found.items() if want <= set(lbls)]
        expected = 20.0 if k.kind == "counter" else 0.5 * spec.scale
        assert hit and hit[0] == pytest.approx(expected), (k.key, spec.prometheus_name, found)
