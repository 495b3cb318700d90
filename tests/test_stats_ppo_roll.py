"""ppo_stats(names="roll") against ROLL's definitions, key for key.

The reference below is written from the definitions (alibaba/ROLL at commit 8eb27cc, paths and lines at that
commit), in numpy float64, one metric at a time, on tensors prepared the way ROLL prepares them:

- ``final_response_mask = response_mask * sample_mask`` (``roll/utils/functionals.py:732-733``,
  ``get_sample_level_mask``): whole samples dropped;
- log-probs and entropies are zero off ``response_mask`` (``op_compute_log_probs`` / ``op_compute_entropy``
  multiply by it, ``roll/distributed/strategy/strategy.py:165-173``);
- token-level rewards and advantages are zero off ``final_response_mask`` (``compute_advantage``,
  ``functionals.py:1161,1184``), rewards sit on the last response token (``expand_to_token_level``).

ppo_stats gets the same tensors with garbage (NaN) off ``response_mask``, which it never reads.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rl_otel.catalog import default_catalog
from rl_otel.stats import ppo_stats

CLIP_LOW, CLIP_HIGH, VALUE_CLIP = 0.2, 0.28, 0.2


def roll_batch(seed: int, b: int = 12, t: int = 16) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, t + 1, (b,), generator=g)
    lengths[0] = 0  # a sequence with no response token
    lengths[1] = t  # one that fills the width
    mask = (torch.arange(t)[None, :] < lengths[:, None]).float()
    keep = (torch.rand(b, generator=g) < 0.6).float()  # the sample-level masks: drop ~40% of the samples
    keep[2], keep[3] = 0.0, 1.0
    final = mask * keep[:, None]
    lp = -torch.rand(b, t, generator=g) * 3
    old = lp + 0.35 * torch.randn(b, t, generator=g)  # a spread of ratios, so dropped samples have clipped tokens
    ref = lp + 0.3 * torch.randn(b, t, generator=g)
    scores = (torch.rand(b, generator=g) < 0.5).float()
    last = (lengths - 1).clamp(min=0)
    rewards = torch.zeros(b, t).scatter_(1, last[:, None], scores[:, None] - 0.5) * final
    return {
        "log_probs": lp * mask, "old_log_probs": old * mask, "ref_log_probs": ref * mask,
        "response_mask": mask, "final_response_mask": final,
        "advantages": torch.randn(b, t, generator=g) * final,
        "values": torch.randn(b, t, generator=g) * final, "returns": torch.randn(b, t, generator=g) * final,
        "vpreds": torch.randn(b, t, generator=g), "entropy": torch.rand(b, t, generator=g) * 2 * mask,
        "rewards": rewards, "scores": scores, "prompt_mask": (torch.rand(b, 6, generator=g) < 0.8).long(),
    }


# -- ROLL's definitions ------------------------------------------------------------------------------------------

def masked_mean(x, mask, dim=None):
    """functionals.py:285-290: (x * mask).sum / (mask.sum + 1e-8); per row, 0 for a row without tokens."""
    if dim is None:
        return (x * mask).sum() / (mask.sum() + 1e-8)
    n = mask.sum(dim)
    return np.where(n > 0, (x * mask).sum(dim) / (n + 1e-8), 0.0)


def agg_loss(loss_mat, loss_mask, mode, batch_num_tokens=None, global_valid_samples=None):
    """functionals.py:229-282. token-mean (l.253-256): sum(loss_mat) / batch_num_tokens, the mask NOT applied;
    seq-mean-token-mean (l.263-268): sum over valid sequences of the per-sequence masked mean, divided by
    global_valid_samples + 1e-8. Defaults: the mask's token count, the batch size."""
    if batch_num_tokens is None:
        batch_num_tokens = loss_mask.sum()
    if global_valid_samples is None:
        global_valid_samples = loss_mat.shape[0]
    with np.errstate(divide="ignore", invalid="ignore"):
        if mode == "token-mean":
            return float(loss_mat.sum() / np.float64(batch_num_tokens))
        valid = (loss_mask > 0).any(-1)
        return float((masked_mean(loss_mat, loss_mask, dim=-1) * valid).sum() / (global_valid_samples + 1e-8))


def roll_reference(batch: dict, *, mode: str, importance_sampling: str = "token", dual_clip: bool = False) -> dict:
    d = {k: v.double().numpy() for k, v in batch.items()}
    resp, final = d["response_mask"], d["final_response_mask"]
    lp, old, ref, adv = d["log_probs"], d["old_log_probs"], d["ref_log_probs"], d["advantages"]
    # the mini-batch's global denominators (strategy.py:355-431): token counts and sequences with a token
    n_tok = {"response_mask": resp.sum(), "final_response_mask": final.sum()}
    n_seq = {"response_mask": (resp > 0).any(-1).sum(), "final_response_mask": (final > 0).any(-1).sum()}

    # roll/pipeline/rlvr/actor_worker.py loss_func
    kl_loss = np.clip(np.exp(ref - lp) - (ref - lp) - 1, -10, 10) * final  # compute_approx_kl k3, l.55-57
    approxkl = 0.5 * (lp - old) ** 2 * resp  # "mse", l.64-66
    policykl = (lp - old) * resp  # "kl", l.67-69
    if importance_sampling == "token":
        ratio = np.exp(lp - old)  # l.71-72
    else:  # l.73-76: exp(masked_mean(log_ratio, final_response_mask, dim=-1)) over all T positions
        ratio = np.repeat(np.exp(masked_mean(lp - old, final, dim=-1))[:, None], lp.shape[1], axis=1)
    surr1 = ratio * adv  # l.80-81
    surr2 = np.clip(ratio, 1 - CLIP_LOW, 1 + CLIP_HIGH) * adv
    loss = -np.minimum(surr1, surr2)  # l.83
    if dual_clip:  # l.85-87: -max(-loss, (1 + 2 * pg_clip) * A) where A < 0
        loss = np.where(adv < 0, -np.maximum(-loss, (1 + CLIP_LOW * 2) * adv), loss)
    clipped_low = (ratio < 1 - CLIP_LOW).astype(float)  # l.102-104
    clipped_high = (ratio > 1 + CLIP_HIGH).astype(float)
    clipped = clipped_low + clipped_high
    out = {  # l.124-159
        "actor/ppo_ratio_high_clipfrac": agg_loss(clipped_high, final, "token-mean", n_tok["final_response_mask"]),
        "actor/ppo_ratio_low_clipfrac": agg_loss(clipped_low, final, "token-mean", n_tok["final_response_mask"]),
        "actor/ppo_ratio_clipfrac": agg_loss(clipped, final, "token-mean", n_tok["final_response_mask"]),
        "actor/ratio_mean": agg_loss(ratio, resp, "seq-mean-token-mean",
                                     global_valid_samples=n_seq["response_mask"]),
        "actor/ratio_max": float(np.max(ratio * resp)),
        "actor/ratio_min": float(np.min(ratio * resp + (1 - resp) * 1e10)),
        "actor/clipfrac": agg_loss((surr2 < surr1).astype(float), resp, mode, n_tok["final_response_mask"],
                                   n_seq["response_mask"]),
        "actor/pg_loss": agg_loss(loss, final, mode, n_tok["final_response_mask"], n_seq["final_response_mask"]),
        "actor/kl_loss": agg_loss(kl_loss, final, mode, n_tok["final_response_mask"],
                                  n_seq["final_response_mask"]),
        "actor/approxkl": agg_loss(approxkl, resp, mode, n_tok["response_mask"], n_seq["response_mask"]),
        "actor/policykl": agg_loss(policykl, resp, mode, n_tok["response_mask"], n_seq["response_mask"]),
    }
    # roll/pipeline/base_worker.py:652-688, CriticWorker.loss_func: masked_mean(x, mask, dim=-1).mean()
    vpr, val, ret = d["vpreds"], d["values"], d["returns"]
    clipped_v = np.clip(vpr, val - VALUE_CLIP, val + VALUE_CLIP)
    s1, s2 = (vpr - ret) ** 2, (clipped_v - ret) ** 2
    out["critic/clipfrac"] = float(masked_mean((s2 > s1).astype(float), resp, dim=-1).mean())
    out["critic/loss"] = float(0.5 * masked_mean(np.maximum(s1, s2), resp, dim=-1).mean())
    out["critic/value"] = float(masked_mean(val, resp, dim=-1).mean())
    out["critic/vpred"] = float(masked_mean(vpr, resp, dim=-1).mean())
    out["critic/error"] = float(masked_mean((vpr - ret) ** 2, resp, dim=-1).mean())
    # roll/utils/metrics/metrics_manager.py:174-300, add_values_metrics (response_mask = final_response_mask)
    fm = final > 0
    sc, tlr = d["scores"], d["rewards"]
    for prefix, x in (("critic/score", sc), ("critic/rewards", tlr.sum(-1)),
                      ("critic/token_level_rewards_mean", tlr.mean(-1))):
        out[f"{prefix}/mean"], out[f"{prefix}/max"], out[f"{prefix}/min"] = (float(np.mean(x)), float(np.max(x)),
                                                                            float(np.min(x)))
    for prefix, x in (("critic/advantages", adv), ("critic/returns", ret), ("critic/values", val)):
        out[f"{prefix}/mean"] = float(masked_mean(x, final))
        if fm.any():  # else ROLL leaves max/min out (l.218-220): ppo_stats gives NaN
            out[f"{prefix}/max"], out[f"{prefix}/min"] = float(np.max(x[fm])), float(np.min(x[fm]))
        else:
            out[f"{prefix}/max"] = out[f"{prefix}/min"] = math.nan
    # rlvr_pipeline.py:650-655: agg_loss(entropy, response_mask, "token-mean")
    out["critic/entropy/mean"] = agg_loss(d["entropy"], resp, "token-mean")
    # agentic_pipeline.py:435-436: masked_mean over response_mask
    out["critic/old_log_prob/mean"] = float(masked_mean(old, resp))
    out["critic/ref_log_prob/mean"] = float(masked_mean(ref, resp))
    # agentic_pipeline.py:1016-1048: per-row lengths, mean/max/min over rows
    for prefix, x in (("tokens/response_length", resp.sum(-1)), ("tokens/prompt_length", d["prompt_mask"].sum(-1))):
        out[f"{prefix}/mean"], out[f"{prefix}/max"], out[f"{prefix}/min"] = (float(np.mean(x)), float(np.max(x)),
                                                                            float(np.min(x)))
    return out


def poisoned(batch: dict) -> dict:
    """The batch with NaN off response_mask in every token tensor: ppo_stats must not read those positions."""
    off = batch["response_mask"] == 0
    out = dict(batch)
    for key in ("log_probs", "old_log_probs", "ref_log_probs", "advantages", "values", "returns", "vpreds",
                "entropy"):
        out[key] = torch.where(off, torch.nan, batch[key])
    return out


def stats(batch: dict, **kw) -> dict:
    return ppo_stats(**batch, clip_ratio_low=CLIP_LOW, clip_ratio_high=CLIP_HIGH, value_clip=VALUE_CLIP,
                     names="roll", **kw)


def max_abs_diff(got: dict, want: dict) -> float:
    worst = 0.0
    for key, expected in want.items():
        assert key in got, f"{key} not returned"
        assert math.isnan(got[key]) == math.isnan(expected), (key, got[key], expected)
        if not math.isnan(expected):
            assert got[key] == pytest.approx(expected, rel=1e-5, abs=1e-6), (key, got[key], expected)
            worst = max(worst, abs(got[key] - expected))
    return worst


# -- the tests ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("compact", [True, False])
@pytest.mark.parametrize("importance_sampling", ["token", "seq"])
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("seed", range(4))
def test_roll_keys_match_rolls_definitions(seed, mode, importance_sampling, compact):
    batch = roll_batch(seed)
    assert (batch["final_response_mask"] != batch["response_mask"]).any()  # whole samples dropped
    want = roll_reference(batch, mode=mode, importance_sampling=importance_sampling)
    got = stats(poisoned(batch), loss_agg_mode=mode, importance_sampling=importance_sampling, _compact=compact)
    assert max_abs_diff(got, want) < 1e-5


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_dual_clip_is_rolls_dual_clip_loss(mode):
    batch = roll_batch(7)
    want = roll_reference(batch, mode=mode, dual_clip=True)
    got = stats(batch, loss_agg_mode=mode, clip_ratio_c=1 + 2 * CLIP_LOW)
    assert got["actor/pg_loss"] == pytest.approx(want["actor/pg_loss"], rel=1e-5)
    assert got["actor/pg_loss"] != pytest.approx(stats(batch, loss_agg_mode=mode)["actor/pg_loss"], rel=1e-3)


def test_the_clip_fractions_count_dropped_samples_in_the_numerator_only():
    """The issue's measurement: with samples dropped by final_response_mask, ROLL's clip fractions are not the
    fraction of final_response_mask tokens clipped, and ratio_mean is not a token mean."""
    batch = roll_batch(0)
    got = stats(batch)
    d = {k: v.double().numpy() for k, v in batch.items()}
    resp, final = d["response_mask"] > 0, d["final_response_mask"] > 0
    high = np.exp(d["log_probs"] - d["old_log_probs"]) > 1 + CLIP_HIGH
    assert got["actor/ppo_ratio_high_clipfrac"] == pytest.approx(high[resp].sum() / final.sum(), rel=1e-6)
    assert abs(got["actor/ppo_ratio_high_clipfrac"] - high[final].mean()) > 0.01
    ratio = np.exp(d["log_probs"] - d["old_log_probs"])
    assert abs(got["actor/ratio_mean"] - ratio[resp].mean()) > 1e-3


def test_without_final_response_mask_it_is_response_mask():
    batch = roll_batch(3)
    batch.pop("final_response_mask")
    same = dict(batch, final_response_mask=batch["response_mask"])
    for mode in ("token-mean", "seq-mean-token-mean"):
        a, b = stats(batch, loss_agg_mode=mode), stats(same, loss_agg_mode=mode)
        assert a.keys() == b.keys()
        for key in a:
            assert a[key] == pytest.approx(b[key], nan_ok=True), key
        assert max_abs_diff(a, roll_reference(same, mode=mode)) < 1e-5


@pytest.mark.parametrize("compact", [True, False])
def test_all_samples_dropped_gives_rolls_numbers(compact):
    batch = roll_batch(5)
    batch["final_response_mask"] = torch.zeros_like(batch["final_response_mask"])
    batch["advantages"] = torch.zeros_like(batch["advantages"])
    batch["rewards"] = torch.zeros_like(batch["rewards"])
    for mode in ("token-mean", "seq-mean-token-mean"):
        want = roll_reference(batch, mode=mode)
        got = stats(batch, loss_agg_mode=mode, _compact=compact)
        # ROLL: clipped tokens over 0 final tokens is inf; a seq-mean over no sequence is 0
        assert got["actor/ppo_ratio_clipfrac"] == want["actor/ppo_ratio_clipfrac"] == math.inf
        for key in ("actor/pg_loss", "actor/kl_loss", "actor/clipfrac", "critic/advantages/mean"):
            if not math.isnan(want[key]):
                assert got[key] == pytest.approx(want[key]), key
            else:
                assert math.isnan(got[key]), key
        assert math.isnan(got["critic/advantages/max"])  # ROLL leaves max/min out (metrics_manager.py:218-220)


@pytest.mark.parametrize("compact", [True, False])
def test_response_level_rewards_read_zero_for_dropped_samples(compact):
    batch = roll_batch(1)
    token_level = stats(batch, _compact=compact)
    per_sample = dict(batch, rewards=batch["rewards"].sum(-1) + (1 - batch["final_response_mask"].amax(-1)) * 7.0)
    got = stats(per_sample, _compact=compact)
    for key in ("critic/rewards/mean", "critic/rewards/max", "critic/rewards/min"):
        assert got[key] == pytest.approx(token_level[key]), key
    assert "critic/token_level_rewards_mean/mean" not in got


def test_distributions_follow_the_keys_masks():
    batch = roll_batch(2)
    got = stats(batch, distributions="tensors")
    final = batch["final_response_mask"] > 0
    np.testing.assert_allclose(np.sort(got["critic/advantages_dist"].numpy()),
                               np.sort(batch["advantages"][final].numpy()))
    counts = stats(batch, distributions=True)
    assert counts["critic/advantages_dist"].count == int(final.sum())
    assert counts["actor/ratio_dist"].count == int(batch["response_mask"].sum())


def test_every_key_is_catalogued():
    catalog = default_catalog()
    got = stats(roll_batch(0), distributions=True, importance_sampling="seq", clip_ratio_c=1.4)
    assert [key for key in got if catalog.lookup(key) is None] == []
