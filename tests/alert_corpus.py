"""The alert corpus: healthy runs no warning or critical alert may fire on, and broken runs each alert must fire on.

Healthy runs:

- ``demo-<seed>``: the demo's real PPO trajectory (``rl_otel.demo.run``, recorded by ``tests/alert_corpus_record.py``
  at three seeds, 1,200 steps each; the quantities the alerts read, 3 significant digits, in
  ``tests/data/alert_corpus/demo.json.gz``), one step a minute (20 hours: every window, the 12 h of the drift alert
  included, fills).
- ``compose-demo-<n>``: the demo as docker-compose runs it and Prometheus sees it (``rl-otel demo --repeat 0
  --linger 240``): runs of the demo's default 200 steps back to back, each recorded with when its steps ended
  (``tests/alert_corpus_record.py --live``, seeds 0-5, ``tests/data/alert_corpus/demo_live.json.gz``), scraped every
  15 s (prometheus/prometheus.yml), holding its last values for the 4 minutes it lingers, then gone.
- ``<framework>-healthy``: every key of each framework's real key set (``tests/data/frameworks/*.tsv``) that a rule
  reads, replayed with a healthy trajectory: the demo's recorded trajectory of the key's concept (seed 0), or, for
  the quantities the demo has no counterpart of (training-inference mismatch, staleness, MFU, GPU memory), a
  trajectory drawn from the statistics noted in :data:`SYNTHETIC`. ROLL's run logs ``critic/entropy/mean = 0``, as
  its default config does.

On the demo's runs (both kinds) the alerts of :data:`CALM` must not even be pending: a healthy run that nears a
page teaches the on-call engineer to ignore it.

Broken runs: for each alert and each framework that logs a concept the alert reads, ``<framework>-<alert>`` is the
healthy run with the hazard induced at minute :data:`INDUCE` (:data:`HAZARDS`); the alert must fire, first no
earlier than the hazard and no later than its documented delay (the alert's ``for`` plus :data:`SLACK`, or what
:data:`DELAYS` says). The phase alerts (stuck phase, rank skew) read rl_otel's own series, whatever the framework:
their corpus is the ``phases`` group.

Goodput, stragglers and progress (issue 33; ``tests/alert_corpus_goodput.py``): every framework's healthy run also
holds each of its processes' goodput buckets, derived from its timing keys through the catalog's placement (with
start-up and periodic checkpoint dips), and their last-progress times; its broken runs starve one process of
productive time (RLGoodputDrop) and stop one process's progress while its endpoint answers (RLProcessNoProgress).
Where a framework's ranks run phases (ROLL's workers, rl_otel's ``tel.phase()``), its ranks serve their compute
seconds, and a broken run slows one rank: RLRankSkew must fire naming that rank and no other.

``python -m tests.alert_corpus`` writes the promtool test file and the alert x framework table.
"""

from __future__ import annotations

import gzip
import json
import math
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from rl_otel.catalog import default_catalog
from rl_otel.catalog.concepts import CONCEPTS, NON_FINITE_WATCHED
from rl_otel.ops import rules
from rl_otel.ops.promql import metric_names
from rl_otel.ops.thresholds import DEFAULT, Thresholds
from tests import alert_corpus_goodput as gp
from tests.frameworks import ALL_FRAMEWORKS, _matches, load

DATA = Path(__file__).resolve().parent / "data" / "alert_corpus"
DEMO = DATA / "demo.json.gz"
DEMO_LIVE = DATA / "demo_live.json.gz"
LIVE_SEEDS = (0, 1, 2, 3, 4, 5)
SCRAPE_S = 15          # prometheus/prometheus.yml's scrape_interval and evaluation_interval
LINGER_S = 240         # docker-compose.yml: rl-otel demo --repeat 0 --linger 240
RAW = Path("/tmp/alert_corpus_raw")
JOB = "rl_otel"
SEEDS = (0, 1, 2)
MINUTES = 360          # a framework replay: 6 h
INDUCE = 150           # minute a broken run turns bad: after every baseline window (75 min) filled
DRIFT_MINUTES, DRIFT_INDUCE = 800, 420  # the drift alert compares two 6 h windows: its own, longer group
SLOW = ("RLRefKLDrift",)
SLACK = 5              # minutes beyond `for`: rule evaluation, recording-rule chains, a 15 m rate window
DELAYS = {             # minutes from the hazard to firing where it is more than `for` + SLACK
    "RLRefKLDrift": lambda t: _minutes(t.ref_kl_drift_window) // 2 + _minutes(t.ref_kl_drift_for) + SLACK,
    "RLThroughputDrop": lambda t: _minutes(t.throughput_for) + 20,  # the 1 h average must sink under 2x
    "RLEvalRegression": lambda t: _minutes(t.eval_smooth) // 2 + _minutes(t.eval_for) + SLACK,  # the mean sinks
    "RLImportanceRatioExploding":  # the median of the batches' max turns half-way through its window
        lambda t: _minutes(t.ratio_max_smooth) // 2 + _minutes(t.ratio_max_for) + SLACK,
    # the 30-minute mean of the 5-minute goodput sinks under half its baseline, then `for`
    "RLGoodputDrop": lambda t: 5 + _minutes(t.goodput_smooth) + _minutes(t.goodput_for) + SLACK,
    # a process progressing every minute: its age passes progress_stall_min_seconds, then `for`
    "RLProcessNoProgress": lambda t: math.ceil(max(t.progress_stall_min_seconds, 60 * t.progress_stall_ratio) / 60)
    + _minutes(t.progress_stall_for) + SLACK,
    "RLRankSkew": lambda t: 5 + _minutes(t.rank_skew_for) + SLACK,  # the 5-minute compute rate turns, then `for`
}
# The straggler cases: the frameworks whose ranks run phases (ROLL's workers: state_offload_manger), their role.
PHASED = {"roll": "actor_train"}
STRAGGLER_RANKS, SLOW_RANK = 4, 2
# Alerts not even pending on the demo's healthy runs (the importance ratio's went pending at the demo's single-batch
# spikes, 10.06 against an absolute 10, and the last batch's value held while a run lingered).
CALM = ("RLImportanceRatioExploding",)
# Real incidents in the recorded demo runs, and the alert that must fire on them (and nothing else): seed 2's
# recording shared the 2 CPU cores with other test runs, and its tokens/s fell from ~7,700 to ~2,800 for ~20 steps
# (steps 580-600): contention, which RLThroughputDrop exists to report.
DEMO_INCIDENTS = {"demo-2": ("RLThroughputDrop",)}
# The concept whose demo trajectory a concept without one borrows, or a synthetic healthy trajectory.
DEMO_KEYS = {
    "policy_kl": "actor/approxkl", "entropy": "critic/entropy/mean", "sequence_entropy": "objective/entropy",
    "sequence_ref_kl": "objective/kl", "ref_kl": "actor/kl_loss", "clip_ratio": "actor/clipfrac",
    "importance_ratio_max": "actor/ratio_max", "reward": "critic/score/mean",
    "explained_variance": "ppo/val/var_explained", "throughput": "system/tps",
    "response_length": "tokens/response_length/mean", "step_duration": "time/step", "policy_loss": "actor/pg_loss",
    "grad_norm": "actor/grad_norm", "learning_rate": "actor/lr",
}
# Synthetic healthy trajectories (seeded): (median, relative noise) - the published healthy levels: bf16 vLLM vs
# FSDP k3 KL ~1e-3 (veRL's rollout-correction docs), |dlogp| ~0.02-0.05, one-step-off async staleness 1-2, MFU 0.3-0.5.
SYNTHETIC: dict[str, tuple[float, float]] = {
    "train_infer_kl": (1e-3, 0.5), "train_infer_logprob_diff": (0.03, 0.3), "train_infer_ratio_deviation": (0.01, 0.5),
    "staleness": (1.0, 0.0), "mfu": (0.4, 0.15), "gpu_memory_peak_ratio": (0.7, 0.05), "gpu_memory_peak": (6e10, 0.05),
    "eval_score": (0.6, 0.02),
}


def _minutes(duration: str) -> int:
    number, unit = int(duration[:-1]), duration[-1]
    return int(number * {"s": 1 / 60, "m": 1, "h": 60}[unit])


# -- the recorded demo trajectories ------------------------------------------------------------------------------

def compact(seeds: tuple[int, ...] = SEEDS) -> Path:
    """``/tmp/alert_corpus_raw/demo-<seed>.json`` (tests/alert_corpus_record.py) -> the committed fixture."""
    out: dict[str, dict[str, list[float]]] = {}
    for seed in seeds:
        raw = json.loads((RAW / f"demo-{seed}.json").read_text())
        steps = sorted(raw, key=int)
        out[str(seed)] = {key: [float(f"{raw[s].get(key, math.nan):.3g}") for s in steps]
                          for key in sorted(set(DEMO_KEYS.values()))}
    DATA.mkdir(parents=True, exist_ok=True)
    DEMO.write_bytes(gzip.compress(json.dumps(out, separators=(",", ":")).encode(), mtime=0))
    return DEMO


def compact_live(seeds: tuple[int, ...] = LIVE_SEEDS) -> Path:
    """``/tmp/alert_corpus_raw/demo-live-<seed>.json`` (``tests/alert_corpus_record.py --live``) -> the committed
    fixture: per seed, when each step ended (``_t``, seconds) and the quantities the alerts read."""
    out: dict[str, dict[str, list[float]]] = {}
    for seed in seeds:
        raw = json.loads((RAW / f"demo-live-{seed}.json").read_text())
        steps = sorted(raw, key=int)
        out[str(seed)] = {key: [float(f"{raw[s].get(key, math.nan):.3g}") for s in steps]
                          for key in sorted(set(DEMO_KEYS.values()))}
        out[str(seed)]["_t"] = [round(raw[s]["_t"], 2) for s in steps]
    DEMO_LIVE.write_bytes(gzip.compress(json.dumps(out, separators=(",", ":")).encode(), mtime=0))
    return DEMO_LIVE


def demo() -> dict[str, dict[str, list[float]]]:
    return json.loads(gzip.decompress(DEMO.read_bytes()))


def demo_live() -> dict[str, dict[str, list[float]]]:
    return json.loads(gzip.decompress(DEMO_LIVE.read_bytes()))


# -- series ------------------------------------------------------------------------------------------------------

@dataclass
class Run:
    """One run's input series ``{series selector: values}``, one value per interval of its group (``None``: no
    sample)."""

    name: str
    series: dict[str, list[float | None]] = field(default_factory=dict)


def _sel(metric: str, run: str, labels: dict[str, str], rank: int = 0) -> str:
    inner = {"job": JOB, "instance": f"{run}-{rank}:9464", "run": run, "rank": str(rank), **labels}
    return metric + "{" + ", ".join(f'{k}="{v}"' for k, v in inner.items()) + "}"


def _fmt(values: list[float | None]) -> str:
    """promtool's notation: ``_`` where a series has no sample (before its run started, after it ended)."""
    out = []
    for v in values:
        out.append("_" if v is None else "NaN" if math.isnan(v) else "Inf" if v == math.inf else f"{v:.4g}")
    return " ".join(out)


def _read_metrics(t: Thresholds) -> set[str]:
    names = set(NON_FINITE_WATCHED)
    for r in rules.recording_rules(t):
        names |= metric_names(r.expr)
    for c in CONCEPTS:
        names |= set(c.metrics)
    return names


def _concept_of(metric: str, labels: dict[str, str]) -> str | None:

    for c in CONCEPTS:
        for s in c.sources:
            if s.metric == metric and _matches(s, _FakeRes(metric, labels)):  # type: ignore[arg-type]
                return c.name
    return None


@dataclass
class _FakeRes:
    """What tests.frameworks._matches reads of a Resolution."""

    name: str
    label_dict: dict[str, str]

    @property
    def spec(self) -> _FakeRes:
        return self

    @property
    def prometheus_name(self) -> str:
        return self.name

    @property
    def labels(self) -> tuple[tuple[str, str], ...]:
        return tuple(self.label_dict.items())


def framework_series(framework: str, t: Thresholds) -> list[tuple[str, dict[str, str], str | None, str]]:
    """``(metric, labels, concept or None, kind)`` of every key of the framework a rule reads (one per series)."""
    catalog = default_catalog(framework)
    read = _read_metrics(t)
    out: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[str, dict[str, str], str | None, str]] = {}
    for key in load(framework):
        res = catalog.resolve(key.key)
        if not res.known or res.spec.prometheus_name not in read:
            continue
        metric, labels = res.spec.prometheus_name, dict(res.labels)
        out.setdefault((metric, tuple(sorted(labels.items()))),
                       (metric, labels, _concept_of(metric, labels), key.kind))
    return list(out.values())


def healthy_value(concept_name: str | None, metric: str, demo0: dict[str, list[float]], rng: random.Random,
                  minutes: int, roll_default: bool) -> list[float]:
    if concept_name == "entropy" and roll_default and metric == "rl_critic_entropy":
        return [0.0] * minutes  # ROLL's default config: entropy not computed, logged as 0
    if concept_name in DEMO_KEYS:
        v = demo0[DEMO_KEYS[concept_name]]
        return [v[i % len(v)] for i in range(minutes)]
    if concept_name in SYNTHETIC:
        median, noise = SYNTHETIC[concept_name]
        if concept_name == "staleness":
            return [float(rng.choice((0, 1, 1, 2))) for _ in range(minutes)]
        if concept_name == "eval_score":  # an eval every 10 minutes on ~2,400 problems: binomial std ~0.01
            evals = [median + rng.gauss(0, 0.01) for _ in range(minutes // 10 + 1)]
            return [evals[i // 10] for i in range(minutes)]
        return [median * math.exp(rng.gauss(0, noise)) if median > 0 else median for _ in range(minutes)]
    return [0.5] * minutes


# -- hazards -----------------------------------------------------------------------------------------------------

Hazard = Callable[[float, Thresholds], float]
# alert -> {concept: how a healthy value turns bad}
HAZARDS: dict[str, dict[str, Hazard]] = {
    "RLLossNotFinite": {"policy_loss": lambda v, t: math.nan},
    "RLKLRunaway": {"policy_kl": lambda v, t: v * 10 + t.approx_kl_floor * 3},  # a noisy KL, 10x and shifted
    "RLImportanceRatioExploding": {"importance_ratio_max": lambda v, t: t.ratio_max_floor * 5},
    "RLClipFractionHigh": {"clip_ratio": lambda v, t: min(1.0, t.clip_ratio_max * 2)},
    "RLEntropyCollapse": {"entropy": lambda v, t: 0.004, "sequence_entropy": lambda v, t: v * t.entropy_ratio_min / 10},
    "RLRewardCollapse": {"reward": lambda v, t: v - 2 * t.reward_drop},
    "RLValueExplainedVarianceCollapse": {"explained_variance": lambda v, t: t.explained_variance_min - 0.5},
    "RLGPUMemoryHeadroomLow": {"gpu_memory_peak_ratio": lambda v, t: (1 + t.gpu_peak_ratio_max) / 2},
    "RLThroughputDrop": {"throughput": lambda v, t: v * t.throughput_ratio_min / 5},
    "RLEvalRegression": {"eval_score": lambda v, t: v - 4 * t.eval_drop},
    "RLRefKLRunaway": {"ref_kl": lambda v, t: max(v * 10, t.ref_kl_floor * 5),
                       "sequence_ref_kl": lambda v, t: max(v * 10, t.sequence_floor * 5)},
    "RLRefKLDrift": {"ref_kl": lambda v, t: max(v * t.ref_kl_drift_ratio * 2, t.ref_kl_floor * 2),
                     "sequence_ref_kl": lambda v, t: max(v * t.ref_kl_drift_ratio * 2, t.sequence_floor * 2)},
    "RLTrainInferenceMismatch": {"train_infer_kl": lambda v, t: t.mismatch_kl_max * 3,
                                 "train_infer_logprob_diff": lambda v, t: t.mismatch_logprob_diff_max * 3,
                                 "train_infer_ratio_deviation": lambda v, t: t.mismatch_ratio_deviation_max * 3},
    "RLTrainInferenceMismatchRising": {
        "train_infer_kl": lambda v, t: max(v * t.mismatch_ratio * 3, t.mismatch_floor * 3),
        "train_infer_logprob_diff": lambda v, t: max(v * t.mismatch_ratio * 3, t.mismatch_floor * 3),
        "train_infer_ratio_deviation": lambda v, t: max(v * t.mismatch_ratio * 3, t.mismatch_floor * 3)},
    "RLStalenessHigh": {"staleness": lambda v, t: t.staleness_max * 2},
    "RLMetricImpossible": {"mfu": lambda v, t: 1.7, "clip_ratio": lambda v, t: 1.4,
                           "response_length": lambda v, t: -v, "step_duration": lambda v, t: -v},
}


def _logged(transform: str, value: float) -> float:
    """What a framework logs for a concept value its source carries through ``transform`` (the inverse of the
    source's PromQL transform: a ratio r logged where the concept is |r - 1|, a sign-flipped KL)."""
    form = transform.replace(" ", "")
    if form == "abs({}-1)":
        return 1 + value
    if form == "-({})":
        return -value
    return value  # no transform, or a filter ({} > 0, {} != 0) the value passes


def _transform_of(metric: str, labels: dict[str, str]) -> str:
    for c in CONCEPTS:
        for s in c.sources:
            if s.metric == metric and _matches(s, _FakeRes(metric, labels)):  # type: ignore[arg-type]
                return s.transform
    return ""


@dataclass
class Check:
    alert: str
    run: str
    framework: str
    kind: str  # "healthy" | "broken"
    deadline: int = 0  # minute
    induce: int = 0  # minute the hazard starts
    ranks: tuple[str, ...] = ()  # a broken check's expected rank labels, over the whole run (none: not checked)


@dataclass
class Group:
    name: str
    runs: list[Run]
    checks: list[Check]
    minutes: int
    interval: str = "1m"  # between two input samples, and between two rule evaluations


def _up(run: str) -> tuple[str, list[float]]:
    return f'up{{job="{JOB}", instance="{run}-0:9464", run="{run}"}}', []


def _psel(metric: str, run: str, role: str, rank: int = 0, **labels: str) -> str:
    """A series of one process (role and rank) of a run, on its own endpoint."""
    inner = {"job": JOB, "instance": f"{run}-{role}-{rank}:9464", "run": run, "role": role, "rank": str(rank),
             **labels}
    return metric + "{" + ", ".join(f'{k}="{v}"' for k, v in inner.items()) + "}"


def _process_series(run: Run, role: str, minutes: int, shares: gp.Shares | None = None, rank: int = 0,
                    progress_until: int | None = None) -> None:
    """One process's endpoint: up, its last progress each minute (frozen from ``progress_until``: alive but no
    progress), and with ``shares`` its goodput counters."""
    run.series[f'up{{job="{JOB}", instance="{run.name}-{role}-{rank}:9464"}}'] = [1.0] * minutes
    until = minutes if progress_until is None else progress_until
    run.series[_psel("rl_last_progress_timestamp_seconds", run.name, role, rank)] = \
        [60.0 * min(m, until) for m in range(minutes)]
    run.series[_psel("rl_progress_total", run.name, role, rank)] = [float(min(m, until)) for m in range(minutes)]
    if shares is not None:
        buckets, wall = gp.counters(shares)
        for bucket, values in buckets.items():
            run.series[_psel("rl_goodput_bucket_seconds_total", run.name, role, rank, bucket=bucket)] = values
        run.series[_psel("rl_goodput_wall_seconds_total", run.name, role, rank)] = wall


def _compute_series(run: Run, role: str, minutes: int, slow_rank: int | None = None, induce: int = 0) -> None:
    """``STRAGGLER_RANKS`` ranks of ``role`` serving their compute and collective-wait seconds and the mean duration
    of the phase holding their all-reduce (the waiting ranks' is as long as the straggler's or longer)."""
    ranks = gp.compute_rates(STRAGGLER_RANKS, minutes, f"{run.name}/{role}", slow_rank, induce)
    for rank, (compute, wait, phase) in enumerate(ranks):
        run.series[_psel("rl_rank_compute_seconds_total", run.name, role, rank)] = list(compute)
        run.series[_psel("rl_collective_wait_seconds_total", run.name, role, rank, point="allreduce")] = list(wait)
        labels = {"cluster": role, "phase": "train_step", "part": "total"}
        run.series[_psel("rl_phase_duration_seconds_count", run.name, role, rank, **labels)] = \
            [float(m) for m in range(minutes)]
        run.series[_psel("rl_phase_duration_seconds_sum", run.name, role, rank, **labels)] = \
            [round(sum(phase[:m]), 3) for m in range(minutes)]


def issue33_runs(framework: str, t: Thresholds, healthy: Run, minutes: int, induce: int) -> tuple[list[Run],
                                                                                                     list[Check]]:
    """The goodput, progress and straggler series of ``framework``'s healthy run (added to it), and its broken runs
    with their checks: RLGoodputDrop on the process with the most goodput, RLProcessNoProgress on a process other
    than the trainer where there is one, RLRankSkew where its ranks run phases."""
    procs = gp.processes(framework)
    shares = {p.role: gp.healthy_shares(p, minutes) for p in procs}
    for p in procs:
        _process_series(healthy, p.role, minutes, shares[p.role])
    if framework in PHASED:
        _compute_series(healthy, PHASED[framework], minutes)
    runs, checks = [], []

    def broken(alert: str, run: Run, ranks: tuple[str, ...] = ()) -> None:
        runs.append(run)
        checks.append(Check(alert, healthy.name, framework, "healthy"))
        checks.append(Check(alert, run.name, framework, "broken", induce + DELAYS[alert](t), induce, ranks))

    level = {p.role: sum(gp.goodput(s) for s in shares[p.role].minutes[gp.STARTUP:induce]) / (induce - gp.STARTUP)
             for p in procs}
    best = max(procs, key=lambda p: level[p.role])
    # starved keeps a fifth: below goodput_drop_ratio of the level, and goodput_drop_min under it with room
    assert t.goodput_drop_ratio > 0.2 and level[best.role] * 0.8 > t.goodput_drop_min * 2, (framework, level)
    run = Run(f"{framework}-RLGoodputDrop")
    _process_series(run, best.role, minutes, gp.starved(best, shares[best.role], induce))
    broken("RLGoodputDrop", run)
    hung = next((p for p in procs if p.role != "trainer"), procs[0])
    run = Run(f"{framework}-RLProcessNoProgress")
    _process_series(run, hung.role, minutes, progress_until=induce)
    broken("RLProcessNoProgress", run)
    if framework in PHASED:
        run = Run(f"{framework}-RLRankSkew")
        _compute_series(run, PHASED[framework], minutes, SLOW_RANK, induce)
        broken("RLRankSkew", run, (str(SLOW_RANK),))
    return runs, checks


def framework_group(framework: str, t: Thresholds, demo0: dict[str, list[float]], slow: bool = False) -> Group:
    """The framework's healthy run and a broken run per alert; ``slow``: the alerts of :data:`SLOW` only, over
    :data:`DRIFT_MINUTES`, with the series of their concepts only."""
    minutes, induce = (DRIFT_MINUTES, DRIFT_INDUCE) if slow else (MINUTES, INDUCE)
    series = framework_series(framework, t)
    if slow:
        reads = {c for name in SLOW for c in HAZARDS[name]}
        series = [x for x in series if x[2] in reads]
    logged = {c for _, _, c, _ in series if c}
    rng = random.Random(framework)
    base: dict[tuple[str, tuple[tuple[str, str], ...]], list[float]] = {}
    for metric, labels, cname, kind in series:
        values = healthy_value(cname, metric, demo0, rng, minutes, roll_default=framework == "roll")
        if kind == "counter":
            values = [float(10 * (i + 1)) for i in range(minutes)]
        base[(metric, tuple(sorted(labels.items())))] = values
    runs, checks = [], []

    def run_of(name: str, alert: str | None) -> Run:
        run = Run(name)
        hazards = HAZARDS.get(alert or "", {})
        for (metric, labels_t), values in base.items():
            labels = dict(labels_t)
            cname = _concept_of(metric, labels)
            vals = list(values)
            if alert is not None and cname not in hazards:
                continue  # a broken run holds the series of its hazard only (promtool's time goes with series)
            if cname in hazards:
                fn = hazards[cname]
                vals = vals[:induce] + [fn(v, t) for v in vals[induce:]]
            transform = _transform_of(metric, labels)
            run.series[_sel(metric, name, labels)] = [_logged(transform, v) for v in vals]
        run.series[f'rl_step{{job="{JOB}", instance="{name}-0:9464", run="{name}", rank="0"}}'] = \
            [float(i) for i in range(minutes)]
        run.series[_up(name)[0]] = [1.0] * minutes
        return run

    healthy = f"{framework}-healthy"
    runs.append(run_of(healthy, None))
    if not slow:
        more, found = issue33_runs(framework, t, runs[0], minutes, induce)
        runs += more
        checks += found
    for alert in rules.alerts(t):
        if (alert.name in SLOW) != slow:
            continue
        reads = set(alert.concepts) | set(HAZARDS.get(alert.name, {}))
        if not reads & logged or alert.name not in HAZARDS or not set(HAZARDS[alert.name]) & logged:
            continue
        checks.append(Check(alert.name, healthy, framework, "healthy"))
        name = f"{framework}-{alert.name}"
        runs.append(run_of(name, alert.name))
        delay = DELAYS.get(alert.name, lambda t, a=alert: _minutes(a.for_) + SLACK)(t)
        checks.append(Check(alert.name, name, framework, "broken", induce + delay, induce))
    if slow:
        for r in runs:
            r.name = r.name.replace(f"{framework}-", f"{framework}-slow-", 1)
            r.series = {k.replace(f'"{framework}-', f'"{framework}-slow-'): v for k, v in r.series.items()}
        for c in checks:
            c.run = c.run.replace(f"{framework}-", f"{framework}-slow-", 1)
    return Group(f"{framework}-slow" if slow else framework, runs, checks, minutes)


def demo_group(t: Thresholds, data: dict[str, dict[str, list[float]]]) -> Group:
    """The demo's real runs: every concept the demo logs, as the demo logs it (ROLL and TRL names)."""
    runs = []
    for seed, keys in data.items():
        name = f"demo-{seed}"
        run = Run(name)
        catalog = default_catalog()
        minutes = len(next(iter(keys.values())))
        for key, values in keys.items():
            res = catalog.resolve(key)
            run.series[_sel(res.spec.prometheus_name, name, dict(res.labels))] = values
            # the TRL names the demo logs beside ROLL's, for the concepts TRL's names feed
        run.series[_up(name)[0]] = [1.0] * minutes
        runs.append(run)
    minutes = max(len(next(iter(k.values()))) for k in data.values())
    checks = [Check("*", r.name, "demo", "healthy") for r in runs]
    return Group("demo", runs, checks, minutes)


def demo_live_group(data: dict[str, dict[str, list[float]]]) -> Group:
    """The demo's recorded runs as docker-compose runs them and Prometheus sees them: back to back, each scraped
    every :data:`SCRAPE_S` seconds from its start (the value of the last step that had ended), holding its last
    values while it lingers :data:`LINGER_S` seconds, then gone (the next run's Telemetry replaces it)."""
    catalog = default_catalog()
    spans: list[tuple[str, int, int, dict[str, list[float]]]] = []  # (run, first scrape, scrapes, recording)
    first = 0
    for i, seed in enumerate(sorted(data, key=int)):
        ended = data[seed]["_t"]
        scrapes = math.ceil((ended[-1] + LINGER_S) / SCRAPE_S) + 1
        spans.append((f"compose-demo-{i + 1}", first, scrapes, data[seed]))
        first += scrapes
    total = first
    runs = []
    for name, start, scrapes, keys in spans:
        ended = keys["_t"]
        # the step whose values a scrape j seconds into the run reads: the last that had ended by then
        seen = [sum(1 for t in ended if t <= j * SCRAPE_S) - 1 for j in range(scrapes)]

        def place(values: list[float | None], start: int = start, scrapes: int = scrapes) -> list[float | None]:
            return [None] * start + values + [None] * (total - start - scrapes)

        run = Run(name)
        for key, values in keys.items():
            if key == "_t":
                continue
            res = catalog.resolve(key)
            run.series[_sel(res.spec.prometheus_name, name, dict(res.labels))] = place(
                [None if k < 0 or math.isnan(values[k]) else values[k] for k in seen])
        run.series[_sel("rl_step", name, {})] = place([None if k < 0 else float(k) for k in seen])
        run.series[_sel("rl_last_step_timestamp_seconds", name, {})] = place(
            [None if k < 0 else round((start * SCRAPE_S) + ended[k], 2) for k in seen])
        # the demo's process progresses at each step (and each phase it ends, within the step)
        run.series[_sel("rl_last_progress_timestamp_seconds", name, {"role": "trainer"})] = \
            run.series[_sel("rl_last_step_timestamp_seconds", name, {})]
        run.series[_up(name)[0]] = place([1.0] * scrapes)
        runs.append(run)
    checks = [Check("*", r.name, "demo", "healthy") for r in runs]
    return Group("demo-live", runs, checks, math.ceil(total * SCRAPE_S / 60) + 1, f"{SCRAPE_S}s")


def phases_group(t: Thresholds) -> Group:
    """rl_otel's own phase series (tel.phase() in any framework): healthy ranks with noise, a stuck phase, a
    straggler rank. Buckets are rl_otel's DURATION_BUCKETS; a generate phase of ~100 s every ~3 minutes."""
    from rl_otel.catalog.define import DURATION_BUCKETS

    rng = random.Random(7)
    minutes = 300
    induce = 150
    runs = []

    def phase_run(name: str, stuck: bool, skew: bool) -> Run:
        run = Run(name)
        for rank in range(4):
            counts = dict.fromkeys((*DURATION_BUCKETS, math.inf), 0.0)
            total_sum, total_count = 0.0, 0.0
            sums, cnts, bks = [], [], {le: [] for le in counts}
            started = []
            for minute in range(minutes):
                live = not (stuck and minute >= induce)
                if live:
                    d = 100 * math.exp(rng.gauss(0, 0.1)) * (3 if skew and rank == 3 and minute >= induce else 1)
                    total_sum += d / 3
                    total_count += 1 / 3
                    for le in counts:
                        if d <= le:
                            counts[le] += 1 / 3
                for le in counts:
                    bks[le].append(round(counts[le], 3))
                sums.append(round(total_sum, 3))
                cnts.append(round(total_count, 3))
                started.append(float(induce * 60 if stuck and minute >= induce else minute * 60 - 30))
            labels = {"cluster": "actor_infer", "phase": "generate", "part": "total"}
            for le, vals in bks.items():
                run.series[_sel("rl_phase_duration_seconds_bucket", name, {**labels, "le": "+Inf" if le == math.inf
                                                                             else f"{le:g}"}, rank)] = vals
            run.series[_sel("rl_phase_duration_seconds_sum", name, labels, rank)] = sums
            run.series[_sel("rl_phase_duration_seconds_count", name, labels, rank)] = cnts
            run.series[_sel("rl_phase_started_timestamp_seconds", name,
                            {"cluster": "actor_infer", "phase": "generate"}, rank)] = started
        run.series[_up(name)[0]] = [1.0] * minutes
        return run

    runs = [phase_run("phases-healthy", False, False), phase_run("phases-RLPhaseStuck", True, False),
            phase_run("phases-RLRankSkew", False, True)]
    # the healthy ranks' goodput: a generate phase of ~100 s every ~3 minutes is generation, the rest waiting (time
    # in no phase); their progress: a phase ends every ~3 minutes; their compute seconds
    for rank in range(4):
        shares = gp.Shares([{"startup": 1.0} if m < gp.STARTUP else {"generation": 100 / 180, "waiting": 80 / 180}
                            for m in range(minutes)])
        _process_series(runs[0], "rollout", minutes, shares, rank=rank)
        runs[0].series[_psel("rl_last_progress_timestamp_seconds", runs[0].name, "rollout", rank)] = \
            [float(m // 3 * 180) for m in range(minutes)]
    _compute_series(runs[0], "trainer", minutes)
    # the trap of TraceML#252: rank 1 slowed, the all-reduce inside the phase evens out the phase times (the waiting
    # ranks' are longer); named by its compute, never a waiting rank
    straggler = Run("phases-RLRankSkew-compute")
    _compute_series(straggler, "trainer", minutes, 1, induce)
    runs.append(straggler)
    stuck_delay = int(max(t.phase_stuck_min_seconds, 300 * t.phase_stuck_ratio) // 60) + _minutes(t.phase_stuck_for) \
        + SLACK
    checks = [Check("*", "phases-healthy", "rl_otel phase()", "healthy"),
              Check("RLPhaseStuck", "phases-RLPhaseStuck", "rl_otel phase()", "broken", induce + stuck_delay, induce),
              Check("RLRankSkew", "phases-RLRankSkew", "rl_otel phase()", "broken",
                    induce + _minutes(t.rank_skew_window) + _minutes(t.rank_skew_for) + SLACK, induce),
              Check("RLRankSkew", "phases-RLRankSkew-compute", "rl_otel phase()", "broken",
                    induce + DELAYS["RLRankSkew"](t), induce, ("1",))]
    return Group("phases", runs, checks, minutes)


def groups(t: Thresholds = DEFAULT) -> list[Group]:
    data = demo()
    demo0 = data["0"]
    return [demo_group(t, data), demo_live_group(demo_live()), *(framework_group(f, t, demo0) for f in ALL_FRAMEWORKS),
            *(framework_group(f, t, demo0, slow=True) for f in ALL_FRAMEWORKS), phases_group(t)]


# -- the promtool test file --------------------------------------------------------------------------------------

_LOUD = 'alertstate="firing", severity=~"warning|critical"'


def test_document(gs: list[Group], rule_files: list[str]) -> dict[str, object]:
    """One promtool test document of ``gs``; they share an evaluation interval (one file per group otherwise)."""
    intervals = {g.interval for g in gs}
    assert len(intervals) == 1, f"groups of one test file share an evaluation interval: {intervals}"
    calm = "|".join(CALM)
    tests = []
    for g in gs:
        exprs = []
        healthy_runs = sorted({c.run for c in g.checks if c.kind == "healthy"})
        for run in healthy_runs:
            # no warning or critical alert fired at any time of the healthy run (but its recorded incidents')
            exprs.append({"expr": f'group by (alertname) (max_over_time(ALERTS{{run="{run}", {_LOUD}}}'
                                  f"[{g.minutes}m]))", "eval_time": f"{g.minutes - 1}m",
                          "exp_samples": [{"labels": f'{{alertname="{a}"}}', "value": 1}
                                          for a in DEMO_INCIDENTS.get(run, ())]})
            if g.name.startswith("demo"):  # the demo's runs: the CALM alerts not even pending
                exprs.append({"expr": f'group by (alertname) (max_over_time(ALERTS{{run="{run}", '
                                      f'alertname=~"{calm}"}}[{g.minutes}m]))', "eval_time": f"{g.minutes - 1}m",
                              "exp_samples": []})
        for c in (c for c in g.checks if c.kind == "broken"):
            first = (f'min_over_time(timestamp(ALERTS{{alertname="{c.alert}", run="{c.run}", '
                     f'alertstate="firing"}})[{g.minutes - 1}m:1m])')
            exprs.append({"expr": f"group by (alertname) ({first} >= {c.induce * 60} <= {c.deadline * 60})",
                          "eval_time": f"{g.minutes - 1}m",
                          "exp_samples": [{"labels": f'{{alertname="{c.alert}"}}', "value": 1}]})
            if c.ranks:  # the alert named these ranks, and no other, at any time of the run
                exprs.append({"expr": f'group by (rank) (max_over_time(ALERTS{{alertname="{c.alert}", '
                                      f'run="{c.run}", alertstate="firing"}}[{g.minutes}m]))',
                              "eval_time": f"{g.minutes - 1}m",
                              "exp_samples": [{"labels": f'{{rank="{r}"}}', "value": 1} for r in c.ranks]})
        tests.append({"name": f"alert corpus: {g.name}", "interval": g.interval,
                      "input_series": [{"series": s, "values": _fmt(v)} for r in g.runs for s, v in r.series.items()],
                      "promql_expr_test": exprs})
    return {"rule_files": rule_files, "evaluation_interval": intervals.pop(), "tests": tests}


def framework_of(group: str) -> str:
    return "rl_otel phase()" if group == "phases" else group.removesuffix("-slow")


def table(gs: list[Group], failed: set[tuple[str, str]] | None = None) -> str:
    """The alert x framework table: where each alert evaluates (the frameworks logging a concept it reads), whether
    its broken run fired in time (and how late it may), whether the healthy runs stayed quiet. ``failed``: the
    (alert or "*", run) checks promtool reported failing."""
    failed = failed or set()
    frameworks = list(dict.fromkeys(framework_of(g.name) for g in gs if not g.name.startswith("demo")))
    by = {(c.alert, framework_of(g.name)): c for g in gs for c in g.checks if c.kind == "broken"}
    noisy = {(framework_of(g.name), a) for g in gs for c in g.checks for a, run in failed
             if c.kind == "healthy" and run == c.run}
    lines = ["| alert | " + " | ".join(frameworks) + " |", "|---|" + "---|" * len(frameworks)]
    for name in [a.name for a in rules.alerts()]:
        cells = []
        for f in frameworks:
            c = by.get((name, f))
            if c is None:
                cells.append("-")
                continue
            fired = "MISSED" if (name, c.run) in failed else f"fired (<= +{c.deadline - c.induce}m)"
            quiet = "NOISY" if (f, name) in noisy else "quiet"
            cells.append(f"{fired}, {quiet}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_files(folder: Path, t: Thresholds = DEFAULT, rule_files: list[str] | None = None) -> dict[Path, Group]:
    """One promtool test file per group (they run in parallel)."""
    rule_files = rule_files or [str(Path(__file__).resolve().parent.parent / "prometheus" / "rules" / f)
                                for f in ("rl_otel_recording.yml", "rl_otel_alerts.yml")]
    out = {}
    for g in groups(t):
        path = folder / f"corpus_{g.name}.yml"
        path.write_text(yaml.safe_dump(test_document([g], rule_files), sort_keys=False, width=10_000))
        out[path] = g
    return out


if __name__ == "__main__":
    if sys.argv[1:] == ["compact"]:
        print(compact())
    elif sys.argv[1:] == ["compact-live"]:
        print(compact_live())
    else:
        folder = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/alert_corpus")
        folder.mkdir(parents=True, exist_ok=True)
        files = write_files(folder)
        print(folder, sum(len(r.series) for g in files.values() for r in g.runs), "series")
        print(table(list(files.values())))
