"""The benchmark's baselines (``benchmarks/baselines/``: the frameworks' own per-metric code) compute what
``ppo_stats`` computes, so the ``ppo_stats`` rows of ``benchmarks/run.py`` time the same numbers; veRL's copy gives
what veRL's installed functions give; and ``ppo_stats`` holds no more tensor memory at its peak than that code.

Memory is deterministic (the bytes held by tensors, recorded by torch's profiler allocation by allocation), so it
is asserted here; time is not (it is the benchmark's business, never a test's).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_stats
from common import peak_tensor_bytes

from rl_otel.stats import ppo_stats


def close(got: float, want: float) -> bool:
    if math.isnan(want):
        return math.isnan(got)
    return got == pytest.approx(want, rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("full", [False, True])
@pytest.mark.parametrize("framework", bench_stats.FRAMEWORKS)
def test_each_baseline_computes_what_ppo_stats_computes(framework, full):
    case = bench_stats.Case(framework, 24, 40, seed=3, full=full)
    ours, theirs = case.ours(), case.theirs()
    assert set(theirs) <= set(ours), sorted(set(theirs) - set(ours))
    assert len(theirs) >= 20
    wrong = {k: (ours[k], v) for k, v in theirs.items() if not close(ours[k], v)}
    assert not wrong
    # ppo_stats' extra keys are ROLL's additions (max/min of families ROLL logs the mean of) and nothing else
    extra = set(ours) - set(theirs)
    assert extra == ({f"critic/{f}/{s}" for f in ("entropy", "old_log_prob", "ref_log_prob") for s in ("max", "min")}
                     if framework == "roll" else set())


def test_the_verl_baseline_is_verls_own_code():
    pytest.importorskip("verl", reason="veRL is not installed (requirements-frameworks.txt)")
    from verl import DataProto
    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo.metric_utils import compute_data_metrics
    from verl.workers.config import ActorConfig

    case = bench_stats.Case("verl", 24, 40, seed=5)
    b = case.batch
    batch = DataProto.from_dict(tensors={k: v for k, v in b.items() if k != "log_probs"})
    config = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1,
                         clip_ratio_low=bench_stats.CLIP_LOW, clip_ratio_high=bench_stats.CLIP_HIGH)
    mask = b["response_mask"].bool()
    pg_loss, metrics = core_algos.get_policy_loss_fn("vanilla")(
        old_log_prob=b["old_log_probs"], log_prob=b["log_probs"], advantages=b["advantages"], response_mask=mask,
        loss_agg_mode="token-mean", config=config)
    kld = core_algos.kl_penalty(b["log_probs"], b["ref_log_prob"], kl_penalty=config.kl_loss_type)
    want = {**compute_data_metrics(batch, use_critic=True), **metrics, "actor/pg_loss": pg_loss.item(),
            "actor/kl_loss": core_algos.agg_loss(kld, mask, "token-mean").item(),
            "actor/entropy": core_algos.agg_loss(b["entropy"], mask, "token-mean").item()}
    got = case.theirs()
    assert set(got) == set(want)
    assert all(close(got[k], float(v)) for k, v in want.items()), {k: (got[k], v) for k, v in want.items()}


@pytest.mark.parametrize("layout", ["cpu", "accelerator"])
@pytest.mark.parametrize("full", [False, True])
@pytest.mark.parametrize("framework", bench_stats.FRAMEWORKS)
def test_ppo_stats_holds_less_tensor_memory_than_the_frameworks_code(framework, full, layout):
    """Half or nearly all of the positions response tokens: the peak of the bytes held by the tensors each
    allocates (the inputs, allocated before, not counted). The CPU layout gathers the response tokens; the
    accelerator layout (run here on the CPU: the same tensors a GPU would allocate) stacks whole ``[B, T]`` rows in
    rounds that reuse one buffer (a T four times the prompt's width, as in training: the prompt lengths'
    ``[B, P]`` temporary is a small part of it)."""
    t = 256 if layout == "cpu" else 1024
    case = bench_stats.Case(framework, 64, t, full=full)
    compact = layout == "cpu"
    ours = peak_tensor_bytes(lambda: ppo_stats(**case.kwargs, _compact=compact))
    theirs = peak_tensor_bytes(case.theirs)
    assert theirs > 64 * t * 4  # the frameworks' code holds several [B, T] float tensors at once
    assert ours <= theirs, (ours, theirs)
