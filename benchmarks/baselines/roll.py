"""ROLL's per-metric code, as ROLL writes it: the baseline of the ``ppo_stats(names="roll")`` rows.

From alibaba/ROLL (the definitions at commit 8eb27cc that ``tests/test_stats_ppo_roll.py`` checks ``ppo_stats``
against; the helpers are unchanged at the current head), on a dict holding what ROLL's ``DataProto.batch`` holds,
prepared the way ROLL prepares it (log-probs and entropy zero off ``response_mask``, advantages and token-level
rewards zero off ``final_response_mask``):

- ``masked_mean``, ``masked_sum``, ``agg_loss``, ``compute_approx_kl``: ``roll/utils/functionals.py``;
- the actor's metrics: ``roll/pipeline/rlvr/actor_worker.py:ActorWorker.loss_func`` (the keys ``ppo_stats``
  computes: ``weighted_pg_loss``, ``total_loss``, the sample counts and weights and the train/infer correction
  are left out, which only makes the baseline cheaper);
- the critic's: ``roll/pipeline/base_worker.py:CriticWorker.loss_func`` (with ``value_clip``);
- the driver's data metrics: ``roll/utils/metrics/metrics_manager.py:MetricsManager.add_values_metrics``
  (``critic/score|rewards|token_level_rewards_mean|advantages|returns|values/*``), ``critic/entropy/mean``
  (``rlvr_pipeline.py``: ``agg_loss(entropy, response_mask, "token-mean")``), ``critic/{old,ref}_log_prob/mean``
  and ``tokens/{response,prompt}_length/*`` (``agentic_pipeline.py``).

The mini-batch's global denominators (``batch_num_tokens``, ``global_valid_samples``:
``roll/distributed/strategy/strategy.py``) are computed once, as the strategy does, the batch being one mini-batch.
"""

from __future__ import annotations

from typing import Any

import torch

# -- roll/utils/functionals.py ------------------------------------------------------------------------------------

def compute_approx_kl(log_probs: torch.Tensor, log_probs_base: torch.Tensor, action_mask: torch.Tensor | None = None,
                      kl_penalty: str = "kl") -> torch.Tensor:
    if kl_penalty == "kl":
        log_ratio = log_probs - log_probs_base
    elif kl_penalty == "abs":
        log_ratio = (log_probs - log_probs_base).abs()
    elif kl_penalty == "mse":
        log_ratio = 0.5 * (log_probs - log_probs_base).square()
    elif kl_penalty == "k3":
        kl = log_probs_base - log_probs
        ratio = torch.exp(kl)
        kld = (ratio - kl - 1).contiguous()
        log_ratio = torch.clamp(kld, min=-10, max=10)
    else:
        raise NotImplementedError
    if action_mask is not None:
        return log_ratio * action_mask
    return log_ratio


def masked_mean(tensor: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    if dim is not None:
        mask_sum = mask.sum(axis=dim)  # type: ignore[call-overload]
        return torch.where(mask_sum > 0, (tensor * mask).sum(axis=dim) / (mask_sum + 1e-8),  # type: ignore[call-overload]
                           torch.zeros_like(mask_sum))
    return (tensor * mask).sum() / (mask.sum() + 1e-8)


def agg_loss(loss_mat: torch.Tensor, loss_mask: torch.Tensor, loss_agg_mode: str, batch_num_tokens: Any = None,
             global_valid_samples: Any = None, weights: torch.Tensor | None = None) -> torch.Tensor:
    if batch_num_tokens is None:
        batch_num_tokens = loss_mask.sum()
    if global_valid_samples is None:
        global_valid_samples = loss_mat.size(0)
    if loss_agg_mode == "token-mean":
        if weights is None:
            weights = torch.ones(loss_mask.shape[0], device=loss_mask.device)
        loss = (loss_mat * weights.unsqueeze(-1)).sum() / batch_num_tokens
    elif loss_agg_mode == "seq-mean-token-mean":
        seq_losses = masked_mean(loss_mat, loss_mask, dim=-1)
        valid_samples = torch.any(loss_mask > 0, dim=-1).float()
        if weights is None:
            weights = torch.ones(loss_mask.shape[0], device=loss_mask.device)
        loss = (seq_losses * weights * valid_samples).sum() / (global_valid_samples + 1e-8)  # seq-mean
    else:
        raise ValueError(f"Invalid loss_agg_mode: {loss_agg_mode}")
    return loss


# -- roll/pipeline/rlvr/actor_worker.py:ActorWorker.loss_func ----------------------------------------------------

def actor_metrics(batch: dict[str, torch.Tensor], *, pg_clip_low: float, pg_clip_high: float,
                  loss_agg_mode: str) -> dict[str, float]:
    response_mask = batch["response_mask"]
    final_response_mask = batch.get("final_response_mask", response_mask)
    ref_log_probs, old_log_probs = batch["ref_log_probs"], batch["old_log_probs"]
    advantages, log_probs = batch["advantages"], batch["log_probs"]
    # strategy.py: the mini-batch's global token and valid-sequence counts, per loss mask key
    batch_num_tokens = {"response_mask": response_mask.sum(), "final_response_mask": final_response_mask.sum()}
    global_valid_samples = {"response_mask": torch.any(response_mask > 0, dim=-1).sum(),
                            "final_response_mask": torch.any(final_response_mask > 0, dim=-1).sum()}
    mode = loss_agg_mode

    kl_loss = compute_approx_kl(log_probs=log_probs, log_probs_base=ref_log_probs, action_mask=final_response_mask,
                                kl_penalty="k3")
    kl_loss = agg_loss(loss_mat=kl_loss, loss_mask=final_response_mask, loss_agg_mode=mode,
                       batch_num_tokens=batch_num_tokens["final_response_mask"],
                       global_valid_samples=global_valid_samples["final_response_mask"])
    approxkl = compute_approx_kl(log_probs=log_probs, log_probs_base=old_log_probs, action_mask=response_mask,
                                 kl_penalty="mse")
    policykl = compute_approx_kl(log_probs=log_probs, log_probs_base=old_log_probs, action_mask=response_mask,
                                 kl_penalty="kl")

    ratio = (log_probs - old_log_probs).exp()
    surr1 = ratio * advantages
    surr2 = ratio.clamp(1 - pg_clip_low, 1 + pg_clip_high) * advantages
    loss = -torch.min(surr1, surr2)
    original_pg_loss = agg_loss(loss_mat=loss, loss_mask=final_response_mask, loss_agg_mode=mode,
                                batch_num_tokens=batch_num_tokens["final_response_mask"],
                                global_valid_samples=global_valid_samples["final_response_mask"])

    clipped_low = (ratio < 1 - pg_clip_low).float()
    clipped_high = (ratio > 1 + pg_clip_high).float()
    clipped = (clipped_low + clipped_high).float()

    n_final = batch_num_tokens["final_response_mask"]
    return {
        "actor/ppo_ratio_high_clipfrac": agg_loss(loss_mat=clipped_high, loss_mask=final_response_mask,
                                                  loss_agg_mode="token-mean", batch_num_tokens=n_final
                                                  ).detach().item(),
        "actor/ppo_ratio_low_clipfrac": agg_loss(loss_mat=clipped_low, loss_mask=final_response_mask,
                                                 loss_agg_mode="token-mean", batch_num_tokens=n_final
                                                 ).detach().item(),
        "actor/ppo_ratio_clipfrac": agg_loss(loss_mat=clipped, loss_mask=final_response_mask,
                                             loss_agg_mode="token-mean", batch_num_tokens=n_final).detach().item(),
        "actor/ratio_mean": agg_loss(loss_mat=ratio, loss_mask=response_mask, loss_agg_mode="seq-mean-token-mean",
                                     global_valid_samples=global_valid_samples["response_mask"]).detach().item(),
        "actor/ratio_max": torch.max(ratio * response_mask).detach().item(),
        "actor/ratio_min": torch.min(ratio * response_mask + (1 - response_mask) * 1e10).detach().item(),
        "actor/clipfrac": agg_loss(loss_mat=torch.lt(surr2, surr1).float(), loss_mask=response_mask,
                                   loss_agg_mode=mode, batch_num_tokens=n_final,
                                   global_valid_samples=global_valid_samples["response_mask"]).detach().item(),
        "actor/pg_loss": original_pg_loss.detach().item(),
        "actor/kl_loss": kl_loss.detach().item(),
        "actor/approxkl": agg_loss(loss_mat=approxkl, loss_mask=response_mask, loss_agg_mode=mode,
                                   batch_num_tokens=batch_num_tokens["response_mask"],
                                   global_valid_samples=global_valid_samples["response_mask"]).detach().item(),
        "actor/policykl": agg_loss(loss_mat=policykl, loss_mask=response_mask, loss_agg_mode=mode,
                                   batch_num_tokens=batch_num_tokens["response_mask"],
                                   global_valid_samples=global_valid_samples["response_mask"]).detach().item(),
    }


# -- roll/pipeline/base_worker.py:CriticWorker.loss_func ---------------------------------------------------------

def critic_metrics(batch: dict[str, torch.Tensor], *, value_clip: float) -> dict[str, float]:
    response_mask = batch["response_mask"]
    values, old_values, returns = batch["vpreds"], batch["values"], batch["returns"]
    values_clipped = torch.clip(values, old_values - value_clip, old_values + value_clip)
    surr1 = (values_clipped - returns) ** 2
    surr2 = (values - returns) ** 2
    vf_clipfrac = masked_mean(torch.gt(surr1, surr2).float(), response_mask, dim=-1).mean()
    loss = torch.max(surr1, surr2)
    vf_loss = 0.5 * masked_mean(loss, response_mask, dim=-1).mean()
    return {
        "critic/loss": vf_loss.detach().item(),
        "critic/value": (masked_mean(old_values, response_mask, dim=-1)).mean().detach().item(),
        "critic/vpred": (masked_mean(values, response_mask, dim=-1)).mean().detach().item(),
        "critic/clipfrac": vf_clipfrac.detach().item(),
        "critic/error": masked_mean((values - returns) ** 2, response_mask, dim=-1).mean().detach().item(),
    }


# -- roll/utils/metrics/metrics_manager.py:add_values_metrics, rlvr/agentic pipeline data metrics ----------------

def data_metrics(batch: dict[str, torch.Tensor], prefix: str = "critic") -> dict[str, float]:
    metrics: dict[str, float] = {}
    sequence_score = batch["scores"]
    sequence_reward = batch["token_level_rewards"].sum(-1)
    sequence_reward_mean = batch["token_level_rewards"].mean(-1)
    advantages, returns = batch["advantages"], batch["returns"]
    response_mask = batch["final_response_mask"].clone().bool()

    metrics[f"{prefix}/score/mean"] = torch.mean(sequence_score).detach().item()
    metrics[f"{prefix}/score/max"] = torch.max(sequence_score).detach().item()
    metrics[f"{prefix}/score/min"] = torch.min(sequence_score).detach().item()

    metrics[f"{prefix}/rewards/mean"] = torch.mean(sequence_reward).detach().item()
    metrics[f"{prefix}/rewards/max"] = torch.max(sequence_reward).detach().item()
    metrics[f"{prefix}/rewards/min"] = torch.min(sequence_reward).detach().item()
    metrics[f"{prefix}/token_level_rewards_mean/mean"] = torch.mean(sequence_reward_mean).detach().item()
    metrics[f"{prefix}/token_level_rewards_mean/max"] = torch.max(sequence_reward_mean).detach().item()
    metrics[f"{prefix}/token_level_rewards_mean/min"] = torch.min(sequence_reward_mean).detach().item()

    metrics[f"{prefix}/advantages/mean"] = masked_mean(advantages, response_mask).detach().item()
    if torch.any(response_mask):
        metrics[f"{prefix}/advantages/max"] = torch.max(advantages[response_mask]).detach().item()
        metrics[f"{prefix}/advantages/min"] = torch.min(advantages[response_mask]).detach().item()

    metrics[f"{prefix}/returns/mean"] = masked_mean(returns, response_mask).detach().item()
    if torch.any(response_mask):
        metrics[f"{prefix}/returns/max"] = torch.max(returns[response_mask]).detach().item()
        metrics[f"{prefix}/returns/min"] = torch.min(returns[response_mask]).detach().item()

    if "values" in batch:
        values = batch["values"]
        metrics[f"{prefix}/values/mean"] = masked_mean(values, response_mask).detach().item()
        if torch.any(response_mask):
            metrics[f"{prefix}/values/max"] = torch.max(values[response_mask]).detach().item()
            metrics[f"{prefix}/values/min"] = torch.min(values[response_mask]).detach().item()

    # rlvr_pipeline.py: meta_info["agg_entropy"] = agg_loss(entropy, response_mask, "token-mean")
    metrics[f"{prefix}/entropy/mean"] = agg_loss(loss_mat=batch["entropy"], loss_mask=batch["response_mask"],
                                                 loss_agg_mode="token-mean").item()
    # agentic_pipeline.py: masked_mean over response_mask; per-row lengths
    metrics[f"{prefix}/old_log_prob/mean"] = masked_mean(batch["old_log_probs"], batch["response_mask"]).item()
    metrics[f"{prefix}/ref_log_prob/mean"] = masked_mean(batch["ref_log_probs"], batch["response_mask"]).item()
    response_length = batch["response_mask"].sum(-1).float()
    prompt_length = batch["prompt_mask"].sum(-1).float()
    for name, length in (("tokens/response_length", response_length), ("tokens/prompt_length", prompt_length)):
        metrics[f"{name}/mean"] = torch.mean(length).detach().item()
        metrics[f"{name}/max"] = torch.max(length).detach().item()
        metrics[f"{name}/min"] = torch.min(length).detach().item()
    return metrics


# -- one step --------------------------------------------------------------------------------------------------

def step_metrics(batch: dict[str, torch.Tensor], *, pg_clip_low: float, pg_clip_high: float, value_clip: float,
                 loss_agg_mode: str = "seq-mean-token-mean") -> dict[str, float]:
    """One step's metrics: the actor's and the critic's ``loss_func`` and the driver's data metrics (the batch
    taken as one mini-batch and one micro-batch, on one rank)."""
    return {**actor_metrics(batch, pg_clip_low=pg_clip_low, pg_clip_high=pg_clip_high, loss_agg_mode=loss_agg_mode),
            **critic_metrics(batch, value_clip=value_clip), **data_metrics(batch)}
