"""ppo_stats against plain float64 reference implementations, one host transfer, and the edge cases."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rl_otel._internal.pipeline.histogram import BucketCounts, BulkHistogram
from rl_otel.catalog import default_catalog
from rl_otel.stats import kl_penalty_terms, ppo_stats
from tests._host_reads import count_host_reads

CLIP_LOW, CLIP_HIGH, VALUE_CLIP, KL_COEF = 0.2, 0.28, 0.2, 0.05


def make_batch(seed: int, b: int, t: int, *, p_mask: float = 0.7, dtype=torch.float32) -> dict:
    g = torch.Generator().manual_seed(seed)
    lp = -torch.rand(b, t, generator=g) * 3
    return {
        "log_probs": lp.to(dtype),
        "old_log_probs": (lp + 0.3 * torch.randn(b, t, generator=g)).to(dtype),
        "response_mask": (torch.rand(b, t, generator=g) < p_mask).long(),
        "advantages": torch.randn(b, t, generator=g).to(dtype),
        "ref_log_probs": (lp + 0.2 * torch.randn(b, t, generator=g)).to(dtype),
        "values": torch.randn(b, t, generator=g).to(dtype),
        "returns": torch.randn(b, t, generator=g).to(dtype),
        "vpreds": torch.randn(b, t, generator=g).to(dtype),
        "rewards": torch.randn(b, t, generator=g).to(dtype),
        "scores": torch.randn(b, generator=g).to(dtype),
        "entropy": torch.rand(b, t, generator=g).to(dtype),
        "prompt_mask": (torch.rand(b, 5, generator=g) < 0.8).long(),
    }


def full_stats(batch: dict, **kw) -> dict:
    return ppo_stats(**batch, clip_ratio_low=CLIP_LOW, clip_ratio_high=CLIP_HIGH, value_clip=VALUE_CLIP,
                     kl_coef=KL_COEF, names=("roll", "trl"), **kw)


# -- the reference: numpy float64, one metric at a time, padding removed by boolean selection --------------------

def _mean(x):
    return float(np.mean(x)) if np.size(x) else math.nan


def _max(x):
    return float(np.max(x)) if np.size(x) else math.nan


def _min(x):
    return float(np.min(x)) if np.size(x) else math.nan


def _var(x, ddof=0):
    return float(np.var(x, ddof=ddof)) if np.size(x) > ddof else math.nan


def _explained(ret, pred):
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(1 - np.float64(_var(ret - pred)) / np.float64(_var(ret)))


def _div(num, den):
    """num / den as a float, with numpy's IEEE results for a zero denominator (0/0 = NaN, x/0 = inf)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(np.float64(num) / np.float64(den))


def reference(batch: dict, *, kl_penalty: str = "k3", seq_mean: bool = False) -> dict:
    """ROLL's, TRL's definitions with final_response_mask = response_mask and token importance sampling
    (tests/test_stats_ppo_roll.py checks ROLL's keys with the masks differing, against ROLL's agg_loss)."""
    a = {k: v.double().numpy() for k, v in batch.items()}
    m = a["response_mask"] != 0
    n = m.sum()

    def row_means(x):
        return [x[i][m[i]].mean() for i in range(x.shape[0]) if m[i].any()]

    def agg(x):  # TRL: NaN for an empty selection
        return _mean(np.array(row_means(x))) if seq_mean else _mean(x[m])

    def roll_agg(x):  # ROLL's agg_loss: a token-mean over no token is 0/0, a seq-mean over no sequence 0
        return _div(sum(row_means(x)), len(row_means(x)) + 1e-8) if seq_mean else _div(x[m].sum(), n)

    def roll_masked_mean(x):  # ROLL's masked_mean: sum / (count + 1e-8)
        return float(x[m].sum() / (n + 1e-8))

    def critic_mean(x):  # ROLL's critic worker: masked_mean(x, mask, dim=-1).mean() over all B sequences
        rows = [x[i][m[i]].mean() if m[i].any() else 0.0 for i in range(x.shape[0])]
        return _mean(np.array(rows))

    lp, old, ref, adv = a["log_probs"], a["old_log_probs"], a["ref_log_probs"], a["advantages"]
    ratio = np.exp(lp - old)
    surr1 = ratio * adv
    surr2 = np.clip(ratio, 1 - CLIP_LOW, 1 + CLIP_HIGH) * adv
    high, low = ratio > 1 + CLIP_HIGH, ratio < 1 - CLIP_LOW
    lr = lp - ref
    penalty = {"kl": lr, "abs": np.abs(lr), "mse": 0.5 * lr ** 2,
               "k3": np.clip(np.exp(np.clip(-lr, -20, 20)) - np.clip(-lr, -20, 20) - 1, -10, 10)}[kl_penalty]
    val, ret, vpr = a["values"], a["returns"], a["vpreds"]
    err = (vpr - ret) ** 2
    clipped = np.clip(vpr, val - VALUE_CLIP, val + VALUE_CLIP)
    err_clipped = (clipped - ret) ** 2
    seq_kl = np.where(m, old - ref, 0).sum(-1)
    seq_rew = np.where(m, a["rewards"], 0).sum(-1)
    sc = a["scores"]
    resp = m.sum(-1).astype(float)
    prompt = (a["prompt_mask"] != 0).sum(-1).astype(float)
    some_padding = m.size > n
    out = {
        "actor/ratio_mean": _div(sum(row_means(ratio)), len(row_means(ratio)) + 1e-8),
        "actor/ratio_max": max(_max(ratio[m]) if n else 0.0, 0.0 if some_padding else -np.inf) if m.size else math.nan,
        "actor/ratio_min": min(_min(ratio[m]) if n else 1e10, 1e10 if some_padding else np.inf) if m.size else math.nan,
        "actor/ppo_ratio_high_clipfrac": _div(high[m].sum(), n), "actor/ppo_ratio_low_clipfrac": _div(low[m].sum(), n),
        "actor/ppo_ratio_clipfrac": _div((high | low)[m].sum(), n),
        "actor/clipfrac": roll_agg((surr2 < surr1).astype(float)),
        "actor/pg_loss": roll_agg(-np.minimum(surr1, surr2)),
        "actor/approxkl": roll_agg(0.5 * (lp - old) ** 2), "actor/policykl": roll_agg(lp - old),
        "actor/kl_loss": roll_agg(penalty),
        "critic/value": critic_mean(val), "critic/vpred": critic_mean(vpr), "critic/error": critic_mean(err),
        "critic/clipfrac": critic_mean((err_clipped > err).astype(float)),
        "critic/loss": 0.5 * critic_mean(np.maximum(err, err_clipped)),
        "ppo/policy/clipfrac": agg((surr2 < surr1).astype(float)),
        "ppo/policy/approxkl": agg(0.5 * (lp - old) ** 2), "ppo/policy/policykl": agg(old - lp),
        "objective/kl": _mean(seq_kl), "objective/kl_coef": KL_COEF,
        "ppo/mean_non_score_reward": _mean(-KL_COEF * seq_kl),
        "objective/entropy": _mean(-np.where(m, old, 0).sum(-1)),
        "ppo/policy/entropy": _mean(a["entropy"][m]), "ppo/policy/advantages_mean": _mean(adv[m]),
        "ppo/returns/mean": _mean(ret[m]), "ppo/returns/var": _var(ret[m], 1),
        "ppo/val/mean": _mean(val[m]), "ppo/val/var": _var(val[m], 1), "ppo/val/vpred": _mean(vpr[m]),
        "ppo/val/error": _mean(err[m]),
        "ppo/val/var_explained": _explained(ret[m], vpr[m]),
        "ppo/val/clipfrac": agg((err_clipped > err).astype(float)),
        "env/reward_mean": _mean(sc), "env/reward_std": math.sqrt(_var(sc, 1)) if sc.size > 1 else math.nan,
        "tokens/responses_len_mean": _mean(resp),
        "tokens/responses_len_std": math.sqrt(_var(resp, 1)) if resp.size > 1 else math.nan,
        "tokens/queries_len_mean": _mean(prompt),
        "tokens/queries_len_std": math.sqrt(_var(prompt, 1)) if prompt.size > 1 else math.nan,
    }
    out["ppo/mean_scores"], out["ppo/std_scores"] = out["env/reward_mean"], out["env/reward_std"]
    for prefix, x in (("critic/ref_log_prob", ref), ("critic/old_log_prob", old), ("critic/advantages", adv),
                      ("critic/returns", ret), ("critic/values", val)):  # ROLL's masked_mean; max/min NaN if empty
        out[f"{prefix}/mean"], out[f"{prefix}/max"], out[f"{prefix}/min"] = (roll_masked_mean(x), _max(x[m]),
                                                                            _min(x[m]))
    t = m.shape[-1]
    for prefix, x in (("critic/entropy", a["entropy"][m]), ("critic/rewards", seq_rew),
                      ("critic/token_level_rewards_mean", seq_rew / t if t else seq_rew * math.nan),
                      ("critic/score", sc), ("tokens/response_length", resp), ("tokens/prompt_length", prompt)):
        out[f"{prefix}/mean"], out[f"{prefix}/max"], out[f"{prefix}/min"] = _mean(x), _max(x), _min(x)
    return out


def reference_dists(batch: dict) -> dict[str, np.ndarray]:
    a = {k: v.double().numpy() for k, v in batch.items()}
    m = a["response_mask"] != 0
    ratio = np.exp(a["log_probs"] - a["old_log_probs"])
    return {
        "actor/ratio_dist": ratio[m], "ppo/policy/ratio": ratio[m], "actor/log_prob_dist": a["log_probs"][m],
        "objective/logprobs": a["old_log_probs"][m], "objective/ref_logprobs": a["ref_log_probs"][m],
        "actor/kl_dist": (a["log_probs"] - a["ref_log_probs"])[m],
        "objective/kl_dist": np.where(m, a["old_log_probs"] - a["ref_log_probs"], 0).sum(-1),
        "critic/advantages_dist": a["advantages"][m], "ppo/policy/advantages": a["advantages"][m],
        "critic/rewards_dist": np.where(m, a["rewards"], 0).sum(-1), "critic/score_dist": a["scores"],
        "env/reward_dist": a["scores"], "tokens/response_length_dist": m.sum(-1).astype(float),
        "tokens/responses_dist": m.sum(-1).astype(float),
        "tokens/queries_dist": (a["prompt_mask"] != 0).sum(-1).astype(float),
    }


def assert_close(got: dict, want: dict, *, rtol: float = 2e-4, atol: float = 2e-5) -> None:
    missing = set(want) - set(got)
    assert not missing, f"keys not returned: {sorted(missing)}"
    for key, expected in want.items():
        actual = got[key]
        if math.isnan(expected):
            assert math.isnan(actual), f"{key}: {actual} != NaN"
        else:
            assert actual == pytest.approx(expected, rel=rtol, abs=atol), key


# -- correctness -----------------------------------------------------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), b=st.integers(1, 6), t=st.integers(1, 9),
       p_mask=st.sampled_from([0.0, 0.3, 0.8, 1.0]), kl_penalty=st.sampled_from(["kl", "abs", "mse", "k3"]),
       seq_mean=st.booleans(), compact=st.booleans())
def test_matches_reference_on_random_batches(seed, b, t, p_mask, kl_penalty, seq_mean, compact):
    # compact=False is the accelerator path (masks instead of a gather), run here on the CPU.
    batch = make_batch(seed, b, t, p_mask=p_mask)
    got = full_stats(batch, kl_penalty=kl_penalty, _compact=compact,
                     loss_agg_mode="seq-mean-token-mean" if seq_mean else "token-mean")
    assert_close(got, reference(batch, kl_penalty=kl_penalty, seq_mean=seq_mean))


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), b=st.integers(1, 6), t=st.integers(1, 9),
       p_mask=st.sampled_from([0.0, 0.5, 1.0]), compact=st.booleans())
def test_bucketed_distributions_are_exact(seed, b, t, p_mask, compact):
    batch = make_batch(seed, b, t, p_mask=p_mask)
    got = full_stats(batch, distributions=True, _compact=compact)
    # the values themselves are checked against float64 in the next test; here: their buckets are exact
    selected = full_stats(batch, distributions="tensors", _compact=compact)
    catalog = default_catalog()
    for key in reference_dists(batch):
        values = selected[key].double().numpy()
        h = BulkHistogram(catalog.lookup(key).spec.buckets)
        h.observe(values)
        bc = got[key]
        assert isinstance(bc, BucketCounts), key
        assert bc.counts.tolist() == h.counts.tolist(), key
        assert bc.count == h.count == values.size, key
        assert bc.sum == pytest.approx(h.sum, rel=1e-12, abs=1e-12), key
        if values.size:
            assert (bc.min, bc.max) == (h.min, h.max), key


@pytest.mark.parametrize("compact", [True, False])
def test_tensor_distributions_hold_the_selected_values(compact):
    batch = make_batch(3, 5, 7)
    got = full_stats(batch, distributions="tensors", _compact=compact)
    for key, values in reference_dists(batch).items():
        assert isinstance(got[key], torch.Tensor) and got[key].dim() == 1, key
        np.testing.assert_allclose(got[key].double().numpy(), values, rtol=1e-6, atol=1e-6, err_msg=key)


def test_names_select_the_key_sets():
    batch = make_batch(0, 3, 4)
    roll = ppo_stats(**batch)
    trl = ppo_stats(**batch, names="trl")
    verl = ppo_stats(**batch, names="verl")
    assert "actor/ratio_mean" in roll and not any(k.startswith(("ppo/", "objective/", "env/")) for k in roll)
    assert "ppo/policy/approxkl" in trl and not any(k.startswith(("actor/", "critic/")) for k in trl)
    assert {"actor/pg_clipfrac", "critic/vf_explained_var", "response/aborted_ratio"} <= set(verl)
    assert "actor/ratio_mean" not in verl and "actor/pg_clipfrac" not in roll
    assert not any(k.startswith(("ppo/", "objective/", "env/", "tokens/")) for k in verl)
    catalog = default_catalog()
    for key in {**full_stats(batch, distributions=True), **verl}:
        assert catalog.lookup(key) is not None, f"{key} has no catalog entry"


def test_minimal_inputs_give_the_policy_family():
    batch = make_batch(1, 2, 3)
    got = ppo_stats(log_probs=batch["log_probs"], old_log_probs=batch["old_log_probs"],
                    response_mask=batch["response_mask"])
    assert {"actor/ratio_mean", "actor/approxkl", "actor/policykl", "tokens/response_length/mean"} <= set(got)
    assert "actor/clipfrac" not in got and "critic/values/mean" not in got


@pytest.mark.parametrize("compact", [True, False])
def test_padding_is_never_counted_even_when_nan(compact):
    batch = make_batch(5, 4, 6, p_mask=0.6)
    pad = batch["response_mask"] == 0
    poisoned = {k: (torch.where(pad, torch.nan, v) if v.shape == pad.shape and v.is_floating_point() else v)
                for k, v in batch.items()}
    clean, dirty = full_stats(batch, _compact=compact), full_stats(poisoned, _compact=compact)
    for key in clean:
        if key.startswith(("objective/kl", "objective/entropy", "ppo/mean_non", "critic/rewards")):
            continue  # per-sequence sums: also masked, compared below
        assert clean[key] == pytest.approx(dirty[key], nan_ok=True), key
    for key in ("objective/kl", "objective/entropy", "critic/rewards/mean"):
        assert clean[key] == pytest.approx(dirty[key]), key


@pytest.mark.parametrize("compact", [True, False])
def test_empty_mask_gives_each_frameworks_value_not_an_error(compact):
    batch = make_batch(2, 3, 4, p_mask=0.0)
    got = full_stats(batch, distributions=True, _compact=compact)
    # ROLL's own empty values: a seq-mean over no sequence is 0 (count + 1e-8), max(ratio * mask) is 0, the
    # min reads the 1e10 fill, masked_mean is 0; a token-mean divides 0 by 0
    assert got["actor/ratio_mean"] == 0.0 and got["actor/ratio_max"] == 0.0 and got["actor/ratio_min"] == 1e10
    assert got["critic/advantages/mean"] == 0.0 and math.isnan(got["critic/advantages/min"])
    assert math.isnan(got["actor/clipfrac"]) and math.isnan(got["actor/ppo_ratio_clipfrac"])
    assert math.isnan(got["ppo/policy/clipfrac"]) and math.isnan(got["ppo/policy/advantages_mean"])
    assert got["tokens/response_length/max"] == 0.0
    assert got["actor/ratio_dist"].count == 0 and got["actor/ratio_dist"].non_finite == 0
    verl = ppo_stats(**batch, names="verl", _compact=compact)
    assert verl["actor/pg_clipfrac"] == 0.0 and verl["actor/ppo_kl"] == 0.0  # veRL's masked_mean: + 1e-8
    assert math.isnan(verl["actor/pg_loss"]) and math.isnan(verl["actor/entropy"])
    assert verl["response/aborted_ratio"] == 1.0 and math.isnan(verl["critic/score/mean"])
    assert math.isnan(verl["response_length_non_aborted/mean"]) and verl["response_length/max"] == 0.0


def test_empty_batch():
    empty = torch.zeros(0, 5)
    got = ppo_stats(log_probs=empty, old_log_probs=empty, response_mask=empty.long(), advantages=empty,
                    names=("roll", "trl"), distributions=True)
    assert got["actor/ratio_mean"] == 0.0 and math.isnan(got["actor/ratio_max"])
    assert math.isnan(got["ppo/policy/clipfrac"]) and math.isnan(got["tokens/response_length/mean"])
    assert got["ppo/policy/ratio"].count == 0
    verl = ppo_stats(log_probs=empty, old_log_probs=empty, response_mask=empty.long(), advantages=empty,
                     names="verl")
    assert math.isnan(verl["response_length/mean"]) and math.isnan(verl["response/aborted_ratio"])


def test_all_nan_inputs_propagate_and_are_left_out_of_histograms():
    batch = make_batch(4, 3, 5, p_mask=1.0)
    batch["log_probs"] = torch.full_like(batch["log_probs"], torch.nan)
    got = full_stats(batch, distributions=True)
    for key in ("actor/ratio_mean", "actor/ratio_max", "actor/ratio_min", "actor/approxkl", "actor/kl_loss"):
        assert math.isnan(got[key]), key
    assert got["actor/ratio_dist"].count == 0 and got["actor/ratio_dist"].non_finite == 15
    assert got["critic/advantages/mean"] == pytest.approx(reference(batch)["critic/advantages/mean"])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_is_accumulated_in_float32(dtype):
    batch = make_batch(6, 8, 64, dtype=dtype)
    as_f32 = {k: (v.float() if v.is_floating_point() else v) for k, v in batch.items()}
    got, want = full_stats(batch, distributions=True), full_stats(as_f32, distributions=True)
    for key, value in want.items():
        if isinstance(value, BucketCounts):
            assert got[key].counts.tolist() == value.counts.tolist(), key
        else:
            assert got[key] == pytest.approx(value, nan_ok=True), key
    # and the float32 path agrees with float64 arithmetic on the same (upcast) values
    assert_close(got, reference(as_f32))


@pytest.mark.parametrize("variant", ["roll+trl", "roll final mask, seq IS, seq-mean", "verl"])
@pytest.mark.parametrize("compact", [True, False])
def test_one_host_transfer_per_call(monkeypatch, compact, variant):
    """Every way a tensor's values reach Python is counted. The accelerator path (compact=False, run here on the
    CPU) reads once: ``.cpu()`` of the concatenated parts, then ``.numpy()`` of that host copy. The CPU path
    (compact: CPU tensors only) views its tensors as numpy arrays where they are, and never reads a value at a
    time (``item``, ``tolist``, ``bool()``, ``float()``...)."""
    calls = count_host_reads(monkeypatch)
    batch = make_batch(7, 16, 32)
    final = batch["response_mask"] * (torch.arange(16) % 3 != 0)[:, None]
    calls.clear()
    if variant == "roll+trl":
        got = full_stats(batch, distributions=True, kl_penalty="k3", _compact=compact)
    elif variant == "verl":
        got = ppo_stats(**batch, names="verl", response_lengths=batch["response_mask"].sum(-1), _compact=compact)
    else:
        got = ppo_stats(**batch, final_response_mask=final, importance_sampling="seq", clip_ratio_c=1.4,
                        value_clip=VALUE_CLIP, loss_agg_mode="seq-mean-token-mean", distributions=True,
                        _compact=compact)
    if compact:
        assert set(calls) == {"cpu", "numpy"}, calls
    else:
        assert calls == ["cpu", "numpy"], calls
    assert len(got) > 30


@pytest.mark.parametrize("compact", [True, False])
def test_the_part_by_part_read_gives_what_the_one_transfer_gives(monkeypatch, compact):
    """Each layout read both ways (part by part, and concatenated then copied at once, which promotes the parts
    to the widest dtype): the same values, the same float types."""
    from rl_otel.stats.fused import Fused

    batch = make_batch(7, 16, 32)
    monkeypatch.setattr(Fused, "read", Fused.read_parts)
    parts = full_stats(batch, distributions=True, kl_penalty="k3", _compact=compact)
    monkeypatch.setattr(Fused, "read", Fused.read_at_once)
    at_once = full_stats(batch, distributions=True, kl_penalty="k3", _compact=compact)
    assert parts.keys() == at_once.keys()
    for key, value in parts.items():
        other = at_once[key]
        if isinstance(value, BucketCounts):
            assert (value.counts.tolist(), value.sum, value.min, value.max, value.non_finite) == (
                other.counts.tolist(), other.sum, other.min, other.max, other.non_finite), key
        else:
            assert type(value) is type(other) is float and (value == other or (value != value and other != other)), key


@pytest.mark.parametrize("compact", [True, False])
def test_a_call_frees_its_buffers_when_it_returns(monkeypatch, compact):
    """The rounds' buffer (device memory on a GPU) is free when the call returns, with no reference cycle left
    for Python's cyclic garbage collector to find some time later."""
    import gc
    import weakref

    from rl_otel.stats import fused

    made: list[weakref.ref] = []
    original = fused.Fused.plan

    def plan(self, *rounds):
        original(self, *rounds)
        made.append(weakref.ref(self._storage))

    monkeypatch.setattr(fused.Fused, "plan", plan)
    batch = make_batch(7, 16, 32)
    final = batch["response_mask"] * (torch.arange(16) % 3 != 0)[:, None]
    gc.disable()
    try:
        full_stats(batch, distributions=True, final_response_mask=final, _compact=compact)
        ppo_stats(**batch, names="verl", _compact=compact)
        assert made and all(ref() is None for ref in made)
    finally:
        gc.enable()


def test_kl_penalty_terms():
    lp, base = torch.tensor([-1.0, -0.5, -30.0]), torch.tensor([-1.5, -0.5, -1.0])
    d = (lp - base).numpy()
    np.testing.assert_allclose(kl_penalty_terms(lp, base, "kl").numpy(), d)
    np.testing.assert_allclose(kl_penalty_terms(lp, base, "abs").numpy(), np.abs(d))
    np.testing.assert_allclose(kl_penalty_terms(lp, base, "mse").numpy(), 0.5 * d ** 2)
    k3 = kl_penalty_terms(lp, base, "k3").numpy()
    assert k3[1] == 0.0 and k3[0] == pytest.approx(np.exp(-0.5) + 0.5 - 1) and k3[2] == 10.0  # clamped
    with pytest.raises(ValueError, match="kl_penalty"):
        kl_penalty_terms(lp, base, "full")


@pytest.mark.parametrize("kwargs, match", [
    ({"names": "openrlhf"}, "names"), ({"names": ("roll", "verl")}, "share keys"), ({"kl_penalty": "x"}, "kl_penalty"),
    ({"loss_agg_mode": "sum"}, "loss_agg_mode"), ({"importance_sampling": "geo"}, "importance_sampling"),
    ({"clip_ratio_c": 1.0}, "clip_ratio_c"), ({"distributions": "yes"}, "distributions"),
    ({"advantages": torch.zeros(2, 2)}, "advantages"), ({"final_response_mask": torch.ones(3, 5)}, "final_response"),
    ({"response_lengths": torch.ones(4)}, "response_lengths"),
    ({"clip_ratio_low": -0.1}, "clip_ratio_low"), ({"clip_ratio_high": -0.2}, "clip_ratio_high"),
    ({"value_clip": -0.5}, "value_clip"), ({"value_clip": float("nan")}, "value_clip"),
])
def test_bad_arguments_raise_naming_the_value(kwargs, match):
    batch = make_batch(0, 3, 4)
    args = {"log_probs": batch["log_probs"], "old_log_probs": batch["old_log_probs"],
            "response_mask": batch["response_mask"], **kwargs}
    with pytest.raises(ValueError, match=match):
        ppo_stats(**args)


def test_import_rl_otel_does_not_import_torch():
    code = "import sys, rl_otel, rl_otel.catalog; import rl_otel.stats.trinity; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_public_names():
    import rl_otel.stats

    assert sorted(rl_otel.stats.__all__) == ["BucketCounts", "bootstrap_best_worst", "bucket", "eval_step_metrics",
                                             "kl_penalty_terms", "ppo_stats", "rollout_step_metrics", "run_metrics",
                                             "task_metrics"]
    for name in rl_otel.stats.__all__:
        assert getattr(rl_otel.stats, name) is not None


def test_exclude_leaves_out_keys_the_user_logs_and_refuses_a_key_never_returned():
    """``names="verl"`` returns ``actor/pg_loss``, which a loop logging its own loss under that key overlaps:
    ``exclude`` leaves it out and every other key as it was; a key the call never returns (a typo) is refused
    naming it, so nothing is silently kept."""
    batch = make_batch(5, 4, 6)
    whole = ppo_stats(**batch, names="verl")
    assert "actor/pg_loss" in whole
    fewer = ppo_stats(**batch, names="verl", exclude={"actor/pg_loss"})
    assert fewer.keys() == whole.keys() - {"actor/pg_loss"}
    assert all(fewer[k] == whole[k] or (math.isnan(fewer[k]) and math.isnan(whole[k])) for k in fewer)
    with pytest.raises(ValueError, match="actor/pg_los'"):
        ppo_stats(**batch, names="verl", exclude=["actor/pg_los"])
