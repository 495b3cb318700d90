"""Routes a logged key to its catalog entry, or to a fallback gauge when the policy allows one.

A fallback name is refused when it would collide - with a name the catalog exposes, or with the fallback of
another key that sanitizes to the same name - and once ``max_unknown_keys`` fallbacks exist. Resolutions are
cached (bounded), so the per-step cost is one dict lookup per key. Thread-safe.

A key is resolved as UTF-8 can write it: a lone surrogate (``os.fsdecode`` of a non-UTF-8 file name) is escaped
first (:func:`~rl_otel.catalog.naming.encodable`), so no label value or description built from it can fail the
scrape's encoding; the key as logged is still what the cache and the trackers see.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from rl_otel._internal.forks import reset_in_forked_child
from rl_otel.catalog import Catalog, MetricSpec
from rl_otel.catalog.naming import encodable

_CACHE_LIMIT = 100_000  # keys remembered...
_CACHE_CHARS = 16 * 2**20  # ...and their characters: 115k keys of 2 kB would otherwise hold ~0.5 GiB
MAX_KEY_CHARS = 1_024  # a longer key is no metric name (it is a bug or an attack): refused at once, not resolved


@dataclass(frozen=True)
class Route:
    """Where a key's value goes."""

    spec: MetricSpec
    labels: tuple[tuple[str, str], ...]
    known: bool


@dataclass(frozen=True)
class Refusal:
    """Why a key's value cannot reach Prometheus (the trackers still get it: they take every key as logged)."""

    reason: str  # "collision" | "unknown_key_cap" | "key_too_long"
    metric: str  # the name counted in rl_telemetry_dropped_series_total{metric=...}
    detail: str


class Router:
    def __init__(self, catalog: Catalog, max_unknown_keys: int) -> None:
        self._catalog = catalog
        self._max_unknown = max_unknown_keys
        self._cache: dict[str, Route | Refusal] = {}
        self.cached = self._cache.get  # a key's resolution if already made (None otherwise): the per-step lookup
        self._fallback_owner: dict[str, str] = {}  # fallback metric name -> the key that claimed it
        self._lock = threading.Lock()
        self._cached_chars = 0
        reset_in_forked_child(self)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()  # the parent's may have been held by another thread at the fork

    def route(self, key: str) -> Route | Refusal:
        found = self._cache.get(key)
        if found is not None:
            return found
        if len(key) > MAX_KEY_CHARS:  # matching a 1 MB key against the templates took 1.7 s
            return Refusal("key_too_long", "key_too_long", f"a key of {len(key)} characters (more than "
                                                         f"{MAX_KEY_CHARS}: {key[:60]!r}...)")
        with self._lock:
            found = self._cache.get(key)
            if found is None:
                found = self._decide(key)
                if len(self._cache) < _CACHE_LIMIT and self._cached_chars + len(key) <= _CACHE_CHARS:
                    self._cache[key] = found
                    self._cached_chars += len(key)
        return found

    def existing(self, key: str) -> Route | None:
        """The route of a key that may already have a series, or None. A read: unlike :meth:`route` it caches
        nothing and claims no fallback name (``tel.value()`` and a ``None`` value have no series to make)."""
        found = self._cache.get(key)
        if found is not None:
            return found if isinstance(found, Route) else None
        if len(key) > MAX_KEY_CHARS:
            return None
        res = self._catalog.resolve(encodable(key))
        if res.known:
            return Route(res.spec, res.labels, True)
        with self._lock:
            owned = self._fallback_owner.get(res.spec.name) == res.key
        return Route(res.spec, (), False) if owned else None

    def _decide(self, key: str) -> Route | Refusal:
        if len(self._fallback_owner) >= self._max_unknown:
            # past the cap a key without an entry is refused before a fallback name is made for it (a flood of
            # new keys costs one catalog lookup each)
            known = self._catalog.lookup(encodable(key))
            if known is None:
                return Refusal("unknown_key_cap", "unknown_keys",
                               f"key {key!r} is past the cap of {self._max_unknown} keys without a catalog entry")
            return Route(known.spec, known.labels, True)
        res = self._catalog.resolve(encodable(key))
        if res.known:
            return Route(res.spec, res.labels, True)
        name = res.spec.name
        owner = self._fallback_owner.get(name)
        if owner is not None:
            if owner == res.key:
                return Route(res.spec, (), False)
            return Refusal("collision", name, f"key {res.key!r} sanitizes to {name!r}, already used by key {owner!r}")
        if self._catalog.exposes(name) or any(self._catalog.exposes(name + s) for s in ("_bucket", "_sum", "_count")):
            return Refusal("collision", name, f"key {res.key!r} sanitizes to {name!r}, a name of the catalog")
        if len(self._fallback_owner) >= self._max_unknown:
            return Refusal("unknown_key_cap", "unknown_keys",
                           f"key {res.key!r} is past the cap of {self._max_unknown} keys without a catalog entry")
        self._fallback_owner[name] = res.key
        return Route(res.spec, (), False)
