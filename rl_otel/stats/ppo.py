"""PPO/critic/token statistics of a batch in a few stacked reductions: every scalar crosses to the host at once.

ROLL's actor worker and veRL's ``compute_data_metrics`` call ``.item()`` once a metric (12-29 host syncs a
micro-batch on a GPU) and launch several kernels for each. :func:`ppo_stats` computes the same keys with the same
definitions: each framework's section writes the per-token quantities it needs as rows of one buffer and reduces
them together in three or four rounds (:mod:`rl_otel.stats.fused`: at most 40 kernels a call, one host transfer);
the keys' formulas then run on the host, in float64, on the few numbers that came back. Rounds reuse the buffer's
few slots, so the peak memory is a fraction of the frameworks' per-metric code's (``benchmarks/bench_stats.py``,
``tests/test_stats_memory.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from functools import lru_cache
from typing import Any, Literal

import numpy as np
import torch

from rl_otel._internal.pipeline.histogram import BucketCounts, BulkHistogram
from rl_otel.catalog import Catalog, default_catalog
from rl_otel.stats.fused import Fused, Rows, Slot
from rl_otel.stats.histogram import as_float, bucket_vector
from rl_otel.stats.reduced import Reduced
from rl_otel.stats.tokens import FIN, RESP, Tokens, count_name

KL_PENALTIES = ("kl", "abs", "mse", "k3", "low_var_kl")
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean")
NAME_SETS = ("roll", "trl", "verl")
IMPORTANCE_SAMPLING = ("token", "seq")
ROLL_RATIO_MIN_FILL = 1e10  # ROLL's actor/ratio_min: min(ratio * mask + (1 - mask) * 1e10)
VERL_CLIP_RATIO_C = 3.0  # veRL's default dual-clip bound (ActorConfig.clip_ratio_c)
_K3 = ("k3", "low_var_kl")

Host = dict[str, Any]  # a section's keys, computed on the host after the transfer


def kl_penalty_terms(log_probs: torch.Tensor, base_log_probs: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL estimate of ``log_probs`` against ``base_log_probs`` (ROLL's ``compute_approx_kl``, veRL's
    ``kl_penalty``).

    ``kl``: k1 = logp - logp_base; ``abs``: |k1|; ``mse``: k2 = k1^2 / 2; ``k3``/``low_var_kl``:
    exp(-k1) + k1 - 1 clamped to [-10, 10], with -k1 clamped to [-20, 20] first as veRL does (ROLL does not
    clamp -k1; for finite inputs the two agree, the result being clamped to 10 either way beyond |k1| = 20;
    ``ppo_stats(names="roll")`` follows ROLL).
    """
    if kind in _K3:
        neg = (base_log_probs - log_probs).clamp_(-20.0, 20.0)  # -k1, exactly: a - b == -(b - a)
        return _k3_from(neg.exp(), neg, out=neg)
    if kind not in KL_PENALTIES:
        raise ValueError(f"kl_penalty must be one of {KL_PENALTIES}, got {kind!r}")
    out = torch.empty(torch.broadcast_shapes(log_probs.shape, base_log_probs.shape),
                      dtype=torch.result_type(log_probs, base_log_probs), device=log_probs.device)
    return _k1_terms(log_probs, base_log_probs, kind, out=out)


def _k1_terms(log_probs: torch.Tensor, base_log_probs: torch.Tensor, kind: str, *, out: torch.Tensor
              ) -> torch.Tensor:
    """The ``kl``, ``abs`` and ``mse`` estimates written into ``out`` (a row: no temporaries)."""
    torch.sub(log_probs, base_log_probs, out=out)
    if kind == "abs":
        out.abs_()
    elif kind == "mse":
        out.square_().mul_(0.5)
    return out


def _k3_from(exp_neg: torch.Tensor, neg: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
    """k3 from -k1 and exp(-k1): ``(exp(-k1) - (-k1)) - 1`` clamped to [-10, 10], in the frameworks' order."""
    return torch.sub(exp_neg, neg, out=out).sub_(1.0).clamp_(-10.0, 10.0)


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
    exclude: Iterable[str] = (),
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
            and veRL's ``clip_ratio``; ``high`` defaults to ``low``), both >= 0.
        clip_ratio_c: dual-clip bound for negative advantages (veRL's ``clip_ratio_c``, default 3.0; ROLL's
            ``dual_clip_loss`` bound is ``1 + 2 * pg_clip``, off by default). value_clip: the critic's clip range
            around ``values`` (>= 0).
        kl_penalty: estimator of ``actor/kl_loss`` against ``ref_log_probs``: ``kl``, ``abs``, ``mse``, ``k3``
            (ROLL's, and veRL's default ``low_var_kl``).
        kl_coef: the KL coefficient (TRL's ``objective/kl_coef`` and ``ppo/mean_non_score_reward``).
        loss_agg_mode: ``token-mean`` or ``seq-mean-token-mean`` (per-sequence mean, then mean over sequences);
            which keys follow it is listed above.
        importance_sampling: ROLL's ``importance_sampling``: ``token`` ratios, or ``seq``: one ratio a sequence,
            ``exp`` of the mean log-ratio over ``final_response_mask``, broadcast to its tokens (ROLL keys only).
        names: some of ``"roll"``, ``"trl"``, ``"verl"``: which keys to return (each set's keys: above, and
            ``sorted(ppo_stats(...))`` of one call).
        exclude: keys of those sets to leave out, e.g. ``{"actor/pg_loss"}`` when the loop logs its own loss
            under that key (``names="verl"`` returns it); a key this call would not return raises ValueError.
        distributions: ``True`` adds histograms (``actor/ratio_dist``, ``ppo/policy/ratio``, ...; ROLL and TRL
            keys) as :class:`BucketCounts` against the catalog's buckets, read back in the same single transfer
            (Prometheus histograms; trackers get no values to draw from); ``"tensors"`` adds them as 1-d tensors
            of the selected values instead, for Prometheus and trackers (per token: a boolean index on the device,
            one more sync each on a GPU; per sequence: CPU tensors, from the transfer).
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
    for name, value in (("clip_ratio_low", clip_ratio_low), ("clip_ratio_high", clip_ratio_high),
                        ("value_clip", value_clip)):
        if value is not None and not value >= 0:
            raise ValueError(f"{name} must be >= 0, got {value!r}")
    if final_response_mask is response_mask:
        final_response_mask = None

    left_out = frozenset(exclude)
    if not all(isinstance(key, str) for key in left_out):
        raise ValueError(f"exclude must be keys (strings), got {exclude!r}")
    with torch.no_grad():
        out = _compute(inputs={
            "log_probs": log_probs, "old_log_probs": old_log_probs, "response_mask": response_mask,
            "final_response_mask": final_response_mask, "advantages": advantages, "ref_log_probs": ref_log_probs,
            "values": values, "returns": returns, "vpreds": vpreds, "rewards": rewards, "scores": scores,
            "entropy": entropy, "prompt_mask": prompt_mask, "response_lengths": response_lengths},
            clip_low=clip_ratio_low, clip_high=clip_ratio_high, clip_c=clip_ratio_c, value_clip=value_clip,
            kl_penalty=kl_penalty, kl_coef=kl_coef, seq_mean=loss_agg_mode == "seq-mean-token-mean",
            seq_is=importance_sampling == "seq", roll="roll" in sets, trl="trl" in sets, verl="verl" in sets,
            distributions=distributions, catalog=catalog or default_catalog(), compact=_compact)
    if left_out:
        unknown = sorted(left_out - out.keys())
        if unknown:
            raise ValueError(f"exclude: {unknown} are not keys this call returns; it returns {sorted(out)}")
        out = {key: value for key, value in out.items() if key not in left_out}
    return out


# -- host-side arithmetic, in Python floats: IEEE results for a zero denominator (0/0 = NaN, x/0 = +-inf) ----------

def _div(num: float, den: float) -> float:
    if den:
        return num / den
    if num != num or not num:  # 0/0 and NaN/0
        return math.nan
    return math.copysign(math.inf, num) * math.copysign(1.0, den)


def _eps(n: float) -> float:
    """``n + 1e-8`` as the frameworks compute it, in float32: ``n`` for a count ``n >= 1``, else ``1e-8``."""
    return n if n >= 1 else n + 1e-8


def _mean(x: np.ndarray) -> float:
    return float(x.sum()) / x.size if x.size else math.nan


def _std(x: np.ndarray) -> float:
    """Bessel-corrected standard deviation (two passes, as torch's ``std``); NaN for fewer than 2 values."""
    if x.size < 2:
        return math.nan
    d = x - x.sum() / x.size
    return math.sqrt(float(d @ d) / (x.size - 1))


def _family(prefix: str, x: np.ndarray) -> Host:
    """Mean, max and min of per-sequence values (NaN for no sequence)."""
    if not x.size:
        return {f"{prefix}/mean": math.nan, f"{prefix}/max": math.nan, f"{prefix}/min": math.nan}
    return {f"{prefix}/mean": float(x.sum()) / x.size, f"{prefix}/max": float(x.max()), f"{prefix}/min": float(x.min())}


def _host_buckets(values: np.ndarray, bounds: tuple[float, ...]) -> BucketCounts:
    """What :func:`~rl_otel.stats.histogram.bucket_vector` gives, for values already on the host."""
    h = BulkHistogram(bounds)
    non_finite = h.observe(values)
    return BucketCounts(bounds=tuple(bounds), counts=h.counts, sum=h.sum, count=h.count, min=h.min, max=h.max,
                        non_finite=non_finite)


@lru_cache(maxsize=32)
def _signs(dtype: torch.dtype, device: torch.device, dims: int) -> torch.Tensor:
    """``[-1, +1]`` shaped to broadcast against a row: made once per device, dtype and shape by kernels on the
    device (``torch.tensor([...], device=...)`` would copy from the host: a host sync on a GPU), and independent of
    the clip value, which a ``torch.add(..., alpha=clip)`` takes as a Python number (a new clip value costs nothing
    on the device)."""
    return torch.arange(2, dtype=dtype, device=device).mul_(2).sub_(1).view(2, *([1] * dims))


class _Stats:
    """One ``ppo_stats`` call: the inputs, the fused reductions, and what each section computes on the host after
    the transfer (its ``finish`` functions). Each section reduces what it needs in rounds over one buffer."""

    def __init__(self, inputs: dict[str, torch.Tensor | None], *, compact: bool | None, catalog: Catalog,
                 distributions: bool | str, seq_mean: bool) -> None:
        self.a = inputs
        final = inputs["final_response_mask"]
        self.tokens = Tokens(inputs["response_mask"], final, compact)  # type: ignore[arg-type]
        # float32 rows, float64 if any token input is float64 (half precision is accumulated in float32)
        wide = any(t is not None and t.dtype == torch.float64 for t in (
            inputs[n] for n in ("log_probs", "old_log_probs", "ref_log_probs", "advantages", "values", "returns",
                                "vpreds", "entropy")))
        self.f = Fused(self.tokens, torch.float64 if wide else torch.float32)
        self.catalog = catalog
        self.distributions = distributions
        self.seq_mean = seq_mean
        self.width = self.tokens.shape[1]
        self.finish: list[Callable[[], Host]] = []
        self.tensors: dict[str, torch.Tensor] = {}
        self._seq_parts: dict[str, int] = {}
        self._taken: dict[str, torch.Tensor] = {}
        self._reused: frozenset[str] = frozenset()

    # -- device side ----------------------------------------------------------------------------------------------

    def plan(self, *rounds: Rows | None, reused: Sequence[str] = ()) -> None:
        """Plan a section's rounds (the absent ones left out). ``reused``: the inputs the section reads in more
        than one round, which the compact layout gathers once for the section (the masked layout reads inputs
        where they are)."""
        self._taken.clear()
        self._reused = frozenset(reused)
        self.f.plan(*[r for r in rounds if r is not None])

    def src(self, name: str) -> torch.Tensor | None:
        """An optional ``[B, T]`` input as a float row: masked, the input itself; compact, its tokens, gathered
        anew unless the section reuses it (hold it while needed: the sections drop each after its last use)."""
        hit = self._taken.get(name)
        if hit is not None:
            return hit
        t = self.a[name]
        if t is None:
            return None
        row = as_float(self.tokens.take(t))
        if self.tokens.compact and name in self._reused:
            self._taken[name] = row
        return row

    def load(self, rows: Rows, slots: dict[str, str]) -> None:
        """Copy the present inputs into their rows (``slots``: row name -> input name; compact: from the tokens
        the section gathered already where it has them)."""
        pairs = sorted((rows.pos[r], r, i) for r, i in slots.items() if self.a[i] is not None and r in rows.pos)
        fresh = []
        for _, r, i in pairs:
            taken = self._taken.get(i)
            if taken is not None:
                rows[r].copy_(taken)
            else:
                fresh.append((r, i))
        if fresh:
            rows.load([r for r, _ in fresh], [self.a[i] for _, i in fresh])  # type: ignore[misc]

    def rows(self, kinds: Sequence[Sequence[Slot]], *, mm: slice | None = None, scratch: Sequence[str] = ()) -> Rows:
        """A round of the section (plan the section's rounds with :meth:`plan`, then ``start()`` each)."""
        return Rows(self.f, kinds, mm=mm, scratch=scratch)

    def seq_input(self, name: str) -> int | None:
        """A ``[B]`` input (scores, rewards, response lengths) as a part, once a call."""
        t = self.a[name]
        if t is None:
            return None
        if name not in self._seq_parts:
            # floats in float32 or wider (float64 scores keep their precision), integers (lengths) as the rows
            t = t.detach().reshape(-1)
            self._seq_parts[name] = self.f.part(as_float(t) if t.is_floating_point() else t.to(self.f.dtype))
        return self._seq_parts[name]

    def seq_sums(self, name: str) -> int:
        """A ``[B, T]`` input summed over all ``T`` positions, unmasked (veRL's token-level scores), as a part:
        one reduction of the input where it is, no row."""
        t = self.a[name]
        assert t is not None
        return self.f.part(t.detach().sum(-1, dtype=self.f.dtype))

    def prompt_lengths(self) -> int | None:
        """Prompt lengths ``[B]`` (nonzero entries of ``prompt_mask``) as a part, once a call: one reduction."""
        pm = self.a["prompt_mask"]
        if pm is None:
            return None
        if "prompt" not in self._seq_parts:
            pm = pm.detach()
            if self.tokens.compact and pm.dtype not in (torch.bfloat16, torch.float16):  # (parts read one by one)
                lengths = np.count_nonzero(pm.numpy(), axis=-1)  # numpy's: two thirds of torch's time on a CPU
            elif self.tokens.compact:
                lengths = torch.count_nonzero(pm, dim=-1)
            else:  # in the rows' dtype, for the one concatenated read: ord=0 counts the nonzero entries
                lengths = torch.linalg.vector_norm(pm if pm.is_floating_point() else pm.to(self.f.dtype), ord=0,
                                                   dim=-1)
            self._seq_parts["prompt"] = self.f.part(lengths)
        return self._seq_parts["prompt"]

    def dist(self, key: str, x: torch.Tensor, kind: int = RESP) -> None:
        """A per-token distribution: ``x`` is a row (padding included on the masked layout)."""
        if not self.distributions:
            return
        tok = self.tokens
        if tok.compact:
            within = None if kind == RESP else tok.fin
            if self.distributions == "tensors":  # a copy: the row's storage is reused by the next round
                self.tensors[key] = x.clone() if within is None else x[within]
                return
        else:
            within = self.a["response_mask"] if kind == RESP else tok.keep[FIN]
            if self.distributions == "tensors":
                self.tensors[key] = x[tok.keep[kind]]  # a boolean index: one sync each
                return
        bounds = self.bounds(key)
        part = self.f.part(bucket_vector(x, bounds, within))
        self.finish.append(lambda: {key: BucketCounts.from_vector(bounds, self.f.host[part].tolist())})

    def seq_dist(self, key: str, values: Callable[[], np.ndarray]) -> Host:
        """A per-sequence distribution, bucketed on the host (``values``: called after the transfer)."""
        if not self.distributions:
            return {}
        x = values()
        if self.distributions == "tensors":
            return {key: torch.from_numpy(np.ascontiguousarray(x, dtype=np.float64))}
        return {key: _host_buckets(x, self.bounds(key))}

    def bounds(self, key: str) -> tuple[float, ...]:
        resolved = self.catalog.lookup(key)
        if resolved is None:
            raise KeyError(f"{key!r} is not in the catalog: its histogram has no buckets")
        return tuple(resolved.spec.buckets)

    def row_sums_now(self, x: torch.Tensor, kind: int) -> torch.Tensor:
        """Per-sequence sums ``[B]`` of a row over the tokens of ``kind``, on the device now (not stacked: for
        what a later row depends on, and for the rarer inputs)."""
        tok = self.tokens
        if tok.compact:
            within = x if kind == RESP else torch.where(tok.fin, x, 0.0)  # type: ignore[arg-type]
            return torch.from_numpy(tok.segment_sums(within.numpy()[None])[0])
        return torch.where(tok.keep[kind], x, 0.0).sum(-1)

    def counts_now(self, kind: int) -> torch.Tensor:
        """Tokens of ``kind`` per sequence ``[B]``, on the device now."""
        tok = self.tokens
        if tok.compact:
            return tok.row_counts.to(self.f.dtype) if kind == RESP else torch.from_numpy(tok.fin_counts())
        return tok.keep[kind].sum(-1).to(self.f.dtype)

    def per_token(self, x: torch.Tensor) -> torch.Tensor:
        """A per-sequence ``[B]`` tensor as a row (each token gets its sequence's value)."""
        tok = self.tokens
        if tok.compact:
            return x.repeat_interleave(tok.row_counts, output_size=tok.size)
        return x.unsqueeze(-1).expand(tok.shape)

    # -- host side (after the transfer) ---------------------------------------------------------------------------

    def host(self, part: int | None) -> np.ndarray | None:
        return None if part is None else self.f.host[part].astype(np.float64)

    def agg(self, rows: Reduced, name: str) -> float:
        """``loss_agg_mode`` over the response tokens: a token mean, or the mean over the sequences that have
        tokens of each one's token mean (NaN when there are none)."""
        if self.seq_mean:
            return _div(rows.seq_sum(name), self.f.n_seqs(RESP))
        return _div(rows.total(name), self.f.n(RESP))


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
    s.f.read()  # the one transfer
    result: dict[str, float | BucketCounts | torch.Tensor] = {}
    try:
        for finish in s.finish:
            result.update(finish())
    finally:  # the rounds, the call and its finish functions refer to each other: freed now, not by the cyclic GC
        s.finish.clear()
        s._taken.clear()
        s.f.close()
    result.update(s.tensors)
    return result


def _dims(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.dim()


def _present(s: _Stats, *names: str) -> list[Slot]:
    """``names`` with the absent inputs as ``None`` (an unused slot: the layouts keep their positions)."""
    return [n if s.a[n] is not None else None for n in names]


def _exp(x: float) -> float:
    """``exp`` (ROLL's ratio extremes are the exponentials of the log-ratio's extremes: exp is monotonic)."""
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


def _value_errors(r: Rows, *, values: torch.Tensor, vpreds: torch.Tensor, returns: torch.Tensor, clip: float,
                  err: str, clipped: str, bounds: tuple[str, str] | None = None) -> None:
    """The critic's squared errors into rows ``err`` and ``clipped``: ``(vpreds - returns)^2`` and
    ``(clamp(vpreds, values - clip, values + clip) - returns)^2`` (ROLL's ``CriticWorker.loss_func`` clips with
    ``torch.clip``, TRL's ``PPOTrainer.loss`` with ``clip_by_value``: the same for ``clip >= 0``), both squared in
    one kernel.

    With ``bounds`` (two spare rows) ``err`` and ``clipped`` hold the predictions already (loaded with the round's
    inputs: four kernels); without, the bounds are made in ``err`` and ``clipped`` (five kernels, no spare row).
    """
    lo, hi = bounds or (err, clipped)
    q = r.q
    assert q is not None
    torch.add(values, _signs(q.dtype, q.device, q.dim() - 1), alpha=float(clip), out=r.rows(lo, hi))
    torch.clamp(r[clipped] if bounds else vpreds, min=r[lo], max=r[hi], out=r[clipped])
    if bounds:
        r.rows(err, clipped).sub_(returns).square_()
    else:
        torch.sub(vpreds, returns, out=r[err])
        r[clipped].sub_(returns)
        r.rows(err, clipped).square_()


def _roll(s: _Stats, *, clip_low: float, clip_high: float, clip_c: float | None, value_clip: float | None,
          kl_penalty: str, seq_is: bool) -> None:
    """ROLL (roll/pipeline/rlvr/actor_worker.py loss_func; roll/utils/functionals.py agg_loss, masked_mean;
    base_worker.py CriticWorker.loss_func; metrics_manager.py add_values_metrics).

    Three rounds over an 8-row storage (FIN rows: ``final_response_mask``, when it is given; else every row is a
    RESP row): A, the inputs' own statistics and the log-ratio, with the maxima and minima of all seven (one
    round: a second would cost four kernels more, beyond 40); P, the policy's per-token quantities, reading A's
    ``lr`` (slot 0) and ``ref`` (slot 2) before writing over them; C, the critic's.
    """
    a, f, tok = s.a, s.f, s.tokens
    fin = tok.kinds > 1
    fin_kind = FIN if fin else RESP
    rewards_2d = a["rewards"] is not None and a["rewards"].dim() == 2
    has_ref, has_adv = a["ref_log_probs"] is not None, a["advantages"] is not None
    k3 = has_ref and kl_penalty in _K3
    ret_in, val_in, vpr_in = a["returns"], a["values"], a["vpreds"]
    pred = vpr_in if vpr_in is not None else val_in
    clipped = value_clip is not None and ret_in is not None and val_in is not None and vpr_in is not None
    critic = val_in is not None or vpr_in is not None
    # A: [lr, old, ref, ent | rewards, adv, ret, val]: maxima and minima of every slot (rewards': unread)
    stats, values = _present(s, "ref_log_probs", "entropy"), _present(s, "advantages", "returns", "values")
    rewards: Slot = "rewards" if rewards_2d else None
    if fin:
        A = s.rows([["lr", "old", *stats], [rewards, *values]], mm=slice(0, 4))
    else:
        A = s.rows([["lr", "old", *stats, *values, rewards]], mm=slice(0, 7))
    # P: [high, ratio, low, clip, (obj, s2) | k3, (obj, s2), 1f]: obj (the objective; surr1 first) is a FIN row
    # when pg_loss averages sequences within the final mask (seq-mean), else a RESP row. The exp of A's lr
    # (slot 0) and of kl (k3's slot) in one kernel puts the ratio in slot 1 and exp(kl) in the slot after k3.
    seq_obj = fin and s.seq_mean
    resp: list[Slot] = [None if seq_is else "high", "ratio", None if seq_is else "low"]
    if has_adv:
        resp.extend(["clip"] if seq_obj else ["clip", "obj", "s2"])
    after_k3 = [*(["obj", "s2"] if has_adv and seq_obj else []), count_name(fin_kind)]
    fin_rows: list[Slot] = ["k3", ("expkl", after_k3[0]), *after_k3[1:]] if has_ref else list(after_k3)
    if fin and not critic:  # the response tokens' count (C's otherwise)
        resp.append(count_name(RESP))
    P = s.rows([resp, fin_rows] if fin else [resp + fin_rows], scratch=("s2", "expkl"))
    # C (RESP): [val, vpr, err, loss, (lo, flag), (hi, 1)]: the critic worker's per-sequence means
    C = None
    if critic:
        hi: Slot = ("hi", count_name(RESP)) if fin else "hi"
        tail: list[Slot] = ["loss", ("lo", "flag"), hi] if clipped else [count_name(RESP)] if fin else []
        C = s.rows([["val" if val_in is not None else None, "vpr" if vpr_in is not None else None,
                     "err" if ret_in is not None and pred is not None else None, *tail]], scratch=("lo", "hi"))
    s.plan(A, P, C)

    A.start()
    s.load(A, {"old": "old_log_probs", "ref_log_probs": "ref_log_probs", "entropy": "entropy",
               "rewards": "rewards", "advantages": "advantages", "returns": "returns", "values": "values"})
    lp = s.src("log_probs")
    assert lp is not None
    torch.sub(lp, A["old"], out=A["lr"])
    if has_ref and s.distributions:
        s.dist("actor/kl_dist", lp - A["ref_log_probs"])
    s.dist("actor/log_prob_dist", lp)
    if has_adv:
        s.dist("critic/advantages_dist", A["advantages"], fin_kind)
    Ar = A.reduce(per_seq=[*(["lr"] if s.seq_mean else []), *(["rewards"] if rewards_2d else [])], sq=["lr"])

    P.start()  # slot 0 (high) holds A's lr until the exp, slot 2 (low) A's ref until kl is taken
    if k3:  # ROLL's compute_approx_kl "k3": exp(kl) - kl - 1 with kl = ref - logp, not clamped first (as ROLL)
        torch.sub(A["ref_log_probs"], lp, out=P["k3"])
    elif has_ref:
        _k1_terms(lp, A["ref_log_probs"], kl_penalty, out=P["k3"])
    del lp
    seq_ratio_part = None
    if seq_is:  # one ratio a sequence: exp(masked_mean(log_ratio, final_response_mask, dim=-1)), on every token
        sums, counts = s.row_sums_now(A["lr"], fin_kind), s.counts_now(fin_kind)
        seq_ratio = torch.where(counts > 0, sums / counts.clamp(min=1), 0.0).exp()
        P["ratio"].copy_(s.per_token(seq_ratio))
        seq_ratio_part = f.part(seq_ratio)
        if k3:
            torch.exp(P["k3"], out=P["expkl"])
    elif k3:  # the ratio and exp(kl) in one kernel: rows (lr, kl) -> (ratio, exp(kl))
        torch.exp(f.rows((A, "lr"), (P, "k3")), out=P.rows("ratio", "expkl"))
    else:
        torch.exp(A["lr"], out=P["ratio"])
    if k3:
        _k3_from(P["expkl"], P["k3"], out=P["k3"])
    if not seq_is:
        torch.gt(P["ratio"], 1.0 + clip_high, out=P["high"])
        torch.lt(P["ratio"], 1.0 - clip_low, out=P["low"])
    s.dist("actor/ratio_dist", P["ratio"])
    adv = s.src("advantages")
    if adv is not None:  # surr1 = ratio * A, surr2 = clamp(ratio) * A, both in one kernel: (ratio, c) -> (obj, s2)
        torch.clamp(P["ratio"], 1.0 - clip_low, 1.0 + clip_high, out=P["s2"])
        torch.mul(P.rows("ratio", "s2"), adv, out=P.rows("obj", "s2"))
        torch.lt(P["s2"], P["obj"], out=P["clip"])
        torch.minimum(P["obj"], P["s2"], out=P["obj"])  # loss = -objective, negated on the host (exact)
        if clip_c is not None:  # dual_clip_loss: -max(-loss, c * A) where A < 0; objective >= 0 where A >= 0
            torch.maximum(P["obj"], torch.clamp(adv, max=0.0, out=P["s2"]).mul_(clip_c), out=P["obj"])
    del adv
    Pr = P.reduce(per_seq=["ratio", *([n for n in ("clip", "obj", "k3") if n in P.pos] if s.seq_mean else [])])

    Cr: Reduced | None = None
    if C is not None:
        C.start()
        ret = s.src("returns")
        if clipped:  # the predictions loaded into err and loss too (one stack), the bounds in lo and hi
            assert val_in is not None and vpr_in is not None and value_clip is not None and ret is not None
            C.load(["val", "vpr", "err", "loss"], [val_in, vpr_in, vpr_in, vpr_in])
            _value_errors(C, values=C["val"], vpreds=C["vpr"], returns=ret, clip=value_clip, err="err",
                          clipped="loss", bounds=("lo", "hi"))
            torch.gt(C["loss"], C["err"], out=C["flag"])  # surr1 > surr2: the clipped error is the larger
            torch.maximum(C["err"], C["loss"], out=C["loss"])
        else:
            s.load(C, {"val": "values", "vpr": "vpreds"})
            if "err" in C.pos:
                torch.sub(C["vpr" if vpr_in is not None else "val"], ret, out=C["err"]).square_()  # type: ignore[arg-type]
        del ret
        Cr = C.reduce(per_seq=[n for n in ("val", "vpr", "err", "loss", "flag") if n in C.pos])  # row means
    rewards_part = None if a["rewards"] is None or rewards_2d else s.seq_input("rewards")
    shape = tok.shape

    def finish() -> Host:
        n_r, n_f = f.n(RESP), f.n(fin_kind)
        seqs = {RESP: f.n_seqs(RESP), FIN: f.n_seqs(fin_kind)}

        def roll_agg(rows: Reduced, name: str, kind: int, n_tokens: float) -> float:
            """agg_loss: token-mean sums over response_mask (ROLL sums every position) and divides by
            ``n_tokens``; seq-mean-token-mean averages the sequences with tokens (0 if none: ROLL's + 1e-8)."""
            if s.seq_mean:
                return _div(rows.seq_sum(name), _eps(seqs[kind]))
            return _div(rows.total(name), n_tokens)

        def roll_family(prefix: str, rows: Reduced, name: str, n: float) -> Host:
            """masked_mean (sum / (count + 1e-8): 0 for none), max and min (NaN for none)."""
            return {f"{prefix}/mean": _div(rows.total(name), _eps(n)), f"{prefix}/max": rows.max(name),
                    f"{prefix}/min": rows.min(name)}

        out: Host = roll_family("critic/old_log_prob", Ar, "old", n_r)
        if has_ref:
            out["actor/kl_loss"] = roll_agg(Pr, "k3", FIN, n_f)
            out.update(roll_family("critic/ref_log_prob", Ar, "ref_log_probs", n_r))
        sq = _div(Ar.sq_seq_sum("lr"), _eps(seqs[RESP])) if s.seq_mean else _div(Ar.sq_total("lr"), n_r)
        out["actor/approxkl"] = 0.5 * sq  # halving is exact
        out["actor/policykl"] = roll_agg(Ar, "lr", RESP, n_r)  # compute_approx_kl(logp, logp_old, "kl")
        positions = shape[0] * shape[1]
        if seq_ratio_part is not None:
            sr = f.host[seq_ratio_part].astype(np.float64)
            selected = sr[f.counts(RESP) > 0]
            hi = float(selected.max()) if selected.size else -math.inf
            lo = float(selected.min()) if selected.size else math.inf
            n_high = float(np.count_nonzero(sr > 1.0 + clip_high)) * shape[1]  # a clipped sequence: all T
            n_low = float(np.count_nonzero(sr < 1.0 - clip_low)) * shape[1]
        else:
            hi = _exp(Ar.max("lr")) if n_r else -math.inf
            lo = _exp(Ar.min("lr")) if n_r else math.inf
            n_high, n_low = Pr.total("high"), Pr.total("low")
        if not positions:
            hi = lo = math.nan
        elif n_r < positions:  # max(ratio * mask) reads 0 and min(ratio * mask + (1 - mask) * 1e10) 1e10 off it
            hi = hi if math.isnan(hi) else max(hi, 0.0)
            lo = lo if math.isnan(lo) else min(lo, ROLL_RATIO_MIN_FILL)
        out.update({"actor/ratio_mean": _div(Pr.seq_sum("ratio"), _eps(seqs[RESP])), "actor/ratio_max": hi,
                    "actor/ratio_min": lo, "actor/ppo_ratio_high_clipfrac": _div(n_high, n_f),
                    "actor/ppo_ratio_low_clipfrac": _div(n_low, n_f),
                    "actor/ppo_ratio_clipfrac": _div(n_high + n_low, n_f)})  # clipped = clipped_low + clipped_high
        if has_adv:
            out["actor/clipfrac"] = roll_agg(Pr, "clip", RESP, n_f)
            out["actor/pg_loss"] = -roll_agg(Pr, "obj", FIN, n_f)
        if a["entropy"] is not None:  # agg_loss(entropy, response_mask, "token-mean")
            out.update({"critic/entropy/mean": _div(Ar.total("entropy"), n_r),
                        "critic/entropy/max": Ar.max("entropy"), "critic/entropy/min": Ar.min("entropy")})
        for name, prefix in (("advantages", "critic/advantages"), ("returns", "critic/returns"),
                             ("values", "critic/values")):
            if a[name] is not None:
                out.update(roll_family(prefix, Ar, name, n_f))
        if Cr is not None:  # masked_mean(x, response_mask, dim=-1).mean() over all B sequences
            for name, key in (("val", "critic/value"), ("vpr", "critic/vpred"), ("err", "critic/error"),
                              ("flag", "critic/clipfrac")):
                if name in Cr.pos:
                    out[key] = _div(Cr.seq_sum(name), shape[0])
            if "loss" in Cr.pos:
                out["critic/loss"] = 0.5 * _div(Cr.seq_sum("loss"), shape[0])
            elif vpr_in is not None and "err" in Cr.pos:
                out["critic/loss"] = 0.5 * out["critic/error"]
        if a["rewards"] is not None:
            # token_level_rewards.sum(-1), the rewards zeroed off final_response_mask (compute_advantage)
            if rewards_2d:
                seq_rewards = Ar.per_seq("rewards")
                with np.errstate(divide="ignore", invalid="ignore"):
                    out.update(_family("critic/token_level_rewards_mean", seq_rewards / shape[1]))
            else:
                r = s.host(rewards_part)
                assert r is not None
                seq_rewards = np.where(f.counts(fin_kind) > 0, r, 0.0)
            out.update(_family("critic/rewards", seq_rewards))
            out.update(s.seq_dist("critic/rewards_dist", lambda: seq_rewards))
        return out

    s.finish.append(finish)


def _trl(s: _Stats, *, clip_low: float, clip_high: float, value_clip: float | None, kl_coef: float | None) -> None:
    """TRL's legacy PPOTrainer (``loss``, ``record_step_stats``).

    Four rounds over a 3-row storage: B, the policy's per-token quantities; C, the value head's clipped-error
    flags (its bounds, then its two errors, in the first two slots), then two inputs' statistics; R, two more and
    the token count; V, the rows whose variances are wanted (``rp``, returns minus the prediction: its squares
    are the value head's errors), their mean dividing by R's count, whose sums sit right before theirs.
    """
    a, f = s.a, s.f
    ret, val, vpr = a["returns"], a["values"], a["vpreds"]
    pred = "vpreds" if vpr is not None else "values" if val is not None else None
    clipped = value_clip is not None and ret is not None and val is not None and vpr is not None
    has_err = ret is not None and pred is not None
    has_ref, has_adv = a["ref_log_probs"] is not None, a["advantages"] is not None
    # B: [lr, (ratio, okl), (s2, clip)]: the ratio and surr2 are scratch, clip written over surr2, okl over the ratio
    B = s.rows([["lr", ("ratio", "okl") if has_ref else "ratio", ("s2", "clip") if has_adv else None]],
               scratch=("ratio", "s2"))
    # C: [(lo, err, vflag), (hi, clipped, vpreds), adv]
    C = None
    if clipped or vpr is not None or has_adv:
        vpr_slot: Slot = ("hi", "clipped", "vpreds") if clipped else "vpreds" if vpr is not None else None
        C = s.rows([[("lo", "err", "vflag") if clipped else None, vpr_slot, "advantages" if has_adv else None]],
                   scratch=("lo", "err", "hi", "clipped"))
    # R: [ent, old, 1]; V: [rp, ret, val], planned right after R: the count's sums sit right before theirs
    R = s.rows([[*_present(s, "entropy"), "old", count_name(RESP)]])
    var = [n for n, present in (("rp", has_err), ("returns", ret is not None), ("values", val is not None)) if present]
    V = s.rows([var]) if var else None
    s.plan(B, C, R, V, reused=("old_log_probs", "advantages", "returns", "values", "vpreds"))

    B.start()
    lp, old = s.src("log_probs"), s.src("old_log_probs")
    assert lp is not None and old is not None
    torch.sub(lp, old, out=B["lr"])
    del lp
    adv = s.src("advantages")
    if adv is not None or s.distributions:
        torch.exp(B["lr"], out=B["ratio"])
        s.dist("ppo/policy/ratio", B["ratio"])
    if adv is not None:  # surr1, surr2 in one kernel, then surr2 < surr1 over surr2
        torch.clamp(B["ratio"], 1.0 - clip_low, 1.0 + clip_high, out=B["s2"])
        B.rows("ratio", "s2").mul_(adv)
        torch.lt(B["s2"], B["ratio"], out=B["clip"])
    del adv
    if has_ref:  # TRL's objective/* describe the rollout: its log-probs against the reference
        ref = s.src("ref_log_probs")
        assert ref is not None
        torch.sub(old, ref, out=B["okl"])
        s.dist("objective/ref_logprobs", ref)
        del ref
    del old
    Br = B.reduce(per_seq=[*(["lr", "clip"] if s.seq_mean and has_adv else ["lr"] if s.seq_mean else []),
                           *(["okl"] if has_ref and s.distributions else [])], sq=["lr"])

    Cr: Reduced | None = None
    if C is not None:
        C.start()
        if clipped:  # the errors in err and clipped, then vf_losses2 > vf_losses1 in vflag (err's slot)
            assert value_clip is not None
            _value_errors(C, values=s.src("values"), vpreds=s.src("vpreds"), returns=s.src("returns"),  # type: ignore[arg-type]
                          clip=value_clip, err="err", clipped="clipped")
            torch.gt(C["clipped"], C["err"], out=C["vflag"])
        s.load(C, {"vpreds": "vpreds", "advantages": "advantages"})
        if has_adv:
            s.dist("ppo/policy/advantages", C["advantages"])
        Cr = C.reduce(per_seq=["vflag"] if clipped and s.seq_mean else [])

    R.start()
    s.load(R, {"entropy": "entropy", "old": "old_log_probs"})
    s.dist("objective/logprobs", R["old"])
    Rr = R.reduce()

    Vr: Reduced | None = None
    if V is not None:
        V.start()
        if has_err:  # returns - prediction: its squares are the value head's errors, its variance explained's
            torch.sub(s.src("returns"), s.src(pred), out=V["rp"])  # type: ignore[arg-type]
        s.load(V, {"returns": "returns", "values": "values"})
        Vr = V.reduce(sq=["rp"] if has_err else [], var=var)
    n_seqs = s.tokens.shape[0]

    def finish() -> Host:
        n = f.n(RESP)
        out: Host = {}
        if has_ref:
            out["objective/kl"] = _div(Br.total("okl"), n_seqs)
            if kl_coef is not None:
                out["objective/kl_coef"] = float(kl_coef)
                out["ppo/mean_non_score_reward"] = _div(-float(kl_coef) * Br.total("okl"), n_seqs)
            out.update(s.seq_dist("objective/kl_dist", lambda: Br.per_seq("okl")))
        out["objective/entropy"] = _div(-Rr.total("old"), n_seqs)
        sq = _div(Br.sq_seq_sum("lr"), f.n_seqs(RESP)) if s.seq_mean else _div(Br.sq_total("lr"), n)
        out["ppo/policy/approxkl"] = 0.5 * sq
        out["ppo/policy/policykl"] = -s.agg(Br, "lr")  # TRL: masked_mean(old_logprobs - logprobs)
        if has_adv:
            assert Cr is not None
            out["ppo/policy/clipfrac"] = s.agg(Br, "clip")
            out["ppo/policy/advantages_mean"] = _div(Cr.total("advantages"), n)
        if a["entropy"] is not None:
            out["ppo/policy/entropy"] = _div(Rr.total("entropy"), n)
        for name, prefix in (("returns", "ppo/returns"), ("values", "ppo/val")):
            if a[name] is not None:
                assert Vr is not None
                out[f"{prefix}/mean"] = _div(Vr.total(name), n)
                out[f"{prefix}/var"] = _div(Vr.m2(name), n - 1) if n > 1 else math.nan
        if vpr is not None:
            assert Cr is not None
            out["ppo/val/vpred"] = _div(Cr.total("vpreds"), n)
        if has_err:
            assert Vr is not None
            out["ppo/val/error"] = _div(Vr.sq_total("rp"), n)
            # Explained variance: a ratio of variances, so population and Bessel-corrected agree.
            out["ppo/val/var_explained"] = 1.0 - _div(Vr.m2("rp"), Vr.m2("returns")) if n else math.nan
        if clipped:
            assert Cr is not None
            out["ppo/val/clipfrac"] = s.agg(Cr, "vflag")
        return out

    s.finish.append(finish)


def _verl(s: _Stats, *, clip_low: float, clip_high: float, clip_c: float | None, kl_penalty: str) -> None:
    """veRL 0.9.1: core_algos.compute_policy_loss_vanilla (masked_mean = sum / (count + 1e-8)), agg_loss,
    metric_utils.compute_data_metrics.

    Three rounds over a 4-row storage: P1, the log-ratio and the KL (and the ratio, for P2, in slot 2); P2, the
    policy loss's per-token quantities and the entropy; A, the inputs' statistics and the variances of
    ``vf_explained_var``, their mean dividing by P1's count, whose sums sit right before A's (planned after P1).
    The token-level scores and rewards are summed where they are, over every position.
    """
    a, f = s.a, s.f
    ret, val = a["returns"], a["values"]
    has_ref, has_adv, has_ent = (a[n] is not None for n in ("ref_log_probs", "advantages", "entropy"))
    k3 = has_ref and kl_penalty in _K3
    rv = ret is not None and val is not None
    # P1: [neg_kl, k3, ratio (or the entropy without P2), (exp(-k1), 1)]
    P1 = s.rows([["neg_kl", "k3" if has_ref else None,
                  "ratio" if has_adv else "entropy" if has_ent else None, ("expk", "1")]], scratch=("ratio", "expk"))
    # P2: [clip, lower, (surr1, ent), (surr2, pg)]: the ratio P1 left in slot 2 becomes surr1, in place
    P2 = None
    if has_adv:
        P2 = s.rows([["clip", "lower", ("s1", "entropy") if has_ent else "s1", ("s2", "pg")]], scratch=("s1", "s2"))
    # A: [rv, ret, val, adv]: maxima and minima of ret .. adv
    slots = ["rv" if rv else None, *_present(s, "returns", "values", "advantages")]
    A = s.rows([slots], mm=slice(1, 4)) if any(slots) else None
    s.plan(P1, A, P2, reused=("advantages",) if has_adv and A is not None else ())
    tail = [n for n in ("scores", "rewards") if _dims(a[n]) == 2]
    tail_parts = {n: s.seq_sums(n) for n in tail}

    P1.start()
    lp, old = s.src("log_probs"), s.src("old_log_probs")
    assert lp is not None and old is not None
    torch.sub(lp, old, out=P1["neg_kl"])
    del old
    ref = s.src("ref_log_probs")
    if k3:  # -k1 beside the log-ratio: both clamped to +-20 as veRL clamps them, in one kernel
        torch.sub(ref, lp, out=P1["k3"])  # type: ignore[arg-type]
    both = P1.rows("neg_kl", "k3") if k3 else P1.rows("neg_kl")
    both.clamp_(-20.0, 20.0)
    if has_adv:
        torch.exp(both, out=P1.rows("ratio", "expk") if k3 else P1.rows("ratio"))  # the ratio (and exp(-k1))
    elif k3:
        torch.exp(P1["k3"], out=P1["expk"])
    if k3:
        _k3_from(P1["expk"], P1["k3"], out=P1["k3"])
    elif has_ref:
        _k1_terms(lp, ref, kl_penalty, out=P1["k3"])  # type: ignore[arg-type]
    del lp, ref
    if not has_adv:
        s.load(P1, {"entropy": "entropy"})
    seq = [n for n in ("k3", "entropy") if n in P1.pos] if s.seq_mean else []
    P1r = P1.reduce(per_seq=seq)

    P2r: Reduced | None = None
    if P2 is not None:
        # veRL's losses are the negated surrogates: pg_losses2 > pg_losses1 <=> surr2 < surr1; clip_pg_losses1 =
        # -min(surr1, surr2); the dual clip's bound -A * c: where A < 0 the objective is raised to A * c
        # (clamp(A, max=0) * c is 0 where A >= 0, where the objective is >= 0), which is pg_clipfrac_lower:
        # bound > min(surr1, surr2), i.e. the raised objective is above the clipped one.
        P2.start()
        adv = s.src("advantages")
        assert adv is not None
        torch.clamp(P1["ratio"], 1.0 - clip_low, 1.0 + clip_high, out=P2["s2"])
        torch.mul(f.rows((P1, "ratio"), (P2, "s2")), adv, out=P2.rows("s1", "s2"))
        torch.lt(P2["s2"], P2["s1"], out=P2["clip"])
        torch.minimum(P2["s1"], P2["s2"], out=P2["s1"])
        bound = torch.clamp(adv, max=0.0, out=P2["s2"]).mul_(VERL_CLIP_RATIO_C if clip_c is None else clip_c)
        torch.maximum(P2["s1"], bound, out=P2["pg"])  # the objective (the loss is its negation), over the bound
        torch.gt(P2["pg"], P2["s1"], out=P2["lower"])
        del adv, bound
        s.load(P2, {"entropy": "entropy"})
        P2r = P2.reduce(per_seq=[n for n in ("pg", "entropy") if n in P2.pos] if s.seq_mean else [])

    Ar: Reduced | None = None
    if A is not None:
        A.start()
        s.load(A, {n: n for n in ("returns", "values", "advantages")})
        if rv:
            torch.sub(A["returns"], A["values"], out=A["rv"])
        Ar = A.reduce(var=["rv", "returns"] if rv else [])
    lengths_part = s.seq_input("response_lengths")
    score_parts = {n: s.seq_input(n) for n in ("scores", "rewards") if _dims(a[n]) == 1}
    prompt_part = s.prompt_lengths()
    width = s.width
    prompt_width = None if a["prompt_mask"] is None else a["prompt_mask"].shape[-1]
    ent_rows = P2r if P2r is not None else P1r

    def finish() -> Host:
        n = f.n(RESP)
        den = _eps(n)  # veRL's masked_mean: sum / (count + 1e-8)
        out: Host = {"actor/ppo_kl": -_div(P1r.total("neg_kl"), den)}  # masked_mean(-negative_approx_kl)
        if has_ref:
            out["actor/kl_loss"] = s.agg(P1r, "k3")
        if P2r is not None:
            out["actor/pg_clipfrac"] = _div(P2r.total("clip"), den)
            out["actor/pg_clipfrac_lower"] = _div(P2r.total("lower"), den)
            out["actor/pg_loss"] = -s.agg(P2r, "pg")
        for name, prefix in (("advantages", "critic/advantages"), ("returns", "critic/returns"),
                             ("values", "critic/values")):
            if a[name] is not None:
                assert Ar is not None
                out.update({f"{prefix}/mean": _div(Ar.total(name), n), f"{prefix}/max": Ar.max(name),
                            f"{prefix}/min": Ar.min(name)})
        if has_ent:
            out["actor/entropy"] = s.agg(ent_rows, "entropy")
        if rv:
            assert Ar is not None
            unbiased = (lambda name: _div(Ar.m2(name), n - 1) if n > 1 else math.nan)
            out["critic/vf_explained_var"] = 1.0 - unbiased("rv") / (unbiased("returns") + 1e-5)
        # metric_utils.compute_data_metrics
        lengths = s.host(lengths_part) if lengths_part is not None else f.counts(RESP)
        assert lengths is not None
        kept = lengths != 0  # aborted: response length 0
        n_kept = float(np.count_nonzero(kept))

        def kept_family(prefix: str, x: np.ndarray, clip: bool = False) -> Host:
            xk = x[kept]
            fam = {f"{prefix}/mean": _div(float(xk.sum()), n_kept),
                   f"{prefix}/max": float(xk.max()) if xk.size else math.nan,
                   f"{prefix}/min": float(xk.min()) if xk.size else math.nan}
            if clip:
                fam[f"{prefix}/clip_ratio"] = _div(float(np.count_nonzero(xk == width)), n_kept)
            return fam

        for name, prefix in (("scores", "critic/score"), ("rewards", "critic/rewards")):
            if a[name] is not None:  # token_level_{scores,rewards}.sum(-1): every position, as veRL sums
                x = s.host(tail_parts[name] if name in tail else score_parts[name])
                out.update(kept_family(prefix, x))  # type: ignore[arg-type]
        out.update(_family("response_length", lengths))
        out["response_length/clip_ratio"] = _mean((lengths == width).astype(np.float64))
        out.update(kept_family("response_length_non_aborted", lengths, clip=True))
        out["response/aborted_ratio"] = _mean((~kept).astype(np.float64))
        if prompt_part is not None:
            prompt_len = s.host(prompt_part)
            assert prompt_len is not None
            out.update(_family("prompt_length", prompt_len))
            out["prompt_length/clip_ratio"] = _mean((prompt_len == prompt_width).astype(np.float64))
        return out

    s.finish.append(finish)


def _sequences(s: _Stats, *, roll: bool, trl: bool) -> None:
    """Per-sequence scores and lengths, ROLL's and TRL's."""
    scores = s.a["scores"]
    if scores is not None and scores.dim() == 2:  # token-level scores: summed over the response tokens
        score_part: int | None = s.f.part(s.row_sums_now(s.src("scores"), RESP))  # type: ignore[arg-type]
    else:
        score_part = s.seq_input("scores")
    prompt_part = s.prompt_lengths()

    def finish() -> Host:
        out: Host = {}
        sc = s.host(score_part)
        if sc is not None:
            if roll:
                out.update(_family("critic/score", sc))
                out.update(s.seq_dist("critic/score_dist", lambda: sc))
            if trl:
                mean, std = _mean(sc), _std(sc)
                out.update({"env/reward_mean": mean, "env/reward_std": std, "ppo/mean_scores": mean,
                            "ppo/std_scores": std})
                out.update(s.seq_dist("env/reward_dist", lambda: sc))
        resp_len = s.f.counts(RESP)
        if roll:
            out.update(_family("tokens/response_length", resp_len))
            out.update(s.seq_dist("tokens/response_length_dist", lambda: resp_len))
        if trl:
            out.update({"tokens/responses_len_mean": _mean(resp_len), "tokens/responses_len_std": _std(resp_len)})
            out.update(s.seq_dist("tokens/responses_dist", lambda: resp_len))
        prompt_len = s.host(prompt_part)
        if prompt_len is not None:
            if roll:
                out.update(_family("tokens/prompt_length", prompt_len))
            if trl:
                out.update({"tokens/queries_len_mean": _mean(prompt_len), "tokens/queries_len_std": _std(prompt_len)})
                out.update(s.seq_dist("tokens/queries_dist", lambda: prompt_len))
        return out

    s.finish.append(finish)
