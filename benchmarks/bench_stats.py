"""``ppo_stats`` against the frameworks' own per-metric code: time, peak memory and, on a GPU, kernels launched.

    python benchmarks/bench_stats.py [--sizes 64x512 256x1024 512x4096] [--rounds 15] [--profile verl:512x4096]
    python benchmarks/bench_stats.py --device cuda     # the GPU comparison: gpu_comparison("cuda")

For each framework's key set (``names="verl"``, ``"roll"``, ``"trl"``) and each batch size, the baseline is that
framework's metric code as the framework writes it (``benchmarks/baselines/``: veRL's ``compute_data_metrics`` and
policy-loss metrics, ROLL's actor/critic ``loss_func`` and data metrics, TRL's legacy ``PPOTrainer`` step stats),
fed the same batch prepared the way that framework prepares it; ``tests/test_stats_baselines.py`` checks the two
give the same numbers. Time: interleaved A/B rounds, the median of the per-round ratios (``common.ab_rounds``).
Memory: the peak of the bytes held by tensors each allocates (``common.peak_tensor_bytes``; the inputs, allocated
before, are not counted), on a CPU also of the accelerator layout (``_compact=False``: the tensors a GPU would
allocate, its rounds' ``[slots, B, T]`` buffer and masks; ``tests/test_stats_memory.py`` bounds it). Also printed:
the host syncs each makes (``.item()``/``.tolist()``/``.cpu()`` calls).

On a GPU (``--device cuda``, or :func:`gpu_comparison`, which ``benchmarks/bench_gpu.py`` prints) both sides are
launch-bound, so the rows are the wall time of a call (interleaved rounds; each call ends reading its results on
the host), the kernels it launches (torch's profiler, CUDA activity; memcpy and memset counted apart), the GPU's
busy time and the peak of the device memory allocated, against issue 32's targets: at most 0.5x the frameworks'
time and at most 40 kernels a call, at B=512, T=4096 and B=64, T=512.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's rl_otel, not an installed one
sys.path.insert(0, str(Path(__file__).resolve().parent))

from baselines import roll as roll_baseline
from baselines import trl as trl_baseline
from baselines import verl as verl_baseline
from common import Row, ab_rounds, peak_tensor_bytes, torch_threads

from rl_otel.stats import ppo_stats

CLIP_LOW, CLIP_HIGH, VALUE_CLIP, KL_COEF, BETA = 0.2, 0.28, 0.2, 0.05, 0.05
SIZES = ((64, 512), (256, 1024), (512, 4096))
GPU_SHAPES = ((512, 4096), (64, 512))  # issue 32's
TARGET_TIME_RATIO, TARGET_KERNELS = 0.5, 40  # on a GPU: ppo_stats' wall time over the framework's, kernels a call
PROMPT = 256
FRAMEWORKS = ("verl", "roll", "trl")


class Case:
    """One framework's batch of ``b`` sequences of ``t`` response tokens: ``ours()`` and ``theirs()`` compute the
    same metrics from it."""

    def __init__(self, framework: str, b: int, t: int, seed: int = 0, full: bool = False) -> None:
        self.framework, self.b, self.t, self.full = framework, b, t, full
        g = torch.Generator().manual_seed(seed)
        # response lengths uniform in [1, T] (half the positions are response tokens), or in [0.9 T, T] (full)
        lengths = torch.randint(max(1, int(0.9 * t)) if full else 1, t + 1, (b,), generator=g)
        lengths[0] = t  # one response cut at the maximum length
        if framework == "verl":
            lengths[1] = 0  # an aborted sample
        mask = torch.arange(t)[None, :] < lengths[:, None]
        prompt_len = torch.randint(1, PROMPT + 1, (b,), generator=g)
        prompt_mask = (torch.arange(PROMPT)[None, :] >= PROMPT - prompt_len[:, None]).long()  # left-padded
        lp = -torch.rand(b, t, generator=g) * 3
        old = lp + 0.3 * torch.randn(b, t, generator=g)
        ref = lp + 0.2 * torch.randn(b, t, generator=g) - 0.02  # a positive KL on average, as in training
        adv, ret = torch.randn(b, t, generator=g), torch.randn(b, t, generator=g)
        val, vpr = torch.randn(b, t, generator=g), torch.randn(b, t, generator=g)
        ent = torch.rand(b, t, generator=g) * 2
        scores = torch.randn(b, generator=g)
        last = (lengths - 1).clamp(min=0)
        getattr(self, f"_{framework}")(mask, prompt_mask, lp, old, ref, adv, ret, val, vpr, ent, scores, last, g)

    def _verl(self, mask, prompt_mask, lp, old, ref, adv, ret, val, vpr, ent, scores, last, g) -> None:
        m = mask.long()
        token_level_scores = torch.zeros(self.b, self.t).scatter_(1, last[:, None], scores[:, None]) * m
        kld = verl_baseline.kl_penalty(old, ref) * m  # ray_trainer.apply_kl_penalty
        token_level_rewards = token_level_scores - BETA * kld
        self.batch = {
            "prompts": torch.randint(0, 100, prompt_mask.shape, generator=g),
            "responses": torch.randint(0, 100, (self.b, self.t), generator=g),
            "attention_mask": torch.cat([prompt_mask, m], dim=1), "response_mask": m,
            "token_level_scores": token_level_scores, "token_level_rewards": token_level_rewards,
            "values": val * m, "advantages": adv * m, "returns": ret * m,
            "old_log_probs": old, "log_probs": lp, "ref_log_prob": ref, "entropy": ent,
        }
        bt = self.batch
        self.kwargs = {"log_probs": lp, "old_log_probs": old, "ref_log_probs": ref, "response_mask": m,
                       "advantages": bt["advantages"], "values": bt["values"], "returns": bt["returns"],
                       "entropy": ent, "scores": token_level_scores, "rewards": token_level_rewards,
                       "prompt_mask": prompt_mask, "clip_ratio_low": CLIP_LOW, "clip_ratio_high": CLIP_HIGH,
                       "names": "verl"}

    def _roll(self, mask, prompt_mask, lp, old, ref, adv, ret, val, vpr, ent, scores, last, g) -> None:
        m = mask.float()
        keep = (torch.rand(self.b, generator=g) < 0.8).float()  # the sample-level masks drop ~20% of the samples
        final = m * keep[:, None]
        rewards = torch.zeros(self.b, self.t).scatter_(1, last[:, None], scores[:, None]) * final
        self.batch = {  # as ROLL prepares them: log-probs and entropy zero off response_mask, the rest off final
            "response_mask": m, "final_response_mask": final, "log_probs": lp * m, "old_log_probs": old * m,
            "ref_log_probs": ref * m, "advantages": adv * final, "returns": ret * final, "values": val * final,
            "vpreds": vpr, "entropy": ent * m, "scores": scores, "token_level_rewards": rewards,
            "prompt_mask": prompt_mask,
        }
        bt = self.batch
        self.kwargs = {**{k: bt[k] for k in ("log_probs", "old_log_probs", "ref_log_probs", "advantages", "returns",
                                             "values", "vpreds", "entropy", "scores", "prompt_mask")},
                       "response_mask": m, "final_response_mask": final, "rewards": rewards,
                       "clip_ratio_low": CLIP_LOW, "clip_ratio_high": CLIP_HIGH, "value_clip": VALUE_CLIP,
                       "loss_agg_mode": "seq-mean-token-mean", "names": "roll"}

    def _trl(self, mask, prompt_mask, lp, old, ref, adv, ret, val, vpr, ent, scores, last, g) -> None:
        m = mask.long()
        self.batch = {"masks": m, "logprobs": lp, "old_logprobs": old, "ref_logprobs": ref, "advantages": adv,
                      "returns": ret, "values": val, "vpreds": vpr, "entropy": ent, "scores": scores,
                      "query_mask": prompt_mask}
        self.kwargs = {"log_probs": lp, "old_log_probs": old, "ref_log_probs": ref, "response_mask": m,
                       "advantages": adv, "returns": ret, "values": val, "vpreds": vpr, "entropy": ent,
                       "scores": scores, "prompt_mask": prompt_mask, "clip_ratio_low": CLIP_LOW,
                       "value_clip": VALUE_CLIP, "kl_coef": KL_COEF, "names": "trl"}

    def to(self, device: str) -> Case:
        """The same batch on ``device`` (e.g. ``cuda``: ppo_stats then takes its one-transfer path)."""
        self.batch = {k: v.to(device) for k, v in self.batch.items()}
        self.kwargs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in self.kwargs.items()}
        return self

    def ours(self) -> dict:
        return ppo_stats(**self.kwargs)

    def theirs(self) -> dict[str, float]:
        if self.framework == "verl":
            return verl_baseline.step_metrics(self.batch, clip_ratio_low=CLIP_LOW, clip_ratio_high=CLIP_HIGH)
        if self.framework == "roll":
            return roll_baseline.step_metrics(self.batch, pg_clip_low=CLIP_LOW, pg_clip_high=CLIP_HIGH,
                                              value_clip=VALUE_CLIP)
        return trl_baseline.step_metrics(self.batch, cliprange=CLIP_LOW, cliprange_value=VALUE_CLIP,
                                         kl_coef=KL_COEF)

    @property
    def label(self) -> str:
        return f"names={self.framework!r}, B={self.b} T={self.t}" + (", 95% full" if self.full else "")


BASELINE_NAMES = {"verl": "veRL compute_data_metrics + policy-loss metrics", "roll": "ROLL loss_func + data metrics",
                  "trl": "TRL legacy PPOTrainer step stats"}


def count_syncs(fn: Callable[[], object]) -> int:
    """Host syncs (``.item()``, ``.tolist()``, ``.cpu()``, ``bool(tensor)``) made by ``fn`` (``.numpy()`` is not
    counted: it views a CPU tensor, a device tensor has to be copied with ``.cpu()`` first)."""
    names = ("item", "tolist", "cpu", "__bool__")
    originals = {name: getattr(torch.Tensor, name) for name in names}
    calls = 0

    def wrap(original):
        def counting(self, *args, **kwargs):
            nonlocal calls
            calls += 1
            return original(self, *args, **kwargs)
        return counting

    try:
        for name, original in originals.items():
            setattr(torch.Tensor, name, wrap(original))
        fn()
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)
    return calls


def peak_cuda_bytes(fn: Callable[[], object]) -> int:
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def measure(case: Case, rounds: int) -> dict[str, float]:
    """Both sides end reading their results on the host (``.item()`` / ``.tolist()``), so on a GPU the wall time
    of a call includes the kernels it waited for."""
    cuda = case.kwargs["log_probs"].is_cuda
    peak = peak_cuda_bytes if cuda else peak_tensor_bytes
    with torch_threads(1):
        timing = ab_rounds([case.ours, case.theirs], rounds, budget_s=2.0)
        ours_bytes, theirs_bytes = peak(case.ours), peak(case.theirs)
        accelerator_bytes = None if cuda else peak(lambda: ppo_stats(**case.kwargs, _compact=False))
    return {"ours": timing.median(0), "theirs": timing.median(1), "ratio": timing.ratio(0, 1),
            "ours_bytes": ours_bytes, "theirs_bytes": theirs_bytes, "accelerator_bytes": accelerator_bytes}


def rows(quick: bool = False, sizes=None, rounds: int | None = None, device: str = "cpu") -> list[Row]:
    full = not quick and not sizes
    sizes = sizes or (SIZES[:1] if quick else SIZES)
    rounds = rounds or (5 if quick else 15)
    cases = [Case(fw, b, t) for b, t in sizes for fw in FRAMEWORKS]
    if full:  # nearly every position a response token: the most memory relative to the frameworks' code
        cases += [Case(fw, 256, 1024, full=True) for fw in FRAMEWORKS]
    where = "CPU 1 thread" if device == "cpu" else device
    cases = [case.to(device) for case in cases] if device != "cpu" else cases
    out = []
    for case in cases:
        m = measure(case, rounds)
        base = BASELINE_NAMES[case.framework]
        out.append(Row(f"ppo_stats {case.label}, {where}: time", m["ours"] * 1e3, m["theirs"] * 1e3, "ms",
                       "ratio <= 1", m["ratio"] <= 1.0, base, paired_ratio=m["ratio"]))
        out.append(Row(f"ppo_stats {case.label}: peak tensor memory", m["ours_bytes"] / 2**20,
                       m["theirs_bytes"] / 2**20, "MiB", "ratio <= 1", m["ours_bytes"] <= m["theirs_bytes"], base))
        if m["accelerator_bytes"] is not None:
            out.append(Row(f"ppo_stats {case.label}: peak tensor memory, accelerator layout",
                           m["accelerator_bytes"] / 2**20, m["theirs_bytes"] / 2**20, "MiB", "ratio <= 1",
                           m["accelerator_bytes"] <= m["theirs_bytes"], base))
    return out


def device_activity(fn: Callable[[], object]) -> dict[str, float]:
    """What one call of ``fn`` does on the current CUDA device, by torch's profiler (CUDA activity): the kernels it
    launches, its memcpy and memset operations (not kernels: a device-to-host read, the zeroing of a large
    reduction's semaphores), and the GPU time they take together (ms)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:  # CPU: its events skipped
        fn()
        torch.cuda.synchronize()
    kernels = copies = 0
    busy_us = 0.0
    for event in prof.events():
        if event.device_type != DeviceType.CUDA:
            continue
        if event.name.startswith(("Memcpy", "Memset")):
            copies += 1
        else:
            kernels += 1
        busy_us += event.time_range.elapsed_us()
    return {"kernels": kernels, "copies": copies, "gpu_ms": busy_us / 1e3}


def gpu_comparison(device: str, rounds: int = 15, shapes: tuple[tuple[int, int], ...] = GPU_SHAPES) -> list[dict]:
    """``ppo_stats`` against each framework's metric code on ``device`` (a CUDA device), one row per framework and
    shape: ``framework``, ``shape`` (``"BxT"``), ``ours_ms``/``theirs_ms`` (median wall time of a call, each ending
    with its results on the host; interleaved A/B rounds), ``ratio`` (the median of the per-round ratios),
    ``ours_kernels``/``theirs_kernels`` (kernels a call launches, by torch's profiler), ``ours_peak_bytes``/
    ``theirs_peak_bytes`` (device memory allocated at the peak, above what was allocated before), and
    ``ours_copies``/``theirs_copies`` (memcpy + memset operations), ``ours_gpu_ms``/``theirs_gpu_ms`` (the time the
    GPU is busy), ``ours_first_ms`` (the first call's wall time: any one-off cost; ppo_stats compiles nothing)."""
    import time

    torch.cuda.set_device(torch.device(device))
    out: list[dict] = []
    for b, t in shapes:
        for fw in FRAMEWORKS:
            case = Case(fw, b, t).to(device)
            start = time.perf_counter()
            case.ours()
            first_ms = (time.perf_counter() - start) * 1e3
            case.theirs()
            timing = ab_rounds([case.ours, case.theirs], rounds, budget_s=2.0)
            ours, theirs = device_activity(case.ours), device_activity(case.theirs)
            out.append({"framework": fw, "shape": f"{b}x{t}", "ours_ms": timing.median(0) * 1e3,
                        "theirs_ms": timing.median(1) * 1e3, "ratio": timing.ratio(0, 1),
                        "ours_kernels": int(ours["kernels"]), "theirs_kernels": int(theirs["kernels"]),
                        "ours_peak_bytes": peak_cuda_bytes(case.ours),
                        "theirs_peak_bytes": peak_cuda_bytes(case.theirs),
                        "ours_copies": int(ours["copies"]), "theirs_copies": int(theirs["copies"]),
                        "ours_gpu_ms": ours["gpu_ms"], "theirs_gpu_ms": theirs["gpu_ms"], "ours_first_ms": first_ms})
    return out


def gpu_table(rows: list[dict]) -> str:
    """:func:`gpu_comparison`'s rows against the targets (at most 0.5x the framework's time, 40 kernels)."""
    head = ("names", "BxT", "ppo_stats ms", "framework ms", "ratio", f"<= {TARGET_TIME_RATIO}", "kernels (+copies)",
            "framework's", f"<= {TARGET_KERNELS}", "GPU busy ms", "peak MiB", "framework's", "first call ms")
    body = [(r["framework"], r["shape"], f"{r['ours_ms']:.3f}", f"{r['theirs_ms']:.3f}", f"{r['ratio']:.3f}",
             "met" if r["ratio"] <= TARGET_TIME_RATIO else "MISSED", f"{r['ours_kernels']} (+{r['ours_copies']})",
             f"{r['theirs_kernels']} (+{r['theirs_copies']})",
             "met" if r["ours_kernels"] <= TARGET_KERNELS else "MISSED",
             f"{r['ours_gpu_ms']:.3f} / {r['theirs_gpu_ms']:.3f}", f"{r['ours_peak_bytes'] / 2**20:.1f}",
             f"{r['theirs_peak_bytes'] / 2**20:.1f}", f"{r['ours_first_ms']:.1f}") for r in rows]
    widths = [max(len(str(c)) for c in col) for col in zip(head, *body, strict=True)]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()
                     for cells in (head, *body))


def profile(spec: str) -> None:
    """cProfile and torch's profiler of ``ppo_stats`` for ``framework:BxT``: where its time goes."""
    import cProfile
    import pstats

    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    fw, size = spec.split(":")
    b, t = map(int, size.split("x"))
    case = Case(fw, b, t)
    with torch_threads(1):
        case.ours()
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(20):
            case.ours()
        pr.disable()
        pstats.Stats(pr).sort_stats("cumulative").print_stats(25)
        with torch_profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            case.ours()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))


def main() -> None:
    from common import table

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=[f"{b}x{t}" for b, t in SIZES], help="BxT")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--profile", metavar="FRAMEWORK:BxT", help="profile ppo_stats instead (e.g. verl:512x4096)")
    parser.add_argument("--device", default="cpu", help="where the batch lives (cuda: the one-transfer path)")
    args = parser.parse_args()
    if args.profile:
        profile(args.profile)
        return
    sizes = [tuple(map(int, s.split("x"))) for s in args.sizes]
    default = args.sizes == [f"{b}x{t}" for b, t in SIZES]
    if args.device.startswith("cuda"):
        print(f"{torch.cuda.get_device_name(torch.device(args.device))}, torch {torch.__version__}; "
              f"{args.rounds}+ interleaved A/B rounds, median of the per-round ratios; targets: ppo_stats at most "
              f"{TARGET_TIME_RATIO}x the framework's wall time, at most {TARGET_KERNELS} kernels a call")
        for fw in FRAMEWORKS:
            case = Case(fw, *GPU_SHAPES[0]).to(args.device)
            print(f"host reads, {fw}: ppo_stats {count_syncs(case.ours)}, {BASELINE_NAMES[fw]} "
                  f"{count_syncs(case.theirs)}")
        print(gpu_table(gpu_comparison(args.device, rounds=args.rounds,
                                       shapes=GPU_SHAPES if default else tuple(sizes))))  # type: ignore[arg-type]
        return
    print(f"{args.device}, 1 torch thread, torch {torch.__version__}; {args.rounds} interleaved A/B rounds, median of "
          "the per-round ratios")
    for fw in FRAMEWORKS:
        case = Case(fw, sizes[0][0], sizes[0][1]).to(args.device)
        accelerator = count_syncs(lambda c=case: ppo_stats(**c.kwargs, _compact=False))
        print(f"host reads, {fw}: ppo_stats {count_syncs(case.ours)} (CPU layout), {accelerator} (its accelerator "
              f"layout), {BASELINE_NAMES[fw]} {count_syncs(case.theirs)} (a sync each on a GPU)")
    print(table(rows(sizes=None if default else sizes, rounds=args.rounds, device=args.device)))


if __name__ == "__main__":
    main()
