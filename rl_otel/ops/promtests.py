"""``promtool test rules`` cases for every alert: a bad run that fires and a healthy run that does not.

Each scenario feeds series over time (promtool's ``'a+bxN'`` notation, one sample a minute) for two ranks of a
``bad`` run and a ``good`` run, and checks at two times: before the alert's ``for`` has elapsed (nothing fires) and
after (exactly the bad run fires, with the value written here by hand). The input values are placed relative to
the thresholds, so the cases stay meaningful when a threshold changes; the expected values are not computed by
the rules' code, so a wrong expression fails the test.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from rl_otel.ops.rules import NODE_SILENT_LOOKBACK, NODE_SILENT_WINDOW, Alert, RunbookLinks, alerts, fleet_alerts
from rl_otel.ops.rules import duration_minutes as _minutes
from rl_otel.ops.thresholds import DEFAULT, Thresholds

JOB = "rl_otel"


@dataclass(frozen=True)
class Firing:
    labels: dict[str, str]
    value: float
    # what the ``{{ with ... | query }}`` / ``{{ range ... | query }}`` blocks of the annotations render to, in order
    queried: str | tuple[str, ...] = ""


@dataclass(frozen=True)
class Case:
    """One test group: input series, then ``{eval minute: alerts expected}``."""

    series: dict[str, str]
    checks: dict[int, list[Firing]] = field(default_factory=dict)


def _s(name: str, run: str, rank: int = 0, **labels: str) -> str:
    """A series of one rank of a run (``metric`` may be a label, as in ``rl_eval_metric{metric=...}``)."""
    inner = {"job": JOB, "instance": f"{run}-{rank}:9464", "run": run, "rank": str(rank), **labels}
    return name + "{" + ", ".join(f'{k}="{v}"' for k, v in inner.items()) + "}"


def _run(**labels: str) -> dict[str, str]:
    return {"job": JOB, **labels}


def _const_fire(metric: str, healthy: float, bad: float, minutes: int, extra: dict[str, str] | None = None
                ) -> dict[str, str]:
    """bad run: rank 0 turns ``bad`` at minute 6, rank 1 stays healthy; good run: both ranks healthy."""
    extra = extra or {}
    return {
        _s(metric, "bad", 0, **extra): f"{healthy:g}x5 {bad:g}x{minutes}",
        _s(metric, "bad", 1, **extra): f"{healthy:g}x{minutes + 5}",
        _s(metric, "good", 0, **extra): f"{healthy:g}x{minutes + 5}",
        _s(metric, "good", 1, **extra): f"{healthy:g}x{minutes + 5}",
    }


class ThresholdsOutsideTests(ValueError):
    """The alert tests (``prometheus/tests``) cannot be built for these thresholds: their healthy and broken runs
    are laid out for thresholds within some bounds (a run of 45 minutes, phases of two minutes)."""


def _fits(condition: bool, text: str) -> None:
    if not condition:
        raise ThresholdsOutsideTests(f"the alert tests (prometheus/tests) are laid out for thresholds where {text}; "
                                     "these thresholds are outside it")


STUCK_DUMP = "/logs/stuck/stack-rollout-0.txt"
NO_PHASE_DUMP = "none written for this phase yet"


def _no_progress_cases(t: Thresholds) -> list[Case]:
    """hung: a rollout engine progressing every minute stops at minute 20 while its endpoint answers; fresh: one
    progress at minute 0, none since (no interval known: stall_seconds); slow: progress every 10 minutes, none
    since minute 20 (25 minutes is 2.5 of its intervals); down: stops and its scrapes fail (RLScrapeTargetDown's);
    finished: its series go at minute 20 (a closed Telemetry) while the endpoint (rl-otel watch) answers. The hung
    engine progressed four times a second (240 events a minute, scraped once a minute): its mean interval is 250ms,
    not the scrape interval. collective: two trainers stop at minute 20, rank 0 inside collective 11 of its group,
    rank 1 (which issued 10) in none: only rank 1 is named here (rank 0 is RLCollectiveHang's waiting rank)."""
    p, n = "rl_last_progress_timestamp_seconds", "rl_progress_total"
    end = 45
    runs = {"hung": ("rollout", "0+60x20 1200x25", "1x45", "0+240x20 4800x25"),
            "fresh": ("trainer", "0x45", "1x45", "1x45"),
            "slow": ("trainer", "0x9 600x9 1200x25", "1x45", "0x9 1x9 2x25"),
            "down": ("trainer", "0+60x20 1200x25", "1x20 0x25", "0+1x20 20x25"),
            "finished": ("trainer", "0+60x20", "1x45", "0+1x20")}
    series = {}
    for run, (role, progress, up, events) in runs.items():
        series[_s(p, run, 0, role=role)] = progress
        series[_s(n, run, 0, role=role)] = events
        series[f'up{{job="{JOB}", instance="{run}-0:9464"}}'] = up
    for rank, issued in ((0, "0+1x19 11x25"), (1, "0+1x19 10x25")):
        series[_s(p, "collective", rank, role="trainer")] = "0+60x20 1200x25"
        series[_s(n, "collective", rank, role="trainer")] = "0+1x20 20x25"
        series[_s("rl_collectives_total", "collective", rank, role="trainer", group="0:default_pg")] = issued
        series[f'up{{job="{JOB}", instance="collective-{rank}:9464"}}'] = "1x45"
    series[_s("rl_collective_started_timestamp_seconds", "collective", 0, role="trainer", group="0:default_pg",
              op="nccl:all_reduce")] = "_x20 1200x25"
    dump = "/logs/hung/stack-rollout-0.txt"
    series[_s("rl_stack_dump_info", "hung", 0, role="rollout", path=dump, cluster="", phase="",
              reason="signal")] = "_x30 1x15"
    hung_at, quiet = 20, int(max(t.progress_stall_min_seconds, 60 * t.progress_stall_ratio) // 60)
    _fits(hung_at + quiet + _minutes(t.progress_stall_for) + 2 < end,
          "max(progress_stall_min_seconds, 60 x progress_stall_ratio) + progress_stall_for is under 23 "
          "minutes (the hung engine stops at minute 20 of 45)")
    _fits(10 * 60 * t.progress_stall_ratio > (end - 20) * 60 > t.progress_stall_min_seconds,
          "progress_stall_min_seconds < 25 min < 10 x progress_stall_ratio minutes (a run progressing "
          "every 10 minutes is slow, not hung)")
    before = int(t.stall_seconds // 60) - 1  # fresh: not pending yet
    _fits(before < hung_at + quiet and t.stall_seconds + 60 * _minutes(t.progress_stall_for) < end * 60,
          "stall_seconds + progress_stall_for is under 45 minutes and stall_seconds under the hung case's threshold")
    labels = {"job": JOB, "rank": "0"}
    return [Case(series, {before: [], end: [
        Firing({**labels, "instance": "hung-0:9464", "run": "hung", "role": "rollout"}, (end - hung_at) * 60,
               (humanize_duration(0.25), f"{dump} (rank 0 on hung-0:9464, signal)")),
        Firing({"job": JOB, "rank": "1", "instance": "collective-1:9464", "run": "collective", "role": "trainer"},
               (end - hung_at) * 60, (humanize_duration(60), "none written by this process yet")),
        Firing({**labels, "instance": "fresh-0:9464", "run": "fresh", "role": "trainer"}, end * 60,
               ("unknown (fewer than two progress events)", "none written by this process yet"))]})]


HANG_DUMP = "/logs/hang/stacks-hang-trainer-rank2-no-phase-stuck.txt"


def _collective_hang_cases(t: Thresholds) -> list[Case]:
    """hang: four trainers issue 10 collectives a minute; at minute 10 ranks 0, 1 and 3 enter collective 101 of the
    world group and wait in it, rank 2 (blocked on a lock) stays at 100: rank 2 is named, with its dump. dead: rank
    1's endpoint stops answering at minute 10 (the GIL held in C) while rank 0 waits: its last count names it.
    good: four trainers, rank 3 one collective behind at every scrape (NCCL's asynchronous launches) and each rank
    briefly inside one: nobody waits long, nothing fires."""
    c, started, group = "rl_collectives_total", "rl_collective_started_timestamp_seconds", "0:default_pg"
    series: dict[str, str] = {}
    for rank in range(4):
        series[_s(c, "hang", rank, role="trainer", group=group)] = "0+10x10 " + ("100x40" if rank == 2 else "101x40")
        if rank != 2:
            series[_s(started, "hang", rank, role="trainer", group=group, op="gloo:all_reduce")] = "_x10 600x40"
        series[_s(c, "good", rank, role="trainer", group=group)] = "0+10x50" if rank == 3 else "1+10x50"
        series[_s(started, "good", rank, role="trainer", group=group, op="nccl:all_reduce")] = \
            f"_x{20 + rank} {(20 + rank) * 60} _x{29 - rank}"
    series[_s(c, "dead", 0, role="trainer", group=group)] = "0+10x10 101x40"
    series[_s(started, "dead", 0, role="trainer", group=group, op="nccl:all_reduce")] = "_x10 600x40"
    series[_s(c, "dead", 1, role="trainer", group=group)] = "0+10x10"  # its endpoint answers no more
    series[_s("rl_stack_dump_info", "hang", 2, role="trainer", path=HANG_DUMP, cluster="", phase="",
              reason="stuck")] = "_x15 1x35"
    series[_s("rl_stack_dump_info", "hang", 0, role="trainer", path="/logs/hang/stacks-rank0.txt", cluster="",
              phase="", reason="stuck")] = "_x15 1x35"
    wait_limit = int(t.collective_hang_seconds // 60)
    _fits(10 + wait_limit + _minutes(t.collective_hang_for) + 2 < 40 and wait_limit >= 1,
          "60 s <= collective_hang_seconds and collective_hang_seconds + collective_hang_for is under 28 minutes")
    _fits(_minutes(t.collective_hang_lookback) >= 30, "collective_hang_lookback >= 30m (the dead rank's last count)")
    fire = 40
    waited = humanize_duration((fire - 10) * 60)

    def named(run: str, rank: int, dump: str) -> Firing:
        return Firing({"job": JOB, "instance": f"{run}-{rank}:9464", "run": run, "rank": str(rank), "role": "trainer",
                       "group": group}, 1, (f"{'gloo' if run == 'hang' else 'nccl'}:all_reduce for {waited}", dump))

    return [Case(series, {10 + wait_limit - 1: [], fire: [
        named("hang", 2, f"{HANG_DUMP} (rank 2 on hang-2:9464, stuck)"),
        named("dead", 1, "none written by this process yet")]})]


def _compute_skew_case(t: Thresholds, fire: int) -> Case:
    """Ranks that serve their compute time. straggler: rank 2 of the trainers computes 2.5x the others from minute
    10 on, and the others wait for it at the all-reduce; rank 0 also waits inside its weight_sync phase, which
    makes that phase 3x the median rank's (the phase rule would point at a waiting rank: a run with compute
    series is judged on those). balanced: four trainers alike, and rollout engines computing 3x as much (another
    role, their own median). idle: a rank 4x the others but 1.5% of the wall time more. hung: the straggler's
    series, but rank 2 never enters collective 101 the others wait in from minute 10: a hang, which
    RLCollectiveHang names; RLRankSkew stays quiet."""
    slow = 2.5
    _fits(slow > t.rank_skew_max and 0.3 * (slow - 1) > t.rank_skew_min_share > 0.015,
          "rank_skew_max < 2.5 and 0.015 < rank_skew_min_share < 0.45 (the straggler computes 2.5x the others)")
    series: dict[str, str] = {}

    def compute(run: str, rank: int, per_s: float, role: str = "trainer", then: float | None = None) -> None:
        values = f"0+{per_s * 60:g}x100" if then is None else \
            f"0+{per_s * 60:g}x10 {per_s * 600 + then * 60:g}+{then * 60:g}x89"
        series[_s("rl_rank_compute_seconds_total", run, rank, role=role)] = values

    for r in range(4):
        compute("straggler", r, 0.3, then=0.3 * slow if r == 2 else None)
        series[_s("rl_collective_wait_seconds_total", "straggler", r, role="trainer", point="allreduce")] = \
            "0+6x100" if r == 2 else "0+6x10 66+33x89"
        series[_s("rl_collective_wait_seconds_total", "straggler", r, role="trainer", point="barrier")] = "0+1x100"
        for part, per_run in (("count", "0+1x100"), ("sum", f"0+{30 if r == 0 else 10}x100")):
            series[_s(f"rl_phase_duration_seconds_{part}", "straggler", r, cluster="actor_train",
                      phase="weight_sync", part="total")] = per_run
        compute("balanced", r, 0.3 + 0.01 * r)
        compute("idle", r, 0.02 if r == 2 else 0.005)
        compute("hung", r, 0.3, then=0.3 * slow if r == 2 else None)
        series[_s("rl_collectives_total", "hung", r, role="trainer", group="0:default_pg")] = \
            "0+10x10 " + ("100x90" if r == 2 else "101x90")
        if r != 2:
            series[_s("rl_collective_started_timestamp_seconds", "hung", r, role="trainer", group="0:default_pg",
                      op="nccl:all_reduce")] = "_x10 600x90"
    for r in range(2):
        compute("balanced", 4 + r, 0.9, role="rollout")
    return Case(series, {40: [], fire: [
        Firing({"job": JOB, "run": "straggler", "role": "trainer", "rank": "2"}, slow,
               "; the other ranks wait for it at allreduce")]})


def _goodput_series(run: str, segments: list[tuple[int, dict[str, float]]], progress_until: int | None = None,
                    role: str = "trainer") -> dict[str, str]:
    """One process's goodput counters (every bucket, as the runtime serves them) and its last progress, a sample a
    minute: ``segments`` are (minutes, {bucket: share of the wall time}) one after another."""
    from rl_otel.ops.contract import BUCKETS

    totals = dict.fromkeys(BUCKETS, 0.0)
    values: dict[str, list[float]] = {b: [0.0] for b in BUCKETS}
    for minutes, shares in segments:
        assert abs(sum(shares.values()) - 1) < 1e-9, shares
        for _ in range(minutes):
            for b in BUCKETS:
                totals[b] += 60 * shares.get(b, 0.0)
                values[b].append(totals[b])
    n = len(values[BUCKETS[0]])
    out = {_s("rl_goodput_bucket_seconds_total", run, 0, role=role, bucket=b): " ".join(f"{v:g}" for v in vals)
           for b, vals in values.items()}
    out[_s("rl_goodput_wall_seconds_total", run, 0, role=role)] = f"0+60x{n - 1}"
    until = n - 1 if progress_until is None else progress_until
    out[_s("rl_last_progress_timestamp_seconds", run, 0, role=role)] = f"0+60x{until} {until * 60}x{n - 1 - until}"
    return out


def _goodput_cases(t: Thresholds) -> list[Case]:
    """starved: the trainer's goodput (0.7) falls to a quarter at minute 120, the time going to waiting; finished: a
    run ends at minute 120 and lingers, its time all waiting and no progress (quiet: RLTrainerStalled's); dips: a
    10-minute eval and an 18-minute checkpoint (all badput) that page nothing."""
    healthy = {"training": 0.4, "generation": 0.3, "waiting": 0.2, "other": 0.1}
    starved = {"training": 0.1, "generation": 0.075, "waiting": 0.725, "other": 0.1}
    drop = 120
    base_age = _minutes(t.goodput_baseline_offset) + _minutes(t.goodput_baseline_min_history)
    _fits(base_age < drop and t.goodput_drop_ratio * 0.7 > 0.175 and t.goodput_drop_min < 0.7 - 0.175,
          "goodput_drop_ratio > 0.25 and goodput_drop_min < 0.525, with the baseline older than the drop")
    fire = drop + 5 + _minutes(t.goodput_smooth) + _minutes(t.goodput_for) + 5
    series = {**_goodput_series("starved", [(drop, healthy), (fire - drop, starved)]),
              **_goodput_series("finished", [(drop, healthy), (fire - drop, {"waiting": 1.0})], progress_until=drop)}
    checkpoint = 18
    _fits(checkpoint < _minutes(t.goodput_for),
          "goodput_for is longer than the healthy run's checkpoint")
    dips = _goodput_series("dips", [(100, healthy), (10, {"validation": 1.0}), (20, healthy),
                                    (checkpoint, {"checkpointing": 1.0}), (60, healthy)])
    labels = {"job": JOB, "run": "starved", "role": "trainer"}
    return [Case(series, {drop + 25: [], fire: [Firing(labels, 0.175, ("70%", "waiting (+52.5% of the wall time)"))]}),
            Case(dips, {m: [] for m in range(120, 200, 5)})]


def cases(t: Thresholds = DEFAULT) -> dict[str, list[Case]]:
    """``{alert name: test groups}``; every alert has at least one firing and one not-firing check."""
    nan = " ".join(["NaN"] * 20)
    inf = " ".join(["Inf"] * 15)
    stall_at = 600  # the bad run's last log() was at t=600s
    stall_start = stall_at // 60 + int(t.stall_seconds // 60) + 1
    stall_fire = stall_start + _minutes(t.stall_for) + 5
    silent_at, window = 10, _minutes(NODE_SILENT_WINDOW)  # node a's agent sends its last samples at minute 10
    node_fire = silent_at + window + _minutes(t.target_down_for) + 5
    node_end = node_fire + 5  # run r's last node stops too: the run ended, while node a is still within lookback
    _fits(node_end + window + 1 < silent_at + _minutes(NODE_SILENT_LOOKBACK),
          "the node silence case fits its lookback")
    kl_base = t.approx_kl_floor / 2                    # below the floor: a tiny KL that must not page when it moves
    kl_jump = max(kl_base * t.approx_kl_ratio * 2.5, t.approx_kl_floor * 2)
    kl_steady = min(t.approx_kl_floor * 5, t.approx_kl_max / 2)
    ref_base, seq_base = t.ref_kl_floor / 2, t.sequence_floor
    ref_jump = max(ref_base * t.ref_kl_ratio * 2, t.ref_kl_floor * 2)
    drift_w, drift_for = _minutes(t.ref_kl_drift_window), _minutes(t.ref_kl_drift_for)
    ir_base = 2.0                                      # the demo's median batch max ratio
    ir_jump = max(ir_base * t.ratio_max_ratio * 2.5, t.ratio_max_floor * 2)
    _fits(ir_jump < t.ratio_max and t.ratio_max_floor * 3 < t.ratio_max,
          "ratio_max_floor x 3 < ratio_max and the jump of the broken run below ratio_max (the cases are relative)")
    ir_fire = _minutes(t.ratio_max_smooth) // 2 + _minutes(t.ratio_max_for) + 3  # the median turns half-way
    mm_base = t.mismatch_floor
    _fits(mm_base * 5 * t.mismatch_ratio * 2 < t.mismatch_logprob_diff_max * 10,
          "the mismatch trend case stays under mismatch_logprob_diff_max (the case is about the trend)")
    stuck_at = 20 * 60
    _fits(120 * t.phase_stuck_ratio <= t.phase_stuck_min_seconds + 60,
          "phase_stuck_ratio x 120 s <= phase_stuck_min_seconds + 60 s (the healthy run's phases last two minutes)")
    stuck_fire = stuck_at // 60 + int(max(120 * t.phase_stuck_ratio, t.phase_stuck_min_seconds) // 60) \
        + _minutes(t.phase_stuck_for) + 3
    skew = 3.0
    smooth = _minutes(t.eval_smooth)
    skew_fire = 10 + _minutes(t.rank_skew_window) + _minutes(t.rank_skew_for) + 5
    return {
        "RLTrainerStalled": [Case(
            {_s("rl_last_step_timestamp_seconds", "bad", r): f"0+60x10 {stall_at}x{stall_fire + 5}" for r in (0, 1)}
            | {_s("rl_last_step_timestamp_seconds", "good", r): f"0+60x{stall_fire + 15}" for r in (0, 1)},
            # stale for more than stall_seconds from minute stall_start on; firing once `for` has passed too
            {stall_start + 1: [], stall_fire: [Firing(_run(run="bad"), stall_fire * 60 - stall_at)]})],
        "RLScrapeTargetDown": [Case(
            {'up{job="rl_otel_pods", instance="a:9464"}': "1x10 0x30",
             'up{job="rl_otel_pods", instance="b:9464"}': "1x40",
             'up{job="node", instance="c:9100"}': "0x40"},
            {12: [], 20: [Firing({"job": "rl_otel_pods", "instance": "a:9464"}, 0)]}), Case(
            # static targets: k killed (its last rl_run_finished 0), f finished (close() served 1, then it stopped),
            # r finished, restarted on the same address (0 again) and killed; finished never pages
            {'up{job="rl_otel", instance="k:9464"}': "1x10 0x30",
             'rl_run_finished{job="rl_otel", instance="k:9464", run="k", rank="0"}': "0x10",
             'up{job="rl_otel", instance="f:9464"}': "1x10 0x30",
             'rl_run_finished{job="rl_otel", instance="f:9464", run="f", rank="0"}': "0x9 1",
             'up{job="rl_otel", instance="r:9464"}': "1x5 0x5 1x10 0x20",
             'rl_run_finished{job="rl_otel", instance="r:9464", run="r", rank="0"}': "0x4 1 _x5 0x10"},
            {8: [], 20: [Firing({"job": "rl_otel", "instance": "k:9464"}, 0)],
             35: [Firing({"job": "rl_otel", "instance": "k:9464"}, 0),
                  Firing({"job": "rl_otel", "instance": "r:9464"}, 0)]})],
        "RLScrapeTargetAbsent": [
            Case({'up{job="node", instance="c:9100"}': "1x30"}, {5: [], 15: [Firing({}, 1)]}),
            Case({'up{job="rl_otel", instance="a:9464"}': "1x30"}, {15: []}),
        ],
        "RLLossNotFinite": [Case(
            {_s("rl_actor_pg_loss", "bad", 0): "0.1x5 " + nan,
             _s("rl_actor_pg_loss", "bad", 1): "0.1x25",
             _s("rl_critic_loss", "bad", 0): "0.2x10 " + inf,
             _s("rl_critic_loss", "bad", 1): "0.2x10 " + inf,
             _s("rl_actor_pg_loss", "good", 0): "0.1x25",
             _s("rl_critic_loss", "good", 0): "0.2x25",
             _s("rl_step", "bad", 0): "0+1x25",
             _s("rl_step", "good", 0): "0+1x25"},
            # three series of the bad run are non-finite: rank 0's pg_loss and critic loss, rank 1's critic loss
            {5: [], 20: [Firing(_run(run="bad"), 3)]})],
        "RLKLRunaway": [Case(
            # bad: 4x... its own baseline; good: constant above the old absolute 0.05 (the demo's 0.07-0.13);
            # early: above the ceiling from its first step, before any baseline exists
            {_s("rl_actor_approx_kl", "bad", 0): f"{kl_base:g}x90 {kl_jump:g}x40",
             _s("rl_actor_approx_kl", "bad", 1): f"{kl_base:g}x130",
             _s("rl_actor_approx_kl", "good", 0): f"{kl_steady:g}x130",
             _s("rl_ppo_policy_approx_kl", "early", 0): f"{t.approx_kl_max * 2:g}x130"},
            {8: [], 95: [Firing(_run(run="early"), t.approx_kl_max * 2)],
             106: [Firing(_run(run="bad"), kl_jump), Firing(_run(run="early"), t.approx_kl_max * 2)]})],
        "RLImportanceRatioExploding": [Case(
            # bad: its batches' max ratio jumps to 2.5x ratio_max_ratio times its own baseline (and above the
            # floor); good: steady above the floor (its own level); spiky: one batch in seven far above the ceiling
            # (the healthy demo's single-batch spikes); early: above the ceiling from its first step, before any
            # baseline exists; a stat other than max is never read
            {_s("rl_actor_importance_ratio", "bad", 0, stat="max"): f"{ir_base:g}x90 {ir_jump:g}x40",
             _s("rl_actor_importance_ratio", "bad", 1, stat="max"): f"{ir_base:g}x130",
             _s("rl_actor_importance_ratio", "good", 0, stat="max"): f"{t.ratio_max_floor * 3:g}x130",
             _s("rl_actor_importance_ratio", "spiky", 0, stat="max"):
                " ".join(f"{t.ratio_max * 5:g}" if i % 7 == 6 else f"{ir_base:g}" for i in range(131)),
             _s("rl_actor_importance_ratio", "early", 0, stat="max"): f"{t.ratio_max * 2:g}x130",
             _s("rl_actor_importance_ratio", "good", 0, stat="mean"): f"{t.ratio_max * 5:g}x130"},
            {1: [], 95: [Firing(_run(run="early"), t.ratio_max * 2)],
             90 + ir_fire: [Firing(_run(run="bad"), ir_jump), Firing(_run(run="early"), t.ratio_max * 2)]})],
        "RLClipFractionHigh": [Case(
            _const_fire("rl_actor_clip_ratio", t.clip_ratio_max / 3, min(1.0, t.clip_ratio_max * 2), 40),
            {15: [], 40: [Firing(_run(run="bad"), min(1.0, t.clip_ratio_max * 2))]})],
        "RLEntropyCollapse": [Case(
            # both ranks of the bad run collapse (the rule averages ranks); stat="max" must be ignored; ROLL's
            # default logs critic/entropy/mean = 0 (no log-probs recomputed): never an alert; a healthy run's
            # entropy decays to 0.3 of its start; TRL OnlineDPO's per-sequence objective/entropy collapses
            {_s("rl_critic_entropy", "bad", r, stat="mean"): f"1x30 {t.entropy_ratio_min / 2:g}x40" for r in (0, 1)}
            | {_s("rl_critic_entropy", "bad", 0, stat="max"): "2x70"}
            | {_s("rl_critic_entropy", "good", r, stat="mean"): "1-0.01x70" for r in (0, 1)}
            | {_s("rl_critic_entropy", "roll_default", r, stat="mean"): "0x70" for r in (0, 1)}
            | {_s("rl_objective_entropy", "trl_seq", 0): f"40x30 {40 * t.entropy_ratio_min / 2:g}x40"},
            {40: [], 60: [Firing(_run(run="bad"), t.entropy_ratio_min / 2),
                          Firing(_run(run="trl_seq"), 40 * t.entropy_ratio_min / 2)]})],
        "RLRewardCollapse": [Case(
            {_s("rl_critic_score", "bad", r, stat="mean"): f"0.8x30 {0.8 - 1.5 * t.reward_drop:g}x40"
             for r in (0, 1)}
            | {_s("rl_critic_score", "good", r, stat="mean"): "0.5+0.005x70" for r in (0, 1)},
            {40: [], 55: [Firing(_run(run="bad"), 0.8 - 1.5 * t.reward_drop)]})],
        "RLValueExplainedVarianceCollapse": [Case(
            _const_fire("rl_ppo_val_explained_variance", 0.6, t.explained_variance_min - 0.5, 60),
            {20: [], 50: [Firing(_run(run="bad"), t.explained_variance_min - 0.5)]})],
        "RLGPUMemoryHeadroomLow": [Case(
            _const_fire("rl_gpu_memory_peak_ratio", 0.6, (1 + t.gpu_peak_ratio_max) / 2, 30,
                        {"cluster": "actor_train", "phase": "train_step", "kind": "max_reserved",
                         "device_id": "0"}),
            {10: [], 30: [Firing(_run(run="bad", cluster="actor_train", phase="train_step"),
                                 (1 + t.gpu_peak_ratio_max) / 2)]})],
        "RLThroughputDrop": [Case(
            # both ranks drop to 0.3 of their rate at minute 61: the run sums 2000 -> 600 tokens/s
            {_s("rl_system_tokens_per_second", "bad", r): f"1000x60 {1000 * t.throughput_ratio_min * 0.6:g}x30"
             for r in (0, 1)}
            | {_s("rl_system_tokens_per_second", "good", r): "1000x90" for r in (0, 1)},
            {70: [], 85: [Firing(_run(run="bad"), 2000 * t.throughput_ratio_min * 0.6)]})],
        "RLEvalRegression": [Case(
            # the eval falls by 2 * eval_drop at minute 31: its eval_smooth average crosses best - eval_drop half-way
            {_s("rl_eval_metric", "bad", 0, taskset="gsm8k", metric="accuracy", stat="mean", k="4"):
                f"0.7x30 {0.7 - 2 * t.eval_drop:g}x60",
             _s("rl_eval_metric", "bad", 0, taskset="gsm8k", metric="accuracy", stat="std", k="4"): "0.3x90",
             # good: one noisy eval (a 2-sigma dip of one eval of a 10-minute cadence) is smoothed away
             _s("rl_eval_metric", "good", 0, taskset="gsm8k", metric="accuracy", stat="mean", k="4"):
                f"0.7x30 {0.7 - 1.5 * t.eval_drop:g}x9 0.7x50"},
            {30 + smooth // 2 - 2: [], 31 + smooth + _minutes(t.eval_for) + 5:
                [Firing(_run(run="bad", taskset="gsm8k", metric="accuracy", k="4"), 0.7 - 2 * t.eval_drop)]})],
        "RLRefKLRunaway": [Case(
            # TRL's kl (GRPO/RLOO, per token) jumps; a per-sequence objective/kl jumps; a steady per-sequence KL far
            # above any per-token threshold stays quiet (sums are never compared with per-token values)
            {_s("rl_kl", "trl", 0): f"{ref_base:g}x90 {ref_jump:g}x40",
             _s("rl_actor_kl_loss", "good", 0): f"{ref_base * 2:g}x130",
             _s("rl_objective_kl", "seq", 0): f"{seq_base:g}x90 {seq_base * t.ref_kl_ratio * 2:g}x40",
             _s("rl_objective_kl", "seq_good", 0): f"{seq_base * 10:g}x130"},
            {95: [], 106: [Firing(_run(run="trl"), ref_jump),
                           Firing(_run(run="seq"), seq_base * t.ref_kl_ratio * 2)]})],
        "RLRefKLDrift": [Case(
            # the KL to the reference settles at a higher level and stays: its 6h median becomes drift_ratio * 2
            # times the 6h before's; a run at a steady high level stays quiet
            {_s("rl_actor_kl_loss", "bad", 0): f"{ref_base:g}x{drift_w} {ref_base * t.ref_kl_drift_ratio * 2:g}x"
                                              f"{drift_w + 60}",
             _s("rl_actor_kl_loss", "good", 0): f"{ref_base * t.ref_kl_drift_ratio * 2:g}x{2 * drift_w + 60}"},
            {drift_w + drift_w // 2 + drift_for - 5: [],
             drift_w + drift_w // 2 + drift_for + 5: [Firing(_run(run="bad"), ref_base * t.ref_kl_drift_ratio * 2)]})],
        "RLTrainInferenceMismatch": [Case(
            # veRL's k3 KL engine vs trainer, ROLL's token probability ratio: both leave their level
            {_s("rl_rollout_corr_k3_kl", "verl", 0): f"{t.mismatch_kl_max / 50:g}x30 {t.mismatch_kl_max * 2:g}x30",
             _s("rl_rollout_corr_k3_kl", "good", 0): f"{t.mismatch_kl_max / 50:g}x60",
             _s("rl_actor_train_infer_ratio", "roll", 0, kind="token"):
                f"1.01x30 {1 + t.mismatch_ratio_deviation_max * 3:g}x30",
             _s("rl_actor_train_infer_ratio", "roll_good", 0, kind="token"):
                f"{1 - t.mismatch_ratio_deviation_max / 5:g}x60"},
            {40: [], 50: [Firing(_run(run="verl"), t.mismatch_kl_max * 2),
                          Firing(_run(run="roll"), t.mismatch_ratio_deviation_max * 3)]})],
        "RLTrainInferenceMismatchRising": [Case(
            # below the level threshold, but 2 * ratio times the run's own mismatch; a steady mismatch stays quiet
            {_s("rl_rollout_corr_kl", "verl", 0): f"{mm_base:g}x90 {mm_base * t.mismatch_ratio * 2:g}x40",
             _s("rl_rollout_corr_log_ppl_abs_diff", "diff", 0): f"{mm_base * 5:g}x90 "
                                                                f"{mm_base * 5 * t.mismatch_ratio * 2:g}x40",
             _s("rl_rollout_corr_k3_kl", "good", 0): f"{mm_base * 10:g}x130"},
            {100: [], 112: [Firing(_run(run="verl"), mm_base * t.mismatch_ratio * 2),
                            Firing(_run(run="diff"), mm_base * 5 * t.mismatch_ratio * 2)]})],
        "RLStalenessHigh": [Case(
            {_s("rl_off_policy_trajectory_staleness", "verl", 0, stat="max"): f"1x10 {t.staleness_max * 2:g}x30",
             _s("rl_async_sample_staleness", "trl", 0, stat="max"): f"{t.staleness_max / 4:g}x40",
             _s("rl_async_sample_staleness", "trl", 0, stat="mean"): f"{t.staleness_max * 3:g}x40"},
            {15: [], 25: [Firing(_run(run="verl"), t.staleness_max * 2)]})],
        "RLPhaseStuck": [Case(
            # stuck: actor_infer/generate took at most 120s (its p90) and started at minute 20, never ending;
            # fresh: a phase without history, stuck since minute 0; good: starts every minute
            {**{_s("rl_phase_duration_seconds_bucket", run, 0, cluster="actor_infer", phase="generate",
                   part="total", le=le): f"0+{n}x60" for run in ("stuck", "good")
                for le, n in (("60", 0), ("120", 9), ("300", 10), ("+Inf", 10))},
             _s("rl_phase_started_timestamp_seconds", "stuck", 0, cluster="actor_infer", phase="generate"):
                f"0+60x19 {stuck_at}x40",
             _s("rl_phase_started_timestamp_seconds", "good", 0, cluster="actor_infer", phase="generate"):
                "0+60x60",
             _s("rl_phase_started_timestamp_seconds", "fresh", 0, cluster="actor_train", phase="train_step"):
                "0x60",
             # the stuck rank's stack dump, written at minute 25; an older dump of another phase is not shown
             _s("rl_stack_dump_info", "stuck", 0, role="rollout", path=STUCK_DUMP, cluster="actor_infer",
                phase="generate", reason="stuck"): "_x24 1x35",
             _s("rl_stack_dump_info", "stuck", 1, role="trainer", path="/logs/stuck/stack-trainer-1.txt",
                cluster="actor_train", phase="train_step", reason="signal"): "1x60"},
            {int(t.stall_seconds // 60) - 2: [],
             stuck_fire - 3: [Firing(_run(run="fresh", cluster="actor_train", phase="train_step"),
                                     (stuck_fire - 3) * 60, ("unknown (its first run)", NO_PHASE_DUMP))],
             stuck_fire: [Firing(_run(run="stuck", cluster="actor_infer", phase="generate"),
                                 stuck_fire * 60 - stuck_at,
                                 (humanize_duration(120), f"{STUCK_DUMP} (rank 0 on stuck-0:9464, stuck)")),
                          Firing(_run(run="fresh", cluster="actor_train", phase="train_step"), stuck_fire * 60,
                                 ("unknown (its first run)", NO_PHASE_DUMP))]})],
        "RLProcessNoProgress": _no_progress_cases(t),
        "RLCollectiveHang": _collective_hang_cases(t),
        "RLRankSkew": [Case(
            # rank 2 of the bad run turns 3x slower at minute 10; good: within 20%; tiny: 5x but 0.4s
            {**{_s(f"rl_phase_duration_seconds_{part}", run, r, cluster="actor_train", phase="train_step",
                   part="total"): values
                for run, per_rank in (("bad", (10, 10, 10)), ("good", (10, 10, 12)), ("tiny", (0.1, 0.1, 0.5)))
                for r, mean in enumerate(per_rank)
                for part, values in (("count", "0+1x100"), ("sum", f"0+{mean:g}x100"))},
             _s("rl_phase_duration_seconds_sum", "bad", 2, cluster="actor_train", phase="train_step",
                part="total"): f"0+10x10 100+{10 * skew:g}x90"},
            {10 + _minutes(t.rank_skew_for): [],
             skew_fire: [Firing(_run(run="bad", cluster="actor_train", phase="train_step"), skew)]}),
            _compute_skew_case(t, skew_fire)],
        "RLGoodputDrop": _goodput_cases(t),
        "RLMetricImpossible": [Case(
            {_s("rl_perf_mfu_ratio", "bad", 0, cluster="actor"): "0.4x5 1.7x20",
             _s("rl_response_length", "bad", 0, stat="mean"): "200x5 -3x20",
             _s("rl_perf_mfu_ratio", "good", 0, cluster="actor"): "0.4x25",
             _s("rl_response_length", "good", 0, stat="mean"): "200x25",
             _s("rl_actor_pg_clip_ratio", "good", 0): "0x25"},
            {8: [], 15: [Firing(_run(run="bad", metric="rl_perf_mfu_ratio"), 1),
                         Firing(_run(run="bad", metric="rl_response_length"), 1)]})],
        "RLTelemetryErrors": [Case(
            {_s("rl_telemetry_errors_total", "bad", 0, sink="input", reason="bad_value"): "0x5 1+1x30",
             _s("rl_telemetry_errors_total", "good", 0, sink="input", reason="bad_value"): "0x35",
             _s("rl_telemetry_errors_total", "new", 0, sink="input", reason="bad_value"): "_x20 3x20"},
            # bad: one error a minute, 15 in the last 15 minutes; new: appears at minute 21 already at 3
            {6: [], 30: [Firing(_run(run="bad", sink="input", reason="bad_value"), 15),
                         Firing(_run(run="new", sink="input", reason="bad_value"), 3)]})],
        "RLNodeSilent": [Case(
            {'up{job="rl_otel", instance="a:9464", node="a", run="r", rank="0"}': f"1x{silent_at}",  # agent dies
             'up{job="rl_otel", instance="a:9465", node="a", run="r", rank="1"}': f"1x{silent_at}",
             'up{job="rl_otel", instance="b:9464", node="b", run="r", rank="2"}': f"1x{node_end}",  # goes on
             # node c: its rank is down (RLScrapeTargetDown), its agent alive and sending up == 0
             'up{job="rl_otel", instance="c:9464", node="c", run="r", rank="3"}': f"1x5 0x{node_end - 6}",
             # a run that ended on its only node is not a silent node
             'up{job="rl_otel", instance="d:9464", node="d", run="ended", rank="4"}': f"1x{silent_at}"},
            # quiet until `for` has passed; then node a (two targets) fires; quiet again once run r has ended
            {silent_at + window + _minutes(t.target_down_for) - 1: [],
             node_fire: [Firing({"job": JOB, "run": "r", "node": "a"}, 2)],
             node_end + window + 1: []})],
    }


_ACTION = re.compile(r"\{\{\s*(.*?)\s*\}\}")
_VALUE = re.compile(r'\$value \| (?:printf "(%[^"]+)"|(humanizeDuration)|(humanizePercentage))')


def humanize_duration(seconds: float) -> str:
    """Prometheus' ``humanizeDuration`` for whole seconds of a minute or more (``660`` -> ``11m 0s``), and under a
    second (``0.25`` -> ``250ms``)."""
    if 0 < seconds < 1:
        value, prefix = seconds, ""
        for p in ("m", "u", "n"):
            if value >= 1:
                break
            value, prefix = value * 1000, p
        return f"{value:.4g}{prefix}s"
    s = int(seconds)
    d, h, m, sec = s // 86400, s % 86400 // 3600, s % 3600 // 60, s % 60
    if d:
        return f"{d}d {h}h {m}m {sec}s"
    if h:
        return f"{h}h {m}m {sec}s"
    return f"{m}m {sec}s" if m else f"{sec}s"


def humanize_percentage(fraction: float) -> str:
    """Prometheus' ``humanizePercentage``: ``fmt.Sprintf("%.4g%%", v*100)``."""
    return f"{fraction * 100:.4g}%"


def _value(action: str, value: float) -> str:
    m = _VALUE.fullmatch(action)
    if m is None:
        raise ValueError(f"the annotation renderer does not know {{{{ {action} }}}}")
    if m.group(1):
        return m.group(1) % value
    return humanize_duration(value) if m.group(2) else humanize_percentage(value)


def render(template: str, labels: dict[str, str], value: float, queried: str | tuple[str, ...] = "") -> str:
    """The template forms the rules use: ``{{ $labels.x }}``, ``{{ $value | printf "%.3g" }}``, ``{{ $value |
    humanizeDuration }}`` and ``humanizePercentage``, ``{{ if $labels.x }}...{{ else }}...{{ end }}``, and
    ``{{ with ... | query }}`` / ``{{ range ... | query }}`` blocks (their ``{{ else }}`` included), each replaced
    by the next of ``queried`` (what the block renders to: written by hand in the cases, so a wrong query fails)."""
    answers = iter((queried,) if isinstance(queried, str) else queried)
    out: list[str] = []
    # a stack of (emitting, kind): an if's branch emits when its condition held; a query block emits nothing itself
    stack: list[tuple[bool, str]] = []
    last = 0
    for m in _ACTION.finditer(template):
        emitting = all(e for e, _ in stack)
        if emitting:
            out.append(template[last:m.start()])
        last = m.end()
        action = m.group(1)
        if action.startswith("if $labels."):
            stack.append((bool(labels.get(action.removeprefix("if $labels."), "")), "if"))
        elif action.startswith("if "):  # on a query block's own variables ({{ if $i }}): inside the block only
            stack.append((False, "if"))
        elif action.startswith(("with ", "range ")) and action.endswith("| query"):
            if emitting:
                out.append(next(answers, ""))
            stack.append((False, "query"))
        elif action == "else":
            held, kind = stack.pop()
            stack.append((not held and kind == "if", kind))
        elif action == "end":
            stack.pop()
        elif not emitting:
            continue
        elif action.startswith("$labels."):
            out.append(labels.get(action.removeprefix("$labels."), ""))
        else:
            out.append(_value(action, value))
    if all(e for e, _ in stack):
        out.append(template[last:])
    return "".join(out)


def _expected(alert: Alert, firing: Firing, links: RunbookLinks | None) -> dict[str, object]:
    labels = {**firing.labels, "severity": alert.severity}
    annotations = {"summary": render(alert.summary, labels, firing.value, firing.queried),
                   "description": render(alert.description, labels, firing.value, firing.queried),
                   "runbook_url": (links or RunbookLinks()).url(alert)}
    return {"exp_labels": labels, "exp_annotations": annotations}


def test_file(t: Thresholds = DEFAULT, links: RunbookLinks | None = None) -> dict[str, object]:
    """The ``promtool test rules`` document (rule files relative to ``prometheus/tests/``)."""
    by_name = {a.name: a for a in alerts(t) + fleet_alerts(t)}
    tests = []
    for name, groups in cases(t).items():
        alert = by_name[name]
        for case in groups:
            tests.append({
                "interval": "1m",
                "input_series": [{"series": s, "values": v} for s, v in case.series.items()],
                "alert_rule_test": [
                    {"eval_time": f"{minute}m", "alertname": name,
                     "exp_alerts": [_expected(alert, f, links) for f in firings]}
                    for minute, firings in case.checks.items()],
            })
    return {"rule_files": ["../rules/rl_otel_recording.yml", "../rules/rl_otel_alerts.yml"],
            "evaluation_interval": "1m", "tests": tests}
