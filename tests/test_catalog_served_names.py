"""Every catalog entry is served under the Prometheus name the catalog (and docs/metrics.md) documents for it.

One real Telemetry logs an example key of every entry a training loop can log; the scrape's ``# TYPE`` lines are
the served family names. rl_otel's own entries (``rl_otel/...`` keys, written by rl_otel itself) are checked
where this process makes them: liveness, build info, an error, a dropped series, a running and a finished phase,
the process gauges.
"""

from __future__ import annotations

import re
import sys

import pytest

from rl_otel.catalog import Kind, default_catalog
from rl_otel.catalog.spec import MetricSpec
from tests.gpu_fakes import FakeCuda, fake_torch, settle
from tests.promtools import scrape

CATALOG = default_catalog()
_TYPE = re.compile(r"^# TYPE (\S+) (\S+)$", re.M)
_GPU = "rl_otel/live/gpu_"  # needs a CUDA device or NVML


def _example(spec: MetricSpec) -> str | None:
    """An example key of ``spec`` that resolves to ``spec`` (another entry may cover some of its examples)."""
    return next((key for key in spec.examples if CATALOG.resolve(key).spec is spec), None)


def _value(spec: MetricSpec) -> object:
    return [0.5, 1.5, 2.5] if spec.kind is Kind.HISTOGRAM else 1.0


def test_every_catalog_entry_is_served_under_its_documented_name(tmp_path):
    import rl_otel

    loggable = [s for s in CATALOG if s.kind is not Kind.INFO and not s.key.startswith("rl_otel/")]
    unresolved = [s.key for s in loggable if _example(s) is None]
    assert unresolved == []
    tel = rl_otel.init(run="names", prometheus={"host": "127.0.0.1", "port": 0}, handle_sigterm=False)
    try:
        tel.log({_example(s): _value(s) for s in loggable}, step=1)  # type: ignore[misc]
        tel.log({"actor/pg_loss": "not a number", "rl_step": 1.0}, step=2)  # an error, a name collision (dropped)
        with pytest.MonkeyPatch.context() as mp:  # a (fake) CUDA device: the phase's GPU times are served too
            mp.setitem(sys.modules, "torch", fake_torch(FakeCuda()))
            with tel.phase("actor_train", "train_step"):  # the families of a running phase, then of a finished one
                served = dict(_TYPE.findall(scrape(tel.metrics_url)))  # type: ignore[arg-type]
            assert settle(tel)
        served.update(_TYPE.findall(scrape(tel.metrics_url)))  # type: ignore[arg-type]
    finally:
        tel.close()
    own = [s for s in CATALOG if s.key.startswith("rl_otel/") and not s.key.startswith(_GPU)]
    wrong = {s.key: (s.prometheus_name, sorted(n for n in served if n.startswith(s.name)))
             for s in (*loggable, *own) if s.prometheus_name not in served}
    assert wrong == {}, f"{len(wrong)} entries are served under another name than documented"
    assert len(loggable) > 600
