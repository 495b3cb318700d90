"""The framework whose keys a watched run logs: given (``--framework verl``) or inferred from its keys.

With ten frameworks one key string can mean different things, so the framework is stated on the target: it
becomes the resource attribute ``rl.framework`` (served in ``target_info``). ``auto`` scores each framework by
the keys of the run's first values that the catalog knows from it (an entry shared by several frameworks counts
for each in part); a run whose keys the catalog does not place is ``unknown``.
"""

from __future__ import annotations

from collections.abc import Iterable

from rl_otel.catalog import Catalog

FRAMEWORKS = ("roll", "verl", "trl", "trinity", "openrlhf", "slime", "areal", "nemo_rl", "skyrl", "prime_rl")
_ALIASES = {"transformers": "trl", "trinity-rft": "trinity", "trinity_rft": "trinity", "nemo-rl": "nemo_rl",
            "prime-rl": "prime_rl"}


def normalize(name: str) -> str:
    """A framework's canonical name (``prime-rl`` → ``prime_rl``); raises ``ValueError`` for an unknown one."""
    name = _ALIASES.get(name.lower(), name.lower())
    if name != "auto" and name not in FRAMEWORKS:
        raise ValueError(f"unknown framework {name!r}: one of auto, {', '.join(FRAMEWORKS)}")
    return name


def infer(keys: Iterable[str], catalog: Catalog) -> str:
    """The framework that best explains ``keys``, else ``"unknown"``."""
    scores: dict[str, float] = {}
    for key in keys:
        res = catalog.lookup(key)
        if res is None or res.spec.source in ("rl_otel", "fallback"):
            continue
        sources = [_ALIASES.get(s.strip(), s.strip()) for s in res.spec.source.split(",") if s.strip()]
        for source in sources:
            scores[source] = scores.get(source, 0.0) + 1.0 / len(sources)
    if not scores:
        return "unknown"
    return max(sorted(scores), key=lambda s: (scores[s], -_order(s)))


def _order(name: str) -> int:
    return FRAMEWORKS.index(name) if name in FRAMEWORKS else len(FRAMEWORKS)
