"""PPO/critic/token statistics of a batch in one fused pass: every scalar (and histogram) crosses to the host once.

ROLL's actor worker and veRL's ``compute_data_metrics`` call ``.item()`` once a metric (12-29 host syncs a
micro-batch on a GPU). :func:`ppo_stats` computes the same keys with the same definitions on the device,
concatenates the results into one vector and calls ``.tolist()`` once. On a CPU, where nothing crosses, the
response tokens are gathered once (an index of the mask) and each 0-d result is read where it is; each section
gathers the inputs it needs and drops each after its last use (elementwise work in place where a temporary is
its own), so the peak memory stays below the frameworks' per-metric code (``benchmarks/bench_stats.py``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

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


def _clipped_error(vpreds: torch.Tensor, values: torch.Tensor, returns: torch.Tensor, clip: float) -> torch.Tensor:
    """``(max(min(vpreds, values + clip), values - clip) - returns)^2``, in two temporaries."""
    clipped = torch.minimum(vpreds, values + clip)
    low = values - clip
    torch.maximum(clipped, low, out=clipped)
    del low
    return clipped.sub_(returns).square_()


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
        resolved = self.catalog.lookup(key)
        if resolved is None:
            raise KeyError(f"{key!r} is not in the catalog: its histogram has no buckets")
        bounds = resolved.spec.buckets
        self.parts.append(bucket_vector(values, bounds, mask))
        self.layout.append((key, bounds))

    def read(self) -> dict[str, float | BucketCounts]:
        out: dict[str, float | BucketCounts] = dict(self.constants)
        if not self.parts:
            return out
        if self.per_part:
            # On a CPU there is nothing to transfer: each part is read where it is (``tolist()`` of a 0-d tensor,
            # ~0.3 us, where a cat of ~50 mixed-dtype parts costs ~150 us); float() as the cat's promotion to a
            # floating dtype gives.
            for (key, bounds), part in zip(self.layout, self.parts, strict=True):
                value: Any = part.tolist()
                out[key] = float(value) if bounds is None else BucketCounts.from_vector(bounds, value)
            return out
        # the one device -> host transfer (cat promotes every part to the widest dtype)
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
        return _compute(inputs={
            "log_probs": log_probs, "old_log_probs": old_log_probs, "response_mask": response_mask,
            "final_response_mask": final_response_mask, "advantages": advantages, "ref_log_probs": ref_log_probs,
            "values": values, "returns": returns, "vpreds": vpreds, "rewards": rewards, "scores": scores,
            "entropy": entropy, "prompt_mask": prompt_mask, "response_lengths": response_lengths},
            clip_low=clip_ratio_low, clip_high=clip_ratio_high, clip_c=clip_ratio_c, value_clip=value_clip,
            kl_penalty=kl_penalty, kl_coef=kl_coef, seq_mean=loss_agg_mode == "seq-mean-token-mean",
            seq_is=importance_sampling == "seq", roll="roll" in sets, trl="trl" in sets, verl="verl" in sets,
            distributions=distributions, catalog=catalog or default_catalog(), compact=_compact)


class _Stats:
    """One ``ppo_stats`` call: the selection, the values collected so far, and the helpers the sections share.

    Each section (:func:`_roll`, :func:`_trl`, :func:`_verl`, :func:`_sequences`) gathers the token inputs it needs
    when it needs them and drops each after its last use, so that at most a few token-sized tensors are alive at
    once (the peak memory stays below the frameworks' own per-metric code, whatever the share of response tokens).
    """

    def __init__(self, inputs: dict[str, torch.Tensor | None], *, compact: bool | None, catalog: Catalog,
                 distributions: bool | str, seq_mean: bool) -> None:
        self.a = inputs
        self.sel = masked.Selection(inputs["response_mask"], compact)  # type: ignore[arg-type]
        self.out = _Batch(catalog, per_part=self.sel.compact)
        self.tensors: dict[str, torch.Tensor] = {}
        self.width = self.sel.shape[-1]
        self.distributions = distributions
        self.seq_mean = seq_mean

    def tok(self, name: str) -> torch.Tensor | None:
        """An optional ``[B, T]`` input as a 1-d tensor over the response tokens (see ``Selection.take``)."""
        t = self.a[name]
        return None if t is None else as_float(self.sel.take(t))

    def put(self, key: str, value: torch.Tensor) -> None:
        self.out.put(key, value)

    def dist(self, key: str, x: torch.Tensor, per_token: bool, within: torch.Tensor | None = None) -> None:
        if self.distributions == "tensors":
            if not per_token:
                self.tensors[key] = x
            else:
                self.tensors[key] = self.sel.select(x) if within is None else x[within]
        elif self.distributions:
            mask = (self.sel.dist_mask if within is None else within) if per_token else None
            self.out.put_dist(key, x, mask)

    def agg(self, x: torch.Tensor) -> torch.Tensor:
        return self.sel.seq_mean(x) if self.seq_mean else self.sel.mean(x)

    def family(self, prefix: str, x: torch.Tensor) -> None:
        total, lo, hi = self.sel.sum_min_max(x)
        self.put(f"{prefix}/mean", total / self.sel.n.to(total.dtype))
        self.put(f"{prefix}/max", hi)
        self.put(f"{prefix}/min", lo)

    def seq_family(self, prefix: str, x: torch.Tensor) -> None:
        lo, hi = torch.aminmax(x) if x.numel() else (_nan_like(x), _nan_like(x))
        self.put(f"{prefix}/mean", _seq_mean_of(x))
        self.put(f"{prefix}/max", hi)
        self.put(f"{prefix}/min", lo)

    def per_seq(self, t: torch.Tensor, within: torch.Tensor | None = None) -> torch.Tensor:
        """A ``[B]`` or ``[B, T]`` input as ``[B]`` floats (``[B, T]``: summed over the selected tokens)."""
        t = t.detach()
        if t.dim() == 2:
            x = as_float(self.sel.take(t))
            return self.sel.row_sums(x if within is None else torch.where(within, x, 0.0))
        return as_float(t.reshape(-1))


def _nan_like(x: torch.Tensor) -> torch.Tensor:
    return x.new_full((), float("nan"))


def _seq_mean_of(x: torch.Tensor) -> torch.Tensor:
    return x.mean() if x.numel() else _nan_like(x)


def _seq_std(x: torch.Tensor) -> torch.Tensor:
    return x.std() if x.numel() > 1 else _nan_like(x)


def _compute(*, inputs: dict[str, torch.Tensor | None], clip_low: float, clip_high: float, clip_c: float | None,
             value_clip: float | None, kl_penalty: str, kl_coef: float | None, seq_mean: bool, seq_is: bool,
             roll: bool, trl: bool, verl: bool, distributions: bool | str, catalog: Catalog, compact: bool | None
             ) -> dict[str, float | BucketCounts | torch.Tensor]:
    s = _Stats(inputs, compact=compact, catalog=catalog, distributions=distributions, seq_mean=seq_mean)
    if roll:
        _roll(s, clip_low=clip_low, clip_high=clip_high, clip_c=clip_c, value_clip=value_clip, kl_penalty=kl_penalty,
              seq_is=seq_is)
    if trl:
        _trl(s, clip_low=clip_low, clip_high=clip_high, value_clip=value_clip, kl_coef=kl_coef)
    if verl:
        _verl(s, clip_low=clip_low, clip_high=clip_high, clip_c=clip_c, kl_penalty=kl_penalty)
    if roll or trl:
        _sequences(s, roll=roll, trl=trl)
    result: dict[str, float | BucketCounts | torch.Tensor] = dict(s.out.read())
    result.update(s.tensors)
    return result


def _roll(s: _Stats, *, clip_low: float, clip_high: float, clip_c: float | None, value_clip: float | None,
          kl_penalty: str, seq_is: bool) -> None:
    """ROLL (roll/pipeline/rlvr/actor_worker.py loss_func; roll/utils/functionals.py agg_loss, masked_mean;
    base_worker.py CriticWorker.loss_func; metrics_manager.py add_values_metrics)."""
    sel, a, width = s.sel, s.a, s.width
    n_resp = sel.n
    fin = None if a["final_response_mask"] is None else sel.take_mask(a["final_response_mask"])
    n_fin = n_resp if fin is None else torch.count_nonzero(fin).to(torch.float32)
    n_resp_eps = n_resp + 1e-8  # float32: n itself for n >= 1
    n_fin_eps = n_resp_eps if fin is None else n_fin + 1e-8

    def roll_agg(x: torch.Tensor, within: torch.Tensor | None, n_tokens: torch.Tensor) -> torch.Tensor:
        """agg_loss with loss_agg_mode: token-mean sums x over response_mask (ROLL sums every position) and
        divides by ``n_tokens``; seq-mean-token-mean averages the sequences of ``within`` (0 if none)."""
        if s.seq_mean:
            return sel.seq_mean(x, within, empty=0.0)
        return sel.sum(x) / n_tokens

    def roll_family(prefix: str, x: torch.Tensor, within: torch.Tensor | None) -> None:
        """ROLL's masked_mean (sum / (count + 1e-8) over the tokens: 0 for none), max and min (NaN for none)."""
        total, lo, hi = sel.sum_min_max(x, within)
        s.put(f"{prefix}/mean", total / (n_resp_eps if within is None else n_fin_eps))
        s.put(f"{prefix}/max", hi)
        s.put(f"{prefix}/min", lo)

    lp, old = s.tok("log_probs"), s.tok("old_log_probs")
    assert lp is not None and old is not None
    log_ratio = lp - old
    roll_family("critic/old_log_prob", old, None)
    del old
    ref = s.tok("ref_log_probs")
    if ref is not None:
        kl = kl_penalty_terms(lp, ref, kl_penalty)  # a new tensor: zeroed in place off the final mask
        s.put("actor/kl_loss", roll_agg(kl if fin is None else kl.masked_fill_(~fin, 0.0), fin, n_fin))
        del kl
        roll_family("critic/ref_log_prob", ref, None)
        s.dist("actor/kl_dist", lp - ref, True)
        del ref
    s.dist("actor/log_prob_dist", lp, True)
    del lp
    s.put("actor/approxkl", 0.5 * roll_agg(log_ratio.square(), None, n_resp))  # halving is exact
    s.put("actor/policykl", roll_agg(log_ratio, None, n_resp))  # compute_approx_kl(logp, logp_old, "kl")
    if seq_is:  # one ratio a sequence: exp(masked_mean(log_ratio, final_response_mask, dim=-1))
        counts = sel.row_counts_within(fin)
        row_lr = sel.row_sums(log_ratio if fin is None else torch.where(fin, log_ratio, 0.0))
        del log_ratio
        seq_ratio = torch.where(counts > 0, row_lr / counts.clamp(min=1).to(row_lr.dtype), 0.0).exp()
        ratio = sel.per_row(seq_ratio)
        n_high = torch.count_nonzero(seq_ratio > 1.0 + clip_high) * width  # broadcast over all T positions
        n_low = torch.count_nonzero(seq_ratio < 1.0 - clip_low) * width
    else:
        ratio = log_ratio.exp_()  # the log-ratio's last use: exponentiated in place
        del log_ratio
        n_high, n_low = sel.sum(ratio > 1.0 + clip_high), sel.sum(ratio < 1.0 - clip_low)
    lo, hi = sel.min_max_fill(ratio, ROLL_RATIO_MIN_FILL, 0.0)
    s.put("actor/ratio_mean", sel.seq_mean(ratio, empty=0.0))
    s.put("actor/ratio_max", hi)
    s.put("actor/ratio_min", lo)
    s.put("actor/ppo_ratio_high_clipfrac", n_high / n_fin)
    s.put("actor/ppo_ratio_low_clipfrac", n_low / n_fin)
    s.put("actor/ppo_ratio_clipfrac", (n_high + n_low) / n_fin)  # clipped = clipped_low + clipped_high
    adv = s.tok("advantages")
    if adv is not None:
        surr1 = ratio * adv
        surr2 = ratio.clamp(1.0 - clip_low, 1.0 + clip_high).mul_(adv)
        s.put("actor/clipfrac", roll_agg(surr2 < surr1, None, n_fin))
        objective = torch.minimum(surr1, surr2, out=surr1)  # loss = -objective, negated after the sum (exact)
        del surr2
        if clip_c is not None:  # dual_clip_loss: -max(-loss, c * A) where A < 0
            objective = torch.where(adv < 0, torch.maximum(objective, clip_c * adv), objective)
        s.put("actor/pg_loss", -roll_agg(objective, fin, n_fin))
        del objective, surr1
    s.dist("actor/ratio_dist", ratio, True)
    del ratio
    ent = s.tok("entropy")
    if ent is not None:
        s.family("critic/entropy", ent)  # agg_loss(entropy, response_mask, "token-mean")
        del ent
    if adv is not None:
        roll_family("critic/advantages", adv, fin)
        s.dist("critic/advantages_dist", adv, True, fin)
        del adv
    ret = s.tok("returns")
    if ret is not None:
        roll_family("critic/returns", ret, fin)
    val = s.tok("values")
    if val is not None:
        roll_family("critic/values", val, fin)
        s.put("critic/value", sel.mean_of_row_means(val))
    vpr = s.tok("vpreds")
    if vpr is not None:
        s.put("critic/vpred", sel.mean_of_row_means(vpr))
    pred = vpr if vpr is not None else val
    if ret is not None and pred is not None:
        err = (pred - ret).square_()
        error = sel.mean_of_row_means(err)
        s.put("critic/error", error)
        if vpr is not None and val is not None and value_clip is not None:
            err_clipped = _clipped_error(vpr, val, ret, value_clip)
            s.put("critic/clipfrac", sel.mean_of_row_means(err_clipped > err))
            s.put("critic/loss", 0.5 * sel.mean_of_row_means(torch.maximum(err, err_clipped, out=err_clipped)))
            del err_clipped
        elif vpr is not None:
            s.put("critic/loss", 0.5 * error)
        del err
    del ret, val, vpr, pred
    if a["rewards"] is not None:
        # token_level_rewards.sum(-1), the rewards zeroed off final_response_mask (compute_advantage)
        seq_rewards = s.per_seq(a["rewards"], fin)
        if a["rewards"].dim() != 2:
            seq_rewards = torch.where(sel.row_counts_within(fin) > 0, seq_rewards, 0.0)
        else:
            s.seq_family("critic/token_level_rewards_mean", seq_rewards / width)
        s.seq_family("critic/rewards", seq_rewards)
        s.dist("critic/rewards_dist", seq_rewards, False)


def _trl(s: _Stats, *, clip_low: float, clip_high: float, value_clip: float | None, kl_coef: float | None) -> None:
    """TRL's legacy PPOTrainer (``loss``, ``record_step_stats``)."""
    sel = s.sel
    lp, old = s.tok("log_probs"), s.tok("old_log_probs")
    assert lp is not None and old is not None
    log_ratio = lp - old
    del lp
    s.dist("objective/logprobs", old, True)
    ref = s.tok("ref_log_probs")
    if ref is not None:
        # TRL's objective/* describe the rollout: its log-probs against the reference, summed per sequence.
        kl_seq = sel.row_sums(old - ref)
        s.put("objective/kl", _seq_mean_of(kl_seq))
        if kl_coef is not None:
            s.out.constants["objective/kl_coef"] = float(kl_coef)
            s.put("ppo/mean_non_score_reward", _seq_mean_of(-float(kl_coef) * kl_seq))
        s.dist("objective/kl_dist", kl_seq, False)
        s.dist("objective/ref_logprobs", ref, True)
        del ref
    s.put("objective/entropy", _seq_mean_of(-sel.row_sums(old)))
    del old
    s.put("ppo/policy/approxkl", 0.5 * s.agg(log_ratio.square()))
    s.put("ppo/policy/policykl", -s.agg(log_ratio))  # TRL: masked_mean(old_logprobs - logprobs)
    ratio = log_ratio.exp_()  # the log-ratio's last use: exponentiated in place
    del log_ratio
    adv = s.tok("advantages")
    if adv is not None:
        surr1 = ratio * adv
        surr2 = ratio.clamp(1.0 - clip_low, 1.0 + clip_high).mul_(adv)
        s.put("ppo/policy/clipfrac", s.agg(surr2 < surr1))
        del surr1, surr2
    s.dist("ppo/policy/ratio", ratio, True)
    del ratio
    ent = s.tok("entropy")
    if ent is not None:
        s.put("ppo/policy/entropy", sel.mean(ent))
        del ent
    if adv is not None:
        s.put("ppo/policy/advantages_mean", sel.mean(adv))
        s.dist("ppo/policy/advantages", adv, True)
        del adv
    ret, val = s.tok("returns"), s.tok("values")
    for x, prefix in ((ret, "ppo/returns"), (val, "ppo/val")):
        if x is not None:
            s.put(f"{prefix}/mean", sel.mean(x))
            s.put(f"{prefix}/var", sel.var(x, unbiased=True))
    vpr = s.tok("vpreds")
    if vpr is not None:
        s.put("ppo/val/vpred", sel.mean(vpr))
    pred = vpr if vpr is not None else val
    if ret is not None and pred is not None:
        err = (pred - ret).square_()
        s.put("ppo/val/error", sel.mean(err))
        # Explained variance: a ratio of variances, so population and Bessel-corrected agree.
        s.put("ppo/val/var_explained", 1.0 - sel.var(ret - pred) / sel.var(ret))
        if vpr is not None and val is not None and value_clip is not None:
            s.put("ppo/val/clipfrac", s.agg(_clipped_error(vpr, val, ret, value_clip) > err))
        del err


def _verl(s: _Stats, *, clip_low: float, clip_high: float, clip_c: float | None, kl_penalty: str) -> None:
    """veRL 0.9.1: core_algos.compute_policy_loss_vanilla (masked_mean = sum / (count + 1e-8)), agg_loss,
    metric_utils.compute_data_metrics."""
    sel, a, width = s.sel, s.a, s.width
    n_resp = sel.n
    nan = float("nan")

    def verl_masked_mean(x: torch.Tensor) -> torch.Tensor:
        total = sel.sum(x)
        return total / (n_resp + 1e-8).to(total.dtype if total.is_floating_point() else torch.float32)

    lp, old = s.tok("log_probs"), s.tok("old_log_probs")
    assert lp is not None and old is not None
    neg_kl = (lp - old).clamp_(-20.0, 20.0)
    del old
    ref = s.tok("ref_log_probs")
    if ref is not None:
        s.put("actor/kl_loss", s.agg(kl_penalty_terms(lp, ref, kl_penalty)))
        del ref
    del lp
    s.put("actor/ppo_kl", -verl_masked_mean(neg_kl))  # masked_mean(-negative_approx_kl): negation is exact
    adv = s.tok("advantages")
    if adv is not None:
        ratio = neg_kl.exp()
        neg_adv = -adv
        losses1 = neg_adv * ratio
        losses2 = ratio.clamp_(1.0 - clip_low, 1.0 + clip_high).mul_(neg_adv)
        s.put("actor/pg_clipfrac", verl_masked_mean(losses2 > losses1))
        clip_losses1 = torch.maximum(losses1, losses2, out=losses1)
        del losses2, ratio
        losses3 = neg_adv.mul_(VERL_CLIP_RATIO_C if clip_c is None else clip_c)
        negative = adv < 0
        s.put("actor/pg_clipfrac_lower", verl_masked_mean((clip_losses1 > losses3) & negative))
        s.put("actor/pg_loss", s.agg(torch.where(negative, torch.minimum(losses3, clip_losses1, out=losses3),
                                                 clip_losses1)))
        del clip_losses1, losses3, negative, neg_adv
        s.family("critic/advantages", adv)
        del adv
    del neg_kl
    ent = s.tok("entropy")
    if ent is not None:
        s.put("actor/entropy", s.agg(ent))
        del ent
    ret, val = s.tok("returns"), s.tok("values")
    for x, prefix in ((ret, "critic/returns"), (val, "critic/values")):
        if x is not None:
            s.family(prefix, x)
    if ret is not None and val is not None:
        s.put("critic/vf_explained_var",
              1.0 - sel.var(ret - val, unbiased=True) / (sel.var(ret, unbiased=True) + 1e-5))
    del ret, val
    # metric_utils.compute_data_metrics
    lengths = (sel.row_counts if a["response_lengths"] is None else a["response_lengths"].detach().reshape(-1)
               ).to(torch.float64)
    kept = lengths != 0  # aborted: response length 0
    n_kept = kept.sum().to(torch.float64)

    def kept_family(prefix: str, x: torch.Tensor, clip: bool = False) -> None:
        if sel.compact:  # on a CPU a boolean index costs no sync: select once, then two reductions
            xk = x[kept]
            s.put(f"{prefix}/mean", xk.sum() / n_kept)
            lo, hi = torch.aminmax(xk) if xk.numel() else (_nan_like(x), _nan_like(x))
            s.put(f"{prefix}/max", hi)
            s.put(f"{prefix}/min", lo)
            if clip:
                s.put(f"{prefix}/clip_ratio", torch.count_nonzero(xk == width) / n_kept)
            return
        some = n_kept > 0
        s.put(f"{prefix}/mean", torch.where(kept, x, 0.0).sum() / n_kept)
        s.put(f"{prefix}/max", torch.where(some, torch.where(kept, x, -torch.inf).max(), nan)
              if x.numel() else _nan_like(x))
        s.put(f"{prefix}/min", torch.where(some, torch.where(kept, x, torch.inf).min(), nan)
              if x.numel() else _nan_like(x))
        if clip:
            s.put(f"{prefix}/clip_ratio", ((x == width) & kept).sum() / n_kept)

    for name, prefix in (("scores", "critic/score"), ("rewards", "critic/rewards")):
        t = a[name]
        if t is not None:  # token_level_{scores,rewards}.sum(-1): every position, as veRL sums
            t = t.detach()
            kept_family(prefix, as_float(t).sum(-1) if t.dim() == 2 else as_float(t.reshape(-1)))
    s.seq_family("response_length", lengths)
    s.put("response_length/clip_ratio", _seq_mean_of((lengths == width).to(torch.float64)))
    kept_family("response_length_non_aborted", lengths, clip=True)
    s.put("response/aborted_ratio", _seq_mean_of((~kept).to(torch.float64)))
    if a["prompt_mask"] is not None:
        pm = a["prompt_mask"].detach()
        prompt_len = pm.bool().sum(-1, dtype=torch.int32).to(torch.float64)
        s.seq_family("prompt_length", prompt_len)
        s.put("prompt_length/clip_ratio", _seq_mean_of((prompt_len == pm.shape[-1]).to(torch.float64)))


def _sequences(s: _Stats, *, roll: bool, trl: bool) -> None:
    """Per-sequence scores and lengths, ROLL's and TRL's."""
    a = s.a
    if a["scores"] is not None:
        sc = s.per_seq(a["scores"])
        if roll:
            s.seq_family("critic/score", sc)
            s.dist("critic/score_dist", sc, False)
        if trl:
            mean, std = _seq_mean_of(sc), _seq_std(sc)
            s.put("env/reward_mean", mean)
            s.put("env/reward_std", std)
            s.put("ppo/mean_scores", mean)
            s.put("ppo/std_scores", std)
            s.dist("env/reward_dist", sc, False)
    resp_len = s.sel.row_counts.to(torch.float64)
    if roll:
        s.seq_family("tokens/response_length", resp_len)
        s.dist("tokens/response_length_dist", resp_len, False)
    if trl:
        s.put("tokens/responses_len_mean", _seq_mean_of(resp_len))
        s.put("tokens/responses_len_std", _seq_std(resp_len))
        s.dist("tokens/responses_dist", resp_len, False)
    if a["prompt_mask"] is not None:
        prompt_len = a["prompt_mask"].detach().bool().sum(-1, dtype=torch.int32).to(torch.float64)
        if roll:
            s.seq_family("tokens/prompt_length", prompt_len)
        if trl:
            s.put("tokens/queries_len_mean", _seq_mean_of(prompt_len))
            s.put("tokens/queries_len_std", _seq_std(prompt_len))
            s.dist("tokens/queries_dist", prompt_len, False)
