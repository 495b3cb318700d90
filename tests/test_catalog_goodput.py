"""The goodput buckets of every framework's timing keys (rl_otel/catalog/goodput.py) against the nesting facts read
off the frameworks' code (rl_otel/catalog/goodput_nesting.py) and their key fixtures (tests/data/frameworks).

A counted key (``bucket_of`` not ``None``) must never contain or lie inside another counted key, nor run beside a
part of its container; the counted keys of a step built from the facts add up to at most the step's wall time and
cover most of it; every duration entry and every fixture timing key has an explicit decision.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from rl_otel.catalog import Resolution, default_catalog, every_entry
from rl_otel.catalog.goodput import (
    BUCKETS,
    FAMILIES,
    PHASES,
    UNDECIDED,
    Decision,
    bucket_of,
    decision_of,
    is_step_duration,
    phase_bucket,
    step_key_of,
)
from rl_otel.catalog.goodput_nesting import LOOPS, Loop
from tests.frameworks import ALL_FRAMEWORKS, load, step_values, watched_keys

REPO = Path(__file__).resolve().parents[1]
TIME_UNITS = ("s", "ms", "min")


def _resolve(framework: str, key: str) -> Resolution:
    found = default_catalog(framework).lookup(key)
    assert found is not None, f"{framework}: {key!r} resolves to no catalog entry"
    return found


def _decision(framework: str, key: str) -> Decision:
    res = _resolve(framework, key)
    decision = decision_of(res.spec, res.labels)
    assert decision is not None, f"{framework}: {key!r} ({res.spec.name}) has no goodput family"
    return decision


def _explicit(framework: str, key: str) -> bool:
    """The key's decision is written for it, not the catch-all of a label value no table names."""
    return _decision(framework, key) != UNDECIDED


def _fixture_timing_keys(framework: str) -> list[str]:
    keys = [k.key for k in load(framework) if k.unit in TIME_UNITS]
    if framework == "prime_rl":  # each process's time/* as rl-otel watch attributes it, and the raw spelling
        catalog = default_catalog(framework)
        keys += [k for k in watched_keys(framework) if catalog.resolve(k).spec.unit == "s" and k not in keys]
    return keys


# ------------------------------------------------------------------------------------------------ vocabulary


def test_buckets_are_the_issue_s_and_every_decision_uses_them():
    assert BUCKETS == ("startup", "generation", "training", "inference", "weight_sync", "offload", "validation",
                       "checkpointing", "other", "waiting")
    for family in FAMILIES.values():
        for decision in (family.default, *family.decisions.values()):
            assert decision.bucket is None or decision.bucket in BUCKETS, (family.name, decision)
            assert decision.rest in BUCKETS, (family.name, decision)
            assert not (decision.step and decision.bucket), f"{family.name}: a step key is no leaf"
            assert decision.bucket or decision.why or family.phases, f"{family.name}: say why it is no leaf"
    assert set(PHASES.values()) <= set(BUCKETS)


def test_every_duration_entry_of_every_catalog_has_a_family_and_nothing_else_does():
    specs = {s.name: s for s in every_entry()}
    durations = {name for name, s in specs.items() if s.unit == "s"}
    assert durations - set(FAMILIES) == set(), "a duration entry without a goodput decision: add it to FAMILIES"
    assert set(FAMILIES) - durations == set(), "a goodput family for no duration entry of the catalog"
    for family in FAMILIES.values():
        spec = specs[family.name]
        assert set(family.by) <= set(spec.labels), (family.name, family.by, spec.labels)
        for values in family.decisions:
            assert len(values) == len(family.by), (family.name, values)


def test_every_enumerated_timer_of_a_decided_label_has_its_own_decision():
    """veRL's timing_s/{operation:step|gen|...}: a timer added to an enumeration fails here until decided."""
    specs = {s.name: s for s in every_entry()}
    for family in FAMILIES.values():
        spec = specs[family.name]
        alternatives = {label: regex.split("|") for label, regex in spec.placeholders
                        if regex and re.fullmatch(r"[\w/]+(\|[\w/]+)*", regex) and label in family.by}
        for label, values in alternatives.items():
            index = family.by.index(label)
            decided = {key[index] for key in family.decisions}
            if len(family.by) == 1:
                assert set(values) <= decided, f"{family.name}: no decision for {label}={set(values) - decided}"
            assert decided <= set(values), f"{family.name}: decisions for {decided - set(values)}, not in the key"


# ------------------------------------------------------------------------------------------------ fixtures


@pytest.mark.parametrize("framework", ALL_FRAMEWORKS)
def test_every_fixture_timing_key_is_placed_in_a_loop_and_explicitly_decided(framework: str):
    named = {key for loop in LOOPS if loop.framework == framework for key in loop.all_keys()}
    keys = _fixture_timing_keys(framework)
    assert keys, framework
    for key in keys:
        assert key in named, f"{framework}: {key!r} is in no loop of goodput_nesting.LOOPS"
        assert _explicit(framework, key), f"{framework}: {key!r} falls to its family's catch-all decision"


@pytest.mark.parametrize("loop", LOOPS, ids=lambda loop: f"{loop.framework}:{loop.name}")
def test_every_key_a_loop_names_is_decided(loop: Loop):
    for key in loop.all_keys():
        assert _explicit(loop.framework, key), f"{key!r} falls to its family's catch-all decision"


# ------------------------------------------------------------------------------------------------ nesting


def _parents(loop: Loop) -> dict[str, list[tuple[str, bool]]]:
    """key -> [(container, overlapping?)]"""
    out: dict[str, list[tuple[str, bool]]] = {}
    for nest in loop.nests:
        for part in nest.parts:
            out.setdefault(part, []).append((nest.key, False))
        for key in nest.overlapping:
            out.setdefault(key, []).append((nest.key, True))
    return out


def _ancestors(loop: Loop, key: str) -> list[tuple[str, bool]]:
    """Every container of ``key``, with whether the path to it passes an overlapping link."""
    parents, found, todo = _parents(loop), [], [(key, False)]
    while todo:
        current, overlapped = todo.pop()
        for parent, overlapping in parents.get(current, []):
            found.append((parent, overlapped or overlapping))
            todo.append((parent, overlapped or overlapping))
    return found


@pytest.mark.parametrize("loop", LOOPS, ids=lambda loop: f"{loop.framework}:{loop.name}")
def test_no_counted_key_contains_or_runs_beside_another(loop: Loop):
    for key in loop.all_keys():
        decision = _decision(loop.framework, key)
        if decision.bucket is None:
            continue
        assert key not in loop.others, f"{key!r} is listed as no timer of the loop's process but counted"
        assert decision.process == loop.process, f"{key!r} counted for {decision.process}, run by {loop.process}"
        for ancestor, overlapped in _ancestors(loop, key):
            assert not overlapped, f"{key!r} runs beside a part of {ancestor!r} (or is a statistic) but is counted"
            assert _decision(loop.framework, ancestor).bucket is None, \
                f"{key!r} and its container {ancestor!r} are both counted: time counted twice"


@pytest.mark.parametrize("loop", LOOPS, ids=lambda loop: f"{loop.framework}:{loop.name}")
def test_a_loop_s_step_key_is_its_process_step_and_nothing_else_is(loop: Loop):
    for key in loop.all_keys():
        res = _resolve(loop.framework, key)
        if key == loop.step:
            found = step_key_of(res.spec, res.labels)
            assert found is not None and found.process == loop.process, (key, found)
        else:
            assert not is_step_duration(res.spec, res.labels), f"{key!r} is not {loop.name}'s step"


def _subtree(loop: Loop, root: str) -> set[str]:
    nests = {n.key: n for n in loop.nests}
    out, todo = set(), [root]
    while todo:
        key = todo.pop()
        out.add(key)
        nest = nests.get(key)
        if nest:
            todo += [*nest.parts, *nest.overlapping]
    return out


def _counted(loop: Loop, values: dict[str, float], counts: Callable[[str], bool]) -> float:
    """The sum of the step's keys ``counts`` picks."""
    assert loop.step is not None
    return sum(values[key] for key in _subtree(loop, loop.step) if counts(key))


STEPPED = [loop for loop in LOOPS if loop.step]


@pytest.mark.parametrize("loop", STEPPED, ids=lambda loop: f"{loop.framework}:{loop.name}")
@pytest.mark.parametrize("seed", range(5))
def test_the_counted_keys_of_a_step_add_up_to_at_most_its_wall_time(loop: Loop, seed: int):
    assert loop.step is not None
    values = step_values(loop, random.Random(seed))
    assert set(_subtree(loop, loop.step)) <= set(values)
    step = values[loop.step]
    counted = _counted(loop, values, lambda key: _decision(loop.framework, key).bucket is not None)
    assert counted <= step * 1.01, (loop.name, step, counted)
    assert counted >= 0.6 * step, f"{loop.name}: the counted keys cover {counted / step:.0%} of the step"


def test_the_sum_check_fails_on_a_table_counting_every_timer():
    """Counting every timer inside veRL's step (the per-sample statistics and the slowest sample's times with
    timing_s/gen) exceeds the step: the check above can fail."""
    loop = next(loop for loop in LOOPS if loop.framework == "verl")
    assert loop.step is not None
    values = step_values(loop, random.Random(0))
    assert _counted(loop, values, lambda key: key != loop.step) > values[loop.step] * 1.01


# ------------------------------------------------------------------------------------------------ step keys


# the key measuring a whole step, per framework and process (frameworks and processes not listed have none: their
# wall time is the interval between their log calls)
STEP_KEYS = {
    ("verl", "trainer"): {"timing_s/step"},
    ("roll", "trainer"): {"time/step_total"},
    ("trl", "trainer"): {"perf/step_s"},
    ("trinity", "explorer"): {"explore/time/sync_interval"},
    ("openrlhf", "trainer"): {"train/timing/step_total"},
    ("slime", "trainer"): {"perf/step_time"},
    ("nemo_rl", "trainer"): {"timing/train/total_step_time"},
    ("skyrl", "trainer"): {"timing/step"},
    ("prime_rl", "trainer"): {"trainer/time/step"},
    ("prime_rl", "orchestrator"): {"orchestrator/time/step"},
}


def test_each_framework_s_step_key_is_the_documented_one():
    found: dict[tuple[str, str], set[str]] = {}
    for framework in ALL_FRAMEWORKS:
        for key in _fixture_timing_keys(framework):
            res = _resolve(framework, key)
            step = step_key_of(res.spec, res.labels)
            if step is not None:
                found.setdefault((framework, step.process), set()).add(key)
    assert found == STEP_KEYS


def test_lookups_through_the_catalog():
    shared = default_catalog()
    gen = shared.resolve("timing_s/gen")
    assert bucket_of(gen.spec, gen.labels) == "generation"
    step = shared.resolve("timing_s/step")
    assert bucket_of(step.spec, step.labels) is None and is_step_duration(step.spec, step.labels)
    stat = shared.resolve("timing_s/agent_loop/generate_sequences/max")
    assert bucket_of(stat.spec, stat.labels) is None and not is_step_duration(stat.spec, stat.labels)
    loss = shared.resolve("actor/pg_loss")
    assert decision_of(loss.spec, loss.labels) is None and bucket_of(loss.spec, loss.labels) is None
    unknown = shared.resolve("time/some_new_timer")  # ROLL's and Trinity-RFT's free time/{operation}
    assert unknown.known and bucket_of(unknown.spec, unknown.labels) is None
    nemo = default_catalog("nemo_rl")
    starving = nemo.resolve("timing/train/idle/buffer_starvation")
    assert bucket_of(starving.spec, starving.labels) is None  # inside exposed_generation, which is counted
    exposed = nemo.resolve("timing/train/exposed_generation")
    assert bucket_of(exposed.spec, exposed.labels) == "waiting"
    prime = default_catalog("prime_rl")
    orchestrator = prime.resolve("orchestrator/time/step")
    found = step_key_of(orchestrator.spec, orchestrator.labels)
    assert found is not None and found.process == "orchestrator" and found.rest == "generation"
    raw = prime.resolve("time/step")  # a line whose writer is unknown divides no known process's step
    assert bucket_of(raw.spec, raw.labels) is None and not is_step_duration(raw.spec, raw.labels)


# ------------------------------------------------------------------------------------------------ phases

# ROLL's state_offload_manger phases (metric_infix = f"{cluster_name}/{phase}") at alibaba/ROLL @ 8eb27cc2:
# base_worker.py (train_step, compute_log_probs, compute_values, compute_rewards), distill_worker.py
# (train_step, teacher_forward), dpo/actor_worker.py, rlvr/rewards/llm_judge_reward_worker.py (compute_rewards),
# distributed/executor/worker.py (model_update); base_worker.py's do_checkpoint writes the same key shape
ROLL_PHASES = {"train_step": "training", "compute_log_probs": "inference", "compute_values": "inference",
               "compute_rewards": "inference", "teacher_forward": "inference", "model_update": "weight_sync",
               "do_checkpoint": "checkpointing"}


def test_roll_phases_and_their_parts_map_as_documented():
    for phase, bucket in ROLL_PHASES.items():
        assert phase_bucket(phase) == phase_bucket(phase, "execute") == bucket
        assert phase_bucket(phase, "onload") == phase_bucket(phase, "offload") == "offload"
        for part in ("total", "reload_nccl", "offload_nccl"):
            assert phase_bucket(phase, part) is None
    assert phase_bucket("generate") == "generation"
    assert phase_bucket("a_phase_nobody_named") == "other"  # measured work all the same
    assert phase_bucket("train_step", "no_such_part") is None


def test_the_demo_s_phases_have_named_buckets():
    source = (REPO / "rl_otel" / "demo" / "ppo.py").read_text()
    names = re.findall(r'phase\("\w+", "(\w+)"', source)
    assert len(names) >= 4
    for name in names:
        assert name in PHASES, f"the demo's phase {name!r} falls to 'other'"


def test_the_phase_histogram_is_decided_by_phase_bucket():
    histogram = every_entry().by_name("rl_phase_duration_seconds")
    for phase in ("train_step", "generate", "compute_values", "model_update", "unnamed"):
        for part in ("total", "execute", "onload", "offload"):
            labels = (("cluster", "actor_train"), ("phase", phase), ("part", part))
            assert bucket_of(histogram, labels) == phase_bucket(phase, part)
    # ROLL's own time/{cluster}/{phase}/* keys lie inside the driver's time/step_* timers: not counted again
    roll = default_catalog().resolve("time/actor_train/train_step/execute")
    assert bucket_of(roll.spec, roll.labels) is None
    checkpoint = default_catalog().resolve("time/actor_train/do_checkpoint/total")
    assert bucket_of(checkpoint.spec, checkpoint.labels) == "checkpointing"
