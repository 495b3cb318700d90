"""Trinity-RFT's metric aggregation: experiences -> run -> task -> step (the "Monitor Metrics Reference").

- run level: the mean over a run's experiences (:func:`run_metrics`, Trinity's ``calculate_run_level_metrics``);
- task level: the mean over the task's runs for rollouts; for eval/bench ``mean@n``, ``std@n`` (population std,
  ``np.std``) and ``best@k``/``worst@k`` for ``k`` = 2, 4, 8, ... below ``n``, and ``n`` (:func:`task_metrics`);
- step level: ``rollout/{metric}/{mean,max,min}`` over the step's tasks (:func:`rollout_step_metrics`), and
  ``eval/{taskset}/{metric}/{stat}@k`` averaged over the taskset's tasks, or with ``detailed_stats``
  ``.../{stat}@k/{mean,std,max,min}`` (:func:`eval_step_metrics`).

``best@k``/``worst@k`` are Trinity's bootstrap, reproduced draw for draw: 1000 subsets of size ``k`` drawn *with
replacement* from the task's runs by numpy's legacy generator seeded with 42 (Trinity seeds the global
generator; here a private ``RandomState(42)`` gives the same draws without touching global state), and the mean
of each subset's max (min). So best@k estimates the expected best of k runs, not the best run.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache

import numpy as np

Metrics = Mapping[str, float]
STATS = ("mean", "max", "min", "std")


def _numeric(rows: Iterable[Metrics]) -> dict[str, list[float]]:
    grouped: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        for key, value in row.items():
            if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
                grouped[key].append(float(value))
    return grouped


def run_metrics(experiences: Sequence[Metrics]) -> dict[str, float]:
    """One run's metrics: the mean of each metric over the run's experiences (multi-turn workflows)."""
    return {key: sum(v) / len(v) for key, v in _numeric(experiences).items()}


def _subset_sizes(n: int) -> list[int]:
    sizes, k = [], 2
    while k < n:
        sizes.append(k)
        k *= 2
    return [*sizes, n]


@lru_cache(maxsize=128)
def _bootstrap_index(n: int, k: int, n_bootstrap: int, seed: int) -> np.ndarray:
    """The resample indices: they depend on the sizes and the seed only, so every task and metric of an
    evaluation with ``n`` runs shares one draw (a fresh generator and draw cost ~50 us a call)."""
    # One (n_bootstrap, k) draw equals n_bootstrap draws of k from the legacy generator, element for element.
    idx = np.random.RandomState(seed).choice(n, size=(n_bootstrap, k), replace=True)
    idx.flags.writeable = False
    return idx


_RESAMPLED_VALUES = 1 << 21  # resampled values held at once by the batched bootstrap (16 MiB of float64)


def _best_worst(data: np.ndarray, k: int, n_bootstrap: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """best@k and worst@k of each row of ``data`` (tasks x runs): one gather and two reductions for a batch of
    tasks instead of a loop of small numpy calls per task (the reductions run along contiguous last axes, so
    each row's figures are bit-identical to the one-task computation)."""
    idx = _bootstrap_index(data.shape[1], k, n_bootstrap, seed).T  # (k, n_bootstrap)
    rows = max(1, _RESAMPLED_VALUES // (n_bootstrap * k))
    best, worst = np.empty(data.shape[0]), np.empty(data.shape[0])
    for start in range(0, data.shape[0], rows):
        # (tasks, k, n_bootstrap), C-ordered: the max/min over k is k-1 elementwise passes (fast; a reduction
        # along a short last axis is not), and leaves contiguous rows, which numpy sums pairwise exactly as it
        # sums one task's 1-d array
        samples = np.ascontiguousarray(data[start:start + rows, idx])
        best[start:start + rows] = samples.max(axis=1).mean(axis=1)
        worst[start:start + rows] = samples.min(axis=1).mean(axis=1)
    return best, worst


def bootstrap_best_worst(values: Sequence[float], k: int, *, n_bootstrap: int = 1000, seed: int = 42
                         ) -> tuple[float, float]:
    """Trinity's best@k and worst@k: mean max and mean min over ``n_bootstrap`` size-``k`` resamples."""
    data = np.asarray(values, dtype=np.float64)
    if data.size == 0:
        return math.nan, math.nan
    best, worst = _best_worst(data.reshape(1, -1), k, n_bootstrap, seed)
    return float(best[0]), float(worst[0])


def _is_time(key: str) -> bool:
    return "time/task_execution" in key or "time/run_execution" in key


def _eval_stats(grouped: list[dict[str, list[float]]], n_bootstrap: int, seed: int
                ) -> dict[tuple[int, str], dict[str, float]]:
    """mean@n, std@n, best@k, worst@k of every (task, metric), computed per (metric, n) over all its tasks."""
    batches: dict[tuple[str, int], list[int]] = defaultdict(list)
    for i, metrics in enumerate(grouped):
        for key, values in metrics.items():
            if not _is_time(key):
                batches[(key, len(values))].append(i)
    stats: dict[tuple[int, str], dict[str, float]] = {}
    for (key, n), tasks in batches.items():
        data = np.array([grouped[i][key] for i in tasks], dtype=np.float64)  # (tasks, n)
        columns = {f"mean@{n}": data.mean(axis=1), f"std@{n}": data.std(axis=1)}
        if n > 1:
            for k in _subset_sizes(n):
                columns[f"best@{k}"], columns[f"worst@{k}"] = _best_worst(data, k, n_bootstrap, seed)
        for row, i in enumerate(tasks):
            stats[(i, key)] = {f"{key}/{name}": float(column[row]) for name, column in columns.items()}
    return stats


def _tasks_metrics(tasks: Sequence[Sequence[Metrics]], *, is_eval: bool, n_bootstrap: int = 1000, seed: int = 42
                   ) -> list[dict[str, float]]:
    """:func:`task_metrics` of each task, the evaluation statistics batched across the tasks."""
    grouped = [_numeric(runs) for runs in tasks]
    stats = _eval_stats(grouped, n_bootstrap, seed) if is_eval else {}
    results = []
    for i, metrics in enumerate(grouped):
        result: dict[str, float] = {}
        for key, values in metrics.items():
            if not is_eval or _is_time(key):
                result[key] = sum(values) / len(values)
            else:
                result.update(stats[(i, key)])
        results.append(result)
    return results


def task_metrics(runs: Sequence[Metrics], *, is_eval: bool, n_bootstrap: int = 1000, seed: int = 42
                 ) -> dict[str, float]:
    """One task's metrics from its runs: the mean (rollout), or mean@n/std@n/best@k/worst@k (eval, bench)."""
    return _tasks_metrics([runs], is_eval=is_eval, n_bootstrap=n_bootstrap, seed=seed)[0]


def _stat(values: list[float], stat: str, ddof: int) -> float:
    arr = np.asarray(values, dtype=np.float64)
    if stat == "mean":
        return float(arr.mean())
    if stat == "max":
        return float(arr.max())
    if stat == "min":
        return float(arr.min())
    if stat == "std":
        return float(arr.std(ddof=ddof)) if arr.size > ddof else math.nan
    raise ValueError(f"stat must be one of {STATS}, got {stat!r}")


def rollout_step_metrics(tasks: Sequence[Sequence[Metrics]], *, prefix: str = "rollout",
                         stats: Sequence[str] = ("mean", "max", "min"), ddof: int = 0) -> dict[str, float]:
    """``{prefix}/{metric}/{stat}`` over a step's tasks, each task given as its runs' metrics."""
    per_task = _tasks_metrics([runs for runs in tasks if runs], is_eval=False)
    return {f"{prefix}/{key}/{stat}": _stat(values, stat, ddof)
            for key, values in _numeric(per_task).items() for stat in stats}


def eval_step_metrics(tasks: Sequence[Sequence[Metrics]], taskset: str, *, prefix: str = "eval",
                      detailed_stats: bool = False, ddof: int = 0, n_bootstrap: int = 1000, seed: int = 42
                      ) -> dict[str, float]:
    """``{prefix}/{taskset}/{metric}/{stat}@k`` averaged over the taskset's tasks (``prefix``: eval or bench).

    With ``detailed_stats`` each becomes ``.../{stat}@k/{mean,std,max,min}`` across the tasks. ``ddof=0`` (the
    population std) reproduces the numbers of Trinity's reference diagrams (``mean@2/std = 0.062``); Trinity's
    code reduces with pandas, whose ``std`` is ``ddof=1``: pass ``ddof=1`` to match that instead.
    """
    if prefix not in ("eval", "bench"):
        raise ValueError(f"prefix must be 'eval' or 'bench', got {prefix!r}")
    per_task = _tasks_metrics([runs for runs in tasks if runs], is_eval=True, n_bootstrap=n_bootstrap, seed=seed)
    out: dict[str, float] = {}
    for key, values in _numeric(per_task).items():
        if detailed_stats:
            for stat in ("mean", "std", "max", "min"):
                out[f"{prefix}/{taskset}/{key}/{stat}"] = _stat(values, stat, ddof)
        else:
            out[f"{prefix}/{taskset}/{key}"] = _stat(values, "mean", ddof)
    return out
