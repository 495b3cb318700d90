"""Trinity-RFT 0.6.0's metric aggregation (``trinity.utils.metrics``), reproduced key for key and value for value.

Trinity reduces a workflow metric in four stages; each function here is one or more of them:

- run level (:func:`run_metrics`, Trinity's ``aggregate_run_level_metrics``): over one run's experiences;
- task level (:func:`task_metrics`, ``calculate_task_level_metrics``): over one task's runs;
- step level for a rollout (:func:`rollout_step_metrics`, ``aggregate_metrics(prefix="rollout")`` over the
  step's tasks) and for an eval/bench taskset (:func:`eval_step_metrics`, ``aggregate_eval_metrics``).

A key may end in an aggregation suffix, ``name:sum``, ``name:max``, ``name:min``, ``name:last`` or ``name:mean``
(the key is split at its last ``:``; any other ending is part of the name, so ``a:std`` is a plain metric). A plain
(mean) metric is averaged over the experiences of a run and then over the runs of a task; at the step level it
becomes ``rollout/{name}/mean``, ``/max`` and ``/min`` over the step's tasks (``np.mean``/``np.max``/``np.min``).
Trinity 0.6.0 emits **no** ``rollout/{name}/std``: its explorer passes no stats, so the default
``("mean", "max", "min")`` applies (``stats=`` can ask for ``"std"``, which Trinity's own function accepts too).
A suffixed metric is reduced with Python's ``sum``/``max``/``min``/last value at *every* stage, and the suffix
moves into the emitted key: ``turns:sum`` becomes ``rollout/turns/sum``, the step's grand total (summed over
experiences, runs and tasks), and ``format_error:max`` becomes ``rollout/format_error/max``, the largest value
anywhere in the step. ``name:mean`` is the same metric as ``name``. When a plain ``x`` and an ``x:max`` both
occur, both write ``rollout/x/max`` and the later one (in first-seen order) wins, as in Trinity.

For eval and bench tasks, the task level turns each plain metric with ``n`` values into ``{name}/mean@{n}``,
``{name}/std@{n}`` (``np.std``: the population std, ``ddof=0``) and, when ``n > 1``, ``{name}/best@{k}`` and
``{name}/worst@{k}`` for ``k`` = 2, 4, 8, ... below ``n``, and ``n``. Keys containing ``time/task_execution`` or
``time/run_execution`` are only averaged, and suffixed keys are reduced as above. The taskset level averages each
task key over the tasks that have it: ``{prefix}/{taskset}/{name}/mean@4``; with ``detailed_stats`` it emits
``.../mean@4/{mean,max,min,std}`` across the tasks instead (``np.std``, ``ddof=0``). Suffixed keys become
``{prefix}/{taskset}/{name}/{sum,max,min,last}`` either way. Tasks with different run counts give different
``@n`` keys, each averaged over the tasks that have it.

``best@k``/``worst@k`` are Trinity's bootstrap, reproduced draw for draw: 1000 subsets of size ``k`` drawn *with
replacement* from the task's values by numpy's legacy generator seeded with 42, and the mean of the subsets'
maxima (minima) taken with Python's ``max``/``min``, so a subset whose first draw is NaN counts as NaN and later
NaN draws are skipped. best@k estimates the expected best of ``k`` runs; best@n is not the best run. Trinity
re-seeds numpy's *global* generator on every call; here a private ``RandomState(seed)`` gives the same draws
without touching global state, and one draw of indices serves every task and metric with the same ``n``, the
subsets of all of them gathered and reduced together (bit-identical to the per-task computation).

Values: like Trinity, only ``isinstance(value, (int, float))`` is aggregated. ``bool`` counts (True is 1.0),
``np.float64`` counts (it subclasses ``float``); ``np.float32``, ``np.int64``, tensors, strings and ``None`` are
skipped silently. Convert them with ``float()`` (or ``.item()``) to have them counted.

Not reproduced: ``{prefix}/finished_task_count``, ``time/run_execution`` and ``time/task_execution``, which
Trinity's explorer, runner and scheduler add around these functions; put the timings into the run dicts
yourself if you want them aggregated.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Any

import numpy as np

Metrics = Mapping[str, Any]
AGGREGATIONS = ("mean", "sum", "max", "min", "last")
STATS = ("mean", "max", "min", "std")
ROLLOUT_STATS = ("mean", "max", "min")  # what Trinity 0.6.0's explorer emits for a plain rollout metric
DETAILED_STATS = ("mean", "max", "min", "std")  # aggregate_eval_metrics' output_stats, in its order

_REDUCERS: dict[str, Callable[[list[float]], float]] = {
    "sum": sum, "max": max, "min": min, "last": lambda values: values[-1]}


def parse_key(key: str) -> tuple[str, str]:
    """``(name, aggregation)`` of a metric key: ``"turns:sum"`` -> ``("turns", "sum")``, ``"a:std"`` ->
    ``("a:std", "mean")`` (only the last ``:`` counts, and only a known aggregation is a suffix)."""
    name, colon, agg = key.rpartition(":")
    if colon and agg in AGGREGATIONS:
        return name, agg
    return key, "mean"


_COUNTED = (int, float)  # as in Trinity: bools count, np.float64 counts; np.float32, np.int64, tensors do not


def _by_key(rows: Iterable[Metrics]) -> dict[str, tuple[str, list[float]]]:
    """Values per canonical key (``name`` for mean metrics, ``name:agg`` otherwise), with the aggregation of the
    key's first occurrence; the run and task levels group this way."""
    groups: dict[str, tuple[str, list[float]]] = {}
    for row in rows:
        for key, value in row.items():
            if isinstance(value, _COUNTED):
                canonical, agg = key, "mean"
                if ":" in key:
                    name, agg = parse_key(key)
                    canonical = name if agg == "mean" else f"{name}:{agg}"
                group = groups.get(canonical)
                if group is None:
                    groups[canonical] = group = (agg, [])
                group[1].append(float(value))
    return groups


def _by_name_and_aggregation(rows: Iterable[Metrics]) -> dict[tuple[str, str], list[float]]:
    """Values per ``(name, aggregation)``; the step level groups this way."""
    groups: dict[tuple[str, str], list[float]] = {}
    for row in rows:
        for key, value in row.items():
            if isinstance(value, _COUNTED):
                ident = parse_key(key) if ":" in key else (key, "mean")
                group = groups.get(ident)
                if group is None:
                    groups[ident] = group = []
                group.append(float(value))
    return groups


def _reduce(agg: str, values: list[float]) -> float:
    return sum(values) / len(values) if agg == "mean" else _REDUCERS[agg](values)


def run_metrics(experiences: Sequence[Metrics]) -> dict[str, float]:
    """One run's metrics from its experiences' metrics: plain keys averaged, suffixed keys reduced (suffix kept)."""
    return {key: _reduce(agg, values) for key, (agg, values) in _by_key(experiences).items()}


def _subset_sizes(n: int) -> list[int]:
    sizes, k = [], 2
    while k < n:
        sizes.append(k)
        k *= 2
    return [*sizes, n]


@lru_cache(maxsize=128)
def _bootstrap_index(n: int, k: int, n_bootstrap: int, seed: int) -> np.ndarray:
    """The resample indices: they depend on the sizes and the seed only, so every task and metric of an
    evaluation with ``n`` values shares one draw (a fresh generator and draw cost ~50 us a call)."""
    # One (n_bootstrap, k) draw equals n_bootstrap draws of k from the legacy generator, element for element.
    idx = np.random.RandomState(seed).choice(n, size=(n_bootstrap, k), replace=True)
    idx.flags.writeable = False
    return idx


_RESAMPLED_VALUES = 1 << 17  # rows x n_bootstrap values per array of the batched bootstrap (1 MiB of float64)


def _best_worst(data: np.ndarray, k: int, n_bootstrap: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """best@k and worst@k of each row of ``data`` (rows x values): for a chunk of rows at once, the running
    max/min over the k draws of every resample (k gathers of a (rows, n_bootstrap) block, two elementwise passes
    each) instead of a loop of small numpy calls per row. The maxima are exact, and their mean runs along the
    contiguous rows, which numpy sums pairwise exactly as it sums one row's 1-d array: bit-identical to the
    one-row computation, and equal to Trinity's (a tie of 0.0 and -0.0 may pick the other sign)."""
    idx = _bootstrap_index(data.shape[1], k, n_bootstrap, seed).T  # (k, n_bootstrap)
    rows = max(1, _RESAMPLED_VALUES // max(1, n_bootstrap))
    has_nan = bool(np.isnan(data).any())
    # Python's max/min keep a NaN first element and skip later NaNs (they lose every comparison): fmax/fmin
    # skip them all, and the resamples whose first draw is NaN are set to NaN afterwards
    high_fn, low_fn = (np.fmax, np.fmin) if has_nan else (np.maximum, np.minimum)
    best, worst = np.empty(data.shape[0]), np.empty(data.shape[0])
    for start in range(0, data.shape[0], rows):
        part = data[start:start + rows]
        high = np.take(part, idx[0], axis=1)  # C-ordered (rows, n_bootstrap); part[:, idx[0]] would be F-ordered
        low = high.copy()
        first_nan = np.isnan(high) if has_nan else None
        for j in range(1, k):
            draw = np.take(part, idx[j], axis=1)
            high_fn(high, draw, out=high)
            low_fn(low, draw, out=low)
        if first_nan is not None:
            high[first_nan] = low[first_nan] = np.nan
        best[start:start + rows] = high.mean(axis=1)
        worst[start:start + rows] = low.mean(axis=1)
    return best, worst


def bootstrap_best_worst(values: Sequence[float], k: int, *, n_bootstrap: int = 1000, seed: int = 42
                         ) -> tuple[float, float]:
    """Trinity's best@k and worst@k of one task's values: the mean max and mean min over ``n_bootstrap``
    size-``k`` resamples drawn with replacement (``bootstrap_metric(values, k, [max, min])``)."""
    data = np.asarray(values, dtype=np.float64)
    if data.size == 0:
        return math.nan, math.nan
    best, worst = _best_worst(data.reshape(1, -1), k, n_bootstrap, seed)
    return float(best[0]), float(worst[0])


def _is_time(name: str) -> bool:
    return "time/task_execution" in name or "time/run_execution" in name


def _at_k_columns(rows: list[list[float]], n_bootstrap: int, seed: int) -> list[tuple[str, list[float]]]:
    """mean@n, std@n, best@k, worst@k (Trinity's key order) of each row, all rows having ``n`` values."""
    data = np.array(rows, dtype=np.float64)
    n = data.shape[1]
    columns = [(f"mean@{n}", data.mean(axis=1)), (f"std@{n}", data.std(axis=1))]
    if n > 1:
        for k in _subset_sizes(n):
            best, worst = _best_worst(data, k, n_bootstrap, seed)
            columns += [(f"best@{k}", best), (f"worst@{k}", worst)]
    return [(suffix, column.tolist()) for suffix, column in columns]


def _eval_tasks_metrics(tasks: Sequence[Sequence[Metrics]], n_bootstrap: int, seed: int) -> list[dict[str, float]]:
    """:func:`task_metrics` (eval) of each task; the @k statistics of all (task, metric) pairs with the same
    number of values are computed together."""
    grouped = [_by_key(runs) for runs in tasks]
    rows: dict[int, list[list[float]]] = {}
    for groups in grouped:
        for key, (agg, values) in groups.items():
            if agg == "mean" and not _is_time(key):
                rows.setdefault(len(values), []).append(values)
    columns = {n: _at_k_columns(values, n_bootstrap, seed) for n, values in rows.items()}
    next_row = dict.fromkeys(columns, 0)
    results = []
    for groups in grouped:  # the same traversal as above, so each (task, metric) finds its row
        result: dict[str, float] = {}
        for key, (agg, values) in groups.items():
            if agg != "mean":
                result[key] = _REDUCERS[agg](values)
            elif _is_time(key):
                result[key] = sum(values) / len(values)
            else:
                n = len(values)
                row, next_row[n] = next_row[n], next_row[n] + 1
                for suffix, column in columns[n]:
                    result[f"{key}/{suffix}"] = column[row]
        results.append(result)
    return results


def task_metrics(runs: Sequence[Metrics], *, is_eval: bool, n_bootstrap: int = 1000, seed: int = 42
                 ) -> dict[str, float]:
    """One task's metrics from its runs' metrics. Rollout: as :func:`run_metrics` over the runs. Eval/bench:
    ``{name}/mean@n``, ``/std@n`` (ddof=0), ``/best@k``, ``/worst@k`` per plain metric, the ``time/...execution``
    keys averaged, suffixed keys reduced (suffix kept)."""
    if not is_eval:
        return run_metrics(runs)
    return _eval_tasks_metrics([runs], n_bootstrap, seed)[0]


def _stat(values: list[float], stat: str, ddof: int) -> float:
    arr = np.array(values)
    if stat == "mean":
        return float(arr.mean())
    if stat == "max":
        return float(arr.max())
    if stat == "min":
        return float(arr.min())
    return float(arr.std(ddof=ddof)) if arr.size > ddof else math.nan


def _check_stats(stats: Sequence[str]) -> None:
    for stat in stats:
        if stat not in STATS:
            raise ValueError(f"stat must be one of {STATS}, got {stat!r}")


def _step_metrics(per_task: list[dict[str, float]], prefix: str, stats: Sequence[str] | None, ddof: int
                  ) -> dict[str, float]:
    """Trinity's step-level reduction over tasks; ``stats=None``: only the mean, keyed without a stat."""
    head = f"{prefix}/" if prefix else ""
    out: dict[str, float] = {}
    for (name, agg), values in _by_name_and_aggregation(per_task).items():
        if agg != "mean":
            out[f"{head}{name}/{agg}"] = _REDUCERS[agg](values)
        elif stats is None:
            out[f"{head}{name}"] = _stat(values, "mean", ddof)
        else:
            for stat in stats:
                out[f"{head}{name}/{stat}"] = _stat(values, stat, ddof)
    return out


def rollout_step_metrics(tasks: Sequence[Sequence[Metrics]], *, prefix: str = "rollout",
                         stats: Sequence[str] = ROLLOUT_STATS, ddof: int = 0) -> dict[str, float]:
    """A rollout step's ``{prefix}/{name}/{stat}`` (and ``{prefix}/{name}/{sum,max,min,last}`` for suffixed
    keys), each task given as its runs' metrics: what Trinity's explorer logs. ``stats`` are the statistics of a
    plain metric across the tasks; Trinity logs ``("mean", "max", "min")``, no std. ``ddof`` applies to a
    requested ``"std"``: 0 (``np.std``) is Trinity's, any other value departs from it."""
    _check_stats(stats)
    return _step_metrics([run_metrics(runs) for runs in tasks], prefix, stats, ddof)


def eval_step_metrics(tasks: Sequence[Sequence[Metrics]], taskset: str, *, prefix: str = "eval",
                      detailed_stats: bool = False, ddof: int = 0, n_bootstrap: int = 1000, seed: int = 42
                      ) -> dict[str, float]:
    """An eval (or bench) taskset's metrics, each task given as its runs' metrics: what Trinity's explorer logs.

    ``{prefix}/{taskset}/{name}/{mean,std,best,worst}@k`` averaged over the tasks; with ``detailed_stats``
    (Trinity's ``monitor.detailed_stats``) ``.../{stat}@k/{mean,max,min,std}`` across the tasks instead. Plain
    ``time/...execution`` keys give ``{prefix}/{taskset}/{name}`` (or ``/{name}/{mean,...}``), suffixed keys
    ``{prefix}/{taskset}/{name}/{sum,max,min,last}``. ``prefix``: ``eval``, or ``bench`` (Trinity's bench mode
    renames ``eval/`` to ``bench/``). The std across tasks is ``np.std`` (``ddof=0``), as in Trinity, whose
    reference diagrams show it (``mean@2/std = 0.062``); ``ddof`` other than 0 departs from Trinity.
    """
    if prefix not in ("eval", "bench"):
        raise ValueError(f"prefix must be 'eval' or 'bench', got {prefix!r}")
    per_task = _eval_tasks_metrics(tasks, n_bootstrap, seed)
    return _step_metrics(per_task, f"{prefix}/{taskset}", DETAILED_STATS if detailed_stats else None, ddof)
