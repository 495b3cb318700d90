"""PPO/critic/token statistics of a batch in one fused pass: every scalar (and histogram) crosses to the host once.

ROLL's actor worker and veRL's ``compute_data_metrics`` call ``.item()`` once a metric (12-29 host syncs a
micro-batch on a GPU). :func:`ppo_stats` computes the same family on the device, stacks the results into one
float64 vector and calls ``.tolist()`` once.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

import torch

from rl_otel.catalog import default_catalog
from rl_otel.core.histogram import BucketCounts
from rl_otel.stats import masked
from rl_otel.stats.histogram import as_float, bucket_vector

KL_PENALTIES = ("kl", "abs", "mse", "k3", "low_var_kl")
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean")
NAME_SETS = ("roll", "trl")


def kl_penalty_terms(log_probs: torch.Tensor, base_log_probs: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL estimate of ``log_probs`` against ``base_log_probs`` (ROLL's ``compute_approx_kl``).

    ``kl``: k1 = logp - logp_base; ``abs``: |k1|; ``mse``: k2 = k1^2 / 2; ``k3``/``low_var_kl``:
    exp(-k1) + k1 - 1, with -k1 clamped to [-20, 20] and the result to [-10, 10] as ROLL/veRL do.
    """
    log_ratio = log_probs - base_log_probs
    if kind == "kl":
        return log_ratio
    if kind == "abs":
        return log_ratio.abs()
    if kind == "mse":
        return 0.5 * log_ratio.square()
    if kind in ("k3", "low_var_kl"):
        neg = (-log_ratio).clamp(-20.0, 20.0)
        return (neg.exp() - neg - 1.0).clamp(-10.0, 10.0)
    raise ValueError(f"kl_penalty must be one of {KL_PENALTIES}, got {kind!r}")


class _Batch:
    """Scalars and bucketed distributions collected on the device, read back with one transfer."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.parts: list[torch.Tensor] = []
        self.layout: list[tuple[str, tuple[float, ...] | None]] = []

    def put(self, key: str, value: torch.Tensor) -> None:
        self.parts.append(value.reshape(1).to(torch.float64))
        self.layout.append((key, None))

    def put_dist(self, key: str, values: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        bounds = default_catalog().lookup(key).spec.buckets
        self.parts.append(bucket_vector(values, bounds, mask))
        self.layout.append((key, bounds))

    def read(self) -> dict[str, float | BucketCounts]:
        if not self.parts:
            return {}
        flat = torch.cat(self.parts).tolist()  # the one device -> host transfer
        out: dict[str, float | BucketCounts] = {}
        pos = 0
        for key, bounds in self.layout:
            if bounds is None:
                out[key] = flat[pos]
                pos += 1
            else:
                size = len(bounds) + 5
                out[key] = BucketCounts.from_vector(bounds, flat[pos:pos + size])
                pos += size
        return out


def ppo_stats(
    *,
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    advantages: torch.Tensor | None = None,
    ref_log_probs: torch.Tensor | None = None,
    values: torch.Tensor | None = None,
    returns: torch.Tensor | None = None,
    vpreds: torch.Tensor | None = None,
    rewards: torch.Tensor | None = None,
    scores: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    prompt_mask: torch.Tensor | None = None,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float | None = None,
    value_clip: float | None = None,
    kl_penalty: str = "kl",
    kl_coef: float | None = None,
    loss_agg_mode: str = "token-mean",
    names: str | Iterable[str] = "roll",
    distributions: bool | Literal["tensors"] = False,
) -> dict[str, float | BucketCounts | torch.Tensor]:
    """PPO, critic and token statistics of one batch, computed on the tensors' device with one host transfer.

    Args:
        log_probs: ``[B, T]`` log-probabilities of the taken tokens under the policy being optimized.
        old_log_probs: ``[B, T]`` the same under the policy that generated the batch (the rollout).
        response_mask: ``[B, T]`` nonzero on response tokens; padding is never counted, even if it is NaN.
        advantages, values, returns, vpreds, entropy, ref_log_probs: optional ``[B, T]`` token tensors; ``values``
            are the rollout's value estimates, ``vpreds`` the critic's predictions being optimized.
        rewards: per-sequence ``[B]`` or token-level ``[B, T]`` rewards (summed over the response).
        scores: ``[B]`` raw reward-model / environment scores.
        prompt_mask: ``[B, P]`` nonzero on prompt tokens (prompt lengths).
        clip_ratio_low, clip_ratio_high: PPO ratio clip range ``[1 - low, 1 + high]`` (ROLL's default 0.2;
            ``high`` defaults to ``low``). value_clip: the critic's clip range around ``values``.
        kl_penalty: estimator of ``actor/kl_loss`` against ``ref_log_probs``: ``kl``, ``abs``, ``mse``, ``k3``.
        kl_coef: the KL coefficient (TRL's ``objective/kl_coef`` and ``ppo/mean_non_score_reward``).
        loss_agg_mode: ``token-mean`` (every response token weighs the same) or ``seq-mean-token-mean``
            (ROLL's aggregation for ``actor/ratio_mean``, clipfrac and KL: per-sequence mean, then mean).
        names: ``"roll"``, ``"trl"`` or both: which keys to return.
        distributions: ``True`` adds histograms (``actor/ratio_dist``, ``ppo/policy/ratio``, ...) as
            :class:`BucketCounts` against the catalog's buckets, read back in the same single transfer;
            ``"tensors"`` adds them as 1-d tensors of the selected values instead (a boolean index: one more
            sync each on a GPU).

    Returns:
        ``{key: float}`` with ROLL's ``actor/*``, ``critic/*``, ``tokens/*`` keys and/or TRL's ``ppo/*``,
        ``objective/*``, ``env/*``, ``tokens/*`` keys, plus the distributions asked for. A statistic of an empty
        selection is NaN; NaN inputs propagate (an alert must see them). Pass the result to ``Telemetry.log``.
    """
    sets = {names} if isinstance(names, str) else set(names)
    if not sets or not sets <= set(NAME_SETS):
        raise ValueError(f"names must be some of {NAME_SETS}, got {names!r}")
    if kl_penalty not in KL_PENALTIES:
        raise ValueError(f"kl_penalty must be one of {KL_PENALTIES}, got {kl_penalty!r}")
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"loss_agg_mode must be one of {LOSS_AGG_MODES}, got {loss_agg_mode!r}")
    if distributions not in (False, True, "tensors"):
        raise ValueError(f"distributions must be False, True or 'tensors', got {distributions!r}")
    if log_probs.dim() != 2:
        raise ValueError(f"log_probs must be [batch, tokens], got shape {tuple(log_probs.shape)}")
    for name, t in (("old_log_probs", old_log_probs), ("response_mask", response_mask),
                    ("advantages", advantages), ("ref_log_probs", ref_log_probs), ("values", values),
                    ("returns", returns), ("vpreds", vpreds), ("entropy", entropy)):
        if t is not None and t.shape != log_probs.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, log_probs {tuple(log_probs.shape)}")
    clip_ratio_high = clip_ratio_low if clip_ratio_high is None else clip_ratio_high
    roll, trl = "roll" in sets, "trl" in sets

    with torch.no_grad():
        out = _Batch(log_probs.device)
        tensors: dict[str, torch.Tensor] = {}

        def dist(key: str, x: torch.Tensor, sel: torch.Tensor | None) -> None:
            if distributions == "tensors":
                tensors[key] = (x if sel is None else x[sel]).detach()
            elif distributions:
                out.put_dist(key, x, sel)

        m = response_mask.detach().bool()
        n_tok = masked.count(m)
        rows = torch.ones(m.shape[0], dtype=torch.bool, device=m.device)

        def agg(x: torch.Tensor) -> torch.Tensor:
            if loss_agg_mode == "token-mean":
                return masked.mean(x, m, n_tok)
            return masked.seq_mean_token_mean(x, m)

        def family(prefix: str, x: torch.Tensor, sel: torch.Tensor, n: torch.Tensor | None = None) -> None:
            out.put(f"{prefix}/mean", masked.mean(x, sel, n))
            out.put(f"{prefix}/max", masked.maximum(x, sel, n))
            out.put(f"{prefix}/min", masked.minimum(x, sel, n))

        lp = as_float(log_probs.detach())
        old = as_float(old_log_probs.detach())
        log_ratio = lp - old
        ratio = log_ratio.exp()
        high = ratio > 1.0 + clip_ratio_high
        low = ratio < 1.0 - clip_ratio_low
        adv = None if advantages is None else as_float(advantages.detach())
        if adv is not None:
            surr1 = ratio * adv
            surr2 = ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high) * adv
            pg_clipped = (surr2 < surr1).to(lp.dtype)
        if roll:
            out.put("actor/ratio_mean", agg(ratio))
            out.put("actor/ratio_max", masked.maximum(ratio, m, n_tok))
            out.put("actor/ratio_min", masked.minimum(ratio, m, n_tok))
            out.put("actor/ppo_ratio_high_clipfrac", agg(high.to(lp.dtype)))
            out.put("actor/ppo_ratio_low_clipfrac", agg(low.to(lp.dtype)))
            out.put("actor/ppo_ratio_clipfrac", agg((high | low).to(lp.dtype)))
            if adv is not None:
                out.put("actor/clipfrac", agg(pg_clipped))
            out.put("actor/approxkl", agg(0.5 * log_ratio.square()))
            out.put("actor/policykl", agg(log_ratio))  # ROLL: compute_approx_kl(logp, logp_old, "kl")
            dist("actor/ratio_dist", ratio, m)
            dist("actor/log_prob_dist", lp, m)
        if trl:
            if adv is not None:
                out.put("ppo/policy/clipfrac", agg(pg_clipped))
            out.put("ppo/policy/approxkl", agg(0.5 * log_ratio.square()))
            out.put("ppo/policy/policykl", agg(-log_ratio))  # TRL: masked_mean(old_logprobs - logprobs)
            dist("ppo/policy/ratio", ratio, m)
            dist("objective/logprobs", old, m)

        if ref_log_probs is not None:
            ref = as_float(ref_log_probs.detach())
            if roll:
                out.put("actor/kl_loss", agg(kl_penalty_terms(lp, ref, kl_penalty)))
                family("critic/ref_log_prob", ref, m, n_tok)
                dist("actor/kl_dist", lp - ref, m)
            if trl:
                # TRL's objective/* describe the rollout: its log-probs against the reference, summed per sequence.
                kl_seq = masked.total_rows(old - ref, m)
                out.put("objective/kl", kl_seq.mean())
                if kl_coef is not None:
                    out.put("objective/kl_coef", torch.tensor(float(kl_coef), device=lp.device))
                    out.put("ppo/mean_non_score_reward", (-float(kl_coef) * kl_seq).mean())
                dist("objective/kl_dist", kl_seq, None)
                dist("objective/ref_logprobs", ref, m)
        if trl:
            out.put("objective/entropy", (-masked.total_rows(old, m)).mean())
        if roll:
            family("critic/old_log_prob", old, m, n_tok)
        if entropy is not None:
            ent = as_float(entropy.detach())
            if roll:
                family("critic/entropy", ent, m, n_tok)
            if trl:
                out.put("ppo/policy/entropy", masked.mean(ent, m, n_tok))

        if adv is not None:
            if roll:
                family("critic/advantages", adv, m, n_tok)
                dist("critic/advantages_dist", adv, m)
            if trl:
                out.put("ppo/policy/advantages_mean", masked.mean(adv, m, n_tok))
                dist("ppo/policy/advantages", adv, m)
        ret = None if returns is None else as_float(returns.detach())
        val = None if values is None else as_float(values.detach())
        vpr = None if vpreds is None else as_float(vpreds.detach())
        if ret is not None:
            if roll:
                family("critic/returns", ret, m, n_tok)
            if trl:
                out.put("ppo/returns/mean", masked.mean(ret, m, n_tok))
                out.put("ppo/returns/var", masked.var(ret, m, n_tok, unbiased=True))
        if val is not None:
            if roll:
                family("critic/values", val, m, n_tok)
            if trl:
                out.put("ppo/val/mean", masked.mean(val, m, n_tok))
                out.put("ppo/val/var", masked.var(val, m, n_tok, unbiased=True))
        if vpr is not None:
            if roll:
                out.put("critic/vpred", masked.mean(vpr, m, n_tok))
            if trl:
                out.put("ppo/val/vpred", masked.mean(vpr, m, n_tok))
        pred = vpr if vpr is not None else val
        if ret is not None and pred is not None:
            err = (pred - ret).square()
            if roll:
                out.put("critic/error", masked.mean(err, m, n_tok))
            if trl:
                out.put("ppo/val/error", masked.mean(err, m, n_tok))
                # Explained variance: a ratio of variances, so population and Bessel-corrected agree.
                out.put("ppo/val/var_explained",
                        1.0 - masked.var(ret - pred, m, n_tok) / masked.var(ret, m, n_tok))
            if vpr is not None and val is not None and value_clip is not None:
                clipped = torch.maximum(torch.minimum(vpr, val + value_clip), val - value_clip)
                vf_clipped = ((clipped - ret).square() > err).to(lp.dtype)
                if roll:
                    out.put("critic/clipfrac", agg(vf_clipped))
                if trl:
                    out.put("ppo/val/clipfrac", agg(vf_clipped))

        if rewards is not None:
            rew = as_float(rewards.detach())
            seq_rewards = masked.total_rows(rew, m) if rew.dim() == 2 else rew.reshape(-1)
            if roll:
                family("critic/rewards", seq_rewards, rows[: seq_rewards.numel()])
                dist("critic/rewards_dist", seq_rewards, None)
        if scores is not None:
            sc = as_float(scores.detach()).reshape(-1)
            sc_rows = torch.ones_like(sc, dtype=torch.bool)
            if roll:
                family("critic/score", sc, sc_rows)
                dist("critic/score_dist", sc, None)
            if trl:
                mean, std = masked.mean(sc, sc_rows), masked.var(sc, sc_rows, unbiased=True).sqrt()
                out.put("env/reward_mean", mean)
                out.put("env/reward_std", std)
                out.put("ppo/mean_scores", mean)
                out.put("ppo/std_scores", std)
                dist("env/reward_dist", sc, None)

        resp_len = m.sum(-1).to(torch.float64)
        if roll:
            family("tokens/response_length", resp_len, rows)
            dist("tokens/response_length_dist", resp_len, None)
        if trl:
            out.put("tokens/responses_len_mean", masked.mean(resp_len, rows))
            out.put("tokens/responses_len_std", masked.var(resp_len, rows, unbiased=True).sqrt())
            dist("tokens/responses_dist", resp_len, None)
        if prompt_mask is not None:
            prompt_len = prompt_mask.detach().bool().sum(-1).to(torch.float64)
            p_rows = torch.ones_like(prompt_len, dtype=torch.bool)
            if roll:
                family("tokens/prompt_length", prompt_len, p_rows)
            if trl:
                out.put("tokens/queries_len_mean", masked.mean(prompt_len, p_rows))
                out.put("tokens/queries_len_std", masked.var(prompt_len, p_rows, unbiased=True).sqrt())
                dist("tokens/queries_dist", prompt_len, None)

        result: dict[str, float | BucketCounts | torch.Tensor] = dict(out.read())
        result.update(tensors)
        return result
