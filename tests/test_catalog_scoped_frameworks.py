"""The catalogs of the six scoped frameworks (OpenRLHF, slime, AReaL, NeMo-RL, SkyRL, prime-rl) against what their
current code logs (tests/data/frameworks/*.tsv).

Each of these frameworks' keys resolves in its own catalog (``default_catalog("slime")``: its entries first, then the
shared ones). For each: at least 95% of the keys its code emits resolve to an entry of its own module, with the kind
the code gives it (a running total is a counter) and its unit converted to the base unit (percent to a 0-1 ratio,
GiB to bytes, TFLOPS to FLOP/s); the free parts of a templated key (data source, eval dataset, reward category, env,
agent, reward function, Ray node and GPU, ...) become label values; every family is named with the framework's
prefix, so the union of every framework's catalog builds; the module's ``CONCEPT_SOURCES`` name its own families and
cover the concepts its keys carry; and a real Telemetry serving the keys passes ``promtool check metrics``.

The generic tests run once per framework (the ``framework`` fixture, or ``name``); the per-framework data they read
is in the tables below; the tests of one framework's particulars follow them, one section per framework.
"""

from __future__ import annotations

import importlib
import json
import re

import pytest

from rl_otel.catalog import SCOPED_FRAMEWORKS, Catalog, Kind, default_catalog
from rl_otel.catalog.concepts import CONCEPTS, Source
from rl_otel.catalog.spec import MetricSpec
from tests.frameworks import ALL_FRAMEWORKS, UNITS, FixtureKey, header, load, watched_keys, writer_lines
from tests.promtools import promtool_check, samples, scrape

NAMES = ("openrlhf", "slime", "areal", "nemo_rl", "skyrl", "prime_rl")
COVERAGE = 0.95

# ---------------------------------------------------------------------------------------------------------------
# Per-framework data
# ---------------------------------------------------------------------------------------------------------------

# The fewest keys a framework's fixture holds (OpenRLHF's code logs few).
MIN_FIXTURE_KEYS = {"openrlhf": 20, "slime": 100, "areal": 100, "nemo_rl": 100, "skyrl": 100, "prime_rl": 100}

# units a framework logs in -> (catalog unit, scale to it), beyond tests.frameworks.UNITS
UNIT_SCALES = {**UNITS, "%": ("1", 0.01), "GiB/s": ("By/s", float(2**30)), "TFLOP/s": ("{flop}/s", 1e12),
               "T{flop}/s": ("{flop}/s", 1e12)}

# Keys veRL's module defines literally (slime's train/loss, train/grad_norm and rollout/spec_accept_* as veRL's SFT and
# rollout log them; NeMo-RL's train/loss, train/grad_norm, train/lr; SkyRL's critic/grad_norm; prime-rl's
# perf/throughput): the frameworks' own entries are templates (a key is literal once in the union of all catalogs),
# and default_catalog(framework) leaves veRL's entries out, so the own ones win.
SHADOWED = {
    "slime": {"train/loss", "train/grad_norm", "rollout/spec_accept_rate", "rollout/spec_accept_length"},
    "nemo_rl": {"train/loss", "train/grad_norm", "train/lr"},
    "skyrl": {"critic/grad_norm"},
    "prime_rl": {"perf/throughput"},
}

# The concepts each framework's code logs (the fixtures' meanings), with the family that must carry each.
EXPECTED_CONCEPTS = {
    "openrlhf": {"reward", "ref_kl", "policy_kl", "policy_loss", "clip_ratio", "entropy", "response_length",
                 "step_duration", "eval_score", "learning_rate", "grad_norm", "train_infer_kl"},
    "slime": {"reward", "ref_kl", "policy_kl", "policy_loss", "clip_ratio", "entropy", "response_length",
              "throughput", "step_duration", "eval_score", "learning_rate", "grad_norm", "train_infer_logprob_diff",
              "train_infer_ratio_deviation"},
    "areal": {"reward", "policy_kl", "policy_loss", "clip_ratio", "importance_ratio_max", "entropy", "eval_score",
              "learning_rate", "grad_norm", "train_infer_kl", "train_infer_ratio_deviation", "staleness"},
    "nemo_rl": {"reward", "ref_kl", "policy_loss", "importance_ratio_max", "entropy", "response_length",
                "throughput", "step_duration", "eval_score", "learning_rate", "grad_norm", "mfu", "train_infer_kl",
                "train_infer_ratio_deviation", "staleness"},
    "skyrl": {"reward", "ref_kl", "policy_loss", "clip_ratio", "entropy", "response_length", "throughput",
              "step_duration", "eval_score", "learning_rate", "grad_norm", "train_infer_logprob_diff", "staleness"},
    "prime_rl": {"reward", "ref_kl", "policy_loss", "clip_ratio", "entropy", "response_length", "throughput",
                 "step_duration", "eval_score", "gpu_memory_peak", "learning_rate", "grad_norm", "mfu",
                 "train_infer_kl", "staleness"},
}

# units that name the same quantity in a framework: staleness counted in trainer steps is counted in policy versions
SAME_UNIT: dict[str, dict[str, str]] = {
    "nemo_rl": {"{step}": "{version}"},
    "skyrl": {"{step}": "{version}"},
    "prime_rl": {"{step}": "{version}"},
}

# Frameworks whose only running totals are step counts (every counter family ends in ``_steps``); NeMo-RL also
# totals seconds (efficiency), prime-rl tokens, rollouts and tasks (progress).
STEP_COUNTERS_ONLY = {"openrlhf", "slime", "areal", "skyrl"}

# Frameworks whose module has no CONCEPT_TRANSFORMS (every other one defines it).
NO_CONCEPT_TRANSFORMS = {"openrlhf"}

# Frameworks where a key's free part may be another key of the framework, whose family the entry is (SkyRL's
# ``generate_kept/{key}`` and ``eval/all/{key}``).
FREE_PART_NAMES_A_FAMILY = {"skyrl"}

# Keys whose free parts become these labels (family, labels), per framework.
LABEL_CASES: dict[str, dict[str, tuple[str, dict[str, str]]]] = {
    "openrlhf": {
        "eval/eval_openai/gsm8k_pass4": ("rl_openrlhf_eval_pass_at_k", {"taskset": "openai_gsm8k", "k": "4"}),
        "train/math_accuracy": ("rl_openrlhf_reward_extra", {"metric": "math_accuracy"}),
    },
    "slime": {
        "eval/aime-2024-pass@8": ("rl_slime_eval_pass_at_k", {"taskset": "aime-2024", "k": "8"}),
        "eval/aime/error_cat/format_error": ("rl_slime_eval_reward_category_ratio",
                                             {"taskset": "aime", "reason": "format_error"}),
        "perf/train_wait_time": ("rl_slime_perf_timer_seconds", {"operation": "train_wait"}),
    },
    "areal": {
        "ppo_actor/num_turns/max": ("rl_areal_actor_agent_stat", {"metric": "num_turns", "stat": "max"}),
        "timeperf/ref_offload": ("rl_areal_engine_offload_duration_seconds", {"worker": "ref", "operation": "offload"}),
        "ppo_actor/update/compute_logp/linear/abs_error/avg": ("rl_areal_actor_approx_logprob_abs_error",
                                                               {"kind": "linear", "stat": "avg"}),
    },
    "nemo_rl": {
        "ray/node.1.gpu.3.util": ("rl_nemo_rl_ray_gpu_utilization_ratio", {"part": "1", "device_id": "3"}),
        "ray/node.2.mem_gb": ("rl_nemo_rl_ray_node_memory_used_bytes", {"part": "2"}),
        "train/math_with_judge/accuracy/stddev": (
            "rl_nemo_rl_rollout_agent_metric",
            {"stage": "train", "agent": "math_with_judge", "metric": "accuracy", "stat": "stddev"}),
        "validation/total_reward/mean": ("rl_nemo_rl_rollout_total_reward", {"stage": "validation", "stat": "mean"}),
        "validation-helpsteer3/loss": ("rl_nemo_rl_validation_dataset_metric",
                                       {"split": "helpsteer3", "metric": "loss"}),
        "timing/train/get_logprobs/shard_data": ("rl_nemo_rl_timing_train_seconds",
                                                 {"operation": "get_logprobs_shard_data"}),
        "efficiency/idle/refit_bubble_s": ("rl_nemo_rl_efficiency_category_seconds_total",
                                           {"kind": "idle", "operation": "refit_bubble"}),
        "ray/ray/ray_step": ("rl_nemo_rl_ray_monitor_elapsed_seconds", {}),
    },
    "skyrl": {
        "eval/openai/gsm8k/pass_at_4": ("rl_skyrl_eval_pass_at_k_ratio", {"data_source": "openai_gsm8k", "k": "4"}),
        "generate_dropped/avg_num_tokens": ("rl_skyrl_generate_num_tokens",
                                            {"split": "generate_dropped", "stat": "avg"}),
        "eval/all/environment/accuracy": ("rl_skyrl_environment_metric",
                                          {"split": "eval_all_environment", "metric": "accuracy"}),
        "vllm/eval/ttft_seconds_avg": ("rl_skyrl_vllm_request_latency_seconds", {"split": "vllm_eval", "kind": "ttft"}),
        "vllm/num_requests_waiting": ("rl_skyrl_vllm_requests", {"split": "vllm", "kind": "waiting"}),
        "generate/trajectory_time_env_p90": ("rl_skyrl_generate_trajectory_time_seconds",
                                             {"split": "generate", "operation": "env", "stat": "p90"}),
        # the released skyrl 0.3.0's spelling of the end-to-end time (issue 35)
        "eval/all/generate/trajectory_completion_time_p90": (
            "rl_skyrl_generate_trajectory_completion_time_seconds", {"split": "eval_all_generate", "stat": "p90"}),
    },
    "prime_rl": {
        "train/primeintellect/gsm8k/all/solver/rewards/correct_answer/p10": (
            "rl_prime_rl_trace_reward_function",
            {"stage": "train", "env": "primeintellect_gsm8k", "split": "all", "agent": "solver",
             "reward_func": "correct_answer", "stat": "p10"}),
        "eval/aime2024/all/agent/num_turns/max": (
            "rl_prime_rl_trace_turns", {"stage": "eval", "env": "aime2024", "split": "all", "agent": "agent",
                                        "stat": "max"}),
        "eval/aime2024/effective/num_turns/max": (
            "rl_prime_rl_episode_turns", {"stage": "eval", "env": "aime2024", "split": "effective", "stat": "max"}),
        "train/agg/effective/agent/timing/agent/model/p90": (
            "rl_prime_rl_trace_phase_duration_seconds",
            {"stage": "train", "env": "agg", "split": "effective", "agent": "agent", "phase": "agent_model",
             "stat": "p90"}),
        "eval/aime2024/effective/agent/pass^8": (
            "rl_prime_rl_eval_pass_all_k_ratio", {"env": "aime2024", "split": "effective", "agent": "agent", "k": "8"}),
        "mismatch_kl/reverse-text/max": ("rl_prime_rl_mismatch_kl", {"env": "reverse-text", "stat": "max"}),
        "time/step": ("rl_prime_rl_time_unattributed_seconds", {"operation": "step"}),
        "orchestrator/time/step": ("rl_prime_rl_time_seconds", {"component": "orchestrator", "operation": "step"}),
    },
}

# Keys logged in percent or in GiB, served in base units: (framework, key, scale, tracker unit).
BASE_UNIT_CASES = (
    ("nemo_rl", "ray/node.0.gpu.0.util", 0.01, "%"),
    ("nemo_rl", "efficiency/efficiency_pct", 0.01, "%"),
    ("nemo_rl", "train/baseline_reward/pct_mixed", 0.01, "%"),
    ("nemo_rl", "ray/node.0.mem_total_gb", float(2**30), "GiBy"),
    ("skyrl", "ray/gpu.util.avg", 0.01, "%"),
    ("prime_rl", "perf/mfu", 0.01, "%"),
    ("prime_rl", "system/ckpt_disk_free_gib", float(2**30), "GiBy"),
)


def test_the_tables_cover_the_scoped_frameworks():
    assert set(NAMES) <= set(SCOPED_FRAMEWORKS)
    assert set(MIN_FIXTURE_KEYS) == set(EXPECTED_CONCEPTS) == set(NAMES)
    for table in (SHADOWED, SAME_UNIT, LABEL_CASES):
        assert set(table) <= set(NAMES)
    for names in (STEP_COUNTERS_ONLY, NO_CONCEPT_TRANSFORMS, FREE_PART_NAMES_A_FAMILY):
        assert names <= set(NAMES)


# ---------------------------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------------------------


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


def _names_a_family(name: str, value: str, spec: MetricSpec) -> bool:
    """SkyRL's ``generate_kept/{key}`` and ``eval/all/{key}``: the free part is a rollout metric's own key, whose
    family (and unit) the entry is, the subset it is taken over a label (``split``)."""
    found = _own(name, value) or _own(name, "generate/" + value)
    return found is not None and found[0] is spec


_CONCEPTS = {c.name: c for c in CONCEPTS}


def _label_regex(spec: MetricSpec, label: str) -> str:
    return next(regex or "[^/]+" for name, regex in spec.placeholders if name == label)


@pytest.fixture(scope="module", params=NAMES)
def framework(request) -> tuple[str, list[FixtureKey]]:
    return request.param, load(request.param)


# ---------------------------------------------------------------------------------------------------------------
# Generic tests, once per framework
# ---------------------------------------------------------------------------------------------------------------


def test_fixture_names_its_source_version(framework):
    name, keys = framework
    assert len(keys) >= MIN_FIXTURE_KEYS[name], name
    assert "commit" in header(name).lower()
    for k in keys:
        assert k.kind in ("gauge", "counter"), (k.line, k.kind)
        assert k.source and k.meaning, k.line
    assert len({k.key for k in keys}) == len(keys)


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
    """Shadowed keys included: the module covers every key its framework's code emits."""
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
        assert spec is not None
        values = set(labels.values())
        for placeholder, value in k.free_values().items():
            if (value.replace("/", "_") not in values and not any(value in v for v in values)
                    and not (name in FREE_PART_NAMES_A_FAMILY and _names_a_family(name, value, spec))):
                baked.append((k.key, placeholder, value, spec.prometheus_name, labels))
    assert baked == []


@pytest.mark.parametrize(("name", "key"), [(name, key) for name, cases in LABEL_CASES.items() for key in cases])
def test_the_free_parts_become_these_labels(name, key):
    family, labels = LABEL_CASES[name][key]
    res = default_catalog(name).lookup(key)
    assert res is not None and (res.spec.prometheus_name, dict(res.labels)) == (family, labels), key


@pytest.mark.parametrize("name", NAMES)
def test_entries_are_well_formed_prefixed_and_name_their_framework(name):
    specs = _module(name).SPECS
    assert specs
    for spec in specs:
        spec.check()
        assert spec.name.startswith(f"rl_{name}_"), spec.name
        assert spec.source == name, spec.key
        assert spec.description.endswith("."), spec.key
        assert spec.scale == 1.0 or spec.tracker_unit, spec.key
        if name in STEP_COUNTERS_ONLY:
            assert spec.kind is not Kind.COUNTER or spec.name.endswith("_steps"), spec.name


@pytest.mark.parametrize("name", NAMES)
def test_every_entry_example_resolves_to_itself_in_its_framework_catalog(name):
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
    for name in SCOPED_FRAMEWORKS:  # any other scoped framework's module present in this checkout
        if name not in NAMES:
            try:
                others = _module(name).SPECS
            except ModuleNotFoundError:
                continue
            union = Catalog((*union.specs, *others))


def test_every_name_is_promtool_clean():
    """All six frameworks' families in one exposition: each name valid, none clashing with another's."""
    lines = []
    for name in NAMES:
        for spec in _module(name).SPECS:
            lines += [f"# HELP {spec.prometheus_name} {spec.description}",
                      f"# TYPE {spec.prometheus_name} {spec.kind.value}"]
            labels = ",".join(f'{label}="x"' for label in ("run", "rank", *spec.labels))
            lines.append(f"{spec.prometheus_name}{{{labels}}} 1")
    assert promtool_check("\n".join(lines) + "\n") == ""


@pytest.mark.parametrize("name", NAMES)
def test_concept_sources_name_own_families_with_their_labels(name):
    module = _module(name)
    same_unit = SAME_UNIT.get(name, {})
    by_name = {s.prometheus_name: s for s in module.SPECS}
    selectors = {sel for sels in module.CONCEPT_SOURCES.values() for sel in sels}
    for concept, sels in module.CONCEPT_SOURCES.items():
        assert concept in _CONCEPTS, (name, concept)
        assert sels, (name, concept)
        for sel in sels:
            source = Source(sel)
            spec = by_name.get(source.metric)
            assert spec is not None, (name, concept, sel)
            unit = same_unit.get(spec.unit, spec.unit)
            assert spec.kind is Kind.GAUGE and unit == _CONCEPTS[concept].unit, (concept, sel, spec.unit)
            for label, op, value in source.matchers:
                assert label in spec.labels, (sel, label)
                assert op == "=" and re.fullmatch(_label_regex(spec, label), value), (sel, label, value)
    for extra in ("CONCEPT_TRANSFORMS", "CONCEPT_SET_LABELS", "CONCEPT_RENAME_LABELS"):
        assert set(getattr(module, extra, {})) <= selectors, (name, extra)
    assert name in NO_CONCEPT_TRANSFORMS or hasattr(module, "CONCEPT_TRANSFORMS"), name
    for transform in getattr(module, "CONCEPT_TRANSFORMS", {}).values():
        assert "{}" in transform
    for sel, renames in getattr(module, "CONCEPT_RENAME_LABELS", {}).items():
        for _to, frm in renames.items():
            assert frm in by_name[Source(sel).metric].labels, (sel, frm)


def test_the_concepts_each_framework_logs_have_sources_its_keys_feed(framework):
    name, _keys = framework
    module = _module(name)
    assert set(module.CONCEPT_SOURCES) >= EXPECTED_CONCEPTS[name], EXPECTED_CONCEPTS[name] - set(
        module.CONCEPT_SOURCES)
    resolved = [r for key in watched_keys(name) if (r := _own(name, key)) is not None]  # as rl-otel watch reads them
    unfed = []
    for concept, sels in module.CONCEPT_SOURCES.items():
        for sel in sels:
            source = Source(sel)
            if not any(spec.prometheus_name == source.metric
                       and all(labels.get(label) == value for label, _op, value in source.matchers)
                       for spec, labels in resolved):
                unfed.append((concept, sel))
    assert unfed == []


@pytest.mark.parametrize("name", ALL_FRAMEWORKS)
def test_watch_infers_each_framework_from_its_keys(name, monkeypatch):
    """``rl-otel watch --framework auto`` places these frameworks' key sets (and the others' stay theirs)."""
    from rl_otel.watch import frameworks

    present = []
    for scoped in SCOPED_FRAMEWORKS:
        try:
            _module(scoped)
        except ModuleNotFoundError:
            continue
        present.append(scoped)
    monkeypatch.setattr(frameworks, "SCOPED_FRAMEWORKS", tuple(present))
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
    tel = rl_otel.init(run=f"{name}-keys", rank=0, prometheus={"host": "127.0.0.1", "port": 0},
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
        want = {("run", f"{name}-keys"), *labels.items()}
        hit = [v for lbls, v in found.items() if want <= set(lbls)]
        expected = 20.0 if k.kind == "counter" else 0.5 * spec.scale
        assert hit and hit[0] == pytest.approx(expected), (k.key, spec.prometheus_name, found)


# ---------------------------------------------------------------------------------------------------------------
# Particulars of some frameworks, read from the tables above
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "key"), [(name, key) for name, keys in SHADOWED.items() for key in sorted(keys)])
def test_keys_verl_defines_literally_resolve_to_the_framework_own_entries(name, key):
    assert default_catalog().lookup(key).spec.source.startswith("verl"), key  # type: ignore[union-attr]
    spec = default_catalog(name).resolve(key).spec
    assert spec.source == name and spec.templated, (name, key, spec.name)


@pytest.mark.parametrize(("name", "key", "scale", "tracker_unit"), BASE_UNIT_CASES)
def test_percent_and_size_keys_are_served_in_base_units(name, key, scale, tracker_unit):
    spec = default_catalog(name).resolve(key).spec
    assert (spec.source, spec.scale, spec.tracker_unit) == (name, scale, tracker_unit), key
    assert spec.name.endswith("_ratio" if tracker_unit == "%" else "_bytes"), spec.name


def test_other_frameworks_keys_keep_their_meaning_outside_these_catalogs():
    shared = default_catalog()
    for key in ("time/step", "timing/step", "eval/gsm8k/avg_score", "ray/node.0.gpu.0.util", "loss/mean"):
        res = shared.lookup(key)
        assert res is None or res.spec.source not in NAMES, key


# ---------------------------------------------------------------------------------------------------------------
# OpenRLHF
# ---------------------------------------------------------------------------------------------------------------


def test_other_frameworks_train_keys_are_no_openrlhf_extra_log():
    """OpenRLHF's extra_logs catch-all leaves loss, norm, KL, learning-rate and step spellings alone."""
    catalog = default_catalog("openrlhf")
    for key in ("train/pg_loss", "train/kl_loss", "train/lr-pg_0", "train/grad_norm", "train/critic-value_loss",
                "train/global_batch_size", "train/opd_reverse_kl"):
        res = catalog.lookup(key)
        assert res is None or res.spec.source != "openrlhf", (key, res.spec.name)


def test_openrlhf_own_keys_are_never_read_as_a_reward_function_extra_log():
    """Every key OpenRLHF's own code writes (a fixture key without a free part) has an entry of its own: the
    extra-log catch-all described ``train/is_filter_ratio`` (0.11.2's IS-correction filter share) and the DPO,
    reward-model and SFT trainers' ``train/acc``, ``train/chosen_reward``, ... as a reward function's extra log."""
    catalog = default_catalog("openrlhf")
    own_keys = [k for k in load("openrlhf") if not k.placeholders]
    mislabelled = {k.key: res.spec.name for k in own_keys
                   if (res := catalog.resolve(k.key)).spec.name == "rl_openrlhf_reward_extra"}
    assert mislabelled == {}
    assert {"train/is_filter_ratio", "train/acc", "train/chosen_reward", "train/loss_mean"} <= {k.key for k in own_keys}
    extra = catalog.resolve("train/math_accuracy")  # a real extra log still is one
    assert (extra.spec.name, dict(extra.labels)) == ("rl_openrlhf_reward_extra", {"metric": "math_accuracy"})


# ---------------------------------------------------------------------------------------------------------------
# prime-rl
# ---------------------------------------------------------------------------------------------------------------


def _prime_rl_line(writer: str, step: int, when: float, value: float) -> str:
    """One line of ``writer``'s time dict as prime-rl's FileMonitor appends it (its fixture keys, ``time/step`` =
    ``value``)."""
    line = {k: v for k, v in writer_lines("prime_rl")[writer].items() if k.startswith("time/")}
    return json.dumps({"step": step, "time": when, **line, "time/step": value}) + "\n"


def test_prime_rl_trainer_and_orchestrator_lines_are_told_apart():
    """Both processes write time/step and time/save_ckpt to one metrics.jsonl: a line's other keys tell its writer,
    and each writer's time keys are served with its component (a line of neither or both stays as it is)."""
    from rl_otel.watch import jsonl

    catalog = default_catalog("prime_rl")
    for writer, line in writer_lines("prime_rl").items():
        assert {"time/step", "time/save_ckpt"} <= set(line), writer
        parsed = jsonl.parse(json.dumps({"step": 1, "time": 1.0, **line}).encode())
        assert parsed is not None
        times = {key: catalog.resolve(key) for key in parsed[2] if "time/" in key}
        assert len(times) >= 4
        assert {(r.spec.name, dict(r.labels)["component"]) for r in times.values()} == {
            ("rl_prime_rl_time_seconds", writer)}, times
        steps = [dict(r.labels) for r in times.values() if dict(r.labels)["operation"] == "step"]
        assert steps == [{"component": writer, "operation": "step"}]
    both = {**writer_lines("prime_rl")["trainer"], **writer_lines("prime_rl")["orchestrator"]}
    parsed = jsonl.parse(json.dumps({"step": 1, **both}).encode())
    assert parsed is not None and "time/step" in parsed[2]  # one line holding both processes' marks: not told
    assert catalog.resolve("time/step").spec.name == "rl_prime_rl_time_unattributed_seconds"


def test_prime_rl_backfill_keeps_both_processes_step_times(tmp_path):
    """backfill kept one sample per millisecond of the two processes' time/step (one series); each now has its own,
    every sample kept."""
    from rl_otel.watch.backfill import backfill

    run = tmp_path / "outputs" / "run1"
    run.mkdir(parents=True)
    start = 1_700_000_000.0
    lines = [_prime_rl_line(w, s, start + 10 * s, (100 if w == "orchestrator" else 1) + s)
             for s in range(5) for w in ("trainer", "orchestrator")]  # the two lines of a step in the same ms
    (run / "metrics.jsonl").write_text("".join(lines))
    out = tmp_path / "out.om"
    backfill([str(tmp_path / "outputs")], out, framework="prime_rl")
    found: dict[str, list[float]] = {}
    for m in re.finditer(r'^rl_prime_rl_time_seconds\{(.*)\} (\S+) \S+$', out.read_text(), re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if labels["operation"] == "step":
            found.setdefault(labels["component"], []).append(float(m.group(2)))
    assert found == {"trainer": [1.0, 2.0, 3.0, 4.0, 5.0], "orchestrator": [100.0, 101.0, 102.0, 103.0, 104.0]}


def test_prime_rl_watch_serves_both_processes_step_times(tmp_path):
    from tests.test_watch_support import ThreadedWatcher, served, wait_for

    run = tmp_path / "outputs" / "run1"
    run.mkdir(parents=True)
    path = run / "metrics.jsonl"
    with path.open("a") as f:  # the orchestrator's line last: it alone was served before
        f.write(_prime_rl_line("trainer", 0, 1.0, 7.0) + _prime_rl_line("orchestrator", 0, 1.0, 3.0))
    w = ThreadedWatcher([str(tmp_path / "outputs")], framework="auto")
    try:
        url = w.url("run1")
        name = "rl_prime_rl_time_seconds"
        wait_for(lambda: served(url, name, component="orchestrator", operation="step") == 3.0, what="orchestrator")
        assert served(url, name, component="trainer", operation="step") == 7.0
        assert served(url, "target_info", rl_framework="prime_rl") == 1.0
    finally:
        w.close()
