"""The key sets the frameworks' current code emits (``tests/data/frameworks/<framework>.tsv``), read as data.

Each fixture line is one key as the framework passes it to its tracker, the template it comes from, its kind, the
unit the framework logs it in, where in the framework's source it comes from, and what it means. The fixtures
were read off the frameworks' code (versions in each file's header); the tests check the catalog against them.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from pathlib import Path

from rl_otel.catalog import Resolution, default_catalog
from rl_otel.catalog.concepts import CONCEPTS, Concept, Source
from rl_otel.catalog.goodput_nesting import Loop

DATA = Path(__file__).resolve().parent / "data" / "frameworks"
FRAMEWORKS = ("trl", "verl", "roll", "trinity")  # the shared catalog's (tests/test_catalog_frameworks.py)
# every framework with a fixture: the six scoped ones resolve in their own catalog (default_catalog(name)), their
# catalogs tested in tests/test_catalog_scoped_frameworks.py
ALL_FRAMEWORKS = (*FRAMEWORKS, "openrlhf", "slime", "areal", "nemo_rl", "skyrl", "prime_rl")

# The unit a framework logs in -> (catalog unit, scale to it) the entry must have.
UNITS: dict[str, tuple[str, float]] = {
    "s": ("s", 1.0), "ms": ("s", 1e-3), "min": ("s", 60.0), "GiB": ("By", float(2**30)), "GB": ("By", 1e9),
    "MiB": ("By", float(2**20)), "By": ("By", 1.0), "1": ("1", 1.0),
}


@dataclass(frozen=True)
class FixtureKey:
    key: str
    template: str
    kind: str
    unit: str
    source: str
    meaning: str
    line: int
    framework: str = ""  # the fixture's framework: its keys resolve in default_catalog(framework)

    @property
    def placeholders(self) -> tuple[str, ...]:
        return tuple(re.findall(r"\{(\w+)\}", self.template))

    def free_values(self) -> dict[str, str]:
        """The example values of the template's placeholders, read back from the key."""
        pattern, last = [], 0
        for i, m in enumerate(re.finditer(r"\{(\w+)\}", self.template)):
            pattern.append(re.escape(self.template[last:m.start()]))
            # the first free part may hold '/' (veRL's data source openai/gsm8k, a Trinity taskset math/aime24)
            pattern.append(f"(?P<{m.group(1)}_{len(pattern)}>{'.+' if i == 0 else '[^/]+'})")
            last = m.end()
        pattern.append(re.escape(self.template[last:]))
        m = re.fullmatch("".join(pattern), self.key)
        if m is None:
            return {}
        return {name.rsplit("_", 1)[0]: value for name, value in m.groupdict().items()}


def load(framework: str) -> list[FixtureKey]:
    lines = (DATA / f"{framework}.tsv").read_text(encoding="utf-8").splitlines()
    out: list[FixtureKey] = []
    header_seen = False
    for number, line in enumerate(lines, start=1):
        if not line.strip() or line.startswith("#"):
            continue
        cells = line.split("\t")
        if not header_seen:
            header_seen = True
            assert cells[:6] == ["key", "template", "kind", "unit", "source", "meaning"], cells
            continue
        cells += [""] * (6 - len(cells))
        out.append(FixtureKey(*(c.strip() for c in cells[:6]), line=number, framework=framework))
    return out


# prime-rl's processes, by the source path of a fixture row (a row naming both is written by both)
_PRIME_RL_WRITERS = {"trainer": "src/prime_rl/trainer/", "orchestrator": "src/prime_rl/orchestrator/"}


def writer_lines(framework: str) -> dict[str, dict[str, float]]:
    """The fixture's keys as each process of ``framework`` writes them into the one file they share, one line each
    (prime-rl's trainer and orchestrator append to one metrics.jsonl), ``{process: {key: value}}``; ``{}`` for a
    framework written by one process. Each key's value is its line number in the fixture."""
    if framework != "prime_rl":
        return {}
    keys = load(framework)
    return {writer: {k.key: float(k.line) for k in keys if path in k.source}
            for writer, path in _PRIME_RL_WRITERS.items()}


def watched_keys(framework: str) -> list[str]:
    """The keys ``rl-otel watch`` routes for ``framework``: the fixture's, and for a file several processes share,
    each process's line as the watcher parses it (prime-rl's ``time/step`` becomes ``trainer/time/step`` and
    ``orchestrator/time/step``)."""
    import json

    from rl_otel.watch import jsonl

    out = dict.fromkeys(k.key for k in load(framework))
    for line in writer_lines(framework).values():
        parsed = jsonl.parse(json.dumps({"step": 1, **line}).encode())
        assert parsed is not None
        out.update(dict.fromkeys(parsed[2]))
    return list(out)


def header(framework: str) -> str:
    """The fixture's leading comment lines (versions, commit)."""
    lines = (DATA / f"{framework}.tsv").read_text(encoding="utf-8").splitlines()
    return "\n".join(line for line in lines if line.startswith("#"))


def resolve(keys: list[FixtureKey]) -> dict[str, Resolution]:
    """Each key resolved in its framework's catalog."""
    return {k.key: default_catalog(k.framework or None).resolve(k.key) for k in keys}


def _matches(source: Source, res: Resolution) -> bool:
    if res.spec.prometheus_name != source.metric:
        return False
    labels = dict(res.labels)
    for label, op, value in source.matchers:
        got = labels.get(label, "")
        ok = {"=": got == value, "!=": got != value, "=~": re.fullmatch(value, got) is not None,
              "!~": re.fullmatch(value, got) is None}[op]
        if not ok:
            return False
    return True


def concepts_logged(keys: list[FixtureKey]) -> dict[str, list[str]]:
    """``{concept name: [fixture keys that feed it]}`` for every concept the key set reaches."""
    resolved = resolve(keys)
    out: dict[str, list[str]] = {}
    for c in CONCEPTS:
        feeding = [k.key for k in keys if resolved[k.key].known and any(_matches(s, resolved[k.key])
                                                                         for s in c.sources)]
        if feeding:
            out[c.name] = feeding
    return out


def concept_keys(keys: list[FixtureKey], c: Concept) -> list[str]:
    return list(concept_sources(keys, c))


def concept_sources(keys: list[FixtureKey], c: Concept) -> dict[str, Source]:
    """``{fixture key: the concept's source it feeds}``."""
    resolved = resolve(keys)
    out = {}
    for k in keys:
        source = next((s for s in c.sources if resolved[k.key].known and _matches(s, resolved[k.key])), None)
        if source is not None:
            out[k.key] = source
    return out


def step_values(loop: Loop, rng: random.Random) -> dict[str, float]:
    """One step's timing values (seconds) of a training loop, consistent with its containment facts
    (``rl_otel.catalog.goodput_nesting``): a part a few seconds, a container its parts' sum plus up to 10% untimed,
    an overlapping key (a statistic, a concurrent timer) a share of its container."""
    nests = {n.key: n for n in loop.nests}
    values: dict[str, float] = {}

    def share(key: str, total: float) -> None:  # an overlapping key and what it contains, inside ``total``
        values[key] = total
        nest = nests.get(key)
        for part in nest.parts if nest else ():
            share(part, total / len(nest.parts) * rng.uniform(0.5, 1.0))
        for other in nest.overlapping if nest else ():
            share(other, total * rng.uniform(0.05, 1.0))

    def value(key: str) -> float:
        if key not in values:
            nest = nests.get(key)
            if nest and nest.parts:
                values[key] = sum(value(p) for p in nest.parts) * rng.uniform(1.0, 1.1)
            else:
                values[key] = rng.uniform(1.0, 10.0)
            for other in nest.overlapping if nest else ():
                share(other, values[key] * rng.uniform(0.05, 1.0))
        return values[key]

    for key in (*([loop.step] if loop.step else []), *loop.top, *(n.key for n in loop.nests)):
        value(key)
    return values
