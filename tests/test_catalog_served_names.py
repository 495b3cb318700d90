"""Every entry of every framework's catalog is served under the Prometheus name the catalog (and docs/metrics.md)
documents for it, with the labels its key gives.

For each catalog a run resolves its keys in (``default_catalog(framework)`` for all ten frameworks: the shared one
of ROLL, veRL, TRL and Trinity-RFT, and the six scoped ones), one real Telemetry logs every example key of every
entry a training loop can log (each alternative of an enumerated placeholder), so an entry whose key another
entry's pattern catches first (shadowing: prime-rl's ``batch/{env}`` caught TRL's ``batch/row_tokens_mean``) is
found. rl_otel's own entries (``rl_otel/...`` keys, written by rl_otel itself) are checked where this process makes
them: liveness, build info, an error, a dropped series, a running and a finished phase, a collective, the
process gauges and the goodput counters.
"""

from __future__ import annotations

import re
import sys

import pytest

from rl_otel.catalog import FRAMEWORKS, Catalog, Kind, default_catalog, left_out
from rl_otel.catalog.spec import MetricSpec
from tests.gpu_fakes import FakeCuda, fake_torch, settle
from tests.promtools import scrape

_TYPE = re.compile(r"^# TYPE (\S+) (\S+)$", re.M)
_GPU = "rl_otel/live/gpu_"  # needs a CUDA device or NVML
# need an initialized torch.distributed (its flight recorder): served for real by tests/test_torch_collectives.py
_DISTRIBUTED = ("rl_otel/collectives/", "rl_otel/collective_started/")

# The shared templates a scoped framework's catalog leaves out, as its own entries match some of their keys
# (rl_otel.catalog.left_out; literal keys are left out the same way): a change here is a change of what a key means
# in that framework's runs.
LEFT_OUT_TEMPLATES = {
    "openrlhf": {"train/{operation:teacher_forward|student_train_step|step_train}"},
    "prime_rl": {"time/{operation}", "batch/row_tokens_{stat:mean|max}"},
}


def _catalogs() -> dict[str, Catalog]:
    """One framework naming each distinct catalog (ROLL, veRL, TRL and Trinity-RFT share one)."""
    out: dict[int, tuple[str, Catalog]] = {}
    for name in FRAMEWORKS:
        catalog = default_catalog(name)
        out.setdefault(id(catalog), (name, catalog))
    return dict(out.values())


CATALOGS = _catalogs()


def _value(spec: MetricSpec) -> object:
    return [spec.buckets[0], spec.buckets[-1]] if spec.kind is Kind.HISTOGRAM else 1.0  # in range (log-probs <= 0)


def _series(text: str) -> dict[str, list[frozenset]]:
    """``{sample name: [its label sets]}`` of an exposition, read once."""
    out: dict[str, list[frozenset]] = {}
    for m in re.finditer(r"^([a-zA-Z_:][\w:]*)(?:\{(.*)\})? \S+$", text, re.M):
        labels = frozenset(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        out.setdefault(m.group(1), []).append(labels)
    return out


def _loggable(catalog: Catalog) -> list[MetricSpec]:
    return [s for s in catalog if s.kind is not Kind.INFO and not s.key.startswith("rl_otel/")]


def test_ten_frameworks_make_seven_catalogs():
    assert len(FRAMEWORKS) == 10 and sorted(CATALOGS) == ["areal", "nemo_rl", "openrlhf", "prime_rl", "roll",
                                                          "skyrl", "slime"]


@pytest.mark.parametrize("framework", sorted(CATALOGS))
def test_every_example_key_of_every_entry_resolves_to_its_entry(framework):
    """No pattern catches another entry's key first (the catalog's order decides)."""
    catalog = CATALOGS[framework]
    shadowed = {key: (spec.name, (res := catalog.resolve(key)).spec.name, dict(res.labels))
                for spec in _loggable(catalog) for key in spec.examples if catalog.resolve(key).spec is not spec}
    assert shadowed == {}, f"{len(shadowed)} keys are served under another entry's name in {framework}'s catalog"


@pytest.mark.parametrize("framework", sorted(CATALOGS))
def test_every_catalog_entry_is_served_under_its_documented_name(framework, tmp_path):
    import rl_otel

    catalog = CATALOGS[framework]
    loggable = _loggable(catalog)
    keys = {key: spec for spec in loggable for key in spec.examples}
    tel = rl_otel.init(run="names", prometheus={"host": "127.0.0.1", "port": 0}, catalog=catalog,
                       handle_sigterm=False, stack_dump_dir=tmp_path)
    try:
        tel.log({key: _value(spec) for key, spec in keys.items()}, step=1)
        tel.log({"actor/pg_loss": "not a number", "rl_step": 1.0}, step=2)  # an error, a name collision (dropped)
        with pytest.MonkeyPatch.context() as mp:  # a (fake) CUDA device: the phase's GPU times are served too
            mp.setitem(sys.modules, "torch", fake_torch(FakeCuda()))
            # the families of a running phase (and a collective's wait in it), then of a finished one
            with tel.phase("actor_train", "train_step"), tel.collective("allreduce"):
                served = dict(_TYPE.findall(scrape(tel.metrics_url)))  # type: ignore[arg-type]
            assert settle(tel)
        scrape(tel.metrics_url.replace("/metrics", "/debug/stacks"))  # type: ignore[union-attr]  # a stack dump
        text = scrape(tel.metrics_url)  # type: ignore[arg-type]
        served.update(_TYPE.findall(text))
    finally:
        tel.close()
    own = [s for s in catalog if s.key.startswith("rl_otel/") and not s.key.startswith((_GPU, *_DISTRIBUTED))]
    wrong = {s.key: (s.prometheus_name, sorted(n for n in served if n.startswith(s.name)))
             for s in (*loggable, *own) if s.prometheus_name not in served}
    assert wrong == {}, f"{len(wrong)} entries are served under another name than documented"
    # each example key's series: under its entry's name, with the labels its key gives
    series, missing = _series(text), []
    for key, spec in keys.items():
        want = {("run", "names"), *catalog.resolve(key).labels}
        name = spec.name + "_bucket" if spec.kind is Kind.HISTOGRAM else spec.prometheus_name
        if not any(want <= labels for labels in series.get(name, ())):
            missing.append((key, name, sorted(want)))
    assert missing == []
    assert len(loggable) > 600


@pytest.mark.parametrize("framework", sorted(CATALOGS))
def test_a_scoped_catalog_leaves_out_the_shared_templates_its_own_entries_overlap(framework):
    """What a scoped catalog leaves out is this reviewed set, and nothing it keeps overlaps its own entries."""
    left = {s.key for s in left_out(framework) if s.templated}
    assert left == LEFT_OUT_TEMPLATES.get(framework, set())
    catalog = CATALOGS[framework]
    kept = {id(s) for s in catalog.specs}
    assert not any(id(s) in kept for s in left_out(framework))
