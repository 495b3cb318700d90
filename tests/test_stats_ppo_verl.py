"""ppo_stats(names="verl") against veRL 0.9.1's own functions, key for key, on batches built as veRL builds them.

- data metrics: ``verl.trainer.ppo.metric_utils.compute_data_metrics`` on a ``DataProto`` with prompts,
  responses, ``attention_mask``, ``response_mask`` (``attention_mask[:, -R:]``, ray_trainer.py
  ``compute_response_mask``), ``token_level_scores`` on the last response token, ``token_level_rewards`` =
  scores - beta * ``core_algos.kl_penalty`` * mask (ray_trainer.py ``apply_kl_penalty``), values, and
  advantages/returns from ``core_algos.compute_gae_advantage_return``; aborted samples (response length 0)
  included;
- policy-loss metrics: ``core_algos.compute_policy_loss_vanilla`` (the default ``policy_loss.loss_mode``), as
  ``workers/utils/losses.py:ppo_loss`` calls it; ``actor/kl_loss``: ``core_algos.kl_penalty`` + ``agg_loss``;
  ``actor/entropy``: ``core_algos.agg_loss(entropy, response_mask, loss_agg_mode)`` (v1/trainer_base.py).

veRL is installed from requirements-frameworks.txt (``--no-deps``); without it this module is skipped.
"""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("verl", reason="veRL is not installed (requirements-frameworks.txt)")

from verl import DataProto
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.metric_utils import compute_data_metrics
from verl.workers.config import ActorConfig

from rl_otel.catalog import default_catalog
from rl_otel.stats import ppo_stats

CLIP_LOW, CLIP_HIGH, BETA = 0.2, 0.28, 0.05


def verl_batch(seed: int, b: int = 16, p: int = 7, r: int = 12, *, all_aborted: bool = False,
               multi_turn: bool = False) -> tuple[DataProto, dict[str, torch.Tensor]]:
    """A PPO batch as veRL's trainer holds it before compute_data_metrics, and the tensors ppo_stats takes."""
    g = torch.Generator().manual_seed(seed)
    prompt_len = torch.randint(1, p + 1, (b,), generator=g)
    prompt_len[0] = p  # a prompt at the maximum length: prompt_length/clip_ratio
    response_len = torch.randint(1, r + 1, (b,), generator=g)
    response_len[1] = r  # a response cut at the maximum length: response_length/clip_ratio
    response_len[2:5] = 0  # aborted samples
    if all_aborted:
        response_len[:] = 0
    prompt_attn = (torch.arange(p)[None, :] >= p - prompt_len[:, None]).long()  # left-padded prompts
    response_attn = (torch.arange(r)[None, :] < response_len[:, None]).long()
    attention_mask = torch.cat([prompt_attn, response_attn], dim=1)
    response_mask = attention_mask[:, -r:].clone()  # ray_trainer.compute_response_mask
    if multi_turn:  # tool-output tokens: in attention_mask, not in response_mask (agent loop)
        response_mask[:, 3:5] = 0
    lp = -torch.rand(b, r, generator=g) * 3
    old = lp + 0.35 * torch.randn(b, r, generator=g)
    old[-1, 0] = lp[-1, 0] + 30.0  # a log-ratio beyond veRL's +-20 clamp
    ref = lp + 0.3 * torch.randn(b, r, generator=g)
    scores = torch.randn(b, generator=g)
    token_level_scores = torch.zeros(b, r)
    has = response_len > 0
    token_level_scores[has, response_len[has] - 1] = scores[has]  # the reward manager's last-token score
    kld = core_algos.kl_penalty(old, ref, kl_penalty="low_var_kl") * response_mask  # apply_kl_penalty
    token_level_rewards = token_level_scores - core_algos.FixedKLController(BETA).value * kld
    values = torch.randn(b, r, generator=g) * response_mask
    if all_aborted:  # GAE whitens over the mask and raises on an empty one
        advantages, returns = torch.zeros(b, r), torch.zeros(b, r)
    else:
        advantages, returns = core_algos.compute_gae_advantage_return(token_level_rewards, values, response_mask,
                                                                      gamma=1.0, lam=0.95)
    entropy = torch.rand(b, r, generator=g) * 2
    batch = DataProto.from_dict(tensors={
        "prompts": torch.randint(0, 100, (b, p), generator=g), "responses": torch.randint(0, 100, (b, r), generator=g),
        "attention_mask": attention_mask, "response_mask": response_mask, "token_level_scores": token_level_scores,
        "token_level_rewards": token_level_rewards, "values": values, "advantages": advantages, "returns": returns,
        "old_log_probs": old, "ref_log_prob": ref, "entropy": entropy,
    })
    tensors = {
        "log_probs": lp, "old_log_probs": old, "ref_log_probs": ref, "response_mask": response_mask,
        "advantages": advantages, "values": values, "returns": returns, "entropy": entropy,
        "scores": token_level_scores, "rewards": token_level_rewards, "prompt_mask": prompt_attn,
    }
    if multi_turn:
        tensors["response_lengths"] = response_attn.sum(-1)
    return batch, tensors


def verl_policy_metrics(t: dict[str, torch.Tensor], mode: str, clip_ratio_c: float = 3.0) -> dict[str, float]:
    config = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, clip_ratio_low=CLIP_LOW,
                         clip_ratio_high=CLIP_HIGH, clip_ratio_c=clip_ratio_c, loss_agg_mode=mode)
    mask = t["response_mask"].bool()
    pg_loss, metrics = core_algos.get_policy_loss_fn("vanilla")(
        old_log_prob=t["old_log_probs"], log_prob=t["log_probs"], advantages=t["advantages"], response_mask=mask,
        loss_agg_mode=mode, config=config)
    kld = core_algos.kl_penalty(t["log_probs"], t["ref_log_probs"], kl_penalty=config.kl_loss_type)
    return {**metrics, "actor/pg_loss": pg_loss.item(),
            "actor/kl_loss": core_algos.agg_loss(kld, mask, mode).item(),
            "actor/entropy": core_algos.agg_loss(t["entropy"], mask, mode).item()}


def compare(got: dict, want: dict) -> float:
    """Every key veRL emits, with its value (float tolerance); returns the largest absolute difference."""
    worst = 0.0
    for key, expected in want.items():
        assert key in got, f"{key} not returned"
        expected = float(expected)
        if math.isnan(expected):
            assert math.isnan(got[key]), (key, got[key])
            continue
        assert got[key] == pytest.approx(expected, rel=1e-5, abs=1e-6), (key, got[key], expected)
        worst = max(worst, abs(got[key] - expected))
    return worst


@pytest.mark.parametrize("compact", [True, False])
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("seed", range(4))
def test_verl_keys_match_verls_functions(seed, mode, compact):
    batch, t = verl_batch(seed)
    want = {**compute_data_metrics(batch, use_critic=True), **verl_policy_metrics(t, mode)}
    got = ppo_stats(**t, clip_ratio_low=CLIP_LOW, clip_ratio_high=CLIP_HIGH, loss_agg_mode=mode, names="verl",
                    _compact=compact)
    assert compare(got, want) < 1e-5
    assert set(got) == set(want)  # key for key: nothing more, nothing less
    assert 0 < got["response/aborted_ratio"] < 1 and got["response_length/min"] == 0.0


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_multi_turn_lengths_come_from_response_lengths(mode):
    batch, t = verl_batch(11, multi_turn=True)
    want = {**compute_data_metrics(batch, use_critic=True), **verl_policy_metrics(t, mode)}
    got = ppo_stats(**t, clip_ratio_low=CLIP_LOW, clip_ratio_high=CLIP_HIGH, loss_agg_mode=mode, names="verl")
    compare(got, want)
    t.pop("response_lengths")  # then the lengths are response_mask's, which leave the tool tokens out
    assert ppo_stats(**t, names="verl")["response_length/mean"] < want["response_length/mean"]


def test_dual_clip_bound():
    _, t = verl_batch(5)
    want = verl_policy_metrics(t, "token-mean", clip_ratio_c=1.5)
    got = ppo_stats(**t, clip_ratio_low=CLIP_LOW, clip_ratio_high=CLIP_HIGH, clip_ratio_c=1.5, names="verl")
    compare(got, want)
    assert want["actor/pg_clipfrac_lower"] > 0


@pytest.mark.parametrize("compact", [True, False])
def test_all_aborted(compact):
    batch, t = verl_batch(3, b=4, all_aborted=True)
    assert not t["response_mask"].any()
    want = {**compute_data_metrics(batch, use_critic=True), **verl_policy_metrics(t, "token-mean")}
    got = ppo_stats(**t, clip_ratio_low=CLIP_LOW, clip_ratio_high=CLIP_HIGH, names="verl", _compact=compact)
    compare(got, want)
    assert got["actor/pg_clipfrac"] == 0.0 and math.isnan(got["critic/score/mean"])


def test_every_key_is_catalogued():
    _, t = verl_batch(0)
    catalog = default_catalog()
    assert [key for key in ppo_stats(**t, names="verl") if catalog.lookup(key) is None] == []
