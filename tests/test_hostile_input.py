"""Hostile input, property-based: whatever keys, values and steps log() gets, it never raises, the scrape stays valid
for ``promtool check metrics`` and every family stays under its series cap.

Caps are set low so that they bite, and each test checks that they did, itself. promtool is a subprocess, so each
test shares one Telemetry across its examples and checks the scrape every ``CHECK_EVERY`` examples and at the end.
Derandomized, no example database: the same examples on every machine, and the file runs in well under a minute on
two shared cores.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

import rl_otel
from rl_otel.catalog import default_catalog
from tests._workload import seed_keys
from tests.promtools import promtool_check, scrape

MAX_SERIES, MAX_UNKNOWN, CHECK_EVERY = 10, 10, 40
PROFILE = settings(max_examples=300, deadline=None, derandomize=True, database=None,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# keys: the catalog's own, its templates with hostile segments (label values), and anything at all
segment = st.text(max_size=12)
keys = st.one_of(
    st.sampled_from(seed_keys()),
    st.builds(lambda c, p, part: f"time/{c}/{p}/{part}", segment, segment,
              st.sampled_from(["total", "execute", "onload", "offload"])),
    st.builds(lambda t, m, s: f"eval/{t}/{m}/{s}", segment, segment, st.sampled_from(["mean@4", "std@2", "best@8"])),
    st.builds("/".join, st.lists(segment, max_size=5)),
    st.text(),
    st.just(""),
    st.builds(lambda c, n: c * n, st.sampled_from(["a", "/", "é", "\n", "\"", "\\", "\x00"]),
              st.integers(1000, 20_000)),
)

TORCH_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int8, torch.uint8,
                torch.bool, torch.complex64]
NUMPY_DTYPES = [np.float32, np.float16, np.float64, np.int64, np.uint64, np.bool_, np.complex128]
shapes = st.lists(st.integers(0, 3), max_size=3).map(tuple)


def _tensor(dtype: torch.dtype, shape: tuple[int, ...], fill: float) -> torch.Tensor:
    """Any dtype from any float: floats overflow to ±Inf as a cast would, ints are clamped into range."""
    base = torch.full(shape, fill, dtype=torch.float64)
    if dtype is torch.bool:
        return base != 0
    if dtype.is_floating_point or dtype.is_complex:
        return base.to(dtype)
    return torch.nan_to_num(base, 0.0, 0.0, 0.0).clamp(0, 100).to(dtype)


floats = st.floats(allow_nan=True, allow_infinity=True)
scalars = st.one_of(floats, st.integers(-2**200, 2**200), st.booleans(), st.none(), st.text(max_size=5),
                    st.builds(object), st.complex_numbers(allow_nan=True), st.just(np.float64("nan")),
                    st.builds(np.int64, st.integers(-2**63, 2**63 - 1)))
arrays = st.one_of(
    st.builds(_tensor, st.sampled_from(TORCH_DTYPES), shapes, floats),
    st.builds(lambda dt, shape: np.ones(shape, dtype=dt), st.sampled_from(NUMPY_DTYPES), shapes),
    st.lists(st.one_of(floats, st.integers(-2**70, 2**70)), max_size=6),
    st.lists(st.text(max_size=2), min_size=1, max_size=3),
)
values = st.recursive(st.one_of(scalars, arrays), lambda inner: st.dictionaries(segment, inner, max_size=3),
                      max_leaves=6)
steps = st.one_of(st.none(), st.integers(-2**70, 2**70), st.sampled_from([0, 0, 5, 3, -1]), floats,
                  st.text(max_size=3))


class Checked:
    """One Telemetry with low caps; ``check()`` scrapes it, runs promtool and counts series per family."""

    def __init__(self) -> None:
        self.tel = rl_otel.init("hostile", rank=0, prometheus={"host": "127.0.0.1", "port": 0},
                                max_series_per_metric=MAX_SERIES, max_unknown_keys=MAX_UNKNOWN,
                                handle_sigterm=False)
        self.catalog = default_catalog()
        self.examples = 0
        self.checks = 0
        self.widest = 0  # most label sets seen in one family
        self.dropped: dict[str, float] = {}

    def log(self, metrics: object, step: object) -> None:
        self.tel.log(metrics, step=step)  # raising here fails the property
        self.examples += 1
        if self.examples % CHECK_EVERY == 0:
            self.check()

    def check(self) -> None:
        text = scrape(self.tel.metrics_url)
        assert promtool_check(text) == "", text[:2000]
        fallback = 0
        for family in text_string_to_metric_families(text):
            label_sets = {frozenset((k, v) for k, v in s.labels.items() if k != "le") for s in family.samples}
            if family.name == "rl_telemetry_dropped_series":
                self.dropped = {s.labels["metric"]: s.value for s in family.samples}
                continue
            assert len(label_sets) <= MAX_SERIES, family.name
            self.widest = max(self.widest, len(label_sets))
            if family.name != "target_info" and not any(self.catalog.exposes(family.name + suffix)
                                                        for suffix in ("", "_total")):
                fallback += 1
        assert fallback <= MAX_UNKNOWN
        assert self.tel.step is not None
        self.checks += 1


def _run(prop) -> Checked:
    """Run the property ``prop(checked, ...)`` against one fresh :class:`Checked`, then check the state every
    example left behind; returns it for the test's own assertions."""
    checked = Checked()
    try:
        prop(checked)
        checked.check()
        assert checked.examples >= 250 and checked.checks >= 7  # the examples really ran and were checked
        assert checked.dropped.get("unknown_keys", 0) > 0  # keys past max_unknown_keys: refused and counted
        # on top of what the examples left: hostile label values past a family's cap are refused and counted,
        # and every family stays within it (check())
        checked.log({f"time/hostile\u2028{i}\"/step/total": 1.0 for i in range(MAX_SERIES + 2)}, None)
        checked.check()
        assert checked.widest == MAX_SERIES
        assert checked.dropped.get("rl_phase_last_duration_seconds", 0) >= 2, checked.dropped
    finally:
        checked.tel.close()
    return checked


@pytest.mark.slow
def test_log_takes_any_dict_and_step():
    @PROFILE
    @given(metrics=st.dictionaries(keys, values, max_size=6), step=steps)
    def prop(checked, metrics, step):
        checked.log(metrics, step)

    _run(prop)


@pytest.mark.slow
def test_log_takes_any_single_value():
    @PROFILE
    @given(key=keys, value=st.one_of(scalars, arrays), step=steps)
    def prop(checked, key, value, step):
        checked.log({key: value}, step)

    _run(prop)


def test_a_flood_of_unknown_keys_costs_one_screen_match_each_past_the_cap(monkeypatch):
    """A log() of 100,000 unknown keys took 3.4 s (issue 35): each key was matched against every template one by
    one and given a fallback name, though all but max_unknown_keys were dropped. Past the cap an unknown key is
    refused after one match of the catalog's screen: no template's own match, no fallback name."""
    import rl_otel.catalog as catalog_module
    from rl_otel.catalog import MetricSpec

    calls = {"match": 0, "fallback": 0}
    real_match, real_fallback = MetricSpec.match, catalog_module.fallback_spec_name

    def match(self, key):
        calls["match"] += 1
        return real_match(self, key)

    def fallback(key):
        calls["fallback"] += 1
        return real_fallback(key)

    monkeypatch.setattr(MetricSpec, "match", match)
    monkeypatch.setattr(catalog_module, "fallback_spec_name", fallback)
    with rl_otel.init(run="flood", prometheus=False, max_unknown_keys=100, handle_sigterm=False) as tel:
        tel.log({f"custom/k{i}": float(i) for i in range(5_000)}, step=0)
        assert calls == {"match": 0, "fallback": 100}  # names for the cap's 100; the rest refused at the screen
        assert tel.value("rl_telemetry_dropped_series_total", metric="unknown_keys") == 4_900
        tel.log({"actor/pg_loss": 1.0, "eval/gsm8k/accuracy/mean@4": 0.5}, step=1)  # known keys still resolve
        assert tel.value("actor/pg_loss") == 1.0 and tel.value("eval/gsm8k/accuracy/mean@4") == 0.5
