"""One watched run and rank, served through its own :func:`rl_otel.init` Telemetry.

:class:`RunTarget` logs the values read from the run's files with ``tel.log(values, step=...)`` - the same router,
store, catalog and labels as a training process - and keeps what the state file needs to serve them again after
a restart: the last ``[step, value]`` of each key and, for a histogram key, its counts as served. Its endpoint is
started at the first values (``--framework auto`` infers the framework from them) or at once for a run restored
from the state file. Nothing here raises: a Telemetry that cannot start (a port taken) is logged and tried again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rl_otel.catalog import Catalog, Kind
from rl_otel.watch import frameworks
from rl_otel.watch.state import RunState

_log = logging.getLogger("rl_otel.watch")
MAX_KEYS = 100_000  # keys remembered per run for the state file (all are still served)
_RETRY_S = 10.0
Point = tuple[int | None, float | None, dict[str, Any]]  # (step, wall time, {key: value}) as read from a file


@dataclass
class ServeOptions:
    """How each run's endpoint is served (``host``/``port``/``port_search``/``file_sd``/``advertise_host`` as
    in ``init(prometheus=...)``), the framework (a name, or ``auto``), and any other ``init()`` options."""

    host: str = "0.0.0.0"
    port: int = 9464
    port_search: int = 100
    file_sd: str | None = None
    advertise_host: str | None = None
    framework: str = "auto"
    init_options: dict[str, Any] = field(default_factory=dict)


class RunTarget:
    """The Telemetry of one ``(run, rank)`` and the state it persists."""

    def __init__(self, state: RunState, options: ServeOptions, catalog: Catalog | None = None) -> None:
        self.state = state
        self.options = options
        self._given_catalog = catalog  # else the run's framework's (frameworks.catalog_for), once it is known
        self.catalog = catalog or frameworks.catalog_for(state.framework)
        self.tel: Any = None
        self._next_try = 0.0
        self._hist_keys: dict[str, tuple[float, ...]] = {}
        self._hist_steps: dict[str, int | None] = {key: h[0] for key, h in state.hists.items()}
        for key in state.hists:
            self._is_histogram(key)

    @property
    def url(self) -> str | None:
        return None if self.tel is None else self.tel.metrics_url

    def start(self, keys: Iterable[str] = ()) -> bool:
        """Start the Telemetry if it is not (framework: given, saved, or inferred from ``keys``); restore the saved
        values into it. False when it cannot start now."""
        if self.tel is not None:
            return True
        now = time.monotonic()
        if now < self._next_try:
            return False
        st = self.state
        if st.framework is None:
            given = self.options.framework
            st.framework = frameworks.infer(keys) if given == "auto" else given
        if self._given_catalog is None:
            self.catalog = frameworks.catalog_for(st.framework)
        prom: dict[str, Any] = {"host": self.options.host, "port": self.options.port, "add_local_rank": False,
                                "port_search": self.options.port_search if self.options.port else 0}
        if self.options.file_sd:
            prom["file_sd"] = self.options.file_sd
        if self.options.advertise_host:
            prom["advertise_host"] = self.options.advertise_host
        try:
            import rl_otel

            kwargs = {"handle_sigterm": False, **self.options.init_options}
            kwargs["resource"] = {**(kwargs.get("resource") or {}), "rl.framework": st.framework,
                                  "rl.source": "rl-otel watch"}
            self.tel = rl_otel.init(run=st.run, rank=st.rank, prometheus=prom, catalog=self.catalog, **kwargs)
        except Exception as exc:
            self._next_try = now + _RETRY_S
            _log.error("rl_otel watch: run %r rank %d cannot be served yet (%s); retrying in %.0f s", st.run, st.rank,
                       exc, _RETRY_S)
            return False
        self._restore()
        _log.info("rl_otel watch: run %r rank %d (framework %s) served at %s", st.run, st.rank, st.framework,
                  self.tel.metrics_url)
        return True

    def feed(self, points: Iterable[Point]) -> None:
        """Log the points read from a file, consecutive points of one step as one ``log()`` (a point without a
        step takes the run's highest step + 1, as ``log(step=None)`` would)."""
        step: int | None = None
        batch: dict[str, Any] = {}
        for p_step, _ts, values in points:
            if not values:
                continue
            if p_step is None:
                p_step = (self.state.step + 1) if self.state.step is not None else 0
            if p_step != step and batch:
                self._log(batch, step)
                batch = {}
            step = p_step
            batch.update(values)
            if self.state.step is None or step > self.state.step:
                self.state.step = step
        if batch:
            self._log(batch, step)

    def _log(self, values: dict[str, Any], step: int | None) -> None:
        remembered = self.state.values
        for key, value in values.items():
            if self._is_histogram(key):
                self._hist_steps[key] = step
                continue
            if (key in remembered or len(remembered) < MAX_KEYS) and (value is None or isinstance(value, (int, float))):
                remembered[key] = [step, value]
        if self.tel is None and not self.start(values):
            return  # the values are remembered: served (restored) once the Telemetry starts
        try:
            self.tel.log(values, step=step)
        except Exception:  # log() does not raise; a watcher never stops for one run
            _log.debug("rl_otel watch: log failed", exc_info=True)

    def count_error(self, reason: str, n: int = 1) -> None:
        """Count ``n`` in ``rl_telemetry_errors_total{sink="watch", reason=...}`` (kept across restarts)."""
        if n <= 0:
            return
        self.state.errors[reason] = self.state.errors.get(reason, 0) + n
        if self.tel is not None:  # else counted when it starts (its restore counts the saved totals)
            _count(self.tel, reason, n)

    def snapshot(self) -> RunState:
        """The run's state for the state file, the histograms read back from what the endpoint serves."""
        if self.tel is not None:
            for key in list(self._hist_keys):
                h = self.tel.value(key)
                if h is not None and hasattr(h, "counts"):
                    self.state.hists[key] = [self._hist_steps.get(key), [int(c) for c in h.counts], h.sum, h.count,
                                             h.min, h.max]
        return self.state

    def close(self) -> None:
        if self.tel is not None:
            self.tel.close()

    def _is_histogram(self, key: str) -> bool:
        if key in self._hist_keys:
            return True
        res = self.catalog.lookup(key)
        if res is not None and res.spec.kind is Kind.HISTOGRAM:
            self._hist_keys[key] = res.spec.buckets
            return True
        return False

    def _restore(self) -> None:
        """Serve the saved values again: each key at its own step, in step order, so the endpoint holds what it
        held before the restart (a histogram from its saved counts)."""
        from rl_otel.stats import BucketCounts

        by_step: dict[int, dict[str, Any]] = {}
        for key, (step, value) in self.state.values.items():
            by_step.setdefault(step if step is not None else 0, {})[key] = value
        for key, (step, counts, total, count, lo, hi) in self.state.hists.items():
            if key in self._hist_keys:
                by_step.setdefault(step if step is not None else 0, {})[key] = BucketCounts(
                    bounds=tuple(self._hist_keys[key]), counts=np.asarray(counts, dtype=np.int64), sum=total,
                    count=count, min=lo, max=hi)
        for step in sorted(by_step):
            self.tel.log(by_step[step], step=step)
        for reason, n in self.state.errors.items():  # the totals, the errors counted before it started included
            _count(self.tel, reason, n)


def _count(tel: Any, reason: str, n: float) -> None:
    """``rl_telemetry_errors_total{sink="watch", reason=...}`` += n. Telemetry has no public way to count an
    error of its caller's; this reaches its diagnostics (see the report: a ``Telemetry.count_error`` is wanted)."""
    diag = getattr(tel, "_diag", None)
    if diag is not None:
        try:
            diag.count("watch", reason, n)
        except Exception:
            pass
