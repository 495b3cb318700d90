"""PPO/critic/token statistics of a batch in one fused pass: every scalar (and histogram) crosses to the host once.

ROLL's actor worker and veRL's ``compute_data_metrics`` call ``.item()`` once a metric (12-29 host syncs a
micro-batch on a GPU). :func:`ppo_stats` computes the same family on the device, stacks the results into one
float64 vector and calls ``.tolist()`` once.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

import torch

from rl_otel.catalog import Catalog, default_catalog
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

    def __init__(self, catalog: Catalog, per_part: bool = False) -> None:
        self.catalog = catalog
        self.per_part = per_part  # read each part where it is (the CPU path: there is no transfer to save)
        self.parts: list[torch.Tensor] = []
        self.layout: list[tuple[str, tuple[float, ...] | None]] = []
        self.constants: dict[str, float] = {}

    def put(self, key: str, value: torch.Tensor) -> None:
        self.parts.append(value)  # a 0-d tensor
        self.layout.append((key, None))

    def put_dist(self, key: str, values: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        bounds = self.catalog.lookup(key).spec.buckets
        self.parts.append(bucket_vector(values, bounds, mask))
        self.layout.append((key, bounds))

    def read(self) -> dict[str, float | BucketCounts]:
        out: dict[str, float | BucketCounts] = dict(self.constants)
        if not self.parts:
            return out
        if self.per_part:
            # on a CPU there is nothing to transfer: read each part where it is (a cat of ~70 mixed-dtype parts
            # costs ~100 us, ten times these reads); float() as the cat's promotion to a floating dtype gives
            flat = []
            for part in self.parts:
                flat.extend(map(float, part.reshape(-1).tolist()))
        else:  # the one device -> host transfer (cat promotes every part to the widest dtype)
            flat = torch.cat([part.reshape(-1) for part in self.parts]).tolist()
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
    catalog: Catalog | None = None,
    _compact: bool | None = None,
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
            :class:`BucketCounts` against the catalog's buckets, read back in the same single transfer
            (Prometheus histograms; trackers get no values to draw from); ``"tensors"`` adds them as 1-d tensors
            of the selected values instead, for Prometheus and trackers (a boolean index: one more sync each on
            a GPU).
        catalog: where the histograms' bucket bounds come from (default: :func:`rl_otel.default_catalog`); use
            the catalog ``Telemetry`` was created with.

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

    with torch.no_grad():
        return _compute(inputs=dict(
            log_probs=log_probs, old_log_probs=old_log_probs, response_mask=response_mask, advantages=advantages,
            ref_log_probs=ref_log_probs, values=values, returns=returns, vpreds=vpreds, rewards=rewards,
            scores=scores, entropy=entropy, prompt_mask=prompt_mask),
            clip_low=clip_ratio_low, clip_high=clip_ratio_high, value_clip=value_clip, kl_penalty=kl_penalty,
            kl_coef=kl_coef, seq_mean=loss_agg_mode == "seq-mean-token-mean", roll="roll" in sets,
            trl="trl" in sets, distributions=distributions, catalog=catalog or default_catalog(), compact=_compact)


def _compute(*, inputs: dict[str, torch.Tensor | None], clip_low: float, clip_high: float,
             value_clip: float | None, kl_penalty: str, kl_coef: float | None, seq_mean: bool, roll: bool, trl: bool,
             distributions: bool | str, catalog: Catalog, compact: bool | None
             ) -> dict[str, float | BucketCounts | torch.Tensor]:
    a = inputs
    sel = masked.Selection(a["response_mask"], compact)
    out = _Batch(catalog, per_part=sel.compact)
    tensors: dict[str, torch.Tensor] = {}

    def tok(name: str) -> torch.Tensor | None:
        """An optional ``[B, T]`` input as a 1-d tensor over the response tokens (see ``Selection.take``)."""
        t = a[name]
        return None if t is None else as_float(sel.take(t))

    def dist(key: str, x: torch.Tensor, per_token: bool) -> None:
        if distributions == "tensors":
            tensors[key] = sel.select(x) if per_token else x
        elif distributions:
            out.put_dist(key, x, sel.dist_mask if per_token else None)

    def agg(x: torch.Tensor) -> torch.Tensor:
        return sel.seq_mean(x) if seq_mean else sel.mean(x)

    def family(prefix: str, x: torch.Tensor) -> None:
        lo, hi = sel.min_max(x)
        out.put(f"{prefix}/mean", sel.mean(x))
        out.put(f"{prefix}/max", hi)
        out.put(f"{prefix}/min", lo)

    def nan(x: torch.Tensor) -> torch.Tensor:
        return x.new_full((), float("nan"))

    def seq_mean_of(x: torch.Tensor) -> torch.Tensor:
        return x.mean() if x.numel() else nan(x)

    def seq_family(prefix: str, x: torch.Tensor) -> None:
        lo, hi = torch.aminmax(x) if x.numel() else (nan(x), nan(x))
        out.put(f"{prefix}/mean", seq_mean_of(x))
        out.put(f"{prefix}/max", hi)
        out.put(f"{prefix}/min", lo)

    def seq_std(x: torch.Tensor) -> torch.Tensor:
        return x.std() if x.numel() > 1 else nan(x)

    lp, old = tok("log_probs"), tok("old_log_probs")
    log_ratio = lp - old
    ratio = log_ratio.exp()
    high = ratio > 1.0 + clip_high
    low = ratio < 1.0 - clip_low
    adv = tok("advantages")
    if adv is not None:
        surr1 = ratio * adv
        surr2 = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv
        pg_clipped = surr2 < surr1
    approxkl = agg(0.5 * log_ratio.square())
    policykl = agg(log_ratio)
    if roll:
        lo, hi = sel.min_max(ratio)
        out.put("actor/ratio_mean", agg(ratio))
        out.put("actor/ratio_max", hi)
        out.put("actor/ratio_min", lo)
        out.put("actor/ppo_ratio_high_clipfrac", agg(high))
        out.put("actor/ppo_ratio_low_clipfrac", agg(low))
        out.put("actor/ppo_ratio_clipfrac", agg(high | low))
        if adv is not None:
            out.put("actor/clipfrac", agg(pg_clipped))
        out.put("actor/approxkl", approxkl)
        out.put("actor/policykl", policykl)  # ROLL: compute_approx_kl(logp, logp_old, "kl")
        dist("actor/ratio_dist", ratio, True)
        dist("actor/log_prob_dist", lp, True)
    if trl:
        if adv is not None:
            out.put("ppo/policy/clipfrac", agg(pg_clipped))
        out.put("ppo/policy/approxkl", approxkl)
        out.put("ppo/policy/policykl", -policykl)  # TRL: masked_mean(old_logprobs - logprobs)
        dist("ppo/policy/ratio", ratio, True)
        dist("objective/logprobs", old, True)

    ref = tok("ref_log_probs")
    if ref is not None:
        if roll:
            out.put("actor/kl_loss", agg(kl_penalty_terms(lp, ref, kl_penalty)))
            family("critic/ref_log_prob", ref)
            dist("actor/kl_dist", lp - ref, True)
        if trl:
            # TRL's objective/* describe the rollout: its log-probs against the reference, summed per sequence.
            kl_seq = sel.row_sums(old - ref)
            out.put("objective/kl", seq_mean_of(kl_seq))
            if kl_coef is not None:
                out.constants["objective/kl_coef"] = float(kl_coef)
                out.put("ppo/mean_non_score_reward", seq_mean_of(-float(kl_coef) * kl_seq))
            dist("objective/kl_dist", kl_seq, False)
            dist("objective/ref_logprobs", ref, True)
    if trl:
        out.put("objective/entropy", seq_mean_of(-sel.row_sums(old)))
    if roll:
        family("critic/old_log_prob", old)
    ent = tok("entropy")
    if ent is not None:
        if roll:
            family("critic/entropy", ent)
        if trl:
            out.put("ppo/policy/entropy", sel.mean(ent))

    if adv is not None:
        if roll:
            family("critic/advantages", adv)
            dist("critic/advantages_dist", adv, True)
        if trl:
            out.put("ppo/policy/advantages_mean", sel.mean(adv))
            dist("ppo/policy/advantages", adv, True)
    ret, val, vpr = tok("returns"), tok("values"), tok("vpreds")
    for x, roll_prefix, trl_prefix in ((ret, "critic/returns", "ppo/returns"), (val, "critic/values", "ppo/val")):
        if x is None:
            continue
        if roll:
            family(roll_prefix, x)
        if trl:
            out.put(f"{trl_prefix}/mean", sel.mean(x))
            out.put(f"{trl_prefix}/var", sel.var(x, unbiased=True))
    if vpr is not None:
        if roll:
            out.put("critic/vpred", sel.mean(vpr))
        if trl:
            out.put("ppo/val/vpred", sel.mean(vpr))
    pred = vpr if vpr is not None else val
    if ret is not None and pred is not None:
        err = (pred - ret).square()
        error = sel.mean(err)
        if roll:
            out.put("critic/error", error)
        if trl:
            out.put("ppo/val/error", error)
            # Explained variance: a ratio of variances, so population and Bessel-corrected agree.
            out.put("ppo/val/var_explained", 1.0 - sel.var(ret - pred) / sel.var(ret))
        if vpr is not None and val is not None and value_clip is not None:
            clipped = torch.maximum(torch.minimum(vpr, val + value_clip), val - value_clip)
            vf_clipped = (clipped - ret).square() > err
            if roll:
                out.put("critic/clipfrac", agg(vf_clipped))
            if trl:
                out.put("ppo/val/clipfrac", agg(vf_clipped))

    if a["rewards"] is not None:
        rew = a["rewards"].detach()
        seq_rewards = sel.row_sums(as_float(sel.take(rew))) if rew.dim() == 2 else as_float(rew.reshape(-1))
        if roll:
            seq_family("critic/rewards", seq_rewards)
            dist("critic/rewards_dist", seq_rewards, False)
    if a["scores"] is not None:
        sc = as_float(a["scores"].detach().reshape(-1))
        if roll:
            seq_family("critic/score", sc)
            dist("critic/score_dist", sc, False)
        if trl:
            mean, std = seq_mean_of(sc), seq_std(sc)
            out.put("env/reward_mean", mean)
            out.put("env/reward_std", std)
            out.put("ppo/mean_scores", mean)
            out.put("ppo/std_scores", std)
            dist("env/reward_dist", sc, False)

    resp_len = sel.row_counts.to(torch.float64)
    if roll:
        seq_family("tokens/response_length", resp_len)
        dist("tokens/response_length_dist", resp_len, False)
    if trl:
        out.put("tokens/responses_len_mean", seq_mean_of(resp_len))
        out.put("tokens/responses_len_std", seq_std(resp_len))
        dist("tokens/responses_dist", resp_len, False)
    if a["prompt_mask"] is not None:
        prompt_len = a["prompt_mask"].detach().bool().sum(-1).to(torch.float64)
        if roll:
            seq_family("tokens/prompt_length", prompt_len)
        if trl:
            out.put("tokens/queries_len_mean", seq_mean_of(prompt_len))
            out.put("tokens/queries_len_std", seq_std(prompt_len))
            dist("tokens/queries_dist", prompt_len, False)

    result: dict[str, float | BucketCounts | torch.Tensor] = dict(out.read())
    result.update(tensors)
    return result
