"""PPO/critic/token statistics of a batch in one fused pass: every scalar (and histogram) crosses to the host once.

ROLL's actor worker and veRL's ``compute_data_metrics`` call ``.item()`` once a metric (12-29 host syncs a
micro-batch on a GPU). :func:`ppo_stats` computes the same keys with the same definitions on the device, stacks
the results into one float64 vector and calls ``.tolist()`` once.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

import torch

from rl_otel._internal.pipeline.histogram import BucketCounts
from rl_otel.catalog import Catalog, default_catalog
from rl_otel.stats import masked
from rl_otel.stats.histogram import as_float, bucket_vector

KL_PENALTIES = ("kl", "abs", "mse", "k3", "low_var_kl")
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean")
NAME_SETS = ("roll", "trl", "verl")
IMPORTANCE_SAMPLING = ("token", "seq")
ROLL_RATIO_MIN_FILL = 1e10  # ROLL's actor/ratio_min: min(ratio * mask + (1 - mask) * 1e10)
VERL_CLIP_RATIO_C = 3.0  # veRL's default dual-clip bound (ActorConfig.clip_ratio_c)


def kl_penalty_terms(log_probs: torch.Tensor, base_log_probs: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL estimate of ``log_probs`` against ``base_log_probs`` (ROLL's ``compute_approx_kl``, veRL's
    ``kl_penalty``).

    ``kl``: k1 = logp - logp_base; ``abs``: |k1|; ``mse``: k2 = k1^2 / 2; ``k3``/``low_var_kl``:
    exp(-k1) + k1 - 1 clamped to [-10, 10], with -k1 clamped to [-20, 20] first as veRL does (ROLL does not
    clamp -k1; for finite inputs the two agree, the result being clamped to 10 either way beyond |k1| = 20).
    """
    if kind in ("k3", "low_var_kl"):
        neg = (base_log_probs - log_probs).clamp_(-20.0, 20.0)  # -k1, exactly: a - b == -(b - a)
        return neg.exp().sub_(neg).sub_(1.0).clamp_(-10.0, 10.0)  # exp(-k1) - (-k1) - 1, in place
    log_ratio = log_probs - base_log_probs
    if kind == "kl":
        return log_ratio
    if kind == "abs":
        return log_ratio.abs()
    if kind == "mse":
        return 0.5 * log_ratio.square()
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
    final_response_mask: torch.Tensor | None = None,
    advantages: torch.Tensor | None = None,
    ref_log_probs: torch.Tensor | None = None,
    values: torch.Tensor | None = None,
    returns: torch.Tensor | None = None,
    vpreds: torch.Tensor | None = None,
    rewards: torch.Tensor | None = None,
    scores: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    prompt_mask: torch.Tensor | None = None,
    response_lengths: torch.Tensor | None = None,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float | None = None,
    value_clip: float | None = None,
    kl_penalty: str = "k3",
    kl_coef: float | None = None,
    loss_agg_mode: str = "token-mean",
    importance_sampling: str = "token",
    names: str | Iterable[str] = "roll",
    distributions: bool | Literal["tensors"] = False,
    catalog: Catalog | None = None,
    _compact: bool | None = None,
) -> dict[str, float | BucketCounts | torch.Tensor]:
    """PPO, critic and token statistics of one batch, computed on the tensors' device with one host transfer.

    Each name set gives that framework's keys with that framework's definitions, so a value equals what the
    framework logs for the same tensors (to float rounding; the tests compare against ROLL's definitions and
    against veRL's own functions):

    - ``"roll"``: ROLL's RLVR actor worker (``roll/pipeline/rlvr/actor_worker.py`` ``loss_func``), critic
      worker (``base_worker.py`` ``CriticWorker.loss_func``) and driver data metrics
      (``metrics_manager.add_values_metrics``; agentic ``tokens/*``). The batch is taken as one ROLL mini-batch,
      its own token and sequence counts being ROLL's global ``batch_num_tokens`` / ``global_valid_samples``:
      ROLL's ``@sum``/``@max``/``@min`` over that mini-batch's micro-batches and ranks give the same number
      (ROLL then averages over optimizer steps; its critic worker averages per-micro-batch values).

      * ``actor/ppo_ratio_{high,low}_clipfrac``, ``actor/ppo_ratio_clipfrac``: token-mean whatever
        ``loss_agg_mode``: clipped tokens of ``response_mask`` over the token count of ``final_response_mask``
        (ROLL's token-mean sums every position; its log-probs are zero off ``response_mask``). With
        ``importance_sampling="seq"`` a clipped sequence counts all ``T`` positions, padding included, as in
        ROLL (the value can exceed 1).
      * ``actor/ratio_mean``: seq-mean-token-mean over ``response_mask`` whatever ``loss_agg_mode``;
        ``actor/ratio_max`` = ``max(ratio * response_mask)`` (0 at unmasked positions);
        ``actor/ratio_min`` = ``min`` with unmasked positions reading 1e10.
      * ``actor/clipfrac``: ``loss_agg_mode`` over ``response_mask`` (token-mean divided by the
        ``final_response_mask`` token count, seq-mean by the ``response_mask`` sequence count);
        ``actor/pg_loss`` (``-min(surr1, surr2)``, dual-clipped at ``clip_ratio_c`` if given; token-mean sums it
        over ``response_mask``, ROLL's advantages being zero off ``final_response_mask``) and ``actor/kl_loss``
        (``kl_penalty``, ROLL's k3 by default, on ``final_response_mask``): ``loss_agg_mode`` with
        ``final_response_mask`` denominators; ``actor/approxkl`` (k2) and ``actor/policykl`` (k1):
        ``loss_agg_mode`` over ``response_mask``. A seq-mean over no sequence is 0 (ROLL's ``+ 1e-8``).
      * ``critic/advantages|returns|values/*``: tokens of ``final_response_mask`` (mean 0 when empty, as ROLL's
        ``masked_mean``; max/min NaN where ROLL leaves them out); ``critic/rewards/*`` and
        ``critic/token_level_rewards_mean/*`` (``[B, T]`` rewards): per sequence, the rewards' sum (mean over
        the ``T`` positions) on ``final_response_mask`` (ROLL zeroes the rewards elsewhere; a ``[B]`` reward of
        a sequence with no such token reads 0); ``critic/score/*`` over all sequences.
      * ``critic/entropy/mean`` (token-mean), ``critic/ref_log_prob/mean``, ``critic/old_log_prob/mean`` over
        ``response_mask``; their ``/max`` and ``/min`` are rl_otel's additions.
      * ``critic/value`` (``values``), ``critic/vpred`` (``vpreds``), ``critic/error`` (``(vpreds - returns)^2``,
        ``values`` standing in without ``vpreds``), ``critic/loss`` (``vpreds``; half the error, or of
        ``max(error, clipped error)`` with ``value_clip``) and ``critic/clipfrac`` (``value_clip``, ``values`` and
        ``vpreds``): each sequence's token mean over ``response_mask``, averaged over all ``B`` sequences, one
        without tokens counting 0 (ROLL logs the squared error as ``critic/clipfrac`` when there is no
        ``value_clip``; rl_otel leaves the key out).
      * ``tokens/response_length/*``, ``tokens/prompt_length/*``: over all sequences (ROLL agentic).
      * Left out: ``weighted_pg_loss`` and ``total_loss`` (sample weights, loss coefficients), the train/infer
        correction (its IS weights and ``filter_mask``: pass the filtered masks), ``token/*`` (RLVR).

    - ``"verl"`` (veRL 0.9.1): ``compute_data_metrics`` and the vanilla policy loss
      (``core_algos.compute_policy_loss_vanilla``).

      * ``critic/score/*`` (``scores``, or ``[B, T]`` token-level scores) and ``critic/rewards/*`` over the
        sequences that are not aborted (response length 0); NaN when all are. ``[B, T]`` tensors are summed
        over all ``T`` positions as veRL sums them (a multi-turn score can sit on a tool-output token, outside
        ``response_mask``), so their padding must be 0, as veRL's is.
      * ``critic/advantages|returns|values/*`` over the tokens of ``response_mask``; ``critic/vf_explained_var``
        = ``1 - var(returns - values) / (var(returns) + 1e-5)`` (unbiased variances; ``values`` and
        ``returns`` given).
      * ``response_length/{mean,max,min,clip_ratio}`` over all sequences (``clip_ratio``: length == ``T``),
        ``response_length_non_aborted/*`` over the others, ``response/aborted_ratio``,
        ``prompt_length/{mean,max,min,clip_ratio}`` (``prompt_mask`` given; clip at its width ``P``). The
        lengths are ``response_lengths`` if given (veRL counts ``attention_mask``, which in multi-turn rollouts
        also holds the tool-output tokens that ``response_mask`` leaves out), else ``response_mask``'s.
      * ``actor/pg_clipfrac``, ``actor/pg_clipfrac_lower`` (dual clip at ``clip_ratio_c``, default 3.0),
        ``actor/ppo_kl``: token masked means over ``response_mask`` whatever ``loss_agg_mode``, with the
        log-ratio clamped to ±20 (0 for an empty mask, veRL's ``+ 1e-8``); ``actor/pg_loss``, ``actor/kl_loss``
        (``ref_log_probs`` given; ``kl_penalty``: k3 is veRL's default ``low_var_kl``) and ``actor/entropy``
        (``entropy`` given): ``loss_agg_mode`` over ``response_mask``. The batch is taken as one micro-batch on
        one rank, as veRL computes ``actor/entropy`` on the driver; its workers average the policy-loss metrics
        over micro-batches (``pg_loss``/``kl_loss``, normalised globally, are summed).

    - ``"trl"``: TRL's legacy ``PPOTrainer`` ``ppo/*``, ``objective/*``, ``env/*``, ``tokens/*`` keys; the
      ``loss_agg_mode`` applies to its clip fractions and KLs.

    ``"roll"`` and ``"verl"`` share keys with different definitions and cannot be asked for together.

    Args:
        log_probs: ``[B, T]`` log-probabilities of the taken tokens under the policy being optimized.
        old_log_probs: ``[B, T]`` the same under the policy that generated the batch (the rollout).
        response_mask: ``[B, T]`` nonzero on response tokens; padding is never counted, even if it is NaN.
        final_response_mask: ``[B, T]`` ROLL's ``final_response_mask``: ``response_mask`` with the sequences
            dropped by its sample-level masks zeroed (default: ``response_mask``); its positions outside
            ``response_mask`` are ignored. Used by the ROLL keys only.
        advantages, values, returns, vpreds, entropy, ref_log_probs: optional ``[B, T]`` token tensors; ``values``
            are the rollout's value estimates, ``vpreds`` the critic's predictions being optimized.
        rewards: per-sequence ``[B]`` or token-level ``[B, T]`` rewards (summed over the response).
        scores: ``[B]`` raw reward-model / environment scores, or ``[B, T]`` token-level scores (summed).
        prompt_mask: ``[B, P]`` nonzero on prompt tokens (prompt lengths).
        response_lengths: ``[B]`` response lengths, for veRL's length keys (default: ``response_mask``'s).
        clip_ratio_low, clip_ratio_high: PPO ratio clip range ``[1 - low, 1 + high]`` (0.2 as ROLL's ``pg_clip``
            and veRL's ``clip_ratio``; ``high`` defaults to ``low``).
        clip_ratio_c: dual-clip bound for negative advantages (veRL's ``clip_ratio_c``, default 3.0; ROLL's
            ``dual_clip_loss`` bound is ``1 + 2 * pg_clip``, off by default). value_clip: the critic's clip range
            around ``values``.
        kl_penalty: estimator of ``actor/kl_loss`` against ``ref_log_probs``: ``kl``, ``abs``, ``mse``, ``k3``
            (ROLL's, and veRL's default ``low_var_kl``).
        kl_coef: the KL coefficient (TRL's ``objective/kl_coef`` and ``ppo/mean_non_score_reward``).
        loss_agg_mode: ``token-mean`` or ``seq-mean-token-mean`` (per-sequence mean, then mean over sequences);
            which keys follow it is listed above.
        importance_sampling: ROLL's ``importance_sampling``: ``token`` ratios, or ``seq``: one ratio a sequence,
            ``exp`` of the mean log-ratio over ``final_response_mask``, broadcast to its tokens (ROLL keys only).
        names: some of ``"roll"``, ``"trl"``, ``"verl"``: which keys to return.
        distributions: ``True`` adds histograms (``actor/ratio_dist``, ``ppo/policy/ratio``, ...; ROLL and TRL
            keys) as :class:`BucketCounts` against the catalog's buckets, read back in the same single transfer
            (Prometheus histograms; trackers get no values to draw from); ``"tensors"`` adds them as 1-d tensors
            of the selected values instead, for Prometheus and trackers (a boolean index: one more sync each on
            a GPU).
        catalog: where the histograms' bucket bounds come from (default: :func:`rl_otel.default_catalog`); use
            the catalog ``Telemetry`` was created with.

    Returns:
        ``{key: float}`` of the name sets asked for, plus the distributions asked for. Where the framework's own
        definition gives a number for an empty selection (0 from a ``+ 1e-8`` denominator, ROLL's 1e10 fill)
        the key has it; any other statistic of an empty selection is NaN. NaN inputs propagate (an alert must
        see them). Pass the result to ``Telemetry.log``.
    """
    sets = {names} if isinstance(names, str) else set(names)
    if not sets or not sets <= set(NAME_SETS):
        raise ValueError(f"names must be some of {NAME_SETS}, got {names!r}")
    if {"roll", "verl"} <= sets:
        raise ValueError(f"names: 'roll' and 'verl' share keys with different definitions; ask for one, got {names!r}")
    if kl_penalty not in KL_PENALTIES:
        raise ValueError(f"kl_penalty must be one of {KL_PENALTIES}, got {kl_penalty!r}")
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"loss_agg_mode must be one of {LOSS_AGG_MODES}, got {loss_agg_mode!r}")
    if importance_sampling not in IMPORTANCE_SAMPLING:
        raise ValueError(f"importance_sampling must be one of {IMPORTANCE_SAMPLING}, got {importance_sampling!r}")
    if clip_ratio_c is not None and not clip_ratio_c > 1.0:
        raise ValueError(f"clip_ratio_c must be greater than 1, got {clip_ratio_c!r}")
    if distributions not in (False, True, "tensors"):
        raise ValueError(f"distributions must be False, True or 'tensors', got {distributions!r}")
    if log_probs.dim() != 2:
        raise ValueError(f"log_probs must be [batch, tokens], got shape {tuple(log_probs.shape)}")
    for name, t in (("old_log_probs", old_log_probs), ("response_mask", response_mask),
                    ("final_response_mask", final_response_mask), ("advantages", advantages),
                    ("ref_log_probs", ref_log_probs), ("values", values), ("returns", returns), ("vpreds", vpreds),
                    ("entropy", entropy)):
        if t is not None and t.shape != log_probs.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, log_probs {tuple(log_probs.shape)}")
    if response_lengths is not None and response_lengths.numel() != log_probs.shape[0]:
        raise ValueError(f"response_lengths has shape {tuple(response_lengths.shape)}, batch {log_probs.shape[0]}")
    clip_ratio_high = clip_ratio_low if clip_ratio_high is None else clip_ratio_high
    if final_response_mask is response_mask:
        final_response_mask = None

    with torch.no_grad():
        return _compute(inputs=dict(
            log_probs=log_probs, old_log_probs=old_log_probs, response_mask=response_mask,
            final_response_mask=final_response_mask, advantages=advantages, ref_log_probs=ref_log_probs,
            values=values, returns=returns, vpreds=vpreds, rewards=rewards, scores=scores, entropy=entropy,
            prompt_mask=prompt_mask, response_lengths=response_lengths),
            clip_low=clip_ratio_low, clip_high=clip_ratio_high, clip_c=clip_ratio_c, value_clip=value_clip,
            kl_penalty=kl_penalty, kl_coef=kl_coef, seq_mean=loss_agg_mode == "seq-mean-token-mean",
            seq_is=importance_sampling == "seq", roll="roll" in sets, trl="trl" in sets, verl="verl" in sets,
            distributions=distributions, catalog=catalog or default_catalog(), compact=_compact)


def _compute(*, inputs: dict[str, torch.Tensor | None], clip_low: float, clip_high: float, clip_c: float | None,
             value_clip: float | None, kl_penalty: str, kl_coef: float | None, seq_mean: bool, seq_is: bool,
             roll: bool, trl: bool, verl: bool, distributions: bool | str, catalog: Catalog, compact: bool | None
             ) -> dict[str, float | BucketCounts | torch.Tensor]:
    a = inputs
    sel = masked.Selection(a["response_mask"], compact)
    out = _Batch(catalog, per_part=sel.compact)
    tensors: dict[str, torch.Tensor] = {}
    width = sel.shape[-1]
    nan = float("nan")

    def tok(name: str) -> torch.Tensor | None:
        """An optional ``[B, T]`` input as a 1-d tensor over the response tokens (see ``Selection.take``)."""
        t = a[name]
        return None if t is None else as_float(sel.take(t))

    def dist(key: str, x: torch.Tensor, per_token: bool, within: torch.Tensor | None = None) -> None:
        if distributions == "tensors":
            if not per_token:
                tensors[key] = x
            else:
                tensors[key] = sel.select(x) if within is None else x[within]
        elif distributions:
            mask = (sel.dist_mask if within is None else within) if per_token else None
            out.put_dist(key, x, mask)

    def agg(x: torch.Tensor) -> torch.Tensor:
        return sel.seq_mean(x) if seq_mean else sel.mean(x)

    def family(prefix: str, x: torch.Tensor) -> None:
        lo, hi = sel.min_max(x)
        out.put(f"{prefix}/mean", sel.mean(x))
        out.put(f"{prefix}/max", hi)
        out.put(f"{prefix}/min", lo)

    def seq_nan(x: torch.Tensor) -> torch.Tensor:
        return x.new_full((), nan)

    def seq_mean_of(x: torch.Tensor) -> torch.Tensor:
        return x.mean() if x.numel() else seq_nan(x)

    def seq_family(prefix: str, x: torch.Tensor) -> None:
        lo, hi = torch.aminmax(x) if x.numel() else (seq_nan(x), seq_nan(x))
        out.put(f"{prefix}/mean", seq_mean_of(x))
        out.put(f"{prefix}/max", hi)
        out.put(f"{prefix}/min", lo)

    def seq_std(x: torch.Tensor) -> torch.Tensor:
        return x.std() if x.numel() > 1 else seq_nan(x)

    def per_seq(t: torch.Tensor, within: torch.Tensor | None = None) -> torch.Tensor:
        """A ``[B]`` or ``[B, T]`` input as ``[B]`` floats (``[B, T]``: summed over the selected tokens)."""
        t = t.detach()
        if t.dim() == 2:
            x = as_float(sel.take(t))
            return sel.row_sums(x if within is None else torch.where(within, x, 0.0))
        return as_float(t.reshape(-1))

    lp, old = tok("log_probs"), tok("old_log_probs")
    log_ratio = lp - old
    ratio = log_ratio.exp() if roll or trl else log_ratio  # veRL clamps the log-ratio first
    adv = tok("advantages")
    ref = tok("ref_log_probs")
    ent = tok("entropy")
    ret, val, vpr = tok("returns"), tok("values"), tok("vpreds")
    n_resp = sel.n

    if roll:
        # ROLL (roll/pipeline/rlvr/actor_worker.py loss_func; roll/utils/functionals.py agg_loss, masked_mean)
        fin = None if a["final_response_mask"] is None else sel.take_mask(a["final_response_mask"])
        n_fin = n_resp if fin is None else torch.count_nonzero(fin).to(torch.float32)
        if seq_is:  # one ratio a sequence: exp(masked_mean(log_ratio, final_response_mask, dim=-1))
            counts = sel.row_counts_within(fin)
            row_lr = sel.row_sums(log_ratio if fin is None else torch.where(fin, log_ratio, 0.0))
            seq_ratio = torch.where(counts > 0, row_lr / counts.clamp(min=1).to(row_lr.dtype), 0.0).exp()
            r_ratio = sel.per_row(seq_ratio)
            high_rows, low_rows = seq_ratio > 1.0 + clip_high, seq_ratio < 1.0 - clip_low
            n_high = torch.count_nonzero(high_rows) * width  # the ratio is broadcast over all T positions
            n_low = torch.count_nonzero(low_rows) * width
        else:
            r_ratio = ratio
            n_high, n_low = sel.sum(ratio > 1.0 + clip_high), sel.sum(ratio < 1.0 - clip_low)
        n_clipped = n_high + n_low  # clipped = clipped_low + clipped_high

        def roll_agg(x: torch.Tensor, within: torch.Tensor | None, n_tokens: torch.Tensor) -> torch.Tensor:
            """agg_loss with loss_agg_mode: token-mean sums x over response_mask (ROLL sums every position) and
            divides by ``n_tokens``; seq-mean-token-mean averages the sequences of ``within`` (0 if none)."""
            if seq_mean:
                return sel.seq_mean(x, within, empty=0.0)
            return sel.sum(x) / n_tokens

        n_resp_eps = n_resp + 1e-8  # float32: n itself for n >= 1
        n_fin_eps = n_resp_eps if fin is None else n_fin + 1e-8

        def roll_masked_mean(x: torch.Tensor, within: torch.Tensor | None) -> torch.Tensor:
            """ROLL's masked_mean: sum / (count + 1e-8) over the tokens (0 for none)."""
            if within is None:
                return sel.sum(x) / n_resp_eps
            return sel.sum(torch.where(within, x, 0.0)) / n_fin_eps

        def roll_family(prefix: str, x: torch.Tensor, within: torch.Tensor | None) -> None:
            lo, hi = sel.min_max(x, within)
            out.put(f"{prefix}/mean", roll_masked_mean(x, within))
            out.put(f"{prefix}/max", hi)
            out.put(f"{prefix}/min", lo)

        lo, hi = sel.min_max_fill(r_ratio, ROLL_RATIO_MIN_FILL, 0.0)
        out.put("actor/ratio_mean", sel.seq_mean(r_ratio, empty=0.0))
        out.put("actor/ratio_max", hi)
        out.put("actor/ratio_min", lo)
        out.put("actor/ppo_ratio_high_clipfrac", n_high / n_fin)
        out.put("actor/ppo_ratio_low_clipfrac", n_low / n_fin)
        out.put("actor/ppo_ratio_clipfrac", n_clipped / n_fin)
        if adv is not None:
            surr1 = r_ratio * adv
            surr2 = r_ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv
            roll_clipped = surr2 < surr1
            objective = torch.minimum(surr1, surr2)  # loss = -objective, negated after the sum (exact)
            if clip_c is not None:  # dual_clip_loss: -max(-loss, c * A) where A < 0
                objective = torch.where(adv < 0, torch.maximum(objective, clip_c * adv), objective)
            out.put("actor/clipfrac", roll_agg(roll_clipped, None, n_fin))
            out.put("actor/pg_loss", -roll_agg(objective, fin, n_fin))
        out.put("actor/approxkl", 0.5 * roll_agg(log_ratio.square(), None, n_resp))  # halving is exact
        out.put("actor/policykl", roll_agg(log_ratio, None, n_resp))  # compute_approx_kl(logp, logp_old, "kl")
        dist("actor/ratio_dist", r_ratio, True)
        dist("actor/log_prob_dist", lp, True)
        if ref is not None:
            kl = kl_penalty_terms(lp, ref, kl_penalty)
            out.put("actor/kl_loss", roll_agg(kl if fin is None else torch.where(fin, kl, 0.0), fin, n_fin))
            roll_family("critic/ref_log_prob", ref, None)
            dist("actor/kl_dist", lp - ref, True)
        roll_family("critic/old_log_prob", old, None)
        if ent is not None:
            family("critic/entropy", ent)  # agg_loss(entropy, response_mask, "token-mean")
        if adv is not None:
            roll_family("critic/advantages", adv, fin)
            dist("critic/advantages_dist", adv, True, fin)
        if ret is not None:
            roll_family("critic/returns", ret, fin)
        if val is not None:
            roll_family("critic/values", val, fin)
            out.put("critic/value", sel.mean_of_row_means(val))
        if vpr is not None:
            out.put("critic/vpred", sel.mean_of_row_means(vpr))
        pred = vpr if vpr is not None else val
        if ret is not None and pred is not None:
            err = (pred - ret).square()
            error = sel.mean_of_row_means(err)
            out.put("critic/error", error)
            if vpr is not None and val is not None and value_clip is not None:
                clipped = torch.maximum(torch.minimum(vpr, val + value_clip), val - value_clip)
                err_clipped = (clipped - ret).square()
                out.put("critic/clipfrac", sel.mean_of_row_means(err_clipped > err))
                out.put("critic/loss", 0.5 * sel.mean_of_row_means(torch.maximum(err, err_clipped)))
            elif vpr is not None:
                out.put("critic/loss", 0.5 * error)
        if a["rewards"] is not None:
            # token_level_rewards.sum(-1), the rewards zeroed off final_response_mask (compute_advantage)
            seq_rewards = per_seq(a["rewards"], fin)
            if a["rewards"].dim() != 2:
                seq_rewards = torch.where(sel.row_counts_within(fin) > 0, seq_rewards, 0.0)
            else:
                seq_family("critic/token_level_rewards_mean", seq_rewards / width)
            seq_family("critic/rewards", seq_rewards)
            dist("critic/rewards_dist", seq_rewards, False)

    if trl:
        if adv is not None:
            surr1 = ratio * adv
            surr2 = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv
            out.put("ppo/policy/clipfrac", agg(surr2 < surr1))
        out.put("ppo/policy/approxkl", 0.5 * agg(log_ratio.square()))
        out.put("ppo/policy/policykl", -agg(log_ratio))  # TRL: masked_mean(old_logprobs - logprobs)
        dist("ppo/policy/ratio", ratio, True)
        dist("objective/logprobs", old, True)
        if ref is not None:
            # TRL's objective/* describe the rollout: its log-probs against the reference, summed per sequence.
            kl_seq = sel.row_sums(old - ref)
            out.put("objective/kl", seq_mean_of(kl_seq))
            if kl_coef is not None:
                out.constants["objective/kl_coef"] = float(kl_coef)
                out.put("ppo/mean_non_score_reward", seq_mean_of(-float(kl_coef) * kl_seq))
            dist("objective/kl_dist", kl_seq, False)
            dist("objective/ref_logprobs", ref, True)
        out.put("objective/entropy", seq_mean_of(-sel.row_sums(old)))
        if ent is not None:
            out.put("ppo/policy/entropy", sel.mean(ent))
        if adv is not None:
            out.put("ppo/policy/advantages_mean", sel.mean(adv))
            dist("ppo/policy/advantages", adv, True)
        for x, prefix in ((ret, "ppo/returns"), (val, "ppo/val")):
            if x is not None:
                out.put(f"{prefix}/mean", sel.mean(x))
                out.put(f"{prefix}/var", sel.var(x, unbiased=True))
        if vpr is not None:
            out.put("ppo/val/vpred", sel.mean(vpr))
        pred = vpr if vpr is not None else val
        if ret is not None and pred is not None:
            err = (pred - ret).square()
            out.put("ppo/val/error", sel.mean(err))
            # Explained variance: a ratio of variances, so population and Bessel-corrected agree.
            out.put("ppo/val/var_explained", 1.0 - sel.var(ret - pred) / sel.var(ret))
            if vpr is not None and val is not None and value_clip is not None:
                clipped = torch.maximum(torch.minimum(vpr, val + value_clip), val - value_clip)
                out.put("ppo/val/clipfrac", agg((clipped - ret).square() > err))

    if verl:
        # veRL 0.9.1: core_algos.compute_policy_loss_vanilla (masked_mean = sum / (count + 1e-8)), agg_loss
        def verl_masked_mean(x: torch.Tensor) -> torch.Tensor:
            s = sel.sum(x)
            return s / (n_resp + 1e-8).to(s.dtype if s.is_floating_point() else torch.float32)

        neg_kl = log_ratio.clamp(-20.0, 20.0)
        out.put("actor/ppo_kl", verl_masked_mean(-neg_kl))
        if adv is not None:
            v_ratio = neg_kl.exp()
            losses1 = -adv * v_ratio
            losses2 = -adv * v_ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
            clip_losses1 = torch.maximum(losses1, losses2)
            losses3 = -adv * (VERL_CLIP_RATIO_C if clip_c is None else clip_c)
            negative = adv < 0
            out.put("actor/pg_clipfrac", verl_masked_mean(losses2 > losses1))
            out.put("actor/pg_clipfrac_lower", verl_masked_mean((clip_losses1 > losses3) & negative))
            out.put("actor/pg_loss", agg(torch.where(negative, torch.minimum(losses3, clip_losses1), clip_losses1)))
        if ref is not None:
            out.put("actor/kl_loss", agg(kl_penalty_terms(lp, ref, kl_penalty)))
        if ent is not None:
            out.put("actor/entropy", agg(ent))
        # metric_utils.compute_data_metrics
        lengths = (sel.row_counts if a["response_lengths"] is None else a["response_lengths"].detach().reshape(-1)
                   ).to(torch.float64)
        kept = lengths != 0  # aborted: response length 0
        n_kept = kept.sum().to(torch.float64)

        def kept_family(prefix: str, x: torch.Tensor, clip: bool = False) -> None:
            some = n_kept > 0
            out.put(f"{prefix}/mean", torch.where(kept, x, 0.0).sum() / n_kept)
            out.put(f"{prefix}/max", torch.where(some, torch.where(kept, x, -torch.inf).max(), nan)
                    if x.numel() else seq_nan(x))
            out.put(f"{prefix}/min", torch.where(some, torch.where(kept, x, torch.inf).min(), nan)
                    if x.numel() else seq_nan(x))
            if clip:
                out.put(f"{prefix}/clip_ratio", ((x == width) & kept).sum() / n_kept)

        for name, prefix in (("scores", "critic/score"), ("rewards", "critic/rewards")):
            if a[name] is not None:  # token_level_{scores,rewards}.sum(-1): every position, as veRL sums
                t = a[name].detach()
                kept_family(prefix, as_float(t).sum(-1) if t.dim() == 2 else as_float(t.reshape(-1)))
        for x, prefix in ((adv, "critic/advantages"), (ret, "critic/returns"), (val, "critic/values")):
            if x is not None:
                family(prefix, x)
        if ret is not None and val is not None:
            out.put("critic/vf_explained_var",
                    1.0 - sel.var(ret - val, unbiased=True) / (sel.var(ret, unbiased=True) + 1e-5))
        seq_family("response_length", lengths)
        out.put("response_length/clip_ratio", seq_mean_of((lengths == width).to(torch.float64)))
        kept_family("response_length_non_aborted", lengths, clip=True)
        out.put("response/aborted_ratio", seq_mean_of((~kept).to(torch.float64)))
        if a["prompt_mask"] is not None:
            pm = a["prompt_mask"].detach()
            prompt_len = pm.bool().sum(-1).to(torch.float64)
            seq_family("prompt_length", prompt_len)
            out.put("prompt_length/clip_ratio", seq_mean_of((prompt_len == pm.shape[-1]).to(torch.float64)))

    if a["scores"] is not None and (roll or trl):
        sc = per_seq(a["scores"])
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

    if roll or trl:
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
