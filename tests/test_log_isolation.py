"""The log path's fault isolation: one odd key costs only that key, a scrape sees whole steps, trackers do not share
a dict, a hung tracker constructor cannot hold init(), and one burst of warnings cannot silence the others."""

from __future__ import annotations

import logging
import threading
from numbers import Real

import pytest
import torch

import rl_otel
from rl_otel.sinks import register_sink
from tests._sinks import tel_errors
from tests.promtools import samples, scrape


class RaisingReal(Real):
    """A number whose conversion raises something other than TypeError/ValueError."""

    def __float__(self):
        raise RuntimeError("no float for you")

    # the rest of the Real ABC, never called
    __abs__ = __add__ = __ceil__ = __eq__ = __floor__ = __floordiv__ = __le__ = __lt__ = __mod__ = __mul__ = (
        __neg__) = __pos__ = __pow__ = __radd__ = __rfloordiv__ = __rmod__ = __rmul__ = __round__ = __rpow__ = (
        __rtruediv__) = __truediv__ = __trunc__ = lambda *a, **k: NotImplemented
    __hash__ = object.__hash__


class UnprintableKey:
    def __str__(self):
        raise RuntimeError("no text for you")

    __hash__ = object.__hash__


class BadStep:
    def __int__(self):
        raise RuntimeError("no int for you")

    def __index__(self):
        raise RuntimeError("no index for you")


@pytest.fixture
def tel():
    t = rl_otel.init(run="iso", prometheus={"host": "127.0.0.1", "port": 0}, handle_sigterm=False)
    yield t
    t.close()


@pytest.mark.parametrize("odd", ["meta_tensor", "sparse_tensor", "raising_real", "unprintable_key", "bad_step"])
def test_one_odd_value_costs_only_its_key(tel, odd):
    metrics: dict = {"actor/pg_loss": 1.0, "critic/score/mean": 0.5}
    step: object = 3
    reason = "bad_value"
    if odd == "meta_tensor":
        metrics["actor/ratio_dist"] = torch.empty(8, device="meta")
    elif odd == "sparse_tensor":
        metrics["actor/ratio_dist"] = torch.sparse_coo_tensor([[0, 2]], [1.0, 2.0], (4,))
    elif odd == "raising_real":
        metrics["actor/entropy"] = RaisingReal()
    elif odd == "unprintable_key":
        metrics[UnprintableKey()] = 2.0
        reason = "bad_key"
    else:
        step, reason = BadStep(), "bad_step"
    tel.log(metrics, step=step)
    assert tel.value("actor/pg_loss") == 1.0 and tel.value("critic/score/mean") == 0.5
    assert tel_errors(tel)[("input", reason)] == 1
    assert ("input", "internal") not in tel_errors(tel)


def test_a_scrape_sees_whole_steps(tel):
    """rl_step and the values of its step are written under one lock: no scrape shows step N+1's values with
    rl_step = N (before: 23% of scrapes under a tight loop did)."""
    stop = threading.Event()

    def train():
        step = 0
        while not stop.is_set():
            tel.log({"actor/pg_loss": float(step), "critic/score/mean": float(step)}, step=step)
            step += 1

    thread = threading.Thread(target=train)
    thread.start()
    mismatched, seen = [], 0
    try:
        while seen < 300:
            text = scrape(tel.metrics_url)
            steps = samples(text, "rl_step")
            losses = samples(text, "rl_actor_pg_loss")
            if not steps or not losses:
                continue
            seen += 1
            (step,), (loss,) = steps.values(), losses.values()
            if step != loss:
                mismatched.append((step, loss))
    finally:
        stop.set()
        thread.join()
    assert mismatched == []


class Mutator:
    """A tracker that empties the dict it is given (as a careless sink might, popping keys it handles)."""

    def __init__(self, *, run: str) -> None:
        self.got: list[dict] = []

    def log(self, metrics, step):
        self.got.append(dict(metrics))
        metrics.clear()

    def close(self):
        pass


class Keeper(Mutator):
    def log(self, metrics, step):
        self.got.append(dict(metrics))


_made: dict[str, Mutator] = {}
register_sink("iso_mutator", lambda **kw: _made.setdefault("mutator", Mutator(**kw)))
register_sink("iso_keeper", lambda **kw: _made.setdefault("keeper", Keeper(**kw)))


def test_trackers_do_not_share_one_dict():
    _made.clear()
    tel = rl_otel.init(run="iso", prometheus=False, trackers=["iso_mutator", "iso_keeper"], handle_sigterm=False)
    try:
        for step in range(5):
            tel.log({"actor/pg_loss": float(step), "critic/score/mean": 0.5}, step=step)
        assert tel.flush(30)
    finally:
        tel.close()
    expected = [{"actor/pg_loss": float(s), "critic/score/mean": 0.5} for s in range(5)]
    assert _made["mutator"].got == expected and _made["keeper"].got == expected


class HangingStart:
    release = threading.Event()

    def __init__(self, *, run: str) -> None:
        HangingStart.release.wait()

    def log(self, metrics, step):
        pass

    def close(self):
        pass


register_sink("iso_hanging", lambda **kw: HangingStart(**kw))


def test_a_hung_tracker_constructor_is_bounded_by_close_timeout_s(caplog):
    _made.clear()
    HangingStart.release.clear()
    result: list = []

    def start():
        result.append(rl_otel.init(run="iso", prometheus=False, trackers=["iso_hanging", "iso_keeper"],
                                   close_timeout_s=0.5, handle_sigterm=False))

    thread = threading.Thread(target=start)
    with caplog.at_level(logging.WARNING, logger="rl_otel"):
        thread.start()
        thread.join(60)  # without the bound, init() waits as long as the constructor hangs (here: until released)
    try:
        assert not thread.is_alive()
        (tel,) = result
        assert tel.trackers == ("iso_keeper",)  # the hung one left out, the other one mirrors
        assert tel_errors(tel)[("iso_hanging", "start_failed")] == 1
        assert "still starting after close_timeout_s=0.5" in caplog.text
        tel.log({"actor/pg_loss": 1.0}, step=0)
        assert tel.flush(30) and _made["keeper"].got == [{"actor/pg_loss": 1.0}]
        tel.close()
    finally:
        HangingStart.release.set()


def test_a_burst_of_one_warning_kind_leaves_the_others_reported(tel, caplog):
    with caplog.at_level(logging.WARNING, logger="rl_otel"):
        for i in range(3_000):  # a burst of distinct bad keys: counted, said for the first 1,000 of them
            tel.log({f"custom/bad_{i}": "text"}, step=i)
        tel.log({"actor/pg_loss": float("nan"), "actor/ratio_dist": [float("nan"), 1.0]}, step=3_001)
    messages = [r.getMessage() for r in caplog.records]
    assert sum("skipping 'custom/bad_" in m for m in messages) == 1_000
    assert sum("further ones are only counted" in m for m in messages) == 1
    assert tel_errors(tel)[("input", "bad_value")] == 3_000
    assert any("NaN/Inf values left out of the histogram" in m for m in messages)  # another kind: still said


def test_a_huge_key_is_refused_at_once_and_the_route_cache_is_bounded_by_characters():
    """A 1 MB key took 1.7 s to match against the catalog, and 115k keys of 2 kB held +515 MiB in the route cache:
    a key over 1,024 characters is refused for Prometheus without matching (the trackers still get it), and the
    cache stops growing at 16 Mi characters."""
    from rl_otel._internal.pipeline.router import _CACHE_CHARS, Refusal, Router
    from rl_otel.catalog import default_catalog

    router = Router(default_catalog(), max_unknown_keys=10)
    refused = router.route("custom/" + "x" * 1_000_000)
    assert isinstance(refused, Refusal) and refused.reason == "key_too_long"
    for i in range(10_000):  # 2 kB keys: 20 M characters offered
        router.route(f"custom/{i}/" + "y" * 2_000)
    assert router._cached_chars <= _CACHE_CHARS < 10_000 * 2_000

    _made.clear()
    tel = rl_otel.init(run="iso", prometheus=False, trackers=["iso_keeper"], handle_sigterm=False)
    try:
        huge = "custom/" + "z" * 1_000_000
        tel.log({huge: 1.0, "actor/pg_loss": 2.0}, step=0)
        assert tel.flush(30)
        assert tel.value("actor/pg_loss") == 2.0 and tel.value(huge) is None
        assert set(_made["keeper"].got[0]) == {huge, "actor/pg_loss"}  # the tracker got every key as logged
        assert tel.value("rl_telemetry_dropped_series_total", metric="key_too_long") == 1
    finally:
        tel.close()
