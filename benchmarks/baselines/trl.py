"""TRL's legacy ``PPOTrainer`` step statistics, as TRL wrote them: the baseline of the ``ppo_stats(names="trl")`` rows.

``names="trl"`` gives the keys of TRL's legacy ``PPOTrainer`` (``ppo/*``, ``objective/*``, ``env/*``,
``tokens/*``), which TRL 1.x no longer ships (TRL 1.16's ``GRPOTrainer`` logs other keys - ``clip_ratio/*``,
``kl``, ``entropy`` - that ``ppo_stats`` does not compute, so there is no like-for-like GRPO baseline). From
huggingface/trl (``trl/trainer/ppo_trainer.py``, ``trl/core.py`` of the 0.x releases):

- ``masked_mean``, ``masked_var``, ``clip_by_value``: ``trl/core.py``;
- ``PPOTrainer.loss``: the policy and value statistics of one mini-batch (``ppo/policy/*``, ``ppo/returns/*``,
  ``ppo/val/*``) - without the GAE and whitening that precede them in ``loss`` (``ppo_stats`` takes advantages and
  returns as given);
- ``PPOTrainer.record_step_stats``: ``objective/kl``, ``objective/entropy``, ``ppo/mean_non_score_reward`` (the
  per-sequence sum of the non-score reward, averaged over sequences, as TRL computed it before it moved to a
  token mean), ``ppo/mean_scores``, ``ppo/std_scores``, ``tokens/*``; ``PPOTrainer.log_stats``: ``env/*``;
- ``stats_to_np`` (``trl/core.py``): every statistic to the host, one at a time (``.cpu().numpy().item()``).

``ppo/val/var_explained`` is written with rl_otel's definition (``1 - var(returns - vpreds) / var(returns)``, over
the response tokens) in TRL's expressions: TRL computed ``1 - ppo/val/error / ppo/returns/var``.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

# -- trl/core.py --------------------------------------------------------------------------------------------------

def masked_mean(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """Compute mean of tensor with a masked values."""
    if axis is not None:
        return (values * mask).sum(axis=axis) / mask.sum(axis=axis)  # type: ignore[call-overload]
    return (values * mask).sum() / mask.sum()


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Compute variance of tensor with masked values."""
    mean = masked_mean(values, mask)
    centered_values = values - mean
    variance = masked_mean(centered_values**2, mask)
    if unbiased:
        mask_sum = mask.sum()
        if mask_sum == 0:
            raise ValueError("At least one element in the mask has to be 1.")
        if mask_sum == 1:
            raise ValueError("The sum of the mask is one, which can cause a division by zero.")
        bessel_correction = mask_sum / (mask_sum - 1)
        variance = variance * bessel_correction
    return variance


def clip_by_value(x: torch.Tensor, tensor_min: torch.Tensor, tensor_max: torch.Tensor) -> torch.Tensor:
    """Tensor extension to torch.clamp https://github.com/pytorch/pytorch/issues/2793#issuecomment-428784713"""
    return torch.max(torch.min(x, tensor_max), tensor_min)


def stats_to_np(stats_dict: dict) -> dict:
    """Cast all torch.tensors in dict to numpy arrays (the scalars to Python floats)."""
    new_dict: dict[str, Any] = {}
    for k, v in stats_dict.items():
        if isinstance(v, torch.Tensor):
            new_dict[k] = v.detach().cpu()
            if new_dict[k].dtype == torch.bfloat16:
                new_dict[k] = new_dict[k].float()
            new_dict[k] = new_dict[k].numpy()
        else:
            new_dict[k] = v
        if isinstance(new_dict[k], float) or getattr(new_dict[k], "ndim", 1) == 0:
            new_dict[k] = float(new_dict[k])
    return new_dict


# -- trl/trainer/ppo_trainer.py -----------------------------------------------------------------------------------

def loss_stats(b: dict[str, torch.Tensor], *, cliprange: float, cliprange_value: float) -> dict[str, torch.Tensor]:
    """The statistics of ``PPOTrainer.loss`` (flattened as ``flatten_dict`` does, prefixed ``ppo/`` as
    ``record_step_stats`` does)."""
    mask, values, returns, advantages = b["masks"], b["values"], b["returns"], b["advantages"]
    logprobs, old_logprobs, vpreds = b["logprobs"], b["old_logprobs"], b["vpreds"]

    vpredclipped = clip_by_value(vpreds, values - cliprange_value, values + cliprange_value)
    vf_losses1 = (vpreds - returns) ** 2
    vf_losses2 = (vpredclipped - returns) ** 2
    vf_clipfrac = masked_mean(torch.gt(vf_losses2, vf_losses1).double(), mask)

    ratio = torch.exp(logprobs - old_logprobs)
    pg_losses = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1.0 - cliprange, 1.0 + cliprange)
    pg_clipfrac = masked_mean(torch.gt(pg_losses2, pg_losses).double(), mask)

    entropy = masked_mean(b["entropy"], mask)
    approxkl = 0.5 * masked_mean((logprobs - old_logprobs) ** 2, mask)
    policykl = masked_mean(old_logprobs - logprobs, mask)
    return_mean, return_var = masked_mean(returns, mask), masked_var(returns, mask)
    value_mean, value_var = masked_mean(values, mask), masked_var(values, mask)
    return {
        "ppo/policy/entropy": entropy.detach(), "ppo/policy/approxkl": approxkl.detach(),
        "ppo/policy/policykl": policykl.detach(), "ppo/policy/clipfrac": pg_clipfrac.detach(),
        "ppo/policy/advantages_mean": masked_mean(advantages, mask).detach(),
        "ppo/returns/mean": return_mean.detach(), "ppo/returns/var": return_var.detach(),
        "ppo/val/vpred": masked_mean(vpreds, mask).detach(),
        "ppo/val/error": masked_mean((vpreds - returns) ** 2, mask).detach(),
        "ppo/val/clipfrac": vf_clipfrac.detach(), "ppo/val/mean": value_mean.detach(),
        "ppo/val/var": value_var.detach(),
        # rl_otel's definition (see the module's docstring), in TRL's expressions
        "ppo/val/var_explained": 1 - masked_var(returns - vpreds, mask) / return_var,
    }


def record_step_stats(kl_coef: float, b: dict[str, torch.Tensor]) -> dict[str, object]:
    mask = b["masks"]
    kl_list = ((b["old_logprobs"] - b["ref_logprobs"]) * mask).sum(axis=-1)  # type: ignore[call-overload]
    mean_kl = kl_list.mean()
    mean_entropy = (-b["old_logprobs"] * mask).sum(axis=-1).mean()  # type: ignore[call-overload]
    non_score_reward = -kl_coef * (b["old_logprobs"] - b["ref_logprobs"])  # compute_rewards
    mean_non_score_reward = (non_score_reward * mask).sum(axis=-1).mean()  # type: ignore[call-overload]
    mean_scores = b["scores"].mean()
    std_scores = b["scores"].std()
    if mean_kl.item() < -1.0:
        warnings.warn(f"KL divergence is starting to become negative: {mean_kl.item():.2f}", stacklevel=2)
    stats: dict[str, object] = {
        "objective/kl": mean_kl, "objective/kl_coef": kl_coef, "objective/entropy": mean_entropy,
        "ppo/mean_non_score_reward": mean_non_score_reward, "ppo/mean_scores": mean_scores,
        "ppo/std_scores": std_scores,
    }
    query_lens = b["query_mask"].sum(-1).float()  # TRL: torch.tensor([len(query) for query in queries])
    response_lens = mask.sum(-1).float()
    stats["tokens/queries_len_mean"] = torch.mean(query_lens).cpu().numpy().item()
    stats["tokens/queries_len_std"] = torch.std(query_lens).cpu().numpy().item()
    stats["tokens/responses_len_mean"] = torch.mean(response_lens).cpu().numpy().item()
    stats["tokens/responses_len_std"] = torch.std(response_lens).cpu().numpy().item()
    return stats


def step_metrics(b: dict[str, torch.Tensor], *, cliprange: float, cliprange_value: float,
                 kl_coef: float) -> dict[str, float]:
    """One step's statistics: ``loss`` and ``record_step_stats``, ``log_stats``' ``env/*``, through
    ``stats_to_np``."""
    stats = {**record_step_stats(kl_coef, b), **loss_stats(b, cliprange=cliprange, cliprange_value=cliprange_value)}
    rewards = b["scores"]
    stats["env/reward_mean"] = torch.mean(rewards).cpu().numpy().item()
    stats["env/reward_std"] = torch.std(rewards).cpu().numpy().item()
    return stats_to_np(stats)
