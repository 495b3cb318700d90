"""The alert corpus's goodput, straggler and progress series (tests/alert_corpus.py): what rl_otel's runtime serves
for a framework's processes, synthesised the way the issue-33 series contract defines them.

- Goodput: a process of a framework reached through its timing keys (``rl-otel watch``, or its integration) gets
  its buckets from those keys through the catalog's placement (``rl_otel.catalog.goodput``): each of the loop's
  counted keys (a leaf, ``bucket_of`` not ``None``) adds its seconds to its bucket, the step time no leaf covers
  goes to the step key's ``rest`` bucket, and the wall clock advances by the step (one step a minute here: 60 s).
  The loops and their keys are the catalog's facts (``rl_otel.catalog.goodput_nesting.LOOPS``); each process
  (trainer, explorer, orchestrator, rollout, ...) is the loop of that process whose counted keys cover the most
  productive time. A healthy process draws its leaves' shares once (seeded by framework and process; productive
  keys weigh 5-20, the others 0.2-2) with noise each minute, starts up for 5 minutes and spends 10 minutes of every
  90 checkpointing (or validating, or in its rest bucket): a dip the goodput alert must not page on.
- Stragglers: ranks that run phases (ROLL's workers, rl_otel's ``tel.phase()``) serve their compute seconds (busy in
  phases less their collective waits); a slowed rank computes more per second of wall time, the ranks waiting for
  it less, while their phases (which hold the wait) look as long as the straggler's or longer.
- Progress: every process serves the time of its last progress (here: each minute).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from rl_otel.catalog import default_catalog
from rl_otel.catalog.goodput import decision_of
from rl_otel.catalog.goodput_nesting import LOOPS, Loop
from rl_otel.ops.contract import BUCKETS, PRODUCTIVE

STARTUP = 5            # minutes of start-up before the first step
DIP_EVERY, DIP = 90, 10  # a healthy process checkpoints (or evaluates) 10 minutes of every 90


@dataclass(frozen=True)
class Process:
    """One process of a framework as its timing keys show it: its role, its counted keys' buckets, the bucket of
    the step time they leave over, and the loop (framework code) they come from."""

    framework: str
    role: str
    loop: str
    leaves: tuple[tuple[str, str], ...]  # (key, bucket)
    rest: str

    @property
    def buckets(self) -> set[str]:
        return {b for _, b in self.leaves} | {self.rest}


def _subtree(loop: Loop, root: str) -> list[str]:
    nests = {n.key: n for n in loop.nests}
    out, todo = [], [root]
    while todo:
        key = todo.pop(0)
        out.append(key)
        nest = nests.get(key)
        if nest:
            todo += [*nest.parts, *nest.overlapping]
    return out


def _process(loop: Loop) -> Process:
    catalog = default_catalog(loop.framework)
    keys = _subtree(loop, loop.step) if loop.step else list(loop.all_keys())
    leaves, rest = [], "waiting"
    for key in keys:
        res = catalog.lookup(key)
        assert res is not None, (loop.framework, key)
        decision = decision_of(res.spec, res.labels)
        if decision is None:
            continue
        if decision.step and key == loop.step:
            rest = decision.rest
        elif decision.bucket is not None:
            leaves.append((key, decision.bucket))
    return Process(loop.framework, loop.process, loop.name, tuple(leaves), rest)


def _productive(p: Process) -> float:
    """How much of a step its productive buckets can hold: the leaves' count, the rest bucket's too."""
    return sum(b in PRODUCTIVE for _, b in p.leaves) + (p.rest in PRODUCTIVE)


def processes(framework: str) -> list[Process]:
    """Each process of ``framework`` (one per role): the loop of that role with the most productive counted keys."""
    best: dict[str, Process] = {}
    for loop in (lp for lp in LOOPS if lp.framework == framework):
        p = _process(loop)
        if (p.leaves or p.rest in PRODUCTIVE) and (p.role not in best or _productive(p) > _productive(best[p.role])):
            best[p.role] = p
    return list(best.values())


@dataclass
class Shares:
    """Per minute, the share of a process's wall time in each bucket (summing to 1)."""

    minutes: list[dict[str, float]] = field(default_factory=list)


def healthy_shares(p: Process, minutes: int) -> Shares:
    rng = random.Random(f"{p.framework}/{p.role}")
    # generation, training and inference take most of a step; offloads, syncs, bookkeeping seconds each; what the
    # timers leave over is a little (or, where the step key says it is productive, much: prime-rl's orchestrator)
    weight = {True: (5.0, 20.0), False: (0.2, 2.0)}
    weights = {key: rng.uniform(*weight[bucket in PRODUCTIVE]) for key, bucket in p.leaves}
    weights[""] = rng.uniform(*weight[p.rest in PRODUCTIVE])
    buckets = dict(p.leaves) | {"": p.rest}
    dip = next((b for b in ("checkpointing", "validation") if b in p.buckets), p.rest)
    out = Shares()
    for m in range(minutes):
        if m < STARTUP:
            out.minutes.append({"startup": 1.0})
            continue
        if m % DIP_EVERY >= DIP_EVERY - DIP:
            out.minutes.append({dip: 1.0})
            continue
        noisy = {key: w * math.exp(rng.gauss(0, 0.1)) for key, w in weights.items()}
        total = sum(noisy.values())
        shares = dict.fromkeys(BUCKETS, 0.0)
        for key, w in noisy.items():
            shares[buckets[key]] += w / total
        out.minutes.append(shares)
    return out


def goodput(shares: dict[str, float]) -> float:
    return sum(v for b, v in shares.items() if b in PRODUCTIVE)


def starved(p: Process, shares: Shares, induce: int) -> Shares:
    """From ``induce`` on, the productive buckets keep a fifth of their time; the rest goes to ``waiting`` (the
    trainer starving for rollouts, an engine idling between requests)."""
    out = Shares(list(shares.minutes[:induce]))
    for s in shares.minutes[induce:]:
        s = dict(s)
        lost = 0.0
        for b in PRODUCTIVE:
            lost += s.get(b, 0.0) * 0.8
            s[b] = s.get(b, 0.0) * 0.2
        s["waiting"] = s.get("waiting", 0.0) + lost
        out.minutes.append(s)
    return out


def counters(shares: Shares) -> tuple[dict[str, list[float]], list[float]]:
    """``({bucket: cumulative seconds per minute}, wall)``: every bucket served from the first scrape, at 0."""
    totals = dict.fromkeys(BUCKETS, 0.0)
    out: dict[str, list[float]] = {b: [] for b in BUCKETS}
    wall = []
    for m, s in enumerate(shares.minutes):
        for b in BUCKETS:
            out[b].append(round(totals[b], 3))
            totals[b] += 60 * s.get(b, 0.0)
        wall.append(60.0 * m)
    return out, wall


def compute_rates(ranks: int, minutes: int, seed: str, slow_rank: int | None = None, induce: int = 0,
                  slow: float = 2.5) -> list[tuple[list[float], list[float], list[float]]]:
    """Per rank ``(compute seconds, collective wait seconds, mean phase duration)`` per minute, cumulative for the
    first two. Healthy: each rank computes ~35% of its wall time, waits ~5% at the all-reduce, its phase (compute +
    wait) ~10 s. From ``induce``, ``slow_rank`` computes ``slow`` times as long per step: every step takes longer, the
    others wait for it inside their phase (so their phase durations grow, the straggler's least)."""
    rng = random.Random(seed)
    out = []
    for rank in range(ranks):
        compute, wait, phase = [], [], []
        c = w = 0.0
        for m in range(minutes):
            compute.append(round(c, 3))
            wait.append(round(w, 3))
            base = 0.35 * math.exp(rng.gauss(0, 0.05))
            if slow_rank is None or m < induce:
                share_c, share_w, d = base, 0.05, 10.0 * math.exp(rng.gauss(0, 0.05))
            else:
                step = 1 + 0.35 * (slow - 1)  # a step's length, healthy = 1
                if rank == slow_rank:
                    share_c, share_w, d = base * slow / step, 0.01, 10.0 * (1 + 0.35 * (slow - 1)) * 0.9
                else:
                    share_c, share_w = base / step, (0.05 + 0.35 * (slow - 1)) / step
                    d = 10.0 * step * math.exp(rng.gauss(0, 0.05))
            c += 60 * share_c
            w += 60 * share_w
            phase.append(round(d, 3))
        out.append((compute, wait, phase))
    return out
