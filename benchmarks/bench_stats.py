"""Fused ppo_stats vs the same metrics computed one by one with ``.item()`` (ROLL / veRL style), on CPU.

    python benchmarks/bench_stats.py [--batch 256] [--tokens 1024] [--repeat 30]

Two per-metric baselines compute the same 42 ROLL-named metrics: one written with the frameworks' own expressions
(ROLL's actor worker: mask multiplication, ``ratio * mask + (1 - mask) * 1e10``; veRL's ``compute_data_metrics``:
``torch.masked_select`` then one ``.item()`` per statistic), and a lean one (``torch.where`` masks, the shared
elementwise tensors computed once). Prints the best time of each over interleaved runs, the ratios measured in
this run, and the host syncs each makes (counted by wrapping ``Tensor.item`` / ``Tensor.tolist``). On a CPU a
sync costs about a microsecond; on a GPU each ``.item()`` is a stream synchronisation that also stalls the
kernel queue, which this CPU run cannot show.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's rl_otel, not an installed one

from rl_otel.stats import ppo_stats

CLIP = 0.2


def make_batch(b: int, t: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lp = -torch.rand(b, t, generator=g) * 3
    lengths = torch.randint(1, t + 1, (b,), generator=g)
    mask = (torch.arange(t)[None, :] < lengths[:, None]).long()
    return {
        "log_probs": lp, "old_log_probs": lp + 0.1 * torch.randn(b, t, generator=g), "response_mask": mask,
        "advantages": torch.randn(b, t, generator=g), "ref_log_probs": lp + 0.1 * torch.randn(b, t, generator=g),
        "values": torch.randn(b, t, generator=g), "returns": torch.randn(b, t, generator=g),
        "vpreds": torch.randn(b, t, generator=g), "rewards": torch.randn(b, generator=g),
        "scores": torch.randn(b, generator=g), "entropy": torch.rand(b, t, generator=g),
        "prompt_mask": (torch.rand(b, 256, generator=g) < 0.9).long(),
    }


def per_metric(d: dict[str, torch.Tensor]) -> dict[str, float]:
    """The same ROLL-named metrics, one reduction and one ``.item()`` each, as the frameworks write them."""
    mask = d["response_mask"].float()
    bmask = d["response_mask"].bool()

    def masked_mean(x):
        return ((x * mask).sum() / mask.sum()).item()

    def masked_max(x):
        return torch.where(bmask, x, -torch.inf).max().item()

    def masked_min(x):
        return torch.where(bmask, x, torch.inf).min().item()

    lp, old, ref, adv = d["log_probs"], d["old_log_probs"], d["ref_log_probs"], d["advantages"]
    ratio = (lp - old).exp()
    surr1 = ratio * adv
    surr2 = ratio.clamp(1 - CLIP, 1 + CLIP) * adv
    clipped_low = (ratio < 1 - CLIP).float()
    clipped_high = (ratio > 1 + CLIP).float()
    m: dict[str, float] = {
        "actor/ratio_mean": masked_mean(ratio), "actor/ratio_max": masked_max(ratio),
        "actor/ratio_min": masked_min(ratio),
        "actor/ppo_ratio_high_clipfrac": masked_mean(clipped_high),
        "actor/ppo_ratio_low_clipfrac": masked_mean(clipped_low),
        "actor/ppo_ratio_clipfrac": masked_mean(clipped_low + clipped_high),
        "actor/clipfrac": masked_mean(torch.lt(surr2, surr1).float()),
        "actor/approxkl": masked_mean(0.5 * (lp - old) ** 2), "actor/policykl": masked_mean(lp - old),
        "actor/kl_loss": masked_mean(lp - ref),
    }
    for prefix, x in (("critic/ref_log_prob", ref), ("critic/old_log_prob", old), ("critic/entropy", d["entropy"]),
                      ("critic/advantages", adv), ("critic/returns", d["returns"]), ("critic/values", d["values"])):
        m[f"{prefix}/mean"], m[f"{prefix}/max"], m[f"{prefix}/min"] = masked_mean(x), masked_max(x), masked_min(x)
    m["critic/vpred"] = masked_mean(d["vpreds"])
    m["critic/error"] = masked_mean((d["vpreds"] - d["returns"]) ** 2)
    for prefix, x in (("critic/rewards", d["rewards"]), ("critic/score", d["scores"]),
                      ("tokens/response_length", mask.sum(-1)),
                      ("tokens/prompt_length", d["prompt_mask"].float().sum(-1))):
        m[f"{prefix}/mean"], m[f"{prefix}/max"], m[f"{prefix}/min"] = (x.mean().item(), x.max().item(),
                                                                      x.min().item())
    return m


def frameworks_style(d: dict[str, torch.Tensor]) -> dict[str, float]:
    """The same metrics written the way ROLL's actor worker and veRL's ``compute_data_metrics`` write them:
    mask multiplication (``(x * mask).sum() / mask.sum()``, ``ratio * mask + (1 - mask) * 1e10``) for the actor,
    ``torch.masked_select`` then ``.item()`` per statistic for the critic, value and token families."""
    mask = d["response_mask"].float()
    bmask = d["response_mask"].bool()

    def masked_mean(x):
        return (x * mask).sum() / mask.sum()

    lp, old, ref, adv = d["log_probs"], d["old_log_probs"], d["ref_log_probs"], d["advantages"]
    ratio = (lp - old).exp()
    surr1 = ratio * adv
    surr2 = ratio.clamp(1 - CLIP, 1 + CLIP) * adv
    approxkl = 0.5 * (lp - old) ** 2 * mask
    policykl = (lp - old) * mask
    kl = (lp - ref) * mask
    clipped_low = (ratio < 1 - CLIP).float()
    clipped_high = (ratio > 1 + CLIP).float()
    clipped = (clipped_low + clipped_high).float()
    m: dict[str, float] = {
        "actor/ppo_ratio_high_clipfrac": masked_mean(clipped_high).detach().item(),
        "actor/ppo_ratio_low_clipfrac": masked_mean(clipped_low).detach().item(),
        "actor/ppo_ratio_clipfrac": masked_mean(clipped).detach().item(),
        "actor/ratio_mean": masked_mean(ratio).detach().item(),
        "actor/ratio_max": torch.max(ratio * mask).detach().item(),
        "actor/ratio_min": torch.min(ratio * mask + (1 - mask) * 1e10).detach().item(),
        "actor/clipfrac": masked_mean(torch.lt(surr2, surr1).float()).detach().item(),
        "actor/kl_loss": masked_mean(kl).detach().item(),
        "actor/approxkl": masked_mean(approxkl).detach().item(),
        "actor/policykl": masked_mean(policykl).detach().item(),
    }
    for prefix, x in (("critic/ref_log_prob", ref), ("critic/old_log_prob", old), ("critic/entropy", d["entropy"]),
                      ("critic/advantages", adv), ("critic/returns", d["returns"]), ("critic/values", d["values"])):
        valid = torch.masked_select(x, bmask)
        m[f"{prefix}/mean"] = torch.mean(valid).detach().item()
        m[f"{prefix}/max"] = torch.max(valid).detach().item()
        m[f"{prefix}/min"] = torch.min(valid).detach().item()
    m["critic/vpred"] = masked_mean(d["vpreds"]).detach().item()
    m["critic/error"] = masked_mean((d["vpreds"] - d["returns"]) ** 2).detach().item()
    response_length = d["response_mask"].sum(-1).float()
    prompt_length = d["prompt_mask"].sum(-1).float()
    for prefix, x in (("critic/rewards", d["rewards"]), ("critic/score", d["scores"]),
                      ("tokens/response_length", response_length), ("tokens/prompt_length", prompt_length)):
        m[f"{prefix}/mean"] = torch.mean(x).detach().item()
        m[f"{prefix}/max"] = torch.max(x).detach().item()
        m[f"{prefix}/min"] = torch.min(x).detach().item()
    return m


def fused(d: dict[str, torch.Tensor]) -> dict[str, float]:
    return ppo_stats(**d, clip_ratio_low=CLIP)


def count_syncs(fn, d) -> int:
    calls = 0
    originals = {name: getattr(torch.Tensor, name) for name in ("item", "tolist")}

    def wrap(original):
        def counting(self, *args, **kwargs):
            nonlocal calls
            calls += 1
            return original(self, *args, **kwargs)
        return counting

    try:
        for name, original in originals.items():
            setattr(torch.Tensor, name, wrap(original))
        fn(d)
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)
    return calls


def best_seconds(fns, d, repeat: int) -> list[float]:
    """The fastest of ``repeat`` interleaved runs of each function (robust to a busy, shared machine)."""
    for fn in fns:
        fn(d)  # warm-up
    best = [float("inf")] * len(fns)
    for _ in range(repeat):
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            fn(d)
            best[i] = min(best[i], time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args()
    d = make_batch(args.batch, args.tokens)
    got = fused(d)
    print(f"B={args.batch} T={args.tokens} on CPU ({torch.get_num_threads()} threads), torch {torch.__version__}; "
          f"best of {args.repeat} interleaved runs")
    baselines = (("per-metric .item(), frameworks' expressions", frameworks_style),
                 ("per-metric .item(), lean (torch.where masks)", per_metric))
    times = best_seconds([fused] + [fn for _, fn in baselines], d, args.repeat)
    print(f"  {'fused ppo_stats':46s} {times[0] * 1e3:7.2f} ms  host syncs: {count_syncs(fused, d):3d}  "
          f"({len(got)} metrics)")
    for (label, fn), seconds in zip(baselines, times[1:]):
        want = fn(d)
        assert set(want) <= set(got), sorted(set(want) - set(got))
        worst = max(abs(got[k] - want[k]) / max(1.0, abs(want[k])) for k in want)
        print(f"  {label:46s} {seconds * 1e3:7.2f} ms  host syncs: {count_syncs(fn, d):3d}  "
              f"({len(want)} metrics, max rel. diff {worst:.1e})  fused is {seconds / times[0]:.2f}x faster")


if __name__ == "__main__":
    main()
