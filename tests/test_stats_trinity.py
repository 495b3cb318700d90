"""Trinity-RFT aggregation: the reference diagrams' numbers, and Trinity's own bootstrap reproduced draw for draw."""

from __future__ import annotations

import math
from itertools import product

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl_otel.catalog import default_catalog
from rl_otel.stats import (bootstrap_best_worst, eval_step_metrics, rollout_step_metrics, run_metrics,
                           task_metrics)


def runs(*accuracies: float) -> list[dict[str, float]]:
    return [{"accuracy": a} for a in accuracies]


SEED_TASKS = [runs(0.8, 0.9), runs(0.6, 0.9), runs(0.95, 0.85)]


def test_rollout_diagram():
    got = rollout_step_metrics(SEED_TASKS)
    assert got == pytest.approx({"rollout/accuracy/mean": 0.8333333, "rollout/accuracy/max": 0.9,
                                 "rollout/accuracy/min": 0.75})
    assert round(got["rollout/accuracy/mean"], 2) == 0.83


def test_eval_task_level_diagram():
    assert task_metrics(SEED_TASKS[0], is_eval=True)["accuracy/mean@2"] == pytest.approx(0.85)
    assert task_metrics(SEED_TASKS[0], is_eval=True)["accuracy/std@2"] == pytest.approx(0.05)
    assert task_metrics(SEED_TASKS[1], is_eval=True)["accuracy/std@2"] == pytest.approx(0.15)
    assert task_metrics(SEED_TASKS[2], is_eval=True)["accuracy/mean@2"] == pytest.approx(0.9)


def test_eval_step_level_diagram():
    got = eval_step_metrics(SEED_TASKS, "dummy")
    assert round(got["eval/dummy/accuracy/mean@2"], 2) == 0.83
    assert round(got["eval/dummy/accuracy/std@2"], 3) == 0.083
    assert set(got) == {f"eval/dummy/accuracy/{s}@2" for s in ("mean", "std", "best", "worst")}


def test_detailed_stats_diagram():
    got = eval_step_metrics(SEED_TASKS, "dummy", detailed_stats=True)
    expected = {"mean@2/mean": 0.83, "mean@2/std": 0.062, "mean@2/max": 0.9, "mean@2/min": 0.75,
                "std@2/mean": 0.083, "std@2/std": 0.047, "std@2/max": 0.15, "std@2/min": 0.05}
    for suffix, value in expected.items():
        key = f"eval/dummy/accuracy/{suffix}"
        assert round(got[key], len(str(value)) - 2) == value, key


def test_bench_prefix_and_catalog_coverage():
    catalog = default_catalog()
    for detailed in (False, True):
        for prefix in ("eval", "bench"):
            for key in eval_step_metrics(SEED_TASKS, "gsm8k-eval", prefix=prefix, detailed_stats=detailed):
                assert catalog.lookup(key).spec.name.startswith(f"rl_{prefix}_metric"), key
    for key in rollout_step_metrics(SEED_TASKS, stats=("mean", "max", "min", "std")):
        assert catalog.lookup(key).spec.name == "rl_rollout_metric", key
    with pytest.raises(ValueError, match="prefix"):
        eval_step_metrics(SEED_TASKS, "x", prefix="val")


def trinity_bootstrap(data, subset_size, reduce_fns, n_bootstrap=1000, seed=42):
    """Trinity-RFT's bootstrap_metric as its monitor code runs it (global numpy seed, one draw per iteration)."""
    np.random.seed(seed)
    lists = [[] for _ in reduce_fns]
    for _ in range(n_bootstrap):
        idxs = np.random.choice(len(data), size=subset_size, replace=True)
        sample = [data[i] for i in idxs]
        for i, fn in enumerate(reduce_fns):
            lists[i].append(fn(sample))
    return [(np.mean(lst), np.std(lst)) for lst in lists]


@settings(max_examples=30, deadline=None)
@given(values=st.lists(st.floats(0, 1), min_size=2, max_size=9))
def test_best_worst_match_trinity_draw_for_draw(values):
    got = task_metrics([{"accuracy": v} for v in values], is_eval=True)
    n, k, sizes = len(values), 2, []
    while k < n:
        sizes.append(k)
        k *= 2
    sizes.append(n)
    assert {key for key in got if key.startswith("accuracy/best@")} == {f"accuracy/best@{k}" for k in sizes}
    for k in sizes:
        (best, _), (worst, _) = trinity_bootstrap(values, k, [np.max, np.min])
        assert got[f"accuracy/best@{k}"] == pytest.approx(best, rel=1e-12, abs=1e-12)
        assert got[f"accuracy/worst@{k}"] == pytest.approx(worst, rel=1e-12, abs=1e-12)


def test_best_at_k_estimates_the_expected_best_of_k():
    values = [0.8, 0.9]
    exact_best = np.mean([max(a, b) for a, b in product(values, repeat=2)])  # 0.875
    exact_worst = np.mean([min(a, b) for a, b in product(values, repeat=2)])  # 0.825
    best, worst = bootstrap_best_worst(values, 2)
    assert best == pytest.approx(exact_best, abs=0.01) and worst == pytest.approx(exact_worst, abs=0.01)
    state = np.random.get_state()[1].copy()
    bootstrap_best_worst(values, 2)
    assert (np.random.get_state()[1] == state).all(), "the global numpy generator must not be touched"
    assert all(math.isnan(v) for v in bootstrap_best_worst([], 2))


def test_single_run_has_no_best_worst_and_time_keys_are_averaged():
    got = task_metrics([{"accuracy": 0.5, "time/task_execution": 3.0}], is_eval=True)
    assert got == {"accuracy/mean@1": 0.5, "accuracy/std@1": 0.0, "time/task_execution": 3.0}


def test_run_level_and_non_numeric_values():
    assert run_metrics([{"reward": 1.0, "tag": "a"}, {"reward": 0.0, "ok": True}]) == {"reward": 0.5}
    assert rollout_step_metrics([]) == {} and eval_step_metrics([[]], "x") == {}


def test_pandas_ddof_is_available():
    got = eval_step_metrics(SEED_TASKS, "dummy", detailed_stats=True, ddof=1)
    assert got["eval/dummy/accuracy/mean@2/std"] == pytest.approx(np.std([0.85, 0.75, 0.9], ddof=1))


def test_eval_batched_across_tasks_equals_each_task_alone_bit_for_bit():
    """eval_step_metrics computes best@k/worst@k for all tasks of one run count at once (chunked); every task's
    figures must equal its own task_metrics() exactly - ragged run counts, missing keys and chunking included."""
    from rl_otel.stats import trinity

    rng = np.random.RandomState(3)
    tasks = [[{"accuracy": float(rng.rand()), "solved": float(rng.rand() > 0.5)} for _ in range(n)]
             for n in [4] * 30 + [3] * 5 + [8] * 7 + [1] * 2]
    tasks[5][2].pop("solved")  # one task where a metric has fewer runs than the others
    alone = [task_metrics(runs, is_eval=True) for runs in tasks]
    batched = trinity._tasks_metrics(tasks, is_eval=True)
    assert batched == alone and all(list(b) == list(a) for b, a in zip(batched, alone))
    small_chunks = trinity._RESAMPLED_VALUES
    try:
        trinity._RESAMPLED_VALUES = 3000  # one task per gather
        assert trinity._tasks_metrics(tasks, is_eval=True) == alone
    finally:
        trinity._RESAMPLED_VALUES = small_chunks
    (best, _), (worst, _) = trinity_bootstrap([r["accuracy"] for r in tasks[40]], 4, [np.max, np.min])
    assert batched[40]["accuracy/best@4"] == pytest.approx(best, rel=1e-12)
    assert batched[40]["accuracy/worst@4"] == pytest.approx(worst, rel=1e-12)
