"""The demo's PPO loop: rollout, reference KL, critic, GAE, clipped policy and value updates - with or without
telemetry, the same math.

With ``telemetry=False`` (:func:`run`, or ``_step(trainer, None, ...)``) the loop makes no ``rl_otel`` call at
all: phases become plain onload/offload calls and no statistics are computed, so the per-step times in
:class:`DemoResult` measure training alone. ``benchmarks/bench_demo.py`` runs ``_step`` of two trainers
built from one seed, one with telemetry fully on and one off, in alternating blocks to time what telemetry costs.
With telemetry, a step's statistics go to ``Telemetry.submit`` and are computed on its metrics worker.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from rl_otel.demo import DEFAULT_STEPS
from rl_otel.demo.models import Critic, Offloader, Policy
from rl_otel.demo.task import CountingTask

if TYPE_CHECKING:
    from rl_otel.telemetry import Telemetry


@dataclass(frozen=True)
class DemoConfig:
    """Hyper-parameters of the demo run. The defaults learn the task in about a minute on two CPU cores."""

    steps: int = DEFAULT_STEPS
    seed: int = 0
    batch_size: int = 128
    hidden: int = 256
    ppo_epochs: int = 2
    minibatch_size: int = 64
    actor_lr: float = 3e-3
    critic_lr: float = 3e-3
    clip_ratio: float = 0.2
    value_clip: float = 0.2
    kl_coef: float = 0.01
    gamma: float = 1.0
    lam: float = 0.95
    eval_every: int = 10
    eval_runs: int = 4
    # The models are tiny: one intra-op thread is as fast as two on an idle machine and several times faster on a
    # busy one (OpenMP threads wait on each other); run() restores torch's setting when it returns.
    torch_threads: int | None = 1
    task: CountingTask = field(default_factory=CountingTask)

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "hidden", "ppo_epochs", "minibatch_size", "eval_every", "eval_runs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.torch_threads is not None and (isinstance(self.torch_threads, bool)
                                               or not isinstance(self.torch_threads, int) or self.torch_threads < 1):
            raise ValueError(f"torch_threads must be a positive int or None, got {self.torch_threads!r}")


@dataclass
class StepReport:
    """What the loop hands ``on_step`` after each step."""

    step: int
    score: float  # mean score of the step's rollouts, in [0, 1]
    seconds: float
    eval_score: float | None = None  # mean@k of the evaluation, on evaluation steps


@dataclass
class DemoResult:
    """Per-step wall times (seconds) and mean rollout scores; evaluation ``(step, mean@k)`` pairs.

    ``step_seconds`` is the training work of a step (what ``time/step`` and ``system/tps`` report);
    ``iteration_seconds`` the whole loop iteration, including the step's statistics and ``log()`` - what a
    benchmark of telemetry's cost compares."""

    step_seconds: list[float] = field(default_factory=list)
    iteration_seconds: list[float] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    evals: list[tuple[int, float]] = field(default_factory=list)


@contextlib.contextmanager
def _plain_phase(onload: Callable[[], Any] | None = None, offload: Callable[[], Any] | None = None) -> Iterator[None]:
    """A phase without telemetry: the same onload/offload calls around the body."""
    if onload is not None:
        onload()
    yield
    if offload is not None:
        offload()


def _gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
         ) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation over the response tokens; returns (advantages, returns)."""
    adv = torch.zeros_like(rewards)
    last = torch.zeros(rewards.shape[0])
    for t in reversed(range(rewards.shape[1])):
        nxt_value = values[:, t + 1] * mask[:, t + 1] if t + 1 < rewards.shape[1] else torch.zeros_like(last)
        nxt_mask = mask[:, t + 1] if t + 1 < rewards.shape[1] else torch.zeros_like(last)
        delta = rewards[:, t] + gamma * nxt_value - values[:, t]
        last = (delta + gamma * lam * last * nxt_mask) * mask[:, t]
        adv[:, t] = last
    return adv, (adv + values) * mask


def _whiten(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    n = mask.sum()
    mean = (x * mask).sum() / n
    var = (((x - mean) * mask) ** 2).sum() / n
    return (x - mean) * torch.rsqrt(var + 1e-8) * mask


class _Trainer:
    """The models, optimizers and offloaders of one run."""

    def __init__(self, cfg: DemoConfig, offload_dir: Path) -> None:
        torch.manual_seed(cfg.seed)
        self.cfg, self.task = cfg, cfg.task
        self.gen = torch.Generator().manual_seed(cfg.seed)
        self.policy = Policy(cfg.task, cfg.hidden)
        self.reference = Policy(cfg.task, cfg.hidden)
        self.reference.load_state_dict(self.policy.state_dict())
        self.reference.requires_grad_(False)
        self.critic = Critic(cfg.task, cfg.hidden)
        self.actor_opt = torch.optim.Adam(self.policy.parameters(), lr=cfg.actor_lr)
        self.critic_opt = torch.optim.Adam(self.critic.parameters(), lr=cfg.critic_lr)
        # Between phases the frozen reference and both optimizers' states live in files, as a colocated RL
        # framework offloads what the next phase does not need.
        self.reference_store = Offloader(self.reference, offload_dir / "reference.pt")
        self.actor_opt_store = Offloader(None, offload_dir / "actor_optim.pt", self.actor_opt)
        self.critic_opt_store = Offloader(None, offload_dir / "critic_optim.pt", self.critic_opt)
        for store in (self.reference_store, self.actor_opt_store, self.critic_opt_store):
            store.offload()

    def _minibatches(self, n: int) -> Iterator[torch.Tensor]:
        for _ in range(self.cfg.ppo_epochs):
            perm = torch.randperm(n, generator=self.gen)
            yield from perm.split(self.cfg.minibatch_size)

    def train_actor(self, b: dict[str, torch.Tensor]) -> dict[str, torch.Tensor | float]:
        """Clipped-ratio PPO epochs; returns the last epoch's per-token log-probs and entropy, and the loss."""
        cfg, n = self.cfg, b["prompts"].shape[0]
        new_lp, entropy = torch.empty_like(b["old_lp"]), torch.empty_like(b["old_lp"])
        losses, norms = [], []
        for idx in self._minibatches(n):
            m = b["mask"][idx]
            lp, ent = self.policy.log_probs(b["prompts"][idx], b["responses"][idx])
            ratio = torch.exp(lp - b["old_lp"][idx])
            adv = b["adv"][idx]
            pg = -torch.min(ratio * adv, ratio.clamp(1 - cfg.clip_ratio, 1 + cfg.clip_ratio) * adv)
            loss = (pg * m).sum() / m.sum().clamp(min=1)
            self.actor_opt.zero_grad(set_to_none=True)
            loss.backward()
            norms.append(_grad_norm(self.policy))
            self.actor_opt.step()
            new_lp[idx], entropy[idx] = lp.detach(), ent.detach()
            losses.append(loss.detach())
        return {"log_probs": new_lp, "entropy": entropy, "loss": torch.stack(losses).mean(),
                "grad_norm": torch.stack(norms).mean()}

    def train_critic(self, b: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Clipped value regression on the returns; returns the last epoch's predictions and the loss."""
        cfg, n = self.cfg, b["prompts"].shape[0]
        vpreds = torch.empty_like(b["values"])
        losses, norms = [], []
        for idx in self._minibatches(n):
            m, ret, old = b["mask"][idx], b["returns"][idx], b["values"][idx]
            v = self.critic(b["prompts"][idx], b["responses"][idx])
            clipped = old + (v - old).clamp(-cfg.value_clip, cfg.value_clip)
            loss = 0.5 * (torch.max((v - ret) ** 2, (clipped - ret) ** 2) * m).sum() / m.sum().clamp(min=1)
            self.critic_opt.zero_grad(set_to_none=True)
            loss.backward()
            norms.append(_grad_norm(self.critic))
            self.critic_opt.step()
            vpreds[idx] = v.detach()
            losses.append(loss.detach())
        return {"vpreds": vpreds, "loss": torch.stack(losses).mean(), "grad_norm": torch.stack(norms).mean()}

    @torch.no_grad()
    def evaluate(self) -> list[list[dict[str, float]]]:
        """Every prompt answered ``eval_runs`` times: per task (prompt), its runs' metrics (Trinity's shape)."""
        prompts = torch.arange(self.task.num_prompts).repeat_interleave(self.cfg.eval_runs)
        responses = self.policy.generate(prompts, self.gen)
        scores = self.task.score(prompts, responses).view(self.task.num_prompts, self.cfg.eval_runs)
        return [[{"accuracy": s, "solved": float(s == 1.0)} for s in row] for row in scores.tolist()]


def _grad_norm(module: torch.nn.Module) -> torch.Tensor:
    """The gradients' total L2 norm before the optimizer step, as ROLL and veRL log ``actor/grad_norm`` (the
    demo clips nothing: an infinite ``max_norm`` leaves the gradients as they are)."""
    return torch.nn.utils.clip_grad_norm_(module.parameters(), float("inf")).detach()


def run(config: DemoConfig | None = None, telemetry: Telemetry | bool = True,
        on_step: Callable[[StepReport], None] | None = None, offload_dir: str | None = None) -> DemoResult:
    """Train the demo's PPO run and return per-step times and scores.

    Args:
        config: the hyper-parameters (default :class:`DemoConfig()`).
        telemetry: a :class:`rl_otel.Telemetry` to log to (the caller closes it); ``True`` for one of its own
            (``rl_otel.init(prometheus=False)``, closed at the end); ``False`` for none - the loop then makes no
            rl_otel call at all, so ``result.step_seconds`` times the training alone.
        on_step: called after every step with a :class:`StepReport` (the CLI's progress bar).
        offload_dir: where offloaded state goes (default: a temporary directory, removed at the end).
    """
    cfg = config or DemoConfig()
    own = telemetry is True
    tel: Telemetry | None
    if own:
        import rl_otel

        tel = rl_otel.init(run=f"demo-{cfg.seed}", prometheus=False)
    else:
        tel = telemetry or None  # type: ignore[assignment]
    with contextlib.ExitStack() as stack:
        if own:
            stack.callback(tel.close)  # type: ignore[union-attr]
        if cfg.torch_threads is not None:
            stack.callback(torch.set_num_threads, torch.get_num_threads())
            torch.set_num_threads(cfg.torch_threads)
        where = Path(offload_dir) if offload_dir else Path(stack.enter_context(tempfile.TemporaryDirectory(
            prefix="rl_otel_demo_")))
        trainer = _Trainer(cfg, where)
        result = DemoResult()
        samples = 0
        for step in range(cfg.steps):
            start = time.perf_counter()
            report = _step(trainer, tel, step, samples)
            result.iteration_seconds.append(time.perf_counter() - start)
            samples += cfg.batch_size
            result.step_seconds.append(report.seconds)
            result.scores.append(report.score)
            if report.eval_score is not None:
                result.evals.append((step, report.eval_score))
            if on_step is not None:
                on_step(report)
        return result


def _step(tr: _Trainer, tel: Telemetry | None, step: int, samples: int) -> StepReport:
    cfg, task = tr.cfg, tr.task

    def phase(cluster: str, name: str, onload: Callable[[], Any] | None = None,
              offload: Callable[[], Any] | None = None) -> contextlib.AbstractContextManager[Any]:
        if tel is None:
            return _plain_phase(onload, offload)
        return tel.phase(cluster, name, onload=onload, offload=offload, step=step)

    t0 = time.perf_counter()
    with phase("actor_infer", "generate"):
        prompts = task.sample_prompts(cfg.batch_size, tr.gen)
        responses = tr.policy.generate(prompts, tr.gen)
        mask = task.response_mask(responses)
        scores = task.score(prompts, responses)
        with torch.no_grad():
            old_lp, _ = tr.policy.log_probs(prompts, responses)
    with phase("reference", "compute_log_probs", tr.reference_store.onload, tr.reference_store.offload), \
            torch.no_grad():
        ref_lp, _ = tr.reference.log_probs(prompts, responses)
    with phase("critic", "compute_values"), torch.no_grad():
        values = tr.critic(prompts, responses) * mask
    # every part of the step in a phase: the time between phases is what goodput accounts as waiting
    with phase("actor_train", "compute_advantage"):
        t_adv = time.perf_counter()
        kl = (old_lp - ref_lp) * mask
        rewards = -cfg.kl_coef * kl
        last = (mask.sum(1) - 1).long()
        rewards[torch.arange(len(last)), last] += scores
        adv, returns = _gae(rewards, values, mask, cfg.gamma, cfg.lam)
        batch = {"prompts": prompts, "responses": responses, "mask": mask, "old_lp": old_lp, "values": values,
                 "returns": returns, "adv": _whiten(adv, mask)}
        t_adv = time.perf_counter() - t_adv
    with phase("actor_train", "train_step", tr.actor_opt_store.onload, tr.actor_opt_store.offload):
        actor = tr.train_actor(batch)
    with phase("critic", "train_step", tr.critic_opt_store.onload, tr.critic_opt_store.offload):
        critic = tr.train_critic(batch)
    eval_tasks = None
    if (step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps:
        with phase("actor_infer", "evaluate"):
            eval_tasks = tr.evaluate()
    seconds = time.perf_counter() - t0
    eval_score = (sum(r["accuracy"] for runs in eval_tasks for r in runs) / sum(len(r) for r in eval_tasks)
                  if eval_tasks else None)
    if tel is not None:
        # the statistics run on telemetry's metrics worker, off this thread: every tensor handed over is new this
        # step and never modified afterwards (submit()'s one rule)
        tel.submit(_step_metrics, tel.catalog, cfg, samples, batch, scores, rewards, ref_lp, actor, critic,
                   eval_tasks, seconds, t_adv, lrs=(tr.actor_opt.param_groups[0]["lr"],
                                                    tr.critic_opt.param_groups[0]["lr"]), step=step)
    return StepReport(step=step, score=float(scores.mean()), seconds=seconds, eval_score=eval_score)


def _step_metrics(catalog: Any, cfg: DemoConfig, samples: int, b: dict[str, torch.Tensor], scores: torch.Tensor,
                  rewards: torch.Tensor, ref_lp: torch.Tensor, actor: dict[str, Any], critic: dict[str, Any],
                  eval_tasks: list[list[dict[str, float]]] | None, seconds: float, t_adv: float, *,
                  lrs: tuple[float, float]) -> dict[str, Any]:
    """Everything a step reports: ROLL's and TRL's PPO statistics with distributions, losses, rollout and
    evaluation aggregation (Trinity-RFT's), throughput. Runs on the metrics worker (``Telemetry.submit``); the
    phases' time/memory keys join this step's tracker record."""
    from rl_otel.stats import eval_step_metrics, ppo_stats, rollout_step_metrics

    metrics: dict[str, Any] = ppo_stats(
        log_probs=actor["log_probs"], old_log_probs=b["old_lp"], response_mask=b["mask"], advantages=b["adv"],
        ref_log_probs=ref_lp, values=b["values"], returns=b["returns"], vpreds=critic["vpreds"], rewards=rewards,
        scores=scores, entropy=actor["entropy"], prompt_mask=torch.ones(len(scores), 1),
        clip_ratio_low=cfg.clip_ratio, value_clip=cfg.value_clip, kl_coef=cfg.kl_coef, names=("roll", "trl"),
        distributions="tensors", catalog=catalog)
    lengths = b["mask"].sum(1).tolist()
    by_prompt: dict[int, list[dict[str, float]]] = {}
    for p, s, n in zip(b["prompts"].tolist(), scores.tolist(), lengths, strict=True):
        by_prompt.setdefault(p, []).append({"reward": s, "response_length": n})
    metrics.update(rollout_step_metrics(list(by_prompt.values())))
    if eval_tasks:
        metrics.update(eval_step_metrics(eval_tasks, "counting"))
        metrics.update(eval_step_metrics(eval_tasks, "counting", detailed_stats=True))
    tokens = sum(lengths)
    metrics.update({
        "actor/pg_loss": float(actor["loss"]), "actor/lr": lrs[0], "actor/grad_norm": float(actor["grad_norm"]),
        "critic/loss": float(critic["loss"]), "critic/lr": lrs[1], "critic/grad_norm": float(critic["grad_norm"]),
        "system/tps": tokens / seconds, "system/samples": samples + len(scores), "time/adv": t_adv,
        "time/step": seconds,
    })
    return metrics
