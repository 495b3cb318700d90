"""veRL 0.9.1's per-metric code, as veRL writes it: the baseline of the ``ppo_stats(names="verl")`` rows.

Copied from the installed ``verl==0.9.1`` (``requirements-frameworks.txt``), logging calls and non-tensor keys left
out, on a dict holding what ``DataProto.batch`` holds (the same tensor indexing):

- ``compute_data_metrics``, ``_compute_response_info``: ``verl/trainer/ppo/metric_utils.py`` (the driver's data
  metrics, ``use_critic=True``);
- ``compute_policy_loss_vanilla`` (the default ``policy_loss.loss_mode``: its three metrics and ``pg_loss``),
  ``agg_loss``, ``kl_penalty`` / ``kl_penalty_forward``: ``verl/trainer/ppo/core_algos.py``;
- ``masked_sum``, ``masked_mean``: ``verl/utils/torch_functional.py``.

:func:`step_metrics` is what one step's metrics cost veRL: the data metrics, then the policy-loss metrics with
``actor/pg_loss`` (``pg_loss.item()``), ``actor/kl_loss`` (``agg_loss(kl_penalty(...)).item()``) and
``actor/entropy`` (``agg_loss(entropy, ...).item()``), as ``tests/test_stats_ppo_verl.py`` calls veRL's own
functions.
"""

from __future__ import annotations

from typing import Any

import torch

CLIP_RATIO_C = 3.0  # ActorConfig.clip_ratio_c's default


# -- verl/utils/torch_functional.py ------------------------------------------------------------------------------

def masked_sum(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    valid_values = torch.where(mask.bool(), values, 0.0)
    return (valid_values * mask).sum(axis=axis)  # type: ignore[call-overload]


def masked_mean(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    s = masked_sum(values, mask, axis)
    return s / (mask.sum(axis=axis) + 1e-8)  # type: ignore[call-overload]


# -- verl/trainer/ppo/core_algos.py ------------------------------------------------------------------------------

def agg_loss(loss_mat: torch.Tensor, loss_mask: torch.Tensor, loss_agg_mode: str) -> torch.Tensor:
    """agg_loss with dp_size=1 and no global batch info (``config.global_batch_info`` is empty by default)."""
    if loss_agg_mode == "token-mean":
        batch_num_tokens = loss_mask.sum()
        loss = masked_sum(loss_mat, loss_mask) / batch_num_tokens * 1
    elif loss_agg_mode == "seq-mean-token-mean":
        seq_mask = torch.sum(loss_mask, dim=-1)  # per-sequence token count
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1) / (seq_mask + 1e-8)  # token-mean
        seq_mask = (seq_mask > 0).float()  # exclude fully masked sequences
        global_batch_size = seq_mask.sum()
        loss = masked_sum(seq_losses, seq_mask) / global_batch_size * 1  # seq-mean
    else:
        raise ValueError(f"Invalid loss_agg_mode: {loss_agg_mode}")
    return loss


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str = "low_var_kl") -> torch.Tensor:
    """kl_penalty -> kl_penalty_forward for ``low_var_kl`` (ActorConfig.kl_loss_type's default)."""
    assert kl_penalty in ("low_var_kl", "k3")
    kl = ref_logprob - logprob
    kl = torch.clamp(kl, min=-20, max=20)  # For numerical stability
    ratio = torch.exp(kl)
    kld = (ratio - kl - 1).contiguous()
    return torch.clamp(kld, min=-10, max=10)


def compute_policy_loss_vanilla(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                                response_mask: torch.Tensor, loss_agg_mode: str, clip_ratio_low: float,
                                clip_ratio_high: float, clip_ratio_c: float = CLIP_RATIO_C
                                ) -> tuple[torch.Tensor, dict[str, Any]]:
    negative_approx_kl = log_prob - old_log_prob
    # Clamp negative_approx_kl for stability
    negative_approx_kl = torch.clamp(negative_approx_kl, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    ppo_kl = masked_mean(-negative_approx_kl, response_mask)

    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_clipfrac = masked_mean(torch.gt(pg_losses2, pg_losses1).float(), response_mask)

    pg_losses3 = -advantages * clip_ratio_c
    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
    pg_clipfrac_lower = masked_mean(torch.gt(clip_pg_losses1, pg_losses3) * (advantages < 0).float(), response_mask)

    pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)
    pg_loss = agg_loss(loss_mat=pg_losses, loss_mask=response_mask, loss_agg_mode=loss_agg_mode)

    pg_metrics = {
        "actor/pg_clipfrac": pg_clipfrac.detach().item(),
        "actor/ppo_kl": ppo_kl.detach().item(),
        "actor/pg_clipfrac_lower": pg_clipfrac_lower.detach().item(),
    }
    return pg_loss, pg_metrics


# -- verl/trainer/ppo/metric_utils.py ----------------------------------------------------------------------------

def _compute_response_info(batch: dict[str, torch.Tensor]) -> dict[str, Any]:
    response_length = batch["responses"].shape[-1]

    prompt_mask = batch["attention_mask"][:, :-response_length]
    response_mask = batch["attention_mask"][:, -response_length:]

    prompt_length = prompt_mask.sum(-1).float()
    response_length = response_mask.sum(-1).float()  # type: ignore[assignment]  # (batch_size,)

    return {"prompt_length": prompt_length, "response_length": response_length}


def compute_data_metrics(batch: dict[str, torch.Tensor], use_critic: bool = True) -> dict[str, Any]:
    nan = float("nan")
    sequence_score = batch["token_level_scores"].sum(-1)
    sequence_reward = batch["token_level_rewards"].sum(-1)

    advantages = batch["advantages"]
    returns = batch["returns"]

    max_prompt_length = batch["prompts"].shape[-1]
    max_response_length = batch["responses"].shape[-1]

    response_mask = batch["response_mask"].bool()

    response_info = _compute_response_info(batch)
    prompt_length = response_info["prompt_length"]
    response_length = response_info["response_length"]

    aborted_mask = (response_length == 0).bool()
    non_aborted_mask = ~aborted_mask

    non_aborted_sequence_score = sequence_score[non_aborted_mask]
    non_aborted_sequence_reward = sequence_reward[non_aborted_mask]

    if non_aborted_sequence_score.numel() > 0:
        score_mean = torch.mean(non_aborted_sequence_score).detach().item()
        score_max = torch.max(non_aborted_sequence_score).detach().item()
        score_min = torch.min(non_aborted_sequence_score).detach().item()
    else:
        score_mean = score_max = score_min = nan

    if non_aborted_sequence_reward.numel() > 0:
        reward_mean = torch.mean(non_aborted_sequence_reward).detach().item()
        reward_max = torch.max(non_aborted_sequence_reward).detach().item()
        reward_min = torch.min(non_aborted_sequence_reward).detach().item()
    else:
        reward_mean = reward_max = reward_min = nan

    valid_adv = torch.masked_select(advantages, response_mask)
    valid_returns = torch.masked_select(returns, response_mask)

    if valid_adv.numel() > 0:
        adv_mean = torch.mean(valid_adv).detach().item()
        adv_max = torch.max(valid_adv).detach().item()
        adv_min = torch.min(valid_adv).detach().item()
    else:
        adv_mean = adv_max = adv_min = nan

    if valid_returns.numel() > 0:
        returns_mean = torch.mean(valid_returns).detach().item()
        returns_max = torch.max(valid_returns).detach().item()
        returns_min = torch.min(valid_returns).detach().item()
    else:
        returns_mean = returns_max = returns_min = nan

    aborted_ratio = torch.mean(aborted_mask.float()).detach().item()

    non_aborted_response_length = response_length[non_aborted_mask]
    if non_aborted_response_length.numel() > 0:
        non_aborted_response_length_mean = torch.mean(non_aborted_response_length).detach().item()
        non_aborted_response_length_max = torch.max(non_aborted_response_length).detach().item()
        non_aborted_response_length_min = torch.min(non_aborted_response_length).detach().item()
        non_aborted_response_length_clip_ratio = (
            torch.mean(torch.eq(non_aborted_response_length, max_response_length).float()).detach().item()
        )
    else:
        non_aborted_response_length_mean = non_aborted_response_length_max = nan
        non_aborted_response_length_min = non_aborted_response_length_clip_ratio = nan

    critic_value_metrics: dict[str, float] = {}
    if use_critic:
        values = batch["values"]
        valid_values = torch.masked_select(values, response_mask)
        if valid_returns.numel() > 0 and valid_values.numel() > 0:
            return_diff_var = torch.var(valid_returns - valid_values)
            return_var = torch.var(valid_returns)
            critic_value_metrics = {
                "critic/values/mean": torch.mean(valid_values).detach().item(),
                "critic/values/max": torch.max(valid_values).detach().item(),
                "critic/values/min": torch.min(valid_values).detach().item(),
                "critic/vf_explained_var": (1.0 - return_diff_var / (return_var + 1e-5)).detach().item(),
            }
        else:
            critic_value_metrics = dict.fromkeys(("critic/values/mean", "critic/values/max", "critic/values/min",
                                                  "critic/vf_explained_var"), nan)

    return {
        "critic/score/mean": score_mean,
        "critic/score/max": score_max,
        "critic/score/min": score_min,
        "critic/rewards/mean": reward_mean,
        "critic/rewards/max": reward_max,
        "critic/rewards/min": reward_min,
        "critic/advantages/mean": adv_mean,
        "critic/advantages/max": adv_max,
        "critic/advantages/min": adv_min,
        "critic/returns/mean": returns_mean,
        "critic/returns/max": returns_max,
        "critic/returns/min": returns_min,
        **critic_value_metrics,
        "response_length/mean": torch.mean(response_length).detach().item(),
        "response_length/max": torch.max(response_length).detach().item(),
        "response_length/min": torch.min(response_length).detach().item(),
        "response_length/clip_ratio": torch.mean(torch.eq(response_length, max_response_length).float())
        .detach()
        .item(),
        "response_length_non_aborted/mean": non_aborted_response_length_mean,
        "response_length_non_aborted/max": non_aborted_response_length_max,
        "response_length_non_aborted/min": non_aborted_response_length_min,
        "response_length_non_aborted/clip_ratio": non_aborted_response_length_clip_ratio,
        "response/aborted_ratio": aborted_ratio,
        "prompt_length/mean": torch.mean(prompt_length).detach().item(),
        "prompt_length/max": torch.max(prompt_length).detach().item(),
        "prompt_length/min": torch.min(prompt_length).detach().item(),
        "prompt_length/clip_ratio": torch.mean(torch.eq(prompt_length, max_prompt_length).float()).detach().item(),
    }


# -- one step --------------------------------------------------------------------------------------------------

def step_metrics(batch: dict[str, torch.Tensor], *, clip_ratio_low: float, clip_ratio_high: float,
                 loss_agg_mode: str = "token-mean") -> dict[str, float]:
    """One step's metrics: ``compute_data_metrics`` and the policy-loss metrics (see the module's docstring).
    ``batch`` holds the ``DataProto.batch`` keys plus ``log_probs`` (the policy being optimized)."""
    mask = batch["response_mask"].bool()
    pg_loss, metrics = compute_policy_loss_vanilla(batch["old_log_probs"], batch["log_probs"], batch["advantages"],
                                                   mask, loss_agg_mode, clip_ratio_low, clip_ratio_high)
    kld = kl_penalty(batch["log_probs"], batch["ref_log_prob"], kl_penalty="low_var_kl")
    return {**compute_data_metrics(batch, use_critic=True), **metrics, "actor/pg_loss": pg_loss.item(),
            "actor/kl_loss": agg_loss(kld, mask, loss_agg_mode).item(),
            "actor/entropy": agg_loss(batch["entropy"], mask, loss_agg_mode).item()}
