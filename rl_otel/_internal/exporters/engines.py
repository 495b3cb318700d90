"""The rollout engine's own families, served on this process's endpoint with the run's labels.

vLLM and SGLang record their metrics with ``prometheus_client`` (``vllm/v1/metrics/loggers.py``,
``python/sglang/srt/metrics/collector.py``). An engine running inside a trainer's process (verl's hybrid engine,
OpenRLHF, slime) keeps them in the process's ``prometheus_client.REGISTRY``, or, when ``PROMETHEUS_MULTIPROC_DIR``
is set (SGLang always sets it with ``--enable-metrics``; vLLM's multiprocess front ends), in that directory's
files, which nobody serves unless the engine's own HTTP server runs (ray#62931). :class:`EngineFamilies` is a live
collector of the recorder: at each collection it reads the families whose names start with one of the configured
prefixes, once, through prometheus_client's public API (``registry.collect()``, ``MultiProcessCollector``), and
hands them on as rl_otel families:

- names are kept verbatim (``vllm:num_requests_running``): they are the engines' own families, which the users'
  dashboards and the engines' docs query; rl_otel's rule that colons belong to recording rules is about the names
  rl_otel makes, and an engine family is none of them. The exposition accepts colons in metric names.
- every series gets the run's ``run``, ``role``, ``rank`` (the recorder's base labels) and ``replica`` (which engine
  replica: the ``engines={"replica": ...}`` option, default the process's rank). An engine label of one of these
  names is renamed ``engine_<name>``, never dropped; every other engine label is kept as it is.
- counters lose their ``_created`` samples (rl_otel serves none); a histogram becomes a
  :class:`~rl_otel._internal.pipeline.records.HistogramValue` with the engine's own buckets; summaries and
  gauge-histograms are left out (no engine family the rules read is one).
- each family is capped at ``max_series_per_metric`` series like a stored one; what is left out is counted
  (``rl_telemetry_errors_total{sink="live", reason="engine_series_cap"}``).

A multiprocess directory is shared by every process that writes it (an engine's workers, several ranks of one node):
summed once per directory, not once per rank. The process that serves it holds an exclusive ``flock`` on
``<dir>/rl_otel-engines.lock`` (released by the kernel when it exits, so another rank takes over at its next
collection; a forked child closes its copy of the descriptor); the others serve none of its families. With a
directory in use, the in-process registry's engine families are not served either: in multiprocess mode they are
this process's share of the directory's.

Nothing here imports prometheus_client: a process that never imported it (no engine) pays one dictionary lookup
per collection.
"""

from __future__ import annotations

import math
import os
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from rl_otel._internal.forks import reset_in_forked_child
from rl_otel._internal.pipeline.records import HistogramValue, Labels
from rl_otel.catalog import Kind, MetricSpec
from rl_otel.catalog.spec import built_in

Item = tuple[MetricSpec, Labels, "float | HistogramValue"]
DEFAULT_PREFIXES = ("vllm:", "sglang:")
LOCK_NAME = "rl_otel-engines.lock"
_KINDS = {"gauge": Kind.GAUGE, "counter": Kind.COUNTER, "histogram": Kind.HISTOGRAM, "unknown": Kind.GAUGE}
RESERVED = ("run", "role", "rank", "replica")  # the labels rl_otel puts on every engine series


@dataclass(frozen=True)
class EnginesConfig:
    """``init(engines=...)`` checked: the family name prefixes served, the ``replica`` label (``None``: the rank)
    and the multiprocess directory (``None``: ``$PROMETHEUS_MULTIPROC_DIR`` at each collection)."""

    prefixes: tuple[str, ...] = DEFAULT_PREFIXES
    replica: str | None = None
    multiprocess_dir: str | None = None


def engine_label(name: str) -> str:
    """An engine's label name as served: ``engine_<name>`` for one of :data:`RESERVED`, else itself."""
    return f"engine_{name}" if name in RESERVED else name


class DirectoryClaim:
    """This process's claim to serve one multiprocess directory: an exclusive, non-blocking ``flock`` on a file
    in it, taken at the first collection that finds it free and held until :meth:`release` or the process's end.
    A directory that cannot hold the file (read-only) is served by every process that reads it, and said."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._fd: int | None = None
        self.unlockable = False

    def held(self) -> bool:
        if self._fd is not None:
            return True
        try:
            import fcntl

            fd = os.open(os.path.join(self.directory, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o644)
        except (ImportError, OSError):
            self.unlockable = True
            return True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.close(fd)  # closing the descriptor releases the lock
            except OSError:
                pass


class EngineFamilies:
    """A live collector (one of the ``Recorder``'s) of the engine families of this process (see the module's doc).

    ``count(reason)`` counts what a collection leaves out; ``registry``: a prometheus_client registry to read
    instead of ``prometheus_client.REGISTRY`` (tests). Never raises from :meth:`collect`. Thread-safe: a claim is
    taken under a lock; the caches are dictionaries read and replaced whole per entry."""

    def __init__(self, config: EnginesConfig, *, rank: int, max_series_per_metric: int,
                 count: Callable[[str], None], registry: Any = None) -> None:
        self.config = config
        self.replica = (("replica", config.replica if config.replica is not None else str(rank)),)
        self._cap = max_series_per_metric
        self._count = count
        self._registry = registry
        self._claims: dict[str, DirectoryClaim] = {}
        self._claiming = threading.Lock()  # a scrape, tel.value() and the OTLP push may collect at once
        self._specs: dict[tuple, MetricSpec] = {}  # one spec per family shape, kept while its shape holds
        self._labels: dict[tuple[tuple[str, str], ...], Labels] = {}
        reset_in_forked_child(self)

    def _after_fork(self) -> None:
        """A forked child (a data loader's worker) drops its copy of the claim's descriptor: the lock stays the
        parent's, and ends with the parent, not with the last of its children."""
        self._claiming = threading.Lock()  # the parent's may have been held by another thread at the fork
        self.close()

    # -- where the families are -------------------------------------------------------------------------------

    def _directory(self) -> str | None:
        directory = self.config.multiprocess_dir or os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        return directory if directory and os.path.isdir(directory) else None

    def _metrics(self) -> Iterable[Any]:
        """The prometheus_client ``Metric`` s to serve now: the directory's when one is in use (and this process
        holds its claim), else the registry's; nothing where prometheus_client was never imported."""
        directory = self._directory()
        if directory is not None:
            with self._claiming:
                claim = self._claims.get(directory)
                if claim is None:
                    claim = self._claims[directory] = DirectoryClaim(directory)
                held = claim.held()
            if not held:
                return ()
            if claim.unlockable:
                self._count("engine_directory_unlockable")
            from prometheus_client.multiprocess import MultiProcessCollector

            return MultiProcessCollector(None, path=directory).collect()
        registry = self._registry
        if registry is None:
            module = sys.modules.get("prometheus_client")
            if module is None:
                return ()
            registry = module.REGISTRY
        return registry.collect()

    # -- the collector ----------------------------------------------------------------------------------------

    def collect(self) -> list[Item]:
        try:
            metrics = list(self._metrics())
        except Exception:  # boundary: the engine's registry (vLLM/SGLang/prometheus_client objects)
            self._count("engine_read")
            return []
        items: list[Item] = []
        prefixes = self.config.prefixes
        for metric in metrics:
            try:
                if metric.name.startswith(prefixes):
                    items += self._family(metric)
            except Exception:  # boundary: an engine's metric object of any shape costs only its family
                self._count("engine_family")
        return items

    def close(self) -> None:
        """Release the claims this process holds (idempotent)."""
        with self._claiming:
            for claim in self._claims.values():
                claim.release()
            self._claims.clear()

    def _served(self, labels: dict[str, str]) -> Labels:
        key = tuple(labels.items())
        got = self._labels.get(key)
        if got is None:
            if len(self._labels) > 8 * max(self._cap, 1024):
                self._labels.clear()
            got = self._labels[key] = self.replica + tuple((engine_label(k), v) for k, v in key)
        return got

    def _spec(self, name: str, kind: Kind, doc: str, buckets: tuple[float, ...]) -> MetricSpec:
        key = (name, kind, doc, buckets)
        spec = self._specs.get(key)
        if spec is None:
            if len(self._specs) > 4096:
                self._specs.clear()
            # the engine's name, not one of rl_otel's (MetricSpec.check holds those to the rl_ scheme): made
            # without that check, as the catalog's own entries are
            with built_in():
                spec = MetricSpec(key=name, name=name, kind=kind, unit="", description=doc or name,
                                  source="engine", buckets=buckets)
            self._specs[key] = spec
        return spec

    def _family(self, metric: Any) -> list[Item]:
        kind = _KINDS.get(metric.type)
        if kind is None:  # summary, gaugehistogram, info, stateset: none the rules or dashboards read
            return []
        name = metric.name
        if kind is Kind.HISTOGRAM:
            return self._histogram(metric, name)
        sample_name = name + "_total" if kind is Kind.COUNTER else name
        spec = self._spec(name, kind, metric.documentation, ())
        items: list[Item] = []
        for sample in metric.samples:
            if sample.name != sample_name:
                continue  # a counter's _created
            if len(items) >= self._cap:
                self._count("engine_series_cap")
                break
            items.append((spec, self._served(sample.labels), float(sample.value)))
        return items

    def _histogram(self, metric: Any, name: str) -> list[Item]:
        series: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}
        for sample in metric.samples:
            suffix = sample.name[len(name):]
            labels = dict(sample.labels)
            le = labels.pop("le", None)
            entry = series.setdefault(tuple(labels.items()), {"buckets": [], "sum": 0.0, "count": None})
            if suffix == "_bucket" and le is not None:
                entry["buckets"].append((float(le), float(sample.value)))
            elif suffix == "_sum":
                entry["sum"] = float(sample.value)
            elif suffix == "_count":
                entry["count"] = float(sample.value)
        items: list[Item] = []
        for key, entry in series.items():
            cumulative = sorted(entry["buckets"])
            if not cumulative or cumulative[-1][0] != math.inf:
                continue
            if len(items) >= self._cap:
                self._count("engine_series_cap")
                break
            bounds = tuple(b for b, _ in cumulative[:-1])
            counts, before = [], 0.0
            for _, total in cumulative:
                counts.append(int(total - before))
                before = total
            value = HistogramValue(tuple(counts), entry["sum"], int(cumulative[-1][1]), math.nan, math.nan)
            spec = self._spec(name, Kind.HISTOGRAM, metric.documentation, bounds)
            items.append((spec, self._served(dict(key)), value))
        return items
