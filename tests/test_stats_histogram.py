"""Bulk bucketing on the tensor's device: exact against BulkHistogram, merged by log(), scraped by Prometheus."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

import rl_otel
from rl_otel._internal.pipeline.histogram import BucketCounts, BulkHistogram
from rl_otel.catalog import default_catalog
from rl_otel.catalog.define import IMPORTANCE_RATIO_BUCKETS, LENGTH_BUCKETS, SIGNED_BUCKETS
from rl_otel.stats import bucket, ppo_stats
from tests.promtools import promtool_check, scrape

BOUNDS = [IMPORTANCE_RATIO_BUCKETS, SIGNED_BUCKETS, LENGTH_BUCKETS]


def reference(values: np.ndarray, bounds) -> BulkHistogram:
    h = BulkHistogram(bounds)
    h.observe(values)
    return h


def assert_same(bc: BucketCounts, h: BulkHistogram, magnitude: float = 0.0) -> None:
    """``magnitude``: the sum of the values' absolute sizes - a float sum's rounding depends on its order (torch's
    and numpy's differ), and after cancellation (1e16 - 1e16 + 0.5) the error is relative to the terms, not to
    the result."""
    assert bc.counts.tolist() == h.counts.tolist()
    assert bc.count == h.count
    assert bc.sum == pytest.approx(h.sum, rel=1e-9, abs=1e-9 + 1e-12 * magnitude)
    assert (bc.min, bc.max) == (h.min, h.max)


values_f64 = st.lists(st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=64),
                                st.sampled_from([b for bounds in BOUNDS for b in bounds])), max_size=200)


@settings(max_examples=50, deadline=None)
@given(values=values_f64, bounds=st.sampled_from(BOUNDS),
       dtype=st.sampled_from([torch.float64, torch.float32, torch.float16, torch.bfloat16]))
def test_bucket_is_exact_for_every_dtype(values, bounds, dtype):
    with np.errstate(over="ignore"):
        t = torch.tensor(values, dtype=torch.float64).to(dtype)
    bc = bucket(t, bounds)
    as_f64 = t.double().numpy()
    h = reference(as_f64, bounds)
    finite = as_f64[np.isfinite(as_f64)]
    assert_same(bc, h, float(np.abs(finite).sum()) if finite.size else 0.0)
    assert bc.non_finite == int((~np.isfinite(as_f64)).sum())


def test_values_on_and_next_to_float32_bounds():
    bounds = IMPORTANCE_RATIO_BUCKETS
    b32 = torch.tensor(bounds, dtype=torch.float64).float()
    t = torch.cat([b32, torch.nextafter(b32, torch.full_like(b32, torch.inf)),
                   torch.nextafter(b32, torch.full_like(b32, -torch.inf))])
    assert_same(bucket(t, bounds), reference(t.double().numpy(), bounds))


@settings(max_examples=30, deadline=None)
@given(n=st.integers(0, 300), seed=st.integers(0, 2**31 - 1))
def test_mask_selects_without_indexing(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * 3
    x[torch.rand(n, generator=g) < 0.1] = torch.nan
    keep = torch.rand(n, generator=g) < 0.6
    bc = bucket(x, SIGNED_BUCKETS, keep)
    assert_same(bc, reference(x[keep].double().numpy(), SIGNED_BUCKETS))
    assert bc.non_finite == int(torch.isnan(x[keep]).sum())


def test_integer_lengths():
    lengths = torch.tensor([0, 1, 2, 3, 1024, 1025, 131072, 200000])
    assert_same(bucket(lengths, LENGTH_BUCKETS), reference(lengths.numpy().astype(float), LENGTH_BUCKETS))


def test_merge_equals_observe_and_rejects_other_bounds():
    x = np.random.default_rng(0).normal(1.0, 0.3, 5000)
    merged = BulkHistogram(IMPORTANCE_RATIO_BUCKETS)
    for part in np.array_split(x, 3):
        merged.merge(bucket(torch.from_numpy(part), IMPORTANCE_RATIO_BUCKETS))
    direct = reference(x, IMPORTANCE_RATIO_BUCKETS)
    assert merged.counts.tolist() == direct.counts.tolist() and merged.count == direct.count
    assert merged.sum == pytest.approx(direct.sum, rel=1e-12)
    with pytest.raises(ValueError, match="differ"):
        merged.merge(bucket(torch.from_numpy(x), SIGNED_BUCKETS))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.floats(), st.sampled_from([float(b) for b in SIGNED_BUCKETS])), max_size=40))
def test_observe_one_equals_observe(values):
    one_by_one, bulk = BulkHistogram(SIGNED_BUCKETS), BulkHistogram(SIGNED_BUCKETS)
    left_out = sum(one_by_one.add(v) for v in values)
    assert left_out == bulk.add(np.array(values, dtype=np.float64))
    assert one_by_one.counts.tolist() == bulk.counts.tolist() and one_by_one.count == bulk.count
    assert (one_by_one.min, one_by_one.max) == (bulk.min, bulk.max)
    scale = sum(abs(v) for v in values if np.isfinite(v))  # summation order differs: cancellation
    assert one_by_one.sum == pytest.approx(bulk.sum, rel=1e-12, abs=1e-12 * scale)


def test_bucket_vector_layout_is_checked():
    with pytest.raises(ValueError, match="entries"):
        BucketCounts.from_vector((1.0, 2.0), [0.0] * 5)
    with pytest.raises(ValueError, match="bucket counts"):
        BucketCounts((1.0,), np.zeros(3, dtype=np.int64), 0.0, 0, 0.0, 0.0)


def test_log_buckets_tensors_on_their_device_and_never_raises(caplog):
    tel = rl_otel.init(run="h", prometheus=False)
    try:
        x = torch.randn(10_000, dtype=torch.float64)
        tel.log({"ppo/policy/advantages": x, "env/reward_dist": x.numpy()}, step=0)
        via_tensor = tel.value("ppo/policy/advantages")  # rl_ppo_policy_advantages_dist
        via_array = tel.value("env/reward_dist")
        assert via_tensor.counts == via_array.counts and via_tensor.count == 10_000
        # bucketed with other bounds, or a distribution for a gauge: skipped and counted, not raised
        tel.log({"ppo/policy/ratio": bucket(x, SIGNED_BUCKETS), "actor/ratio_mean": torch.ones(3)}, step=1)
        assert tel.value("rl_telemetry_errors_total", sink="input", reason="bad_value") == 2.0
        assert tel.value("ppo/policy/ratio") is None
    finally:
        tel.close()


@pytest.mark.prometheus
def test_ppo_stats_end_to_end_scrape_and_promtool():
    g = torch.Generator().manual_seed(11)
    b, t = 32, 64
    lp = -torch.rand(b, t, generator=g) * 4
    old = lp + 0.2 * torch.randn(b, t, generator=g)
    mask = torch.rand(b, t, generator=g) < 0.7
    adv = torch.randn(b, t, generator=g)
    scores = torch.randn(b, generator=g)
    stats = ppo_stats(log_probs=lp, old_log_probs=old, response_mask=mask, advantages=adv, scores=scores,
                      ref_log_probs=lp - 0.1, names=("roll", "trl"), distributions=True)
    tel = rl_otel.init(run="t", prometheus={"host": "127.0.0.1", "port": 0})
    try:
        tel.log(stats, step=1)
        body = scrape(tel.metrics_url)
    finally:
        tel.close()
    families = {f.name: f for f in text_string_to_metric_families(body)}
    ratio = torch.exp(lp - old)[mask].double().numpy()
    catalog = default_catalog()
    for key, values in (("actor/ratio_dist", ratio), ("ppo/policy/ratio", ratio),
                        ("ppo/policy/advantages", adv[mask].double().numpy()),
                        ("env/reward_dist", scores.double().numpy()),
                        ("tokens/response_length_dist", mask.sum(-1).double().numpy())):
        spec = catalog.lookup(key).spec
        family = families[spec.name]
        assert family.type == "histogram", key
        want = np.cumsum(reference(values, spec.buckets).counts).tolist()
        got = [s.value for s in family.samples if s.name.endswith("_bucket")]
        assert got == want, key
        if spec.buckets[0] >= 0:  # prometheus_client writes no _sum/_count when the first bound is negative
            count = [s.value for s in family.samples if s.name.endswith("_count")]
            assert count == [values.size], key
            total = [s.value for s in family.samples if s.name.endswith("_sum")]
            assert total == [pytest.approx(values.sum(), rel=1e-6)], key
    assert families["rl_actor_importance_ratio"].type == "gauge"
    assert promtool_check(body) == ""


def test_scatter_counts_equal_bincount():
    from rl_otel.stats.histogram import _count

    idx = torch.randint(0, 17, (10_000,), generator=torch.Generator().manual_seed(1))
    assert _count(idx, 18, scatter=True).tolist() == _count(idx, 18, scatter=False).tolist()
    assert _count(idx, 18, scatter=True).tolist() == torch.bincount(idx, minlength=18).tolist()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (runs on the GPU machine)")
def test_cuda_matches_cpu_with_one_sync():
    from tests.test_stats_ppo import full_stats, make_batch

    batch = make_batch(9, 64, 256)
    cpu = full_stats(batch, distributions=True)
    on_gpu = {k: v.cuda() for k, v in batch.items()}
    full_stats(on_gpu, distributions=True)  # warm-up: first CUDA calls may sync while initialising
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        import warnings

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            gpu = full_stats(on_gpu, distributions=True)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    syncs = [w for w in caught if "synchroniz" in str(w.message)]
    assert len(syncs) == 1, [str(w.message) for w in syncs]
    for key, value in cpu.items():
        if isinstance(value, BucketCounts):
            assert gpu[key].counts.tolist() == value.counts.tolist(), key
        else:
            assert gpu[key] == pytest.approx(value, rel=1e-4, abs=1e-5, nan_ok=True), key
    assert_same(bucket(on_gpu["advantages"], SIGNED_BUCKETS), reference(batch["advantages"].double().numpy(),
                                                                        SIGNED_BUCKETS))


def test_trackers_get_the_values_of_a_tensor_histogram(tmp_path):
    import json

    out = tmp_path / "out.log"
    x = torch.tensor([0.5, 1.0, 1.5, 3.0])
    with rl_otel.init(run="m", prometheus=False, trackers={"stdout": {"file": str(out)}}) as tel:
        tel.log({"ppo/policy/ratio": x, "env/reward_dist": [1.0, -1.0],
                 "actor/ratio_dist": bucket(x, IMPORTANCE_RATIO_BUCKETS), "actor/ratio_mean": 1.5}, step=3)
        assert tel.value("actor/ratio_dist").count == 4  # Prometheus has all three
        assert tel.value("ppo/policy/ratio").count == 4
    line = out.read_text().splitlines()[-1]
    metrics = json.loads(line.split("metrics_tag: ", 1)[1])["metrics"]
    assert metrics["ppo/policy/ratio"] == {"count": 4, "mean": 1.5, "min": 0.5, "max": 3.0}
    assert metrics["env/reward_dist"]["count"] == 2 and metrics["actor/ratio_mean"] == 1.5
    assert "actor/ratio_dist" not in metrics  # bucketed counts carry no values for a tracker to draw
