from __future__ import annotations

from pathlib import Path

import pytest

from rl_otel.catalog import Catalog, Kind, MetricSpec, default_catalog, strip_reducer_tag
from rl_otel.catalog.naming import check_name, fallback_spec_name
from tests.promtools import promtool_check

SEED_DOC_KEYS = Path(__file__).resolve().parent / "data" / "seed_doc_keys.txt"
CATALOG = default_catalog()


def test_every_seed_key_has_an_entry(seed_keys):
    unknown = [k for k in seed_keys if not CATALOG.resolve(k).known]
    assert unknown == []
    assert len(seed_keys) > 400


def _seed_doc_keys() -> dict[str, list[str]]:
    """``{document: [keys it names]}`` (tests/data/seed_doc_keys.txt: the seed documents' key lists, shipped)."""
    out: dict[str, list[str]] = {}
    for line in SEED_DOC_KEYS.read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            doc, key = line.split("\t")
            out.setdefault(doc, []).append(key)
    return out


def test_seed_fixture_covers_every_key_the_seed_documents_name(seed_keys):
    """The fixture (seed_keys.txt) is the seed documents' keys with their templates filled: it covers every key
    ROLL's and Trinity-RFT's metric references name (their lists ship in tests/data, so this runs in any clone)."""
    named = _seed_doc_keys()
    assert len(named["roll"]) == 89 and len(named["trinity"]) == 28
    filled = {k.replace("{metric_infix}", "actor_train/train_step").replace("{device_id}", "0") for k in named["roll"]}
    assert filled - set(seed_keys) == set()
    assert set(named["trinity"]) - set(seed_keys) == set()
    for example in ("rollout/accuracy/mean", "eval/gsm8k-eval/accuracy/mean@4", "bench/gsm8k-eval/accuracy/best@4",
                    "eval/dummy/accuracy/std@2/min", "experience_pipeline/group_advantages/reward_mean/mean",
                    "sample/model_version/mean", "sample/task_count", "timing_per_token_ms/update_critic"):
        assert example in named["trinity"]


def test_no_two_seed_keys_share_a_series(seed_keys):
    owner: dict[tuple, str] = {}
    for key in seed_keys:
        r = CATALOG.resolve(key)
        series = (r.spec.name, r.labels)
        assert series not in owner, f"{key} and {owner[series]} map to the same series"
        owner[series] = key


@pytest.mark.parametrize("key,name,labels", [
    ("memory/actor_train/train_step/end/onload/max_allocated_frac/0", "rl_gpu_memory_peak_ratio",
     {"cluster": "actor_train", "phase": "train_step", "kind": "max_allocated", "device_id": "0"}),
    ("memory/actor_train/generate/start/offload/reserved/7", "rl_gpu_memory_bytes",
     {"cluster": "actor_train", "phase": "generate", "stage": "start_offload", "kind": "reserved", "device_id": "7"}),
    ("memory/cpu/critic/compute_values/end/vms", "rl_cpu_memory_bytes",
     {"cluster": "critic", "phase": "compute_values", "stage": "end", "kind": "vms"}),
    ("time/actor_infer/generate/onload", "rl_phase_last_duration_seconds",
     {"cluster": "actor_infer", "phase": "generate", "part": "onload"}),
    ("time/rollout", "rl_operation_duration_seconds", {"operation": "rollout"}),
    ("eval/gsm8k/accuracy/mean@4", "rl_eval_metric",
     {"taskset": "gsm8k", "metric": "accuracy", "stat": "mean", "k": "4"}),
    ("eval/gsm8k/accuracy/mean@4/std", "rl_eval_metric_across_tasks",
     {"taskset": "gsm8k", "metric": "accuracy", "stat": "mean", "k": "4", "across": "std"}),
    ("bench/math500/pass/worst@16", "rl_bench_metric",
     {"taskset": "math500", "metric": "pass", "stat": "worst", "k": "16"}),
    ("critic/score/mean", "rl_critic_score", {"stat": "mean"}),
    ("actor/ratio_max", "rl_actor_importance_ratio", {"stat": "max"}),
    ("ppo/loss/total", "rl_ppo_loss", {"kind": "total"}),
    ("actor/pg_loss@sum", "rl_actor_pg_loss", {}),
])
def test_templated_keys_become_labels(key, name, labels):
    r = CATALOG.resolve(key)
    assert r.known and r.spec.name == name and dict(r.labels) == labels


def test_units_are_base_units_with_the_tracker_unit_kept():
    gpu = CATALOG.resolve("memory/a/b/start/onload/allocated/0").spec
    assert (gpu.unit, gpu.tracker_unit, gpu.scale) == ("By", "GiBy", 2.0**30)
    per_token = CATALOG.resolve("timing_per_token_ms/adv").spec
    assert (per_token.unit, per_token.scale) == ("s", 1e-3)
    assert CATALOG.resolve("system/samples").spec.prometheus_name == "rl_system_samples_total"


def test_reducer_tags_are_stripped_but_trinity_at_k_is_not():
    assert strip_reducer_tag("actor/pg_loss@sum") == "actor/pg_loss"
    assert strip_reducer_tag("actor/clipfrac@mean") == "actor/clipfrac"
    assert strip_reducer_tag("eval/x/acc/mean@4") == "eval/x/acc/mean@4"


def test_every_entry_example_resolves_to_itself():
    for spec in CATALOG:
        assert spec.examples, spec.key
        for example in spec.examples:
            assert CATALOG.resolve(example).spec is spec, (example, spec.key)


def test_every_catalog_name_is_promtool_clean():
    lines = []
    for spec in CATALOG:
        ptype = {"gauge": "gauge", "counter": "counter", "histogram": "histogram"}[spec.kind.value]
        lines += [f"# HELP {spec.prometheus_name} {spec.description}", f"# TYPE {spec.prometheus_name} {ptype}"]
        labels = ",".join(f'{label}="x"' for label in ("run", "rank", *spec.labels))
        if spec.kind is Kind.HISTOGRAM:
            lines += [f'{spec.name}_bucket{{{labels},le="+Inf"}} 1', f"{spec.name}_sum{{{labels}}} 1",
                      f"{spec.name}_count{{{labels}}} 1"]
        else:
            lines.append(f"{spec.prometheus_name}{{{labels}}} 1")
    assert promtool_check("\n".join(lines) + "\n") == ""


def test_catalog_rejects_conflicting_entries():
    a = MetricSpec("a/x", "rl_a", Kind.GAUGE, "1", "a", "test")
    with pytest.raises(ValueError, match="share the name"):
        Catalog([a, MetricSpec("b/x", "rl_a", Kind.GAUGE, "1", "b", "test")])
    with pytest.raises(ValueError, match="already exposed"):
        Catalog([MetricSpec("hist", "rl_hist", Kind.HISTOGRAM, "1", "h", "test", buckets=(1.0,)),
                 MetricSpec("g", "rl_hist_count", Kind.GAUGE, "1", "g", "test")])
    with pytest.raises(ValueError, match="must end in '_seconds'"):
        MetricSpec("t", "rl_t", Kind.GAUGE, "s", "t", "test")
    with pytest.raises(ValueError, match="bounded labels"):
        MetricSpec("x/{step}", "rl_x", Kind.GAUGE, "1", "x", "test")
    with pytest.raises(ValueError, match="abbreviations"):
        check_name("rl_time_ms")


@pytest.mark.parametrize("key,name", [
    ("custom/myLoss-v2", "rl_custom_my_loss_v2"),
    ("perf/time_ms", "rl_perf_time_seconds"),
    ("a/b_total", "rl_ab_total_value"),
    ("queue/size_count", "rl_queue_size_count_value"),
    ("my gauge", "rl_mygauge"),
    ("", "rl_unnamed"),
    ("rl/x", "rl_x"),
])
def test_fallback_names_are_sanitized(key, name):
    assert fallback_spec_name(key)[0] == name
    r = CATALOG.resolve(key)
    assert not r.known and r.spec.name == name


@pytest.mark.parametrize("key,name,unit,scale,tracker_unit", [
    ("custom/step_time", "rl_custom_step_time_seconds", "s", 1.0, ""),
    ("custom/train_runtime", "rl_custom_train_runtime_seconds", "s", 1.0, ""),
    ("custom/rollout_ms", "rl_custom_rollout_seconds", "s", 1e-3, "ms"),
    ("timing_s/my_phase", "rl_timing_my_phase_seconds", "s", 1.0, ""),
    ("custom/latency", "rl_custom_latency_seconds", "s", 1.0, ""),
    ("custom/peak_gb", "rl_custom_peak_bytes", "By", float(2**30), "GiBy"),
    ("custom/loss", "rl_custom_loss", "1", 1.0, ""),
])
def test_fallback_infers_units_from_the_usual_spellings(key, name, unit, scale, tracker_unit):
    r = CATALOG.resolve(key)
    assert not r.known
    assert (r.spec.name, r.spec.unit, r.spec.scale, r.spec.tracker_unit) == (name, unit, scale, tracker_unit)


def test_fallback_names_are_promtool_clean():
    keys = ["perf/time_ms", "a/b_total", "x/s", "gauge", "m/s/x", "kb/mb/gb", "foo/MegaBytes", "hours/used",
            "A/B/C", "üñí/çødé", "q_bucket", "z_info", "kilo/bytes", "milliseconds/x"]
    lines = []
    for k in keys:
        n = fallback_spec_name(k)[0]
        lines += [f"# HELP {n} x", f"# TYPE {n} gauge", f"{n} 1"]
    assert promtool_check("\n".join(lines) + "\n") == ""


def test_json_and_markdown_list_every_entry():
    import json

    entries = json.loads(CATALOG.to_json())
    assert len(entries) == len(CATALOG)
    assert {"key", "otel_name", "prometheus_name", "kind", "unit", "labels", "description"} <= set(entries[0])
    md = CATALOG.to_markdown()
    for spec in CATALOG:
        assert f"`{spec.prometheus_name}`" in md


def test_committed_metrics_doc_is_current():
    from rl_otel.catalog import every_entry

    doc = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"
    assert doc.read_text() == every_entry().to_markdown() + "\n", \
        "regenerate: rl-otel catalog --format markdown > docs/metrics.md"


def test_every_built_in_entry_passes_the_checks_it_skipped_at_import():
    """rl_otel's own entries are made without MetricSpec.check() (built_in(): a third of the catalog's import
    cost); this is where they are checked, every one."""
    from rl_otel.catalog import meta

    specs = [*CATALOG, meta.TARGET_INFO]
    assert len(specs) > 600
    for spec in specs:
        spec.check()
    assert spec.placeholders == ()  # computed for built-in entries too
    assert CATALOG.by_name("rl_phase_duration_seconds").placeholders[0] == ("cluster", None)


def test_an_entry_defined_elsewhere_is_checked_when_made_even_beside_the_built_in_ones():
    import threading

    from rl_otel.catalog.spec import built_in

    with pytest.raises(ValueError, match="abbreviations"):
        MetricSpec("user/t", "rl_user_time_ms", Kind.GAUGE, "1", "t", "user")
    with built_in():
        unchecked = MetricSpec("user/t", "rl_user_time_ms", Kind.GAUGE, "1", "t", "user")
        errors: list[Exception] = []

        def other_thread() -> None:  # built_in() is this thread's: another thread's entries are still checked
            try:
                MetricSpec("user/x/{step}", "rl_user_x", Kind.GAUGE, "1", "x", "user")
            except ValueError as exc:
                errors.append(exc)

        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
    assert len(errors) == 1 and "bounded labels" in str(errors[0])
    with pytest.raises(ValueError, match="abbreviations"):
        unchecked.check()
    with pytest.raises(ValueError, match="abbreviations"):  # and after the block, checked again
        MetricSpec("user/t", "rl_user_time_ms", Kind.GAUGE, "1", "t", "user")
