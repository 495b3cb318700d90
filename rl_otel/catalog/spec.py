"""What one catalog entry says: a key pattern and the instrument, unit, labels and Prometheus name it becomes."""

from __future__ import annotations

import enum
import itertools
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property

from rl_otel.catalog.naming import check_name, label_value

# The labels every series of a process carries (its Telemetry's run, role and rank): no entry may use them.
BASE_LABELS = ("run", "role", "rank")
# Labels a catalog entry may use. Every one is bounded by the training code (never a step, sample id or
# timestamp); free-text ones are still capped per metric at run time.
ALLOWED_LABELS = frozenset({
    "cluster", "phase", "part", "stage", "kind", "device_id", "gpu_uuid", "taskset", "metric",
    "stat", "k", "across", "operation", "operator", "sink", "reason", "version",
    # free parts of the frameworks' keys: veRL's data source and variable, ROLL's domain and env tag, TRL's
    # reward function, tool and clip region, Trinity-RFT's model index; each bounded by the run's configuration
    "data_source", "var", "domain", "tag", "env", "reward_func", "tool", "region", "model", "component",
    "split", "bound",
    # which model or engine of a framework a value is about (veRL's actor/critic workers, AReaL's engines, veRL's
    # training/rollout engine), and an environment's agent (NeMo-RL, prime-rl): never "role", the process's own
    "worker", "engine", "agent",
    # rl_otel's goodput bucket (catalog.goodput.BUCKETS) and a tel.collective() point (capped per process)
    "bucket", "point",
    # rl_stack_dump_info's file: one series per process (the last dump), replaced at each dump
    "path",
    # a torch.distributed process group of a rank and torch's name of the collective it is in (capped per process)
    "group", "op",
})

# Values used to write a concrete example of a templated key (docs, tests, `rl-otel catalog`).
EXAMPLE_VALUES = {
    "cluster": "actor_train", "phase": "train_step", "device_id": "0", "taskset": "gsm8k", "metric": "accuracy",
    "k": "4", "operation": "rollout", "operator": "group_advantages", "sink": "prometheus",
    "reason": "bad_value", "version": "0.1.0", "data_source": "openai/gsm8k", "var": "reward", "domain": "math",
    "tag": "SimpleSokoban", "env": "sokoban", "reward_func": "accuracy_reward", "tool": "search", "region": "low",
    "model": "0", "worker": "actor", "engine": "rollout", "agent": "agent", "component": "actor", "split": "train",
    "bound": "high", "point": "allreduce", "group": "0:default_pg", "op": "nccl:all_reduce",
    "path": "rl_otel_dumps/stacks-run-trainer-rank0-actor_infer.generate-stuck.txt",
    "gpu_uuid": "GPU-8f1e2d3c-0000-0000-0000-000000000000",
}

_PLACEHOLDER = re.compile(r"\{(\w+)(?::([^{}]+))?\}")
_UCUM_TO_SUFFIX = {"s": "_seconds", "By": "_bytes"}


class _BuiltIn(threading.local):
    active = False


_BUILT_IN = _BuiltIn()


@contextmanager
def built_in() -> Iterator[None]:
    """Entries made in this block (on this thread) skip :meth:`MetricSpec.check`: for rl_otel's own catalog
    modules only, whose ~700 entries would otherwise be checked at every ``import rl_otel.catalog`` (a third of
    its cost). ``tests/test_catalog.py`` checks every one of them instead; an entry defined anywhere else is
    checked when it is made."""
    before, _BUILT_IN.active = _BUILT_IN.active, True
    try:
        yield
    finally:
        _BUILT_IN.active = before


class Kind(str, enum.Enum):
    """The OTel instrument kind an entry is exported as."""

    GAUGE = "gauge"
    COUNTER = "counter"
    HISTOGRAM = "histogram"
    # an OpenMetrics info family (``target_info``): always 1, its labels are the facts; a gauge in the text format
    # 0.0.4, served on the scrape endpoint only (OTLP carries the same facts as its resource). No catalog entry.
    INFO = "info"


@dataclass(frozen=True)
class MetricSpec:
    """One catalog entry.

    ``key`` is a slash key, concrete (``actor/approxkl``) or a template with placeholders ``{label}`` (one key
    segment) or ``{label:alt1|alt2}`` (a regular expression, which may span segments; ``/`` in a captured value
    becomes ``_`` in the label). A placeholder named with a leading ``_`` (``{_:token|tokens}``) is anonymous: it
    is matched but becomes no label (two spellings of one key feeding one family). ``scale`` converts the
    tracker-side value into the base unit Prometheus gets (GiB -> bytes is ``2**30``). ``buckets`` are the
    explicit upper bounds of a histogram.
    """

    key: str
    name: str
    kind: Kind
    unit: str
    description: str
    source: str
    scale: float = 1.0
    buckets: tuple[float, ...] = ()
    tracker_unit: str = ""
    placeholders: tuple[tuple[str, str | None], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "placeholders",
                           tuple((m.group(1), m.group(2)) for m in _PLACEHOLDER.finditer(self.key)))
        if not _BUILT_IN.active:
            self.check()

    def check(self) -> None:
        """Raise ``ValueError`` unless the entry is well-formed: a lint-clean name (``target_info``-like for an
        info family), the unit's suffix, no ``_total`` on a counter, increasing histogram buckets, bounded labels.
        Run when an entry is made (rl_otel's own entries: by the tests, see :func:`built_in`)."""
        if self.kind is Kind.INFO:  # a name fixed by convention (target_info), not an rl_ metric name
            if not re.fullmatch(r"[a-z][a-z0-9_]*_info", self.name):
                raise ValueError(f"info family {self.name!r} must be snake_case ending in '_info'")
        else:
            check_name(self.name)
        if self.kind is Kind.COUNTER and self.name.endswith("_total"):
            raise ValueError(f"{self.name!r}: give counters their name without '_total'; it is added on export")
        # the exporter appends the unit's word to a name not ending in it: the documented name must already
        suffix = _UCUM_TO_SUFFIX.get(self.unit) or ("_per_second" if self.unit.endswith("/s") else None)
        if suffix and not self.name.endswith(suffix):
            raise ValueError(f"{self.name!r} has unit {self.unit!r} and must end in {suffix!r}")
        if self.kind is Kind.HISTOGRAM and (not self.buckets or list(self.buckets) != sorted(set(self.buckets))):
            raise ValueError(f"histogram {self.name!r} needs strictly increasing explicit buckets")
        for label, _ in self.placeholders:
            if label in BASE_LABELS:
                raise ValueError(f"{self.key!r}: label {label!r} is a label of every series (run, role, rank); name "
                                 "it after what it is (worker, engine, agent, ...)")
            if label not in ALLOWED_LABELS and not label.startswith("_"):
                raise ValueError(f"{self.key!r}: label {label!r} is not one of the bounded labels "
                                 f"{sorted(ALLOWED_LABELS)}")

    @cached_property
    def regex(self) -> re.Pattern[str]:
        """The key template as a regex, compiled at its first use (700 entries compiled at import would cost
        ``import rl_otel`` ~60 ms; a key is only matched against the entries of its first segment)."""
        pattern, last = [], 0
        for m in _PLACEHOLDER.finditer(self.key):
            pattern.append(re.escape(self.key[last:m.start()]))
            group = "?:" if m.group(1).startswith("_") else f"?P<{m.group(1)}>"
            pattern.append(f"({group}{m.group(2) or '[^/]+'})")
            last = m.end()
        pattern.append(re.escape(self.key[last:]))
        return re.compile("".join(pattern))

    @property
    def first_segment(self) -> str | None:
        """The key's literal first segment (``actor`` of ``actor/{x}/y``), ``None`` when a placeholder is in it."""
        head = self.key.split("/", 1)[0]
        return None if "{" in head else head

    @property
    def templated(self) -> bool:
        return bool(self.placeholders)

    @property
    def labels(self) -> tuple[str, ...]:
        """Label names the entry's series carry besides ``run`` and ``rank``."""
        return tuple(label for label, _ in self.placeholders if not label.startswith("_"))

    @property
    def prometheus_name(self) -> str:
        """The family name in the exposition (counters get ``_total``; histograms add ``_bucket/_sum/_count``)."""
        return self.name + "_total" if self.kind is Kind.COUNTER else self.name

    @property
    def exposed_names(self) -> tuple[str, ...]:
        """Every sample name the family writes: used to prove no two families can collide."""
        if self.kind is Kind.HISTOGRAM:
            return (self.name, self.name + "_bucket", self.name + "_sum", self.name + "_count")
        return (self.prometheus_name,)

    def match(self, key: str) -> dict[str, str] | None:
        """Labels of ``key`` if this entry covers it, else ``None``."""
        m = self.regex.fullmatch(key)
        if m is None:
            return None
        return {label: label_value(value) for label, value in m.groupdict().items()}

    @cached_property
    def examples(self) -> tuple[str, ...]:
        """Concrete keys of this entry: every alternative of an enumerated placeholder, example values elsewhere."""
        choices = []
        for label, regex in self.placeholders:
            if regex and re.fullmatch(r"[\w/]+(\|[\w/]+)*", regex):
                choices.append(regex.split("|"))
            else:
                choices.append([EXAMPLE_VALUES.get(label, label)])
        keys = []
        for combo in itertools.product(*choices):
            values = iter(combo)
            keys.append(_PLACEHOLDER.sub(lambda _m: next(values), self.key))  # noqa: B023 (called here, not later)
        return tuple(keys)

    def to_dict(self) -> dict[str, object]:
        return {
            "key": self.key,
            "otel_name": self.name,
            "prometheus_name": self.prometheus_name,
            "kind": self.kind.value,
            "unit": self.unit,
            "tracker_unit": self.tracker_unit or self.unit,
            "scale": self.scale,
            "labels": [*BASE_LABELS, *self.labels],
            "description": self.description,
            "source": self.source,
            **({"buckets": list(self.buckets)} if self.buckets else {}),
        }
