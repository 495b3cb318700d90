"""The framework whose keys a watched run logs: given (``--framework verl``) or inferred from its keys.

With ten frameworks one key string can mean different things, so a run's keys resolve in its framework's catalog
(:func:`rl_otel.catalog.default_catalog`), and the framework is stated on the target: it becomes the resource
attribute ``rl.framework`` (served in ``target_info``). ``auto`` scores each framework by the keys of the run's
first values that its own catalog entries explain (an entry shared by several frameworks counts for each in
part); a run whose keys no framework places, or whose keys two frameworks explain equally (veRL's and ROLL's
shared ``actor/pg_loss``, ``critic/score/mean``: a guess named ROLL a veRL run), is ``unknown`` and resolves in
the default catalog, which holds the shared entries; ``--framework`` states it.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import TypeVar

from rl_otel.catalog import FRAMEWORKS, SCOPED_FRAMEWORKS, Catalog, default_catalog, framework_module, framework_name
from rl_otel.catalog.writers import SharedFile

V = TypeVar("V")


def normalize(name: str) -> str:
    """A framework's canonical name (``prime-rl`` → ``prime_rl``), or ``auto``; ``ValueError`` for an unknown one."""
    if name.lower() == "auto":
        return "auto"
    try:
        return framework_name(name)
    except ValueError:
        raise ValueError(f"unknown framework {name!r}: one of auto, {', '.join(FRAMEWORKS)}") from None


def catalog_for(framework: str | None) -> Catalog:
    """The catalog a run of ``framework`` resolves its keys in (the default one for ``unknown``/``None``)."""
    return default_catalog(framework if framework in FRAMEWORKS else None)


def infer(keys: Iterable[str]) -> str:
    """The framework that best explains ``keys``, else ``"unknown"``."""
    keys = list(keys)
    scores: dict[str, float] = {}
    for catalog in (default_catalog(), *(default_catalog(f) for f in SCOPED_FRAMEWORKS)):
        for key in keys:
            res = catalog.lookup(key)
            if res is None or res.spec.source in ("rl_otel", "fallback"):
                continue
            sources = [_canonical(s) for s in res.spec.source.split(",") if s.strip()]
            own = [s for s in sources if s in FRAMEWORKS]
            for source in own:
                # a scoped framework's catalog also holds the shared entries: count those once, from the default
                if catalog is default_catalog() or source in SCOPED_FRAMEWORKS:
                    scores[source] = scores.get(source, 0.0) + 1.0 / len(own)
    if not scores:
        return "unknown"
    best = max(scores.values())
    leaders = [s for s, score in scores.items() if score > best - 1e-9]
    return leaders[0] if len(leaders) == 1 else "unknown"  # a tie is no evidence for either


def _canonical(source: str) -> str:
    try:
        return framework_name(source.strip())
    except ValueError:
        return source.strip()


def attribute(values: dict[str, V]) -> dict[str, V]:
    """The values of one line of a metrics file, with the keys that several processes writing that file share
    renamed by the process whose line it is (prime-rl's trainer and orchestrator both write ``time/step`` to one
    ``metrics.jsonl``: ``trainer/time/step``, ``orchestrator/time/step``; see :mod:`rl_otel.catalog.writers`). Any
    other line is returned as it is."""
    for shared in _shared_files():
        values = shared.attribute(values)
    return values


@functools.cache
def _shared_files() -> tuple[SharedFile, ...]:
    """The ``LINE_WRITERS`` of the frameworks' catalog modules (imported once, at the first JSONL line)."""
    found = (getattr(framework_module(name), "LINE_WRITERS", None) for name in SCOPED_FRAMEWORKS)
    return tuple(f for f in found if isinstance(f, SharedFile))
