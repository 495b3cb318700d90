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


def bootstrap_best_worst(values: Sequence[float], k: int, *, n_bootstrap: int = 1000, seed: int = 42
                         ) -> tuple[float, float]:
    """Trinity's best@k and worst@k: mean max and mean min over ``n_bootstrap`` size-``k`` resamples."""
    data = np.asarray(values, dtype=np.float64)
    if data.size == 0:
        return math.nan, math.nan
    samples = data[_bootstrap_index(data.size, k, n_bootstrap, seed)]
    return float(samples.max(axis=1).mean()), float(samples.min(axis=1).mean())


def task_metrics(runs: Sequence[Metrics], *, is_eval: bool, n_bootstrap: int = 1000, seed: int = 42
                 ) -> dict[str, float]:
    """One task's metrics from its runs: the mean (rollout), or mean@n/std@n/best@k/worst@k (eval, bench)."""
    result: dict[str, float] = {}
    for key, values in _numeric(runs).items():
        if not is_eval or "time/task_execution" in key or "time/run_execution" in key:
            result[key] = sum(values) / len(values)
            continue
        n = len(values)
        result[f"{key}/mean@{n}"] = float(np.mean(values))
        result[f"{key}/std@{n}"] = float(np.std(values))
        if n > 1:
            for k in _subset_sizes(n):
                best, worst = bootstrap_best_worst(values, k, n_bootstrap=n_bootstrap, seed=seed)
                result[f"{key}/best@{k}"] = best
                result[f"{key}/worst@{k}"] = worst
    return result


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
    per_task = [task_metrics(runs, is_eval=False) for runs in tasks if runs]
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
    per_task = [task_metrics(runs, is_eval=True, n_bootstrap=n_bootstrap, seed=seed) for runs in tasks if runs]
    out: dict[str, float] = {}
    for key, values in _numeric(per_task).items():
        if detailed_stats:
            for stat in ("mean", "std", "max", "min"):
                out[f"{prefix}/{taskset}/{key}/{stat}"] = _stat(values, stat, ddof)
        else:
            out[f"{prefix}/{taskset}/{key}"] = _stat(values, "mean", ddof)
    return out
