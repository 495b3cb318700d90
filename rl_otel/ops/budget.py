"""The series budget of a job: how many active series its ranks serve, its nodes send and its store holds.

Computed, not guessed: the keys each rank logs for a job of a given :class:`Shape` (``tel.phase()``'s time and
memory keys per cluster, phase and device, ``ppo_stats(distributions=True)``, rollout and eval keys, the user's own
keys) are resolved through the catalog as ``log()`` resolves them; each resulting series counts the sample lines
the endpoint serves for it (a histogram: its buckets, ``+Inf``, and ``_sum``/``_count`` unless its lowest bound is
negative), each family capped at ``max_series_per_metric`` and the user's keys at ``max_unknown_keys``, as the
store caps them; rl_otel's own series and the live gauges are added; Prometheus adds 5 series per target (``up``,
``scrape_*``). The recording rules' output is counted by evaluating their grouping on those series. Two kinds of
rank: *workers* (a rank per GPU and cluster: phases, memory, live gauges) and *step ranks* (the process that logs
the training step's statistics - the driver in veRL, ROLL and Trinity-RFT; every rank when each logs its own
``ppo_stats``).

``rl-otel budget`` prints it per rank, per node and per job at 8, 64 and 1,024 GPUs; ``tests/test_budget.py``
checks the per-rank figure against a real scrape and the recorded figure against a real Prometheus;
``benchmarks/bench_fleet.py`` measures what a Prometheus pays per series; ``docs/scale.md`` puts both together.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields

from rl_otel._internal.runtime.options import BY_NAME
from rl_otel.catalog import Catalog, Kind, default_catalog, live, meta
from rl_otel.catalog.goodput import bucket_of, is_step_duration
from rl_otel.ops import contract
from rl_otel.ops.engines import vllm_lines as engine_vllm_lines
from rl_otel.ops.promql import metric_names
from rl_otel.ops.rules import OUT_OF_RANGE, recording_rules

# ppo_stats(names="roll", distributions=True) given every input (log-probs, masks, advantages, reference log-probs,
# values, returns, rewards, scores, entropy): tests/test_budget.py checks this list against ppo_stats itself.
PPO_KEYS = (
    "actor/approxkl", "actor/clipfrac", "actor/kl_dist", "actor/kl_loss", "actor/log_prob_dist", "actor/pg_loss",
    "actor/policykl", "actor/ppo_ratio_clipfrac", "actor/ppo_ratio_high_clipfrac", "actor/ppo_ratio_low_clipfrac",
    "actor/ratio_dist", "actor/ratio_max", "actor/ratio_mean", "actor/ratio_min", "critic/advantages/max",
    "critic/advantages/mean", "critic/advantages/min", "critic/advantages_dist", "critic/entropy/max",
    "critic/entropy/mean", "critic/entropy/min", "critic/error", "critic/old_log_prob/max", "critic/old_log_prob/mean",
    "critic/old_log_prob/min", "critic/ref_log_prob/max", "critic/ref_log_prob/mean", "critic/ref_log_prob/min",
    "critic/returns/max", "critic/returns/mean", "critic/returns/min", "critic/rewards/max", "critic/rewards/mean",
    "critic/rewards/min", "critic/rewards_dist", "critic/score/max", "critic/score/mean", "critic/score/min",
    "critic/score_dist", "critic/value", "critic/values/max", "critic/values/mean", "critic/values/min",
    "tokens/response_length/max", "tokens/response_length/mean", "tokens/response_length/min",
    "tokens/response_length_dist",
)
# The rest of a ROLL pipeline step (benchmarks/node.py's node): step timers, throughput, learning rates, losses.
STEP_KEYS = ("time/rollout", "time/adv", "time/eval", "system/tps", "actor/lr", "critic/lr", "critic/loss",
             "actor/total_loss", "system/samples")
# ROLL's clusters and phases name the first ones; more are numbered.
CLUSTERS = ("actor_train", "actor_infer", "reference", "critic", "reward")
PHASES = ("train_step", "generate", "compute_log_probs", "compute_values", "compute_rewards", "model_update",
          "do_checkpoint")
PARTS = ("total", "execute", "onload", "offload")
GPU_STAGES = ("start/offload", "start/onload", "end/onload", "end/offload")
GPU_KINDS = ("allocated", "reserved", "max_allocated", "max_reserved")
# Series Prometheus writes for every target it scrapes.
PER_TARGET = ("up", "scrape_duration_seconds", "scrape_samples_scraped", "scrape_samples_post_metric_relabeling",
              "scrape_series_added")
# rl_otel's own series on every endpoint: rl_step, rl_last_step_timestamp_seconds, rl_otel_build_info, target_info,
# rl_last_progress_timestamp_seconds, rl_progress_total, rl_run_finished, and rl_stack_dumps_total per reason
# (rl_telemetry_errors_total, rl_telemetry_dropped_series_total and rl_stack_dump_info appear only once something
# fails or a dump is written).
OWN = (meta.STEP.name, meta.LAST_STEP_TIMESTAMP.name, meta.BUILD_INFO.name, meta.TARGET_INFO.name,
       meta.LAST_PROGRESS.name, meta.PROGRESS.name, meta.RUN_FINISHED.name)
GPUS = (8, 64, 1024)

Series = tuple[str, tuple[tuple[str, str], ...]]  # (family, labels without run/rank)


@dataclass(frozen=True)
class Shape:
    """What a job looks like to its telemetry. Every count must be >= 0 (GPUs and per-node counts >= 1)."""

    gpus: int = 8
    gpus_per_node: int = 8
    ranks_per_gpu: int = 1         # processes serving an endpoint per GPU (ROLL colocated: one per cluster)
    clusters: int = 5              # clusters of the job (ROLL: actor_train, actor_infer, reference, critic, reward)
    clusters_per_rank: int = 1     # clusters whose phases one worker times (veRL's hybrid worker: actor+rollout+ref)
    phases: int = 7                # phases per cluster (train_step, generate, compute_log_probs, ...)
    devices_per_rank: int = 1      # GPUs whose memory one worker reports (device_id label values)
    step_ranks: int = 1            # processes logging the training step's statistics (the driver; or every rank)
    distributions: bool = True     # ppo_stats(distributions=True): 8 histograms
    rollout_metrics: int = 3       # rollout/{metric}/{mean,max,min}
    tasksets: int = 2              # eval/{taskset}/{metric}/{mean,std,best,worst}@{k}
    eval_metrics: int = 2
    eval_ks: int = 1
    live_gpu: bool = True          # live GPU gauges (torch: 2, NVML: 3 per device)
    user_keys: int = 0             # the user's own keys (fallback gauges)
    collective_points: int = 0     # tel.collective() points a rank waits at (allreduce, barrier, ...)
    drop_phase_buckets: bool = False  # the agents drop each rank's rl_phase_duration_seconds_bucket (agent.yml)
    engines_per_worker: int = 0    # in-process vLLM engines a worker serves (engines=; docs/engines.md), each a replica
    engine_max_model_len: int = 4096  # sets the count of vLLM's token-count histogram buckets
    max_series_per_metric: int = BY_NAME["max_series_per_metric"].default  # init()'s caps, as a job would run
    max_unknown_keys: int = BY_NAME["max_unknown_keys"].default

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type in ("bool", bool):
                if not isinstance(value, bool):
                    raise ValueError(f"Shape.{f.name} must be True or False, got {value!r}")
                continue
            low = 1 if f.name in ("gpus", "gpus_per_node", "ranks_per_gpu", "clusters", "clusters_per_rank",
                                  "max_series_per_metric", "max_unknown_keys") else 0
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"Shape.{f.name} must be an int >= {low}, got {value!r}")
        if self.clusters_per_rank > self.clusters:
            raise ValueError(f"Shape.clusters_per_rank ({self.clusters_per_rank}) exceeds clusters ({self.clusters})")

    @property
    def nodes(self) -> int:
        return math.ceil(self.gpus / self.gpus_per_node)

    @property
    def workers(self) -> int:
        return self.gpus * self.ranks_per_gpu

    @property
    def workers_per_node(self) -> int:
        return min(self.gpus, self.gpus_per_node) * self.ranks_per_gpu


def _name(names: Sequence[str], i: int, prefix: str) -> str:
    return names[i] if i < len(names) else f"{prefix}{i}"


def phase_pairs(shape: Shape, worker: int = 0) -> list[tuple[str, str]]:
    """The (cluster, phase) pairs worker ``worker`` times: its ``clusters_per_rank`` clusters, round robin."""
    clusters = [_name(CLUSTERS, (worker * shape.clusters_per_rank + j) % shape.clusters, "cluster")
                for j in range(shape.clusters_per_rank)]
    return [(c, _name(PHASES, p, "phase")) for c in clusters for p in range(shape.phases)]


def phase_keys(shape: Shape, worker: int = 0, devices: int | None = None) -> list[str]:
    """What ``tel.phase()`` records for worker ``worker``: ROLL's time keys, CPU memory, and per device the GPU memory
    at four stages and the peak fractions (no GPU keys without CUDA: ``devices=0``)."""
    devices = shape.devices_per_rank if devices is None else devices
    keys = []
    for cluster, phase in phase_pairs(shape, worker):
        infix = f"{cluster}/{phase}"
        keys += [f"time/{infix}/{part}" for part in PARTS]
        keys += [f"memory/cpu/{infix}/{stage}/{kind}" for stage in ("start", "end") for kind in ("rss", "vms")]
        for d in range(devices):
            keys += [f"memory/{infix}/{stage}/{kind}/{d}" for stage in GPU_STAGES for kind in GPU_KINDS]
            keys += [f"memory/{infix}/end/onload/{kind}_frac/{d}" for kind in ("max_allocated", "max_reserved")]
    return keys


def step_keys(shape: Shape) -> list[str]:
    """The training step's keys a step rank logs: PPO statistics, rollout and eval metrics, step timers."""
    ppo = [k for k in PPO_KEYS if shape.distributions or not k.endswith("_dist")]
    rollout = [f"rollout/{_name(('accuracy', 'format_score', 'length'), m, 'metric')}/{s}"
               for m in range(shape.rollout_metrics) for s in ("mean", "max", "min")]
    evals = [f"eval/{_name(('gsm8k', 'math500'), t, 'taskset')}/{_name(('accuracy', 'reward'), m, 'metric')}/"
             f"{s}@{2 ** k}" for t in range(shape.tasksets) for m in range(shape.eval_metrics)
             for s in ("mean", "std", "best", "worst") for k in range(shape.eval_ks)]
    return [*ppo, *rollout, *evals, *STEP_KEYS]


def user_keys(shape: Shape) -> list[str]:
    return [f"custom/metric_{i}" for i in range(shape.user_keys)]


@dataclass
class Endpoint:
    """The series one endpoint serves: ``families`` maps a family to its series (labels without run/rank), and
    :attr:`lines` counts the sample lines (a histogram series is several)."""

    families: dict[str, set[tuple[tuple[str, str], ...]]] = field(default_factory=dict)
    lines_per_series: dict[str, int] = field(default_factory=dict)

    def add(self, family: str, labels: Iterable[tuple[str, str]], lines: int, cap: int) -> None:
        found = self.families.setdefault(family, set())
        if len(found) < cap:
            found.add(tuple(sorted(labels)))
        self.lines_per_series[family] = lines

    @property
    def lines(self) -> int:
        return sum(len(s) * self.lines_per_series[f] for f, s in self.families.items())

    def by_family(self) -> dict[str, int]:
        return {f: len(s) * self.lines_per_series[f] for f, s in sorted(self.families.items())}

    def series(self) -> set[Series]:
        return {(f, labels) for f, found in self.families.items() for labels in found}


def _lines(kind: Kind, buckets: tuple[float, ...]) -> int:
    if kind is not Kind.HISTOGRAM:
        return 1
    return len(buckets) + 1 + (2 if buckets and buckets[0] >= 0 else 0)


def endpoint(keys: Iterable[str], shape: Shape, *, pairs: Iterable[tuple[str, str]] = (), live_devices: int = 0,
             catalog: Catalog | None = None) -> Endpoint:
    """The series an endpoint serves after its process logged ``keys`` and ran ``tel.phase()`` over ``pairs``,
    with ``live_devices`` GPUs under the live gauges (less the phase buckets when the shape's agents drop them).
    Keys resolve as ``log()`` resolves them (catalog entries, then fallback gauges up to ``max_unknown_keys``);
    each family is capped at ``max_series_per_metric``."""
    catalog = catalog or default_catalog()
    out = Endpoint()
    cap, unknown = shape.max_series_per_metric, 0
    for key in dict.fromkeys(keys):
        res = catalog.resolve(key)
        if not res.known:
            if unknown >= shape.max_unknown_keys:
                continue
            unknown += 1
        spec = res.spec
        out.add(spec.name, res.labels, _lines(spec.kind, spec.buckets), cap)
    duration = live.PHASE_DURATION
    # dropped buckets leave _sum and _count (the phase means) in the store
    lines = 2 if shape.drop_phase_buckets else _lines(duration.kind, duration.buckets)
    for cluster, phase in pairs:
        for part in PARTS:
            out.add(duration.name, (("cluster", cluster), ("phase", phase), ("part", part)), lines, cap)
    for spec in (live.PROCESS_RSS, live.PROCESS_VMS):
        out.add(spec.name, (), 1, cap)
    for d in range(live_devices):
        uuid = f"GPU-{d:08d}"
        for spec in (live.GPU_PROCESS_ALLOCATED, live.GPU_PROCESS_RESERVED):
            out.add(spec.name, (("device_id", str(d)),), 1, cap)
        for spec in (live.GPU_DEVICE_USED, live.GPU_DEVICE_TOTAL, live.GPU_DEVICE_RESERVED):
            out.add(spec.name, (("device_id", str(d)), ("gpu_uuid", uuid)), 1, cap)
    for name in OWN:
        out.add(name, (), 1, cap)
    _issue33(out, shape, phases=bool(pairs), timed=any(_timed(catalog, k) for k in keys))
    for reason in meta.STACK_DUMP_REASONS:
        out.add(meta.STACK_DUMPS.name, (("reason", reason),), 1, cap)
    return out


def _timed(catalog: Catalog, key: str) -> bool:
    """Whether ``key`` is a timing key the goodput accounting counts (a bucket's leaf or a step's wall time)."""
    res = catalog.resolve(key)
    return res.known and (bucket_of(res.spec, res.labels) is not None or is_step_duration(res.spec, res.labels))


def _issue33(out: Endpoint, shape: Shape, phases: bool, timed: bool) -> None:
    """The goodput, straggler and progress series a process serves (those its rl_otel's catalog defines): every
    goodput bucket and the wall clock for a process with phases or timing keys, its last progress, and for a
    process with phases its compute seconds and a wait counter per collective point. Stack dumps: none in a
    healthy run."""
    def add(family: contract.Family, labels: Iterable[tuple[str, str]] = ()) -> None:
        if contract.served(family):  # live families, outside the store's per-metric cap (bounded by design)
            out.add(family.name, labels, 1, 10**9)

    if phases or timed:
        for bucket in contract.BUCKETS:
            add(contract.GOODPUT_BUCKET, (("bucket", bucket),))
        add(contract.GOODPUT_WALL)
        add(contract.LAST_PROGRESS)
    if phases:
        add(contract.RANK_COMPUTE)
        for i in range(shape.collective_points):
            add(contract.COLLECTIVE_WAIT, (("point", _name(("allreduce", "barrier"), i, "point")),))


def worker_endpoint(shape: Shape, worker: int = 0, catalog: Catalog | None = None) -> Endpoint:
    """A worker rank: its phases on its devices, the live gauges, the user's keys."""
    return endpoint([*phase_keys(shape, worker), *user_keys(shape)], shape, pairs=phase_pairs(shape, worker),
                    live_devices=shape.devices_per_rank if shape.live_gpu else 0, catalog=catalog)


def step_endpoint(shape: Shape, catalog: Catalog | None = None) -> Endpoint:
    """A step rank (a worker that also logs the step's statistics: the driver's GPU-less process adds the same)."""
    return endpoint([*phase_keys(shape), *step_keys(shape), *user_keys(shape)], shape, pairs=phase_pairs(shape),
                    live_devices=shape.devices_per_rank if shape.live_gpu else 0, catalog=catalog)


_SELECTOR = r"(?<![\w:]){name}(?![\w:])\s*(\{{(?P<matchers>[^}}]*)\}})?"
_MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')


def _matches(labels: dict[str, str], matchers: str) -> bool:
    for label, op, value in _MATCHER.findall(matchers or ""):
        have = labels.get(label, "")
        hit = re.fullmatch(value, have) is not None if op in ("=~", "!~") else have == value
        if hit != (op in ("=", "=~")):
            return False
    return True


def recorded(series: set[Series], ranks: int = 1) -> dict[str, int]:
    """``{recording rule: series it records}`` for one healthy run of ``ranks`` ranks, long enough for its
    baselines, whose endpoints serve ``series`` (one role): the distinct values of each rule's ``by (...)`` labels
    (besides job and run; ``rank`` counts ``ranks``) over the series its selectors match (a histogram's
    ``_sum``/``_count`` read from its family, a counter's ``_total``); a rule over recorded series
    (``avg_over_time``) records as many as it reads, one dividing a recorded series (``group_left``) as many as
    that series; the count of impossible values records none."""
    out: dict[str, int] = {}
    by_name: dict[str, list[dict[str, str]]] = {}
    for name, labels in series:
        by_name.setdefault(name, []).append(dict(labels))
    for name in list(by_name):
        for suffix in ("_sum", "_count", "_bucket", "_total"):
            by_name.setdefault(name + suffix, by_name[name])
    for rule in recording_rules():
        if rule.record == OUT_OF_RANGE:
            out[rule.record] = 0  # a healthy run logs no value outside its range
            continue
        names = metric_names(rule.expr)
        groups = re.findall(r"\bby \(([^)]*)\)", rule.expr)
        left = re.match(r"[\w:]+", rule.expr)
        if "group_left" in rule.expr and left is not None and left.group() in out:
            out[rule.record] = out[left.group()]
            continue
        if not groups:
            out[rule.record] = sum(out.get(n, 0) for n in names)
            continue
        keep = [x.strip() for x in groups[0].split(",") if x.strip() not in ("job", "run", "role", "rank")]
        if names <= set(out) and not keep:  # recorded series aggregated to the run (and role): one, or none
            out[rule.record] = int(any(out[n] for n in names))
            continue
        per_rank = "rank" in groups[0].split(", ")
        seen = set()
        for name in names:
            for m in re.finditer(_SELECTOR.format(name=re.escape(name)), rule.expr):
                for found in by_name.get(name, []):
                    if _matches(found, m.group("matchers")):
                        seen.add(tuple(found.get(x, "") for x in keep))
        out[rule.record] = len(seen) * (ranks if per_rank else 1)
    return out


@dataclass(frozen=True)
class Budget:
    """The active series of one job (one run), and the sample rate they make at the given intervals."""

    shape: Shape
    worker_series: int        # sample lines one worker endpoint serves
    step_series: int          # ... a step rank's endpoint
    per_target: int           # what Prometheus adds per target
    node_series: int          # the busiest node: its workers (and the step ranks' extra keys, on node 0)
    job_scraped: int          # every endpoint of the job, with the per-target series
    job_recorded: int         # the recording rules' output (one run)
    scrape_interval_s: float
    evaluation_interval_s: float

    @property
    def job_total(self) -> int:
        return self.job_scraped + self.job_recorded

    @property
    def samples_per_second(self) -> float:
        return self.job_scraped / self.scrape_interval_s + self.job_recorded / self.evaluation_interval_s

    def to_dict(self) -> dict[str, object]:
        return {"gpus": self.shape.gpus, "nodes": self.shape.nodes, "ranks": self.shape.workers,
                "per_worker_rank": self.worker_series + self.per_target,
                "per_step_rank": self.step_series + self.per_target,
                "per_node": self.node_series, "job_scraped": self.job_scraped, "job_recorded": self.job_recorded,
                "job_total": self.job_total, "samples_per_second": round(self.samples_per_second, 1)}


def budget(shape: Shape, *, scrape_interval_s: float = 15.0, evaluation_interval_s: float = 15.0,
           catalog: Catalog | None = None) -> Budget:
    """The series budget of ``shape``. Workers differ only in which clusters they time, so one worker per
    cluster assignment is resolved and the rest counted."""
    catalog = catalog or default_catalog()
    assignments = math.gcd(shape.clusters, shape.clusters_per_rank)  # distinct round-robin starting points
    distinct = shape.clusters // assignments
    workers = [worker_endpoint(shape, w, catalog) for w in range(min(distinct, shape.workers))]
    step = step_endpoint(shape, catalog)
    worker_lines = max(w.lines for w in workers)
    per_target = len(PER_TARGET)
    step_extra = step.lines - worker_endpoint(shape, 0, catalog).lines
    steps = min(shape.step_ranks, shape.workers)
    engine_lines = shape.engines_per_worker * engine_vllm_lines(shape.engine_max_model_len)
    worker_lines += engine_lines
    job_scraped = shape.workers * (worker_lines + per_target) + steps * step_extra
    node = shape.workers_per_node * (worker_lines + per_target) + min(steps, shape.workers_per_node) * step_extra
    union = set().union(*(w.series() for w in workers), step.series() if steps else set())
    rec = recorded(union, ranks=shape.workers)
    return Budget(shape, worker_lines, step.lines + engine_lines, per_target, node, job_scraped,
                  sum(rec.values()) + engine_recorded(shape.workers * shape.engines_per_worker),
                  scrape_interval_s, evaluation_interval_s)


def engine_recorded(replicas: int) -> int:
    """The engines' recorded series (``rl_otel/ops/engines.py``) of one role with ``replicas`` engine replicas:
    a ``run_role_replica:`` rule one per replica, a ``run_role:`` rule one; none without an engine."""
    if replicas == 0:
        return 0
    from rl_otel.ops.engines import recording_rules as engine_rules

    return sum(replicas if r.record.startswith("run_role_replica:") else 1 for r in engine_rules())


# -- the command ------------------------------------------------------------------------------------------------

# each option's help: what the count is, in the words of the Shape field's comment
_HELP = {
    "gpus_per_node": "GPUs per node",
    "ranks_per_gpu": "processes serving an endpoint per GPU (ROLL colocated: one per cluster)",
    "clusters": "clusters of the job (ROLL: actor_train, actor_infer, reference, critic, reward)",
    "clusters_per_rank": "clusters whose phases one worker times (veRL's hybrid worker: actor+rollout+ref)",
    "phases": "phases per cluster (train_step, generate, compute_log_probs, ...)",
    "devices_per_rank": "GPUs whose memory one worker reports (device_id label values)",
    "step_ranks": "processes logging the training step's statistics (the driver; or every rank)",
    "distributions": "ppo_stats(distributions=True): 8 histograms",
    "rollout_metrics": "rollout metrics, each rollout/{metric}/{mean,max,min}",
    "tasksets": "eval task sets, each eval/{taskset}/{metric}/{mean,std,best,worst}@{k}",
    "eval_metrics": "eval metrics per task set",
    "eval_ks": "eval k values (the @k of eval keys)",
    "live_gpu": "live GPU gauges (torch: 2, NVML: 3 per device)",
    "user_keys": "the user's own keys without a catalog entry (fallback gauges)",
    "collective_points": "tel.collective() points a rank waits at (allreduce, barrier, ...)",
    "drop_phase_buckets": "the agents drop each rank's rl_phase_duration_seconds_bucket (agent.yml)",
    "max_series_per_metric": "init()'s max_series_per_metric",
    "max_unknown_keys": "init()'s max_unknown_keys",
    "engines_per_worker": "in-process vLLM engines a worker serves (engines=; docs/engines.md), each a replica",
    "engine_max_model_len": "the engines' max_model_len (sets the buckets of their token-count histograms)",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``rl-otel budget``'s options: every :class:`Shape` field (``--gpus`` takes a list)."""
    defaults = Shape()
    parser.add_argument("--gpus", default=",".join(map(str, GPUS)),
                        help="comma-separated job sizes in GPUs (default 8,64,1024)")
    for f in fields(Shape):
        if f.name == "gpus":
            continue
        flag = "--" + f.name.replace("_", "-")
        default = getattr(defaults, f.name)
        if isinstance(default, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default,
                                help=f"{_HELP[f.name]} (default {default})")
        else:
            parser.add_argument(flag, type=int, default=default, help=f"{_HELP[f.name]} (default {default})")
    parser.add_argument("--scrape-interval", type=float, default=15.0,
                        help="Prometheus's scrape interval, seconds (default 15)")
    parser.add_argument("--evaluation-interval", type=float, default=15.0,
                        help="Prometheus's rule evaluation interval, seconds (default 15)")
    parser.add_argument("--format", choices=("table", "json"), default="table",
                        help="a table to read, or JSON for a program (default table)")


def budgets(args: argparse.Namespace) -> list[Budget]:
    """The budgets ``args`` (from :func:`add_arguments`) ask for; raises ValueError naming a bad value."""
    try:
        sizes = [int(g) for g in str(args.gpus).split(",")]
    except ValueError:
        raise ValueError(f"--gpus must be comma-separated ints, got {args.gpus!r}") from None
    values = {f.name: getattr(args, f.name) for f in fields(Shape) if f.name != "gpus"}
    return [budget(Shape(gpus=g, **values), scrape_interval_s=args.scrape_interval,
                   evaluation_interval_s=args.evaluation_interval) for g in sizes]


def render(results: Sequence[Budget], fmt: str = "table") -> str:
    if fmt == "json":
        return json.dumps({"shape": {k: v for k, v in asdict(results[0].shape).items() if k != "gpus"},
                           "budgets": [b.to_dict() for b in results]}, indent=2)
    head = ("GPUs", "nodes", "ranks", "per worker rank", "per step rank", "per node", "job scraped",
            "job recorded", "job total", "samples/s")
    rows = [[str(v) if not isinstance(v, float) else f"{v:,.0f}" for v in b.to_dict().values()] for b in results]
    rows = [[f"{int(c):,}" if c.isdigit() else c for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(head, widths, strict=True))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    b = results[0]
    lines.append(f"series: active series (sample lines) incl. {b.per_target} per target that Prometheus adds; "
                 f"samples/s at a {b.scrape_interval_s:g} s scrape and {b.evaluation_interval_s:g} s evaluation "
                 "interval. docs/scale.md: what they cost.")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    import sys

    try:
        results = budgets(args)
    except ValueError as exc:
        print(f"rl-otel budget: {exc}", file=sys.stderr)
        return 2
    print(render(results, args.format))
    return 0
