"""Trinity-RFT aggregation: the reference diagrams' numbers, and key-for-key agreement with Trinity-RFT 0.6.0's own
``trinity.utils.metrics`` (scripts/test.sh installs it from requirements-frameworks.txt; those tests skip without
it)."""

from __future__ import annotations

import math
import random
from itertools import product

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl_otel.catalog import default_catalog
from rl_otel.stats import bootstrap_best_worst, eval_step_metrics, rollout_step_metrics, run_metrics, task_metrics
from rl_otel.stats import trinity as rl_trinity

pytestmark = pytest.mark.slow  # the slow layer (tests/conftest.py)


@pytest.fixture(scope="module")
def ref():
    """Trinity-RFT's own aggregation module (needs numpy only)."""
    return pytest.importorskip("trinity.utils.metrics")


def runs(*accuracies: float) -> list[dict[str, float]]:
    return [{"accuracy": a} for a in accuracies]


SEED_TASKS = [runs(0.8, 0.9), runs(0.6, 0.9), runs(0.95, 0.85)]


# --- Trinity's pipeline, driven the way its explorer drives it ------------------------------------------------

def ref_rollout(ref, tasks, stats=None):
    """rollout_coordinator: aggregate_metrics(prefix="rollout") over calculate_task_level_metrics of each task."""
    per_task = [ref.calculate_task_level_metrics(runs_, False) for runs_ in tasks]
    return ref.aggregate_metrics(per_task, prefix="rollout", default_output_stats=stats)


def ref_eval(ref, tasks, taskset, prefix="eval", detailed_stats=False, per_task=None):
    """rollout_coordinator: aggregate_eval_metrics(prefix="eval/{taskset}") over the tasks' eval task metrics."""
    if per_task is None:
        per_task = [ref.calculate_task_level_metrics(runs_, True) for runs_ in tasks]
    return ref.aggregate_eval_metrics(per_task, prefix=f"{prefix}/{taskset}", detailed_stats=detailed_stats)


def assert_same(ours: dict, theirs: dict) -> float:
    """Same keys in the same order, Python floats, equal to float tolerance (NaN where Trinity has NaN); returns the
    largest absolute difference."""
    assert list(ours) == list(theirs), (sorted(set(ours) - set(theirs)), sorted(set(theirs) - set(ours)))
    worst = 0.0
    for key, value in ours.items():
        expected = theirs[key]
        assert type(value) is float and type(expected) is float, (key, type(value), type(expected))
        if math.isnan(expected):
            assert math.isnan(value), (key, value)
            continue
        assert value == pytest.approx(expected, rel=1e-12, abs=1e-12), (key, value, expected)
        worst = max(worst, abs(value - expected))
    return worst


def check_all_levels(ref, tasks) -> None:
    """Every level (run, task, rollout step, eval/bench taskset with and without detailed_stats) of ``tasks``."""
    per_task = [ref.calculate_task_level_metrics(runs_, True) for runs_ in tasks]
    for runs_, expected in zip(tasks, per_task, strict=True):
        assert_same(run_metrics(runs_), ref.aggregate_run_level_metrics(runs_))
        assert_same(task_metrics(runs_, is_eval=False), ref.calculate_task_level_metrics(runs_, False))
        assert_same(task_metrics(runs_, is_eval=True), expected)
    assert_same(rollout_step_metrics(tasks), ref_rollout(ref, tasks))
    assert_same(rollout_step_metrics(tasks, stats=("mean", "max", "min", "std")),
                ref_rollout(ref, tasks, ["mean", "max", "min", "std"]))
    for prefix, detailed in product(("eval", "bench"), (False, True)):
        assert_same(eval_step_metrics(tasks, "gsm8k", prefix=prefix, detailed_stats=detailed),
                    ref_eval(ref, tasks, "gsm8k", prefix, detailed, per_task))


# --- the reference diagrams ------------------------------------------------------------------------------------

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


# --- Trinity's own functions, key for key ----------------------------------------------------------------------

def test_diagram_inputs_match_trinity(ref):
    check_all_levels(ref, SEED_TASKS)


def test_suffixes_change_reduction_and_key(ref):
    """The issue's numbers: a :sum metric is the step's grand total, a :max metric the step's largest value."""
    tasks = [[{"accuracy": 1.0, "turns:sum": 1.0, "format_error:max": 0.0, "length:min": 7.0, "version:last": 1.0},
              {"accuracy": 0.0, "turns:sum": 1.0, "format_error:max": 1.0, "length:min": 5.0, "version:last": 2.0},
              {"accuracy": 1.0, "turns:sum": 1.0, "format_error:max": 0.0, "length:min": 9.0, "version:last": 3.0}]]
    got = rollout_step_metrics(tasks)
    assert got["rollout/turns/sum"] == 3.0 and got["rollout/format_error/max"] == 1.0
    assert got["rollout/length/min"] == 5.0 and got["rollout/version/last"] == 3.0
    assert not any(":" in key for key in got) and "rollout/turns/mean" not in got
    assert task_metrics(tasks[0], is_eval=True)["turns:sum"] == 3.0
    two = [tasks[0], [{"turns:sum": 9.0}, {"turns:sum": 100.0}]]
    assert rollout_step_metrics(two)["rollout/turns/sum"] == 112.0
    assert eval_step_metrics(two, "ts")["eval/ts/turns/sum"] == 112.0
    check_all_levels(ref, tasks)
    check_all_levels(ref, two)


def test_key_parsing_edge_cases_match_trinity(ref):
    """``a:std`` is a plain metric, ``x:mean`` merges with ``x``, only the last ``:`` counts, and a plain ``y`` and a
    ``y:max`` both write ``rollout/y/max`` (the later group wins) - all as in Trinity."""
    for key in ("a", "a:std", "x:mean", "b:c:sum", "a:sum:mean", ":sum", "x:", "time/run_execution:max"):
        assert rl_trinity.parse_key(key) == (lambda n, a: (n, a.value))(*ref.parse_metric_key(key)), key
    tasks = [[{"x": 1.0, "x:mean": 3.0, "a:std": 0.5, "y": 2.0, "y:max": 7.0, "b:c:sum": 1.0, "a:sum:mean": 4.0,
               "a:sum": 2.0},
              {"y:max": 1.0, "y": 5.0, "a:sum": 6.0, "x:": 2.0}],
             [{"y": 0.5, "a:sum": 1.0, "a:sum:mean": 0.0, "b:c:sum": 2.0}]]
    check_all_levels(ref, tasks)
    assert rollout_step_metrics(tasks)["rollout/y/max"] == 7.0  # y:max (7, 1 | -) after y's max (5, 0.5)


def test_rollout_has_no_std(ref):
    tasks = [runs(0.1, 0.5, 0.9), runs(0.4), runs(1.0, 0.0)]
    got = rollout_step_metrics(tasks)
    assert list(got) == ["rollout/accuracy/mean", "rollout/accuracy/max", "rollout/accuracy/min"]
    assert_same(got, ref_rollout(ref, tasks))
    with pytest.raises(ValueError, match="stat"):
        rollout_step_metrics(tasks, stats=("mean", "median"))


def test_std_is_population_std_like_trinity(ref):
    """np.std (ddof=0) at the task level (std@n) and across tasks (detailed_stats): the default matches Trinity
    exactly; ddof=1 is available but departs from it."""
    tasks = [runs(1, 0, 1, 1, 0), runs(0.2, 0.3, 0.9, 0.1, 0.5), runs(0.7, 0.7, 0.6, 0.9, 0.8)]
    got = eval_step_metrics(tasks, "ts", detailed_stats=True)
    assert_same(got, ref_eval(ref, tasks, "ts", detailed_stats=True))
    assert task_metrics(tasks[0], is_eval=True)["accuracy/std@5"] == pytest.approx(0.4898979, abs=1e-7)
    means = [np.mean([r["accuracy"] for r in t]) for t in tasks]
    assert got["eval/ts/accuracy/mean@5/std"] == pytest.approx(np.std(means, ddof=0), rel=1e-12)
    ddof1 = eval_step_metrics(tasks, "ts", detailed_stats=True, ddof=1)["eval/ts/accuracy/mean@5/std"]
    assert ddof1 == pytest.approx(np.std(means, ddof=1)) and abs(ddof1 - got["eval/ts/accuracy/mean@5/std"]) > 0.01


def test_differing_run_counts_give_separate_at_k_keys(ref):
    tasks = [runs(0.1, 0.2, 0.3, 0.4), runs(0.5, 0.6, 0.7), runs(0.9, 0.8, 0.7, 0.6), runs(0.3), runs()]
    got = eval_step_metrics(tasks, "ts")
    assert {"eval/ts/accuracy/mean@4", "eval/ts/accuracy/mean@3", "eval/ts/accuracy/mean@1",
            "eval/ts/accuracy/best@4", "eval/ts/accuracy/best@3", "eval/ts/accuracy/best@2"} <= set(got)
    assert got["eval/ts/accuracy/mean@4"] == pytest.approx(0.5) and got["eval/ts/accuracy/mean@1"] == 0.3
    check_all_levels(ref, tasks)


def test_value_types_are_filtered_like_trinity(ref):
    """Mirrored on purpose: bools count as 0/1, ints and np.float64 count; np.float32, np.int64, strings, None
    are skipped."""
    rows = [{"reward": 1.0, "tag": "a", "ok": True, "n": 3, "f32": np.float32(0.5), "i64": np.int64(2),
             "f64": np.float64(0.25), "none": None},
            {"reward": 0.0, "ok": False, "n": 4, "f32": np.float32(1.5), "f64": np.float64(0.75)}]
    assert run_metrics(rows) == {"reward": 0.5, "ok": 0.5, "n": 3.5, "f64": 0.5}
    assert_same(run_metrics(rows), ref.aggregate_run_level_metrics(rows))
    check_all_levels(ref, [rows, rows[::-1], [{"ok": True}]])
    assert rollout_step_metrics([]) == {} and eval_step_metrics([[]], "x") == {}
    assert eval_step_metrics([[{"f32": np.float32(1.0)}]], "x") == {}


def test_time_keys_are_averaged_and_nan_propagates_like_trinity(ref):
    nan = float("nan")
    tasks = [[{"accuracy": 0.5, "time/run_execution": 2.0, "score": nan, "turns:sum": nan, "hi:max": 1.0},
              {"accuracy": nan, "time/run_execution": 4.0, "score": 1.0, "turns:sum": 2.0, "hi:max": nan},
              {"time/task_execution": 7.0}],
             [{"accuracy": 1.0, "time/run_execution": 1.0, "score": 0.5, "turns:sum": 1.0, "hi:max": nan},
              {"accuracy": 0.0, "time/run_execution": 3.0, "score": 0.5, "turns:sum": 1.0, "hi:max": 2.0}]]
    got = task_metrics(tasks[0], is_eval=True)
    assert got["time/run_execution"] == 3.0 and got["time/task_execution"] == 7.0
    assert not any(key.startswith("time/") and "@" in key for key in got)
    check_all_levels(ref, tasks)


def test_single_run_has_no_best_worst(ref):
    got = task_metrics([{"accuracy": 0.5, "time/task_execution": 3.0}], is_eval=True)
    assert got == {"accuracy/mean@1": 0.5, "accuracy/std@1": 0.0, "time/task_execution": 3.0}
    check_all_levels(ref, [[{"accuracy": 0.5, "time/task_execution": 3.0}]])


KEYS = ("accuracy", "reward", "x", "x:mean", "a:std", "turns:sum", "format_error:max", "len:min", "version:last",
        "time/run_execution")
VALUES = st.one_of(st.floats(-2, 2), st.sampled_from([0.0, 1.0, float("nan"), True, False, 3, np.float64(0.25),
                                                      np.float32(0.5)]))
TASKS = st.lists(st.lists(st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=6), max_size=9), max_size=5)


@settings(max_examples=30, deadline=None)
@given(tasks=TASKS)
def test_random_steps_match_trinity_key_for_key(ref, tasks):
    check_all_levels(ref, tasks)


def test_varied_steps_match_trinity_key_for_key(ref):
    """Larger steps than the property test: up to 10 tasks, 1 to 16 runs, suffixed keys, NaN, timings."""
    rnd = random.Random(7)

    def value():
        r = rnd.random()
        return (float("nan") if r < 0.02 else True if r < 0.05 else rnd.randint(0, 5) if r < 0.1
                else float(rnd.random() < 0.5) if r < 0.4 else rnd.random())

    for _ in range(8):
        tasks = []
        for _ in range(rnd.randint(1, 10)):
            n = rnd.choice([1, 2, 3, 4, 5, 8, 9, 16])
            task = [{key: value() for key in rnd.sample(KEYS, rnd.randint(1, len(KEYS)))} for _ in range(n)]
            tasks.append([*task, {"time/task_execution": rnd.random()}])
        check_all_levels(ref, tasks)


@settings(max_examples=30, deadline=None)
@given(values=st.lists(st.floats(0, 1), min_size=2, max_size=9))
def test_best_worst_match_trinity_draw_for_draw(ref, values):
    got = task_metrics([{"accuracy": v} for v in values], is_eval=True)
    n, k, sizes = len(values), 2, []
    while k < n:
        sizes.append(k)
        k *= 2
    sizes.append(n)
    assert {key for key in got if key.startswith("accuracy/best@")} == {f"accuracy/best@{k}" for k in sizes}
    for k in sizes:
        (best, _), (worst, _) = ref.bootstrap_metric(values, k, [max, min], seed=42)
        assert got[f"accuracy/best@{k}"] == pytest.approx(best, rel=1e-12, abs=1e-12)
        assert got[f"accuracy/worst@{k}"] == pytest.approx(worst, rel=1e-12, abs=1e-12)


def test_bootstrap_takes_nan_like_pythons_max_and_min(ref):
    """Trinity reduces each resample with Python's max/min: a NaN first draw makes the subset NaN, a later NaN is
    skipped. With few resamples that yields numbers where np.max would give NaN."""
    values = [0.3, float("nan"), 0.9, 0.1, 0.7]
    finite = 0
    for n_bootstrap, k, seed in product((1, 2, 3, 5, 8, 50), (2, 3, 5), (42, 0, 7)):
        (best, _), (worst, _) = ref.bootstrap_metric(values, k, [max, min], n_bootstrap=n_bootstrap, seed=seed)
        got = bootstrap_best_worst(values, k, n_bootstrap=n_bootstrap, seed=seed)
        assert_same({"best": got[0], "worst": got[1]}, {"best": best, "worst": worst})
        finite += not math.isnan(best)
    assert finite >= 10


def test_best_at_k_estimates_the_expected_best_of_k():
    values = [0.8, 0.9]
    exact_best = np.mean([max(a, b) for a, b in product(values, repeat=2)])  # 0.875
    exact_worst = np.mean([min(a, b) for a, b in product(values, repeat=2)])  # 0.825
    best, worst = bootstrap_best_worst(values, 2)
    assert best == pytest.approx(exact_best, abs=0.01) and worst == pytest.approx(exact_worst, abs=0.01)
    state = np.random.get_state()[1].copy()
    bootstrap_best_worst(values, 2)
    eval_step_metrics(SEED_TASKS, "x")
    assert (np.random.get_state()[1] == state).all(), "the global numpy generator must not be touched"
    assert all(math.isnan(v) for v in bootstrap_best_worst([], 2))


def test_eval_batched_across_tasks_equals_each_task_alone_bit_for_bit():
    """eval_step_metrics computes best@k/worst@k of all (task, metric) pairs with the same number of values at once
    (chunked); every task's figures must equal its own task_metrics() exactly - ragged run counts, missing keys,
    NaN and chunking included."""
    rng = np.random.RandomState(3)
    tasks = [[{"accuracy": float(rng.rand()), "solved": float(rng.rand() > 0.5)} for _ in range(n)]
             for n in [4] * 30 + [3] * 5 + [8] * 7 + [1] * 2 + [130] * 3]
    tasks[5][2].pop("solved")  # one task where a metric has fewer runs than the others
    tasks[7][1]["accuracy"] = float("nan")
    alone = [task_metrics(runs_, is_eval=True) for runs_ in tasks]

    def same(a, b):
        return all(list(x) == list(y) and all(x[k] == y[k] or (math.isnan(x[k]) and math.isnan(y[k])) for k in x)
                   for x, y in zip(a, b, strict=True))

    assert same(rl_trinity._eval_tasks_metrics(tasks, 1000, 42), alone)
    budget = rl_trinity._RESAMPLED_VALUES
    try:
        rl_trinity._RESAMPLED_VALUES = 3000  # three rows per chunk
        assert same(rl_trinity._eval_tasks_metrics(tasks, 1000, 42), alone)
    finally:
        rl_trinity._RESAMPLED_VALUES = budget


def test_catalog_covers_every_emitted_key():
    catalog = default_catalog()
    tasks = [[{"accuracy": 1.0, "turns:sum": 2.0, "format_error:max": 0.0, "length:min": 3.0, "version:last": 1.0,
               "time/run_execution": 1.0},
              {"accuracy": 0.0, "turns:sum": 1.0, "format_error:max": 1.0, "length:min": 2.0, "version:last": 2.0,
               "time/run_execution": 2.0},
              {"time/task_execution": 3.0}]] * 3
    keys = [*rollout_step_metrics(tasks), *rollout_step_metrics(tasks, stats=("mean", "max", "min", "std"))]
    for prefix, detailed in product(("eval", "bench"), (False, True)):
        keys += eval_step_metrics(tasks, "gsm8k-eval", prefix=prefix, detailed_stats=detailed)
    assert len(keys) > 80
    for key in keys:
        name = catalog.lookup(key).spec.name
        assert name.startswith(f"rl_{key.split('/')[0]}_"), (key, name)
    with pytest.raises(ValueError, match="prefix"):
        eval_step_metrics(SEED_TASKS, "x", prefix="val")
