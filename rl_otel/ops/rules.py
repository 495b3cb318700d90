"""Prometheus recording and alerting rules for RL training, generated from :mod:`rl_otel.ops.thresholds`.

Recording rules follow ``level:metric:operations``: ``run:rl_policy_kl:max`` is the largest old-to-new policy KL
any rank of a run reported. They aggregate ``by (job, run)`` and never keep ``rank`` or ``instance``, so 1 or 1,000
ranks give one series per run. Each training quantity is a concept of :mod:`rl_otel.catalog.concepts`: ROLL,
veRL, TRL and Trinity-RFT log it under their own keys, the rule takes whichever source a run reports
(``max by (job, run) (a) or max by (job, run) (b)``), so the alerts and dashboards see every framework. Alerts read
the recorded series, so a threshold is checked once per run, not once per rank.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from rl_otel.catalog import meta
from rl_otel.catalog.concepts import NON_FINITE_WATCHED, SANE_RANGES, concept
from rl_otel.ops import contract, runbook
from rl_otel.ops.thresholds import DEFAULT, Thresholds

RUN = "job, run"
# Scrape jobs of rl_otel endpoints all start with this (prometheus/prometheus.yml names them so).
JOB_REGEX = "rl_otel.*"
# how long a target whose last scrape said rl_run_finished 1 (its run ended normally, close() ran) is not "down":
# a static target stays listed after its run, so it would page otherwise; longer windows cost every evaluation more
FINISHED_QUIET = "1d"

@dataclass(frozen=True)
class Recording:
    record: str
    expr: str

    def to_dict(self) -> dict[str, str]:
        return {"record": self.record, "expr": self.expr}


@dataclass(frozen=True)
class Alert:
    """One alert. ``summary``/``description`` are Go templates (``{{ $labels.run }}``, ``{{ $value }}``)."""

    name: str
    expr: str
    for_: str
    severity: str
    summary: str
    description: str
    concept: str | None = None  # the concept (rl_otel.catalog.concepts) the alert watches, whatever logged it
    also: tuple[str, ...] = ()  # further concepts it reads (a per-sequence sum beside the per-token mean, ...)

    @property
    def concepts(self) -> tuple[str, ...]:
        return ((self.concept,) if self.concept else ()) + self.also

    @property
    def anchor(self) -> str:
        """The runbook section: a ``## RLTrainerStalled`` heading has the anchor ``rltrainerstalled``."""
        return runbook.anchor(self.name)

    def to_dict(self, links: RunbookLinks | None = None) -> dict[str, object]:
        return {
            "alert": self.name,
            "expr": self.expr,
            "for": self.for_,
            "labels": {"severity": self.severity},
            "annotations": {"summary": self.summary, "description": self.description,
                            "runbook_url": (links or RunbookLinks()).url(self)},
        }


# The Grafana whose runbook dashboard the shipped rule files link to when no base is given: docker-compose.yml
# publishes its Grafana (grafana/dashboards/ provisioned, the runbook dashboard among them) on this machine's port
# 3000, as docs/without-docker.md's Grafana is; a Kubernetes Prometheus names its team's Grafana in the external
# label ``grafana_url`` (the Prometheus CR's spec.externalLabels), else a port-forward to 3000 opens it.
COMPOSE_GRAFANA = "http://localhost:3000"
KUBERNETES_GRAFANA = ("{{ with $externalLabels.grafana_url }}{{ . }}{{ else }}" + COMPOSE_GRAFANA + "{{ end }}")


@dataclass(frozen=True)
class RunbookLinks:
    """Where an alert's ``runbook_url`` points (:mod:`rl_otel.ops.runbook`): by default the alert's panel of the
    generated runbook dashboard in the Grafana that ships with the rule file (:data:`COMPOSE_GRAFANA`; with
    ``kubernetes``, :data:`KUBERNETES_GRAFANA`); with ``runbook_base``, ``<runbook_base>#<anchor>`` (your fork's or
    wiki's page of docs/runbook.md); with ``grafana_url``, the alert's panel in that Grafana. ``ValueError`` for a
    base that is not an absolute http(s) URL, or for both at once."""

    grafana_url: str | None = None
    runbook_base: str | None = None
    kubernetes: bool = False  # the default Grafana is the one the Kubernetes Prometheus' external label names

    def __post_init__(self) -> None:
        if self.grafana_url is not None and self.runbook_base is not None:
            raise ValueError("give the runbook links one base: --runbook-base or --grafana-url, not both")
        if self.grafana_url is not None:
            runbook.check_url(self.grafana_url, "--grafana-url")
        if self.runbook_base is not None:
            runbook.check_url(self.runbook_base, "--runbook-base")

    @property
    def chosen(self) -> bool:
        """Whether a base was given (else the shipped Grafana's)."""
        return self.grafana_url is not None or self.runbook_base is not None

    @property
    def base(self) -> str:
        """The URL every link starts with."""
        if self.runbook_base is not None:
            return self.runbook_base
        return self.grafana_url or (KUBERNETES_GRAFANA if self.kubernetes else COMPOSE_GRAFANA)

    def url(self, alert: Alert) -> str:
        if self.runbook_base is not None:
            return f"{self.runbook_base}#{alert.anchor}"
        return runbook.panel_url(alert_names(), alert.name, self.base)


@functools.lru_cache(maxsize=1)
def _alert_names() -> tuple[str, ...]:
    from rl_otel.ops import engines  # it builds on this module's records

    return tuple(a.name for a in (*alerts(DEFAULT), *fleet_alerts(DEFAULT), *engines.alerts(DEFAULT)))


def alert_names() -> list[str]:
    """Every alert, in rule-file order (the runbook dashboard's panel order; thresholds change no name)."""
    return list(_alert_names())


def _agg(op: str, selectors: tuple[str, ...], by: str = RUN) -> str:
    """``op by (by) (s1) or op by (by) (s2) ...``: the first source a run reports wins."""
    return " or ".join(f"{op} by ({by}) ({s})" for s in selectors)


def _non_finite(metric: str) -> str:
    # NaN fails every comparison and ±Inf fails one of these two, so "unless finite" keeps exactly the bad samples;
    # the `loss` label keeps two bad losses of one rank apart (`or` matches series without their metric name).
    return f'label_replace({metric} unless ({metric} > -Inf < +Inf), "loss", "$1", "__name__", "(.+)")'


def _concept(name: str) -> Recording:
    c = concept(name)
    return Recording(c.record, c.expr())


# concepts whose alerts compare the run with its own median (thresholds.py: baseline_window, baseline_offset)
BASELINED = ("policy_kl", "ref_kl", "sequence_ref_kl", "importance_ratio_max", "train_infer_kl",
             "train_infer_logprob_diff", "train_infer_ratio_deviation")
PHASE = "job, run, cluster, phase"
PHASE_STARTED = "run_phase:rl_phase_started_timestamp_seconds:min"
PHASE_P90 = "run_phase:rl_phase_duration_seconds:p90"
RANK_SKEW = "run_phase:rl_phase_duration_seconds:rank_skew"
RANK_SPREAD = "run_phase:rl_phase_duration_seconds:rank_spread_seconds"
OUT_OF_RANGE = "run:rl_metric_out_of_range:count"
# Goodput per run and role (the process's role: trainer, explorer, rollout, ...), stragglers per rank, progress
ROLE = "job, run, role"
GOODPUT_BUCKET = "run_role_bucket:rl_goodput_bucket_seconds:rate5m"
GOODPUT_SHARE = "run_role_bucket:rl_goodput_bucket_seconds:share_rate5m"
GOODPUT_WALL = "run_role:rl_goodput_wall_seconds:rate5m"
GOODPUT_RATIO = "run_role:rl_goodput:ratio_rate5m"
GOODPUT_BASELINE = GOODPUT_RATIO + "_baseline"
LAST_PROGRESS = "run_role:rl_last_progress_timestamp_seconds:max"
RANK_COMPUTE = "run_role_rank:rl_rank_compute:rate5m"
RANK_COMPUTE_RATIO = "run_role_rank:rl_rank_compute_ratio:rate5m"
PRODUCTIVE = "|".join(contract.PRODUCTIVE)  # a label regex: bucket=~"generation|training|inference"


def baseline(name: str) -> str:
    """The recorded baseline of a concept: ``run:rl_policy_kl:max_baseline``."""
    return concept(name).record + "_baseline"


def _baseline(name: str, t: Thresholds) -> Recording:
    rec = concept(name).record
    return Recording(baseline(name), f"quantile_over_time(0.5, {rec}[{t.baseline_window}] offset {t.baseline_offset})")


def duration_minutes(duration: str) -> int:
    """``"90s"`` -> 1, ``"15m"`` -> 15, ``"1h"`` -> 60: whole minutes of a Prometheus duration."""
    number, unit = int(duration[:-1]), duration[-1]
    return int(number * {"s": 1 / 60, "m": 1, "h": 60, "d": 1440}[unit])


def smoothed(name: str, window: str) -> str:
    """The median of a concept's recorded series over ``window``: one batch's value (or a finished run's held last
    one) does not move it."""
    return f"quantile_over_time(0.5, {concept(name).record}[{window}])"


def _above_own(name: str, ratio: float, floor: float, ceiling: float | None, t: Thresholds,
               smooth: str | None = None) -> str:
    """``x > ratio * baseline and x > floor``, or ``x > ceiling`` whatever the baseline (also before one exists);
    ``x`` is the concept's recorded series, or with ``smooth`` its median over that window (:func:`smoothed`).

    The comparison with the baseline waits until the run is older than the baseline's window and offset (``x
    offset <both>`` exists): a KL to the reference grows from 0 in a run's first minutes, and a baseline of those
    minutes would page on every healthy start."""
    rec = concept(name).record
    x = rec if smooth is None else smoothed(name, smooth)
    age = f"{duration_minutes(t.baseline_window) + duration_minutes(t.baseline_offset)}m"
    rel = f"({x} > {ratio:g} * {baseline(name)} and {x} > {floor:g} and {rec} offset {age})"
    return rel if ceiling is None else f"{rel} or {x} > {ceiling:g}"


def _out_of_range() -> str:
    parts = []
    for name, (low, high) in SANE_RANGES.items():
        for source in concept(name).sources:
            sel = source.promql()
            bad = f"{sel} < {low:g}" + (f" or {sel} > {high:g}" if high != float("inf") else "")
            parts.append(f'label_replace({bad}, "metric", "$1", "__name__", "(.+)")')
    return f"count by ({RUN}, metric) ({' or '.join(parts)})"


def _phase_mean_per_rank(t: Thresholds) -> str:
    sel = 'rl_phase_duration_seconds_{}{{part="total"}}'
    return f"(rate({sel.format('sum')}[{t.rank_skew_window}]) / rate({sel.format('count')}[{t.rank_skew_window}]))"


def _goodput_rules(t: Thresholds) -> tuple[Recording, ...]:
    """Where a role's wall time goes (seconds per second of wall, summed over its ranks), its productive share and
    the run's own baseline of it; the last progress of a role; each rank's compute rate and its ratio to the median
    rank of its run and role (the straggler computes more, the ranks waiting on it less: a rank's wait at a
    collective is no compute)."""
    bucket, wall = contract.GOODPUT_BUCKET.exposed, contract.GOODPUT_WALL.exposed
    return (
        Recording(GOODPUT_BUCKET, f"sum by ({ROLE}, bucket) (rate({bucket}[5m]))"),
        # a finished process that lingers advances nothing a timing key counts: no 0/0 from it
        Recording(GOODPUT_WALL, f"sum by ({ROLE}) (rate({wall}[5m])) > 0"),
        Recording(GOODPUT_SHARE, f"{GOODPUT_BUCKET} / on ({ROLE}) group_left () {GOODPUT_WALL}"),
        # a role with no productive bucket served at all has a goodput of 0, not none
        Recording(GOODPUT_RATIO, f'(sum by ({ROLE}) ({GOODPUT_BUCKET}{{bucket=~"{PRODUCTIVE}"}}) or 0 * '
                                 f"{GOODPUT_WALL}) / {GOODPUT_WALL}"),
        Recording(GOODPUT_BASELINE, f"quantile_over_time(0.5, {GOODPUT_RATIO}[{t.goodput_baseline_window}] offset "
                                    f"{t.goodput_baseline_offset})"),
        # a process of an rl_otel without the progress gauge: its last step
        Recording(LAST_PROGRESS, f"max by ({ROLE}) ({contract.LAST_PROGRESS.exposed} or "
                                 "rl_last_step_timestamp_seconds)"),
        Recording(RANK_COMPUTE, f"sum by ({ROLE}, rank) (rate({contract.RANK_COMPUTE.exposed}[5m]))"),
        Recording(RANK_COMPUTE_RATIO, f"{RANK_COMPUTE} / on ({ROLE}) group_left () "
                                      f"(quantile by ({ROLE}) (0.5, {RANK_COMPUTE}) > 0)"),
    )


def recording_rules(t: Thresholds = DEFAULT) -> tuple[Recording, ...]:
    """The recorded series dashboards and alerts share."""
    throughput = concept("throughput").record
    mean = _phase_mean_per_rank(t)
    return (
        Recording("run:rl_step:max", _agg("max", ("rl_step",))),
        Recording("run:rl_step:count", _agg("count", ("rl_step",))),
        Recording("run:rl_step:deriv5m", f"max by ({RUN}) (deriv(rl_step[5m]))"),
        Recording("run:rl_last_step_timestamp_seconds:max", _agg("max", ("rl_last_step_timestamp_seconds",))),
        Recording("run:rl_loss_non_finite:count",
                  f"count by ({RUN}) ({' or '.join(_non_finite(m) for m in NON_FINITE_WATCHED)})"
                  f" or (count by ({RUN}) (rl_step) * 0)"),
        *(_concept(name) for name in ("reward", "policy_kl", "ref_kl", "sequence_ref_kl", "policy_loss",
                                      "clip_ratio", "importance_ratio_max", "entropy", "sequence_entropy",
                                      "explained_variance", "response_length", "step_duration", "learning_rate",
                                      "grad_norm", "gpu_memory_peak", "gpu_memory_peak_ratio", "throughput",
                                      "train_infer_kl", "train_infer_logprob_diff", "train_infer_ratio_deviation",
                                      "staleness", "mfu")),
        *(_baseline(name, t) for name in BASELINED),
        Recording(f"{throughput}_avg{t.throughput_window}", f"avg_over_time({throughput}[{t.throughput_window}])"),
        _concept("eval_score"),
        # phases: the oldest running one, its usual duration, and how much slower the slowest rank is
        Recording(PHASE_STARTED, f"min by ({PHASE}) (rl_phase_started_timestamp_seconds)"),
        Recording(PHASE_P90, f"histogram_quantile(0.9, sum by ({PHASE}, le) (increase(rl_phase_duration_seconds_"
                             f'bucket{{part="total"}}[{t.phase_history_window}]))) > 0'),
        Recording(RANK_SKEW, f"max by ({PHASE}) ({mean}) / quantile by ({PHASE}) (0.5, {mean})"),
        Recording(RANK_SPREAD, f"max by ({PHASE}) ({mean}) - quantile by ({PHASE}) (0.5, {mean})"),
        Recording(OUT_OF_RANGE, _out_of_range()),
        *_goodput_rules(t),
    )


def _query(promql: str, args: str) -> str:
    """The pipeline of a Go template action running ``promql`` (a printf format, written as a raw string) with
    ``args``: ``printf `x{job=%q}` $labels.job | query``."""
    return f"printf `{promql}` {args} | query"


def _dumps(matchers: str, args: str, none: str) -> str:
    """Where the alerted processes' last stack dumps are (rl_stack_dump_info's ``path``, on the machine of its
    ``instance``), matched on the alert's job and run and ``matchers`` (the remaining printf format and its
    ``args``); ``none`` when no dump matches. At most three are listed."""
    dump = contract.STACK_DUMP_INFO.exposed
    return ("{{ range $i, $d := " + _query(f"topk(3, {dump}{{job=%q, run=%q, {matchers}}})",
                                           f"$labels.job $labels.run {args}")
            + " }}{{ if $i }}; {{ end }}{{ $d.Labels.path }} (rank {{ $d.Labels.rank }} on {{ $d.Labels.instance }}, "
            "{{ $d.Labels.reason }}){{ else }}" + none + "{{ end }}")


def _no_progress(t: Thresholds) -> Alert:
    """A process whose endpoint answers (up) but whose last progress (a logged step, a finished phase) is far older
    than its own mean interval between progress over the history window: alive but hung (a rollout engine whose
    requests never end, a trainer deadlocked in a collective). Without two progress events in the window, older
    than ``stall_seconds``. A finished run's processes close their endpoints: their series go, and so does the
    alert; ``up`` keeps a process whose scrapes fail out (RLScrapeTargetDown speaks for it)."""
    p, w = contract.LAST_PROGRESS.exposed, t.progress_history_window
    n = contract.PROGRESS.exposed
    age = f"time() - {p}"
    # the progress events between the window's first and last progress time: their mean interval (a count of
    # the timestamp's changes would be one per scrape, and the interval the scrape interval)
    events = f"({n} - min_over_time({n}[{w}]))"
    interval = f"(({p} - min_over_time({p}[{w}])) / {events})"
    expr = (f"((({age} > {t.progress_stall_ratio:g} * {interval} and {age} > {t.progress_stall_min_seconds:g}) or "
            f"({age} > {t.stall_seconds:g} unless {events} > 0)) and on (job, instance) "
            f'up{{job=~"{JOB_REGEX}"}} == 1) unless on (job, instance) {_waiting_in_hang(t)}')
    who = "{{ $labels.role }} rank {{ $labels.rank }} of run {{ $labels.run }} ({{ $labels.instance }})"
    sel = "job=%[1]q, run=%[2]q, role=%[3]q, rank=%[4]q, instance=%[5]q"
    args = "$labels.job $labels.run $labels.role $labels.rank $labels.instance"
    usual = ("{{ with " + _query(f"(({p}{{{sel}}} - min_over_time({p}{{{sel}}}[{w}])) / ({n}{{{sel}}} - "
                                 f"min_over_time({n}{{{sel}}}[{w}]))) > 0", args)
             + " }}{{ . | first | value | humanizeDuration }}{{ else }}unknown (fewer than two progress events)"
             "{{ end }}")
    return Alert(
        "RLProcessNoProgress", expr, t.progress_stall_for, "critical",
        f"Process {who} is up but made no progress for {{{{ $value | humanizeDuration }}}}",
        f"The endpoint of {who} answers, but the process logged no step and finished no phase for "
        f"{{{{ $value | humanizeDuration }}}}; its mean interval between progress over the last {w} is {usual} "
        f"(fires above {t.progress_stall_ratio:g} times it and {t.progress_stall_min_seconds:g}s, or "
        f"{t.stall_seconds:g}s without one): alive but hung (an engine whose requests never end, a collective "
        "waiting for a dead peer, a lock). A rank waiting inside a collective that another rank of its group never "
        "entered is left to RLCollectiveHang, which names that rank. Stack dumps: "
        + _dumps("role=%q, rank=%q", "$labels.role $labels.rank", "none written by this process yet") + ".")


def _behind(t: Thresholds) -> str:
    """The ranks that issued fewer collectives in a process group than its most advanced rank, while that
    group's ranks wait in a collective for ``collective_hang_seconds``: the value is how many fewer. A rank whose
    endpoint stopped answering keeps its last count for ``collective_hang_lookback``."""
    issued = f"last_over_time({contract.COLLECTIVES.exposed}[{t.collective_hang_lookback}])"
    started = contract.COLLECTIVE_STARTED.exposed
    return (f"((max by (job, run, group) ({issued}) - on (job, run, group) group_right {issued}) > 0 and on (job, "
            f"run, group) time() - min by (job, run, group) ({started}) > {t.collective_hang_seconds:g})")


def _waiting_in_hang(t: Thresholds) -> str:
    """The ranks inside a collective of a group in which :func:`_behind` names a rank."""
    return (f"({contract.COLLECTIVE_STARTED.exposed} and on (job, run, group) count by (job, run, group) "
            f"({_behind(t)}))")


def _collective_hang(t: Thresholds) -> Alert:
    """The rank not in the collective the others wait in, named (issue 41): from torch's own flight recorder, so
    an unwrapped ``dist.all_reduce`` counts. Every rank of a hung collective stops making progress, so progress
    alone cannot tell the stuck rank from the waiting ones; the count of collectives each issued can."""
    started = contract.COLLECTIVE_STARTED.exposed
    sel = "job=%q, run=%q, group=%q"
    args = "$labels.job $labels.run $labels.group"
    waited = ("{{ with " + _query(f"topk(1, time() - {started}{{{sel}}})", args)
              + ' }}{{ . | first | label "op" }} for {{ . | first | value | humanizeDuration }}{{ end }}')
    return Alert(
        "RLCollectiveHang", _behind(t), t.collective_hang_for, "critical",
        "Run {{ $labels.run }}: rank {{ $labels.rank }} ({{ $labels.role }}) is not in the collective the other "
        "ranks of group {{ $labels.group }} wait in",
        "Rank {{ $labels.rank }} ({{ $labels.role }}, {{ $labels.instance }}) of run {{ $labels.run }} issued "
        "{{ $value | printf \"%.0f\" }} fewer collectives in process group {{ $labels.group }} than the most "
        "advanced rank of it, "
        f"whose ranks wait in {waited} (fires past {t.collective_hang_seconds:g}s): it never entered that "
        "collective - the stuck rank (a lock, a data loader, a branch the others did not take, the GIL held in C; "
        "a rank whose endpoint no longer answers keeps its last count for "
        f"{t.collective_hang_lookback}). Its stack dumps: "
        + _dumps("role=%q, rank=%q", "$labels.role $labels.rank", "none written by this process yet")
        + ". Counted from torch's flight recorder (torch.distributed's own collectives, NCCL or gloo): a rank slow "
        "inside the collective itself (a slow link) issued as many as the others and is not named.")


def _rank_skew(t: Thresholds) -> Alert:
    """The slow rank, named. Where ranks serve ``rl_rank_compute_seconds_total`` (busy time in phases less the
    waits at ``tel.collective()`` points), a rank computing ``rank_skew_max`` times the median rank of its run and
    role: the straggler computes more per second of wall time, the ranks waiting on it less (their wait is no
    compute), so a waiting rank is never named, however long its phases look. A run without those series keeps the
    phase rule (the slowest rank's mean phase duration against the median rank's): it names no rank, since a rank
    waiting for a straggler inside the phase looks slower there than the straggler does."""
    compute = (f"({RANK_COMPUTE_RATIO} > {t.rank_skew_max:g} and on ({ROLE}, rank) ({RANK_COMPUTE} - on ({ROLE}) "
               f"group_left () quantile by ({ROLE}) (0.5, {RANK_COMPUTE}) > {t.rank_skew_min_share:g}))")
    phases = (f"(({RANK_SKEW} > {t.rank_skew_max:g} and {RANK_SPREAD} > {t.rank_skew_min_seconds:g}) unless on "
              f"(job, run) {RANK_COMPUTE})")
    value = '{{ $value | printf "%.3g" }}'
    wait = contract.COLLECTIVE_WAIT.exposed
    waits = ("{{ with " + _query(f"topk(1, sum by (point) (rate({wait}{{job=%q, run=%q, role=%q, rank!=%q}}[5m])))",
                                 "$labels.job $labels.run $labels.role $labels.rank")
             + " }}; the other ranks wait for it at {{ . | first | label \"point\" }}{{ end }}")
    return Alert(
        # quiet in a hang (its compute ratios fall with everyone's): RLCollectiveHang names the rank then
        "RLRankSkew", f"({compute} or {phases}) unless on (job, run) count by (job, run) ({_behind(t)})",
        t.rank_skew_for, "warning",
        "Run {{ $labels.run }}: {{ if $labels.rank }}rank {{ $labels.rank }} ({{ $labels.role }}) computes "
        f"{value}x the median rank{{{{ else }}}}a rank of {{{{ $labels.cluster }}}}/{{{{ $labels.phase }}}} is "
        f"{value}x slower than the median rank{{{{ end }}}}",
        "{{ if $labels.rank }}Over 5m, rank {{ $labels.rank }} of role {{ $labels.role }} in run {{ $labels.run }} "
        f"spent {value} times the median rank's time computing (busy in phases, less its waits at "
        f"tel.collective() points; threshold {t.rank_skew_max:g}, and {t.rank_skew_min_share:g} of the wall time "
        f"more), for {t.rank_skew_for}: it is the straggler" + waits + ". "
        f"{{{{ else }}}}Over {t.rank_skew_window}, the slowest rank's mean duration of phase "
        f"{{{{ $labels.cluster }}}}/{{{{ $labels.phase }}}} is {value} times the median rank's (threshold "
        f"{t.rank_skew_max:g}, and {t.rank_skew_min_seconds:g}s slower), for {t.rank_skew_for}; which rank is not "
        "named: this run serves no rl_rank_compute_seconds_total, and phase times alone cannot tell the slow rank "
        "from the ranks waiting on it. {{ end }}A slow GPU or node, thermal throttling, an unbalanced data shard. "
        "Not named: a rank slow between phases (it shows as the rank that waits least at the collectives) or inside "
        "a collective (a slow link); a hang is RLCollectiveHang's.")


def _goodput_drop(t: Thresholds) -> Alert:
    """A role's goodput (productive share of its wall time) well below the run's own baseline: its mean over
    ``goodput_smooth`` below ``goodput_drop_ratio`` times the baseline and ``goodput_drop_min`` under it, for
    ``goodput_for`` (a checkpoint or an eval shorter than that never pages), once the baseline holds
    ``goodput_baseline_min_history`` of the run, while the role still makes progress (a finished run that lingers,
    or a hung one, is another alert's: RLTrainerStalled, RLProcessNoProgress)."""
    x = f"avg_over_time({GOODPUT_RATIO}[{t.goodput_smooth}])"
    age = (f"{duration_minutes(t.goodput_baseline_offset) + duration_minutes(t.goodput_baseline_min_history)}m")
    expr = (f"({x} < {t.goodput_drop_ratio:g} * {GOODPUT_BASELINE} and {GOODPUT_BASELINE} - {x} > "
            f"{t.goodput_drop_min:g} and {GOODPUT_RATIO} offset {age}) and on ({ROLE}) {LAST_PROGRESS} > time() - "
            f"{duration_minutes(t.goodput_smooth) * 60}")
    sel = "job=%[1]q, run=%[2]q, role=%[3]q"
    args = "$labels.job $labels.run $labels.role"
    baseline = ("{{ with " + _query(f"{GOODPUT_BASELINE}{{{sel}}}", args)
                + " }}{{ . | first | value | humanizePercentage }}{{ end }}")
    grew = ("{{ with " + _query(
        f'topk(1, {GOODPUT_SHARE}{{{sel}, bucket!~"{PRODUCTIVE}"}} - (avg_over_time({GOODPUT_SHARE}{{{sel}}}'
        f"[{t.goodput_baseline_window}] offset {t.goodput_baseline_offset}) or 0 * {GOODPUT_SHARE}{{{sel}}}))",
        args) + ' }}{{ . | first | label "bucket" }} (+{{ . | first | value | humanizePercentage }} of the wall '
        "time){{ else }}unknown{{ end }}")
    who = "role {{ $labels.role }} of run {{ $labels.run }}"
    return Alert(
        "RLGoodputDrop", expr, t.goodput_for, "warning",
        "Run {{ $labels.run }}: goodput of {{ $labels.role }} fell to {{ $value | humanizePercentage }}",
        f"The productive share ({', '.join(contract.PRODUCTIVE)}) of the wall time of {who}, its mean over "
        f"{t.goodput_smooth}, is {{{{ $value | humanizePercentage }}}}: below {t.goodput_drop_ratio:g} times the "
        f"run's own baseline of {baseline} (its median over {t.goodput_baseline_window} ending "
        f"{t.goodput_baseline_offset} ago) and {t.goodput_drop_min:g} under it, for {t.goodput_for}. The badput "
        f"bucket that grew most against the baseline: {grew}.")


def alerts(t: Thresholds = DEFAULT) -> tuple[Alert, ...]:
    value = '{{ $value | printf "%.3g" }}'
    run = "{{ $labels.run }}"
    return (
        Alert("RLTrainerStalled", f"time() - run:rl_last_step_timestamp_seconds:max > {t.stall_seconds:g}",
              t.stall_for, "critical", f"Run {run} made no training step for {t.stall_seconds:g}s",
              f"No rank of run {run} (job {{{{ $labels.job }}}}) called log() for {value}s: the trainer is hung, "
              "deadlocked in a collective, or finished without exiting."),
        Alert("RLScrapeTargetDown",
              f'up{{job=~"{JOB_REGEX}"}} == 0 unless on (job, instance) '
              f'last_over_time({meta.RUN_FINISHED.name}{{job=~"{JOB_REGEX}"}}[{FINISHED_QUIET}]) == 1',
              t.target_down_for, "critical",
              "rl_otel endpoint {{ $labels.instance }} is down",
              "Prometheus cannot scrape {{ $labels.instance }} (job {{ $labels.job }}): the process died, the pod "
              "moved, or the port is not reachable (not a run that finished: its last scrape said "
              f"{meta.RUN_FINISHED.name} 1, which keeps this alert quiet for {FINISHED_QUIET})."),
        Alert("RLScrapeTargetAbsent", f'absent(up{{job=~"{JOB_REGEX}"}})', t.target_absent_for, "warning",
              "No rl_otel scrape target is known to Prometheus",
              f"No target of a job matching {JOB_REGEX} exists: service discovery finds no training pod (wrong "
              "annotations, labels or namespace), or no training runs."),
        Alert("RLLossNotFinite", "run:rl_loss_non_finite:count > 0", t.nan_loss_for, "critical",
              f"Run {run} reports a NaN or infinite loss",
              f"{value} loss or gradient-norm series of run {run} are NaN or ±Inf: the update is garbage and the "
              "weights are probably corrupted from here on.",
              concept="policy_loss"),
        Alert("RLKLRunaway", _above_own("policy_kl", t.approx_kl_ratio, t.approx_kl_floor, t.approx_kl_max, t),
              t.approx_kl_for, "warning", f"Run {run}: KL between old and new policy is {value}",
              f"The approximate KL of one PPO update is {value}: above {t.approx_kl_ratio:g} times the run's own "
              f"median of {t.baseline_window} ({t.baseline_offset} ago) and above {t.approx_kl_floor:g}, or above "
              f"{t.approx_kl_max:g}: the policy moves too far per step (learning rate, too many PPO epochs, stale "
              "rollouts).",
              concept="policy_kl"),
        Alert("RLImportanceRatioExploding",
              _above_own("importance_ratio_max", t.ratio_max_ratio, t.ratio_max_floor, t.ratio_max, t,
                         smooth=t.ratio_max_smooth),
              t.ratio_max_for, "warning",
              f"Run {run}: importance ratio max is {value} (its median over {t.ratio_max_smooth})",
              f"The largest importance ratio exp(logp - logp_old) of a batch, its median over "
              f"{t.ratio_max_smooth}, is {value}: above {t.ratio_max_ratio:g} times the run's own median of "
              f"{t.baseline_window} ({t.baseline_offset} ago) and above {t.ratio_max_floor:g}, or above "
              f"{t.ratio_max:g}: rollout and training policies disagree batch after batch (off-policy drift, a "
              "mismatched inference engine, or numerics).",
              concept="importance_ratio_max"),
        Alert("RLClipFractionHigh", f"run:rl_clip_ratio:max > {t.clip_ratio_max:g}", t.clip_ratio_for,
              "warning", f"Run {run}: clip fraction {value}",
              f"{value} of the tokens hit the PPO ratio clip (threshold {t.clip_ratio_max:g}): most of the "
              "batch gives no gradient.",
              concept="clip_ratio"),
        Alert("RLEntropyCollapse",
              f"run:rl_entropy:avg < {t.entropy_ratio_min:g} * max_over_time(run:rl_entropy:avg[{t.entropy_window}]) "
              f"or run:rl_entropy:avg < {t.entropy_min:g} "
              f"or run:rl_sequence_entropy:avg < {t.entropy_ratio_min:g} * "
              f"max_over_time(run:rl_sequence_entropy:avg[{t.entropy_window}])",
              t.entropy_for, "warning", f"Run {run}: policy entropy collapsed to {value}",
              f"Policy entropy is {value} (nats per token, or per sequence for TRL's objective/entropy): below "
              f"{t.entropy_ratio_min:g} of its own highest value of the last {t.entropy_window}, or below "
              f"{t.entropy_min:g} per token: the policy became deterministic and stops exploring.",
              concept="entropy", also=("sequence_entropy",)),
        Alert("RLRewardCollapse",
              f"run:rl_reward:avg < max_over_time(run:rl_reward:avg[{t.reward_window}]) - "
              f"{t.reward_drop:g}", t.reward_for, "warning", f"Run {run}: mean score fell to {value}",
              f"Mean score {value} is more than {t.reward_drop:g} below its best of the last {t.reward_window}: "
              "the policy is collapsing (or reward hacking broke the reward model).",
              concept="reward"),
        Alert("RLValueExplainedVarianceCollapse",
              f"run:rl_explained_variance:min < {t.explained_variance_min:g}", t.explained_variance_for,
              "warning", f"Run {run}: value function explains no variance ({value})",
              f"Explained variance of the returns by the value function is {value}, below "
              f"{t.explained_variance_min:g}: the critic predicts worse than a constant, advantages are noise.",
              concept="explained_variance"),
        Alert("RLGPUMemoryHeadroomLow", f"run_phase:rl_gpu_memory_peak_ratio:max > {t.gpu_peak_ratio_max:g}",
              t.gpu_peak_for, "warning",
              f"Run {run}: {{{{ $labels.cluster }}}}/{{{{ $labels.phase }}}} peaks at {value} of GPU memory",
              f"Peak allocated or reserved GPU memory during phase {{{{ $labels.cluster }}}}/{{{{ $labels.phase }}}} "
              f"reaches {value} of the device, above {t.gpu_peak_ratio_max:g}: the next longer batch may OOM.",
              concept="gpu_memory_peak_ratio"),
        Alert("RLThroughputDrop",
              f"run:rl_tokens_per_second:sum < {t.throughput_ratio_min:g} * "
              f"run:rl_tokens_per_second:sum_avg{t.throughput_window}", t.throughput_for, "warning",
              f"Run {run}: throughput fell to {value} tokens/s",
              f"Tokens per second ({value}) are below {t.throughput_ratio_min:g} times their own average over "
              f"{t.throughput_window}: a slow node, thermal throttling, a longer-response regime, or contention.",
              concept="throughput"),
        Alert("RLEvalRegression",
              f"avg_over_time(run_taskset:rl_eval_score:avg[{t.eval_smooth}]) < max_over_time(avg_over_time("
              f"run_taskset:rl_eval_score:avg[{t.eval_smooth}])[{t.eval_window}:{t.eval_resolution}]) "
              f"- {t.eval_drop:g}",
              t.eval_for, "warning",
              f"Run {run}: eval {{{{ $labels.taskset }}}}/{{{{ $labels.metric }}}} regressed to {value}",
              f"mean@{{{{ $labels.k }}}} of {{{{ $labels.metric }}}} on {{{{ $labels.taskset }}}}, averaged over "
              f"{t.eval_smooth}, is {value}, more than {t.eval_drop:g} below its best such average of the last "
              f"{t.eval_window}.",
              concept="eval_score"),
        Alert("RLRefKLRunaway",
              _above_own("ref_kl", t.ref_kl_ratio, t.ref_kl_floor, t.ref_kl_max, t) + " or "
              + _above_own("sequence_ref_kl", t.ref_kl_ratio, t.sequence_floor, None, t),
              t.ref_kl_for, "warning", f"Run {run}: KL to the reference model jumped to {value}",
              f"KL between the policy and the reference model is {value} (per token; per sequence for TRL's "
              f"objective/kl): above {t.ref_kl_ratio:g} times the run's own median of {t.baseline_window} "
              f"({t.baseline_offset} ago), or above {t.ref_kl_max:g} per token: the policy leaves the reference "
              "fast (KL coefficient 0 or too small, a reward hack, a learning-rate spike).",
              concept="ref_kl", also=("sequence_ref_kl",)),
        Alert("RLRefKLDrift",
              " or ".join(
                  f"(quantile_over_time(0.5, {r}[{w}]) > {t.ref_kl_drift_ratio:g} * quantile_over_time(0.5, {r}[{w}] "
                  f"offset {w}) and {r} > {floor:g})"
                  for r, w, floor in ((concept("ref_kl").record, t.ref_kl_drift_window, t.ref_kl_floor),
                                      (concept("sequence_ref_kl").record, t.ref_kl_drift_window, t.sequence_floor))),
              t.ref_kl_drift_for, "warning", f"Run {run}: KL to the reference keeps growing ({value})",
              f"The median KL to the reference model over the last {t.ref_kl_drift_window} is {value}, "
              f"{t.ref_kl_drift_ratio:g} times or more its median of the {t.ref_kl_drift_window} before: the policy "
              "drifts away from the reference without settling (a KL penalty too weak to hold it).",
              concept="ref_kl", also=("sequence_ref_kl",)),
        Alert("RLTrainInferenceMismatch",
              f"{concept('train_infer_kl').record} > {t.mismatch_kl_max:g} "
              f"or {concept('train_infer_logprob_diff').record} > {t.mismatch_logprob_diff_max:g} "
              f"or {concept('train_infer_ratio_deviation').record} > {t.mismatch_ratio_deviation_max:g}",
              t.mismatch_for, "warning", f"Run {run}: inference and training log-probs disagree ({value})",
              f"The inference engine's log-probabilities differ from the trainer's for the same tokens: {value} "
              f"(KL above {t.mismatch_kl_max:g}, mean |log-prob difference| above {t.mismatch_logprob_diff_max:g}, "
              f"or |probability ratio - 1| above {t.mismatch_ratio_deviation_max:g}): the rollouts are off-policy "
              "in a way the importance weights must absorb (weights not synced, precision, kernels, tokenizer).",
              concept="train_infer_kl", also=("train_infer_logprob_diff", "train_infer_ratio_deviation")),
        Alert("RLTrainInferenceMismatchRising",
              " or ".join(_above_own(c, t.mismatch_ratio, t.mismatch_floor, None, t)
                          for c in ("train_infer_kl", "train_infer_logprob_diff", "train_infer_ratio_deviation")),
              t.mismatch_for, "warning", f"Run {run}: training-inference mismatch rose to {value}",
              f"The mismatch between the inference engine's and the trainer's log-probs is {value}, above "
              f"{t.mismatch_ratio:g} times the run's own median of {t.baseline_window} ({t.baseline_offset} ago) and "
              f"above {t.mismatch_floor:g}: something changed between engine and trainer (a failed weight sync, a "
              "new engine version, an fp8 or kernel switch).",
              concept="train_infer_kl", also=("train_infer_logprob_diff", "train_infer_ratio_deviation")),
        Alert("RLStalenessHigh", f"{concept('staleness').record} > {t.staleness_max:g}", t.staleness_for,
              "warning", f"Run {run}: samples are {value} policy versions stale",
              f"The stalest sample of a batch was generated {value} policy versions before the one training on it, "
              f"above {t.staleness_max:g}: the asynchronous rollout falls behind the trainer (slow or stuck "
              "rollout workers, a too-large buffer, a staleness bound not enforced).",
              concept="staleness"),
        Alert("RLPhaseStuck",
              f"(time() - {PHASE_STARTED} > {t.phase_stuck_ratio:g} * {PHASE_P90} and time() - {PHASE_STARTED} > "
              f"{t.phase_stuck_min_seconds:g}) or (time() - {PHASE_STARTED} > {t.stall_seconds:g} unless on "
              f"({PHASE}) {PHASE_P90})",
              t.phase_stuck_for, "critical",
              f"Run {run}: cluster {{{{ $labels.cluster }}}}, phase {{{{ $labels.phase }}}} has been running for "
              "{{ $value | humanizeDuration }}",
              f"Cluster {{{{ $labels.cluster }}}}, phase {{{{ $labels.phase }}}} of run {run} has been running for "
              "{{ $value | humanizeDuration }}; its p90 over the last "
              f"{t.phase_history_window} is "
              f'{{{{ with printf "{PHASE_P90}{{job=%q, run=%q, cluster=%q, phase=%q}}" $labels.job $labels.run '
              "$labels.cluster $labels.phase | query }}{{ . | first | value | humanizeDuration }}{{ else }}"
              "unknown (its first run){{ end }}"
              f" (fires above {t.phase_stuck_ratio:g} times the p90 and {t.phase_stuck_min_seconds:g}s, or "
              f"{t.stall_seconds:g}s without a p90). Stack dumps: "
              + _dumps("cluster=%q, phase=%q", "$labels.cluster $labels.phase", "none written for this phase yet")
              + "."),
        _no_progress(t),
        _collective_hang(t),
        _rank_skew(t),
        _goodput_drop(t),
        Alert("RLMetricImpossible", f"{OUT_OF_RANGE} > 0", t.sanity_for, "warning",
              f"Run {run}: {{{{ $labels.metric }}}} reports values that cannot be true",
              f"{value} series of {{{{ $labels.metric }}}} in run {run} are out of their possible range (a fraction "
              "outside [0, 1], an MFU above 1, a negative length, duration, rate or entropy): a unit or aggregation "
              "bug upstream or in the catalog's scale; the dashboards and alerts reading it are wrong too."),
        Alert("RLTelemetryErrors",
              # a counter's first sample has no increase: a series new in the window counts with its value
              f"sum by ({RUN}, sink, reason) ((rl_telemetry_errors_total unless rl_telemetry_errors_total offset "
              f"{t.telemetry_errors_window}) or increase(rl_telemetry_errors_total[{t.telemetry_errors_window}]))"
              " > 0", t.telemetry_errors_for, "info", f"Run {run}: rl_otel absorbs errors ({{{{ $labels.sink }}}})",
              f"rl_otel counted {value} errors of sink {{{{ $labels.sink }}}} ({{{{ $labels.reason }}}}) in "
              f"{t.telemetry_errors_window}; training goes on, but some values do not reach their destination."),
    )


# The many-node topology (prometheus/agent.yml, deploy/multinode/): one Prometheus agent per node remote-writes to
# a central store, and every series it sends carries the agent's external label `node`.
NODE_LABEL = "node"
NODE_SILENT_WINDOW = "2m"     # > scrape interval + remote-write send deadline + VictoriaMetrics' 30 s latency offset
NODE_SILENT_LOOKBACK = "30m"  # a node silent for longer is forgotten (a finished or moved node)


def fleet_alerts(t: Thresholds = DEFAULT, window: str = NODE_SILENT_WINDOW,
                 lookback: str = NODE_SILENT_LOOKBACK) -> tuple[Alert, ...]:
    """Alerts of the many-node topology, evaluated by the central store.

    A node whose agent dies (or whose network or remote write fails) sends nothing at all: no ``up == 0`` reaches
    the central store, so :data:`RLScrapeTargetDown` cannot fire, and its last samples even look current for the
    query lookback (5 min) since a dead agent writes no staleness markers. ``RLNodeSilent`` fires for a node whose
    rl_otel targets of a run reported within ``lookback`` but not within ``window``, while the same run still
    reports from another node (a run that ended everywhere is not a silent node). A rank that dies under a
    living agent is ``up == 0``, i.e. RLScrapeTargetDown, not this alert.
    """
    up = f'up{{job=~"{JOB_REGEX}", {NODE_LABEL}!=""}}'
    by = f"{RUN}, {NODE_LABEL}"
    node = f"{{{{ $labels.{NODE_LABEL} }}}}"
    value = '{{ $value | printf "%.3g" }}'
    return (
        Alert("RLNodeSilent",
              f"(count by ({by}) (count_over_time({up}[{lookback}])) unless count by ({by}) "
              f"(count_over_time({up}[{window}]))) and on ({RUN}) count by ({RUN}) (count_over_time({up}[{window}]))",
              t.target_down_for, "critical", f"Node {node} of run {{{{ $labels.run }}}} sends nothing",
              f"No sample of the {value} rl_otel targets of node {node} (run {{{{ $labels.run }}}}) reached "
              f"the central store for {window}, while other nodes of the run still report: the node's Prometheus "
              "agent (or Collector) is down, its remote write fails, or the node is gone."),
    )


def rule_files(t: Thresholds = DEFAULT, links: RunbookLinks | None = None) -> dict[str, dict[str, object]]:
    """``{file name under prometheus/rules/: rule-file document}``. The alerts file holds two groups: the alerts
    of every setup, then :func:`fleet_alerts` (meaningful where agents label their series with ``node``); the
    rollout engines' rules and alerts are a file of their own (:mod:`rl_otel.ops.engines`)."""
    from rl_otel.ops import engines

    return {
        "rl_otel_recording.yml": {"groups": [{"name": "rl_otel_recording",
                                              "rules": [r.to_dict() for r in recording_rules(t)]}]},
        "rl_otel_alerts.yml": {"groups": [{"name": "rl_otel_alerts",
                                           "rules": [a.to_dict(links) for a in alerts(t)]},
                                          {"name": "rl_otel_fleet",
                                           "rules": [a.to_dict(links) for a in fleet_alerts(t)]}]},
        "rl_otel_engines.yml": engines.rule_file(t, links),
    }
