"""One watched run and rank: a :class:`~rl_otel._internal.pipeline.recorder.Recorder` of its own, fed with what
its files hold.

:class:`RunTarget` records the values read from the run's files through a step log (``log(values, step)``) - the
same router, store, catalog and labels as a training process - and keeps what the state file needs to serve them again
after a restart: the last ``[step, value]`` of each key and, for a histogram key, its counts as served. Its
recorder is made at the first values (``--framework auto`` infers the framework from them) or at once for a run
restored from the state file. The watcher serves every run's recorder from one endpoint (or, with
``port_per_run``, each from an endpoint of its own, made here). Nothing here raises.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from rl_otel._internal.pipeline.recorder import Recorder
from rl_otel._internal.pipeline.records import HistogramValue
from rl_otel._internal.runtime.assembly import Pipeline, pipeline
from rl_otel._internal.runtime.config import PrometheusConfig
from rl_otel._internal.runtime.identity import info_batch, resource_of
from rl_otel._internal.runtime.options import PROMETHEUS_DEFAULTS, default
from rl_otel._internal.runtime.serving import Served
from rl_otel.catalog import Catalog, Kind
from rl_otel.watch import frameworks
from rl_otel.watch.state import RunState

_log = logging.getLogger("rl_otel.watch")
MAX_KEYS = 100_000  # keys remembered per run for the state file (all are still served)
ROLE: str = default("role")  # what a watched process is (init()'s default), until its files say otherwise
_RETRY_S = 10.0
Point = tuple[int | None, float | None, dict[str, Any]]  # (step, wall time, {key: value}) as read from a file


@dataclass
class ServeOptions:
    """Where the runs are served (``host``/``port``/``port_search``/``file_sd``/``advertise_host`` as in
    ``init(prometheus=...)``): by default every run from one endpoint, each series labelled with its run, role
    and rank; ``port_per_run``: an endpoint (and a file_sd target) per run and rank, as each training process
    would have. ``framework``: a name, or ``auto``; ``max_unknown_keys``: per run, as ``init()``'s."""

    host: str = PROMETHEUS_DEFAULTS["host"]
    port: int = PROMETHEUS_DEFAULTS["port"]
    port_search: int = 100
    file_sd: str | None = None
    advertise_host: str | None = None
    framework: str = "auto"
    max_unknown_keys: int = default("max_unknown_keys")
    port_per_run: bool = False

    def prometheus(self) -> PrometheusConfig:
        """The endpoint's settings (the port search only from a given port)."""
        return PrometheusConfig(host=self.host, port=self.port, file_sd=self.file_sd,
                                advertise_host=self.advertise_host, port_search=self.port_search if self.port else 0)


class RunTarget:
    """The recorder of one ``(run, rank)`` and the state it persists. ``ready`` is False while a restored run
    catches up with what its files gained since the state was saved: it is not served meanwhile, so no series
    goes back to an older value (a restart may pause a series, never move it backwards)."""

    def __init__(self, state: RunState, options: ServeOptions, catalog: Catalog | None = None) -> None:
        self.state = state
        self.options = options
        self._given_catalog = catalog  # else the run's framework's (frameworks.catalog_for), once it is known
        self.catalog = catalog or frameworks.catalog_for(state.framework)
        self.recorder: Recorder | None = None
        self._parts: Pipeline | None = None  # the recorder's writer, its reads, its goodput accounting
        self.ready = True
        self.served: Served | None = None  # port_per_run only
        self._next_try = 0.0
        self._hist_keys: dict[str, tuple[float, ...]] = {}
        self._hist_steps: dict[str, int | None] = {key: h[0] for key, h in state.hists.items()}
        for key in state.hists:
            self._is_histogram(key)

    @property
    def url(self) -> str | None:
        """The run's own endpoint (``port_per_run``), else ``None``."""
        return None if self.served is None else self.served.url

    def start(self, keys: Iterable[str] = ()) -> bool:
        """Make the recorder if there is none (framework: given, saved, or inferred from ``keys``) and restore the
        saved values into it. False when it cannot start now (its own endpoint's port taken)."""
        if self.recorder is not None:
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
        # a training process's options by default (no start-up measured: a watched run's start is not known)
        parts = pipeline(self.catalog, {"run": st.run, "role": ROLE, "rank": str(st.rank)},
                         max_unknown_keys=self.options.max_unknown_keys)
        recorder = parts.recorder
        recorder.record(info_batch(resource_of(host_name=socket.gethostname(), run=st.run, role=ROLE, rank=st.rank,
                                               own={"rl.framework": st.framework, "rl.source": "rl-otel watch"},
                                               host_attribute=False)))
        if self.options.port_per_run and not self._serve(parts, now):
            return False
        self.recorder, self._parts = recorder, parts
        self._restore()
        _log.info("rl_otel watch: run %r rank %d (framework %s) served%s", st.run, st.rank, st.framework,
                  f" at {self.url}" if self.url else "")
        return True

    def _serve(self, parts: Pipeline, now: float) -> bool:
        st, prom = self.state, self.options.prometheus()
        diag, store = parts.diagnostics, parts.store
        try:
            self.served = Served(prom, parts.collect, lambda reason: diag.count("prometheus", reason), store.clock,
                                 host_name=socket.gethostname(), run=st.run, rank=st.rank,
                                 role=ROLE, labels=dict(store.base))
        except Exception as exc:  # boundary: binding a socket, writing the targets file (the OS)
            self._next_try = now + _RETRY_S
            _log.error("rl_otel watch: run %r rank %d cannot be served yet (%s); retrying in %.0f s", st.run,
                       st.rank, exc, _RETRY_S)
            return False
        return True

    def feed(self, points: Iterable[Point]) -> None:
        """Record the points read from a file, consecutive points of one step as one ``log()`` (a point without a
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
        if self.recorder is None and not self.start(values):
            return  # the values are remembered: served (restored) once it starts
        try:
            self._parts.log(values, step)  # type: ignore[union-attr]  # started above
        except Exception:  # boundary: a watcher never stops for one run (a file's values are user data)
            _log.debug("rl_otel watch: log failed", exc_info=True)

    def count_error(self, reason: str, n: int = 1) -> None:
        """Count ``n`` in ``rl_telemetry_errors_total{sink="watch", reason=...}`` (kept across restarts)."""
        if n <= 0:
            return
        self.state.errors[reason] = self.state.errors.get(reason, 0) + n
        if self.recorder is not None:  # else counted when it starts (its restore counts the saved totals)
            self.recorder.diagnostics.count("watch", reason, n)

    def snapshot(self) -> RunState:
        """The run's state for the state file, the histograms read back from what is served."""
        if self.recorder is not None:
            for key in list(self._hist_keys):
                h = self.value(key)
                if isinstance(h, HistogramValue):
                    self.state.hists[key] = [self._hist_steps.get(key), [int(c) for c in h.counts], h.sum, h.count,
                                             h.min, h.max]
        return self.state

    def value(self, key: str, labels: dict[str, str] | None = None) -> float | HistogramValue | None:
        """What the run serves now for one series (``Telemetry.value``'s read); ``None`` before it started."""
        return None if self._parts is None else self._parts.value(key, labels)

    def close(self) -> None:
        """Stop the run's own endpoint and remove its targets file (``port_per_run``); idempotent."""
        if self.served is not None:
            self.served.close()
            self.served = None

    def _is_histogram(self, key: str) -> bool:
        if key in self._hist_keys:
            return True
        res = self.catalog.lookup(key)
        if res is not None and res.spec.kind is Kind.HISTOGRAM:
            self._hist_keys[key] = res.spec.buckets
            return True
        return False

    def _restore(self) -> None:
        """Record the saved values again: each key at its own step, in step order, so the recorder holds what it
        held before the restart (a histogram from its saved counts)."""
        from rl_otel.stats import BucketCounts

        parts = self._parts
        assert parts is not None
        by_step: dict[int, dict[str, Any]] = {}
        for key, (step, value) in self.state.values.items():
            by_step.setdefault(step if step is not None else 0, {})[key] = value
        for key, (step, counts, total, count, lo, hi) in self.state.hists.items():
            if key in self._hist_keys:
                by_step.setdefault(step if step is not None else 0, {})[key] = BucketCounts(
                    bounds=tuple(self._hist_keys[key]), counts=np.asarray(counts, dtype=np.int64), sum=total,
                    count=count, min=lo, max=hi)
        # the goodput counters start again at 0 in this process (a counter reset to Prometheus, whose increase()
        # already holds what the previous process counted): the restored values' timing keys are not counted again
        # (before, every key's last value was: validation 91.15 s instead of 49.96 s)
        with parts.goodput.muted():
            for step in sorted(by_step):
                parts.log(by_step[step], step)
        for reason, n in self.state.errors.items():  # the totals, the errors counted before it started included
            parts.diagnostics.count("watch", reason, n)

